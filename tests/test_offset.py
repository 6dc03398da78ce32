"""``offset=``: element ``i`` of a call uses the stochastic counter ``offset + i``, so a tensor
quantized in chunks (each chunk with its start as offset) equals the tensor quantized at once,
for every format (issue 14, item 2).  MX counts in the axis-last layout, so its chunks are whole
rows of that layout.  Expected values come from the whole-array call."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec as lp

torch = pytest.importorskip("torch")


def _x(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(np.nan_to_num(a), np.nan_to_num(b))


SR = dict(rounding="stochastic", seed=2024, sr_bits=7)


@pytest.mark.parametrize("fmt", ["hif8", "e4m3", "e5m2"])
@pytest.mark.parametrize("kind", ["numpy", "torch", "float64"])
def test_float_chunks_equal_whole(fmt, kind):
    x = _x(1000)
    if kind == "float64":
        x = x.astype(np.float64) * (1 + 2.0**-40)
    xx = torch.from_numpy(x) if kind == "torch" else x
    whole = lp.quantize(xx, fmt, **SR)
    codes = lp.encode(xx, fmt, **SR)
    for cuts in ([0, 1, 333, 1000], [0, 500, 1000], [0, 999, 1000]):
        spans = list(zip(cuts[:-1], cuts[1:], strict=True))
        parts = [lp.quantize(xx[a:b], fmt, offset=a, **SR) for a, b in spans]
        cparts = [lp.encode(xx[a:b], fmt, offset=a, **SR) for a, b in spans]
        cat = torch.cat if kind == "torch" else np.concatenate
        same(cat(parts), whole)
        same(cat(cparts), codes)
    # the default offset is 0, and a different offset gives different draws
    same(lp.quantize(xx, fmt, offset=0, **SR), whole)
    assert np.any(np.asarray(lp.quantize(xx, fmt, offset=1, **SR)) != np.asarray(whole))


@pytest.mark.parametrize("fmt", ["hif8", "e4m3"])
def test_offset_wraps_like_a_uint64_counter(fmt):
    x = _x(64)
    top = 2**64 - 10  # elements 10.. of this call use counters 0..
    a = lp.quantize(x, fmt, offset=top, **SR)
    b = lp.quantize(x[10:], fmt, offset=0, **SR)
    same(a[10:], b)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_mx_row_chunks_equal_whole(fmt):
    x = _x((6, 70))
    for axis in (0, 1):
        whole = lp.quantize(x, fmt, axis=axis, block_size=16, **SR)
        xm = np.moveaxis(x, axis, -1)  # the counter runs over this layout
        n = xm.shape[-1]
        rows = [lp.quantize(xm[r:r + 1], fmt, axis=-1, block_size=16, offset=r * n, **SR)
                for r in range(xm.shape[0])]
        same(np.moveaxis(np.concatenate(rows), -1, axis), whole)


@pytest.mark.parametrize("fmt", ["int8", "uint8"])
def test_int_chunks_equal_whole_with_the_same_scale(fmt):
    x = _x(1000)
    whole = lp.quantize(x, fmt, scale=0.05, **SR)
    parts = [lp.quantize(x[a:b], fmt, scale=0.05, offset=a, **SR)
             for a, b in ((0, 300), (300, 301), (301, 1000))]
    same(np.concatenate(parts), whole)
    codes = lp.encode(x, fmt, scale=0.05, **SR).codes
    cparts = [lp.encode(x[a:b], fmt, scale=0.05, offset=a, **SR).codes
              for a, b in ((0, 500), (500, 1000))]
    same(np.concatenate(cparts), codes)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "3"])
def test_offset_validation(bad):
    x = _x(8)
    err = TypeError if isinstance(bad, (float, bool, str)) else ValueError
    for fmt in ("e4m3", "mxfp8_e4m3", "int8"):
        with pytest.raises(err, match="offset"):
            lp.quantize(x, fmt, offset=bad, **SR)
