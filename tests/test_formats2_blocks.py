"""Issue 17 ("Formats II"): block formats (MXFP4, MXFP6, MXINT8, NVFP4), INT4/UINT4 and packed
storage against independent oracles.

* MX blocks: gfloat ``quantize_block`` with ``compute_scale_amax`` (OCP floor scale) for mxfp4,
  mxfp6_e2m3, mxfp6_e3m2 and mxint8, values compared bit for bit, every element rounding mode
  gfloat has;
* MXFP4 and NVFP4: torchao 0.18 (``to_mx`` / ``nvfp4_quantize``, their CPU reference code), codes
  and scales compared as integers, single- and two-level NVFP4; torchao packs two FP4 codes per
  byte, so its bytes are also the oracle of ``packed=True``;
* NVFP4 against an exact Fraction twin of the torchao recipe (float32 steps emulated with
  ml_dtypes-free exact rounding), so that the recipe is checked without torchao too;
* INT4 / UINT4: value tables vs ml_dtypes.int4 / uint4, codes vs ``clip(rint(x / s))``.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import lowprec as lp

MX = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxint8")


def _blocks(rows=48, n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * np.exp(rng.uniform(-10, 10, (rows, 1)))
    x[0, :32] = 0.0
    x[1, 3] = 1e-30
    x[2, :] = np.linspace(-1, 1, n)  # many exact ties at small scales
    return x.astype(np.float32)


@pytest.mark.parametrize(("fmt", "mode"), [
    pytest.param(f, m, marks=() if (m == "nearest_even" or (f, m) == ("mxfp4", "toward_zero")
                                     or (f, m) == ("mxint8", "nearest_away"))
                 else (pytest.mark.slow,))
    for f in MX for m in ("nearest_even", "nearest_away", "toward_zero")])
def test_mx_equals_gfloat(fmt, mode):
    import gfloat
    from gfloat import formats as G

    bf = {"mxfp4": G.format_info_mxfp4_e2m1, "mxfp6_e2m3": G.format_info_mxfp6_e2m3,
          "mxfp6_e3m2": G.format_info_mxfp6_e3m2, "mxint8": G.format_info_mxint8}[fmt]
    rm = {"nearest_even": gfloat.RoundMode.TiesToEven,
          "nearest_away": gfloat.RoundMode.TiesToAway,
          "toward_zero": gfloat.RoundMode.TowardZero}[mode]
    x = _blocks().astype(np.float64)
    want = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            want[r, b:b + 32] = gfloat.quantize_block(bf, x[r, b:b + 32],
                                                      gfloat.compute_scale_amax, rm)
    got = lp.quantize(x, fmt, mode).astype(np.float64)
    if fmt == "mxint8":
        # gfloat's int8 element includes -2 (code 0x80); lowprec's MXINT8 range is symmetric,
        # [-127/64, 127/64], as microxcaling: a negative element that rounds below -127/64
        # saturates there.  Those elements (and only those) differ.
        scale = got / np.where(want == 0, 1, want)
        minus2 = (want != got) & np.isclose(scale, 127 / 128, rtol=0, atol=0)
        want = np.where(minus2, got, want)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]


def test_mx_formats_info_and_packing():
    assert lp.get_format("mxfp4").info.element == "e2m1"
    assert lp.get_format("mxfp6_e3m2").info.max == 28.0
    assert lp.get_format("mxint8").info.max == 127 / 64
    x = _blocks()
    q = lp.encode(x, "mxint8")
    assert q.codes.min() >= 0 and lp.decode(q).dtype == np.float32
    # MXINT8 codes are two's complement: -1.0 at scale 1 is -64 = 0xC0
    q1 = lp.encode(np.array([-1.0, 1.0] + [0.0] * 30, np.float32), "mxint8")
    assert q1.codes[:2].tolist() == [0xC0, 0x40] and int(q1.scales[0]) == 127
    with pytest.raises(ValueError, match="4-bit"):
        lp.encode(x, "mxfp6_e2m3", packed=True)


# ------------------------------------------------------------------------------------------
# torchao (its reference functions run on the CPU)


def _torchao():
    pytest.importorskip("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats import kernels, mx_tensor, nvfp4_tensor
    return kernels, mx_tensor, nvfp4_tensor


@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_equals_torchao(two_level):
    import torch

    kernels, _mx, nv = _torchao()
    x = _blocks(64, 256, 4)
    xt = torch.from_numpy(x)
    pts = nv.per_tensor_amax_to_scale(xt.abs().max()) if two_level else None
    s, packed = nv.nvfp4_quantize(xt, 16, pts)
    codes = kernels.unpack_uint4(packed).numpy().reshape(x.shape)
    q = lp.encode(x, "nvfp4", tensor_scale="amax" if two_level else None)
    assert np.array_equal(q.codes, codes)
    assert np.array_equal(q.scales, s.view(torch.uint8).numpy())
    if two_level:
        assert np.float32(q.tensor_scale) == pts.numpy()
    qp = lp.encode(x, "nvfp4", tensor_scale="amax" if two_level else None, packed=True)
    assert np.array_equal(qp.codes, packed.numpy())  # torchao's byte layout
    # decode as torchao's NVFP4Tensor.to_dtype: element * (tensor_scale * block_scale)
    hp = s.to(torch.float32) if pts is None else pts * s.to(torch.float32)
    ev = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(packed)).reshape(64, 16, 16)
    want = (ev * hp.reshape(64, 16, 1)).reshape(x.shape).numpy()
    assert np.array_equal(lp.decode(qp).view(np.uint32), want.view(np.uint32))


def test_mxfp4_equals_torchao():
    import torch

    kernels, mx, _nv = _torchao()
    x = _blocks(32, 128, 5)
    scale, data = mx.to_mx(torch.from_numpy(x), "fp4_e2m1"
                           if not hasattr(torch, "float4_e2m1fn_x2") else torch.float4_e2m1fn_x2,
                           32)
    codes = kernels.unpack_uint4(data.view(torch.uint8)).numpy().reshape(x.shape)
    q = lp.encode(x, "mxfp4")
    assert np.array_equal(q.scales, scale.view(torch.uint8).numpy())
    assert np.array_equal(q.codes, codes)


def _f32(v) -> float:
    """Exact float32 rounding (nearest even) of a float64 or Fraction, via numpy."""
    return float(np.float32(float(v)))


def test_nvfp4_recipe_twin():
    # the torchao recipe written out element by element with Python floats (each float32 step
    # rounded by numpy.float32) and exact nearest-even E4M3 / E2M1 value tables
    from fractions import Fraction

    e4 = sorted({Fraction(float(v)) for v in np.arange(256, dtype=np.uint8)
                 .view(ml_dtypes.float8_e4m3fn).astype(np.float64) if np.isfinite(v) and v >= 0})
    e2 = sorted({Fraction(float(v)) for v in np.arange(16, dtype=np.uint8)
                 .view(ml_dtypes.float4_e2m1fn).astype(np.float64) if v >= 0})

    def rne(a, grid):
        a = Fraction(a)
        s = -1 if a < 0 else 1
        a = abs(a)
        k = max(i for i, g in enumerate(grid) if g <= a) if a < grid[-1] else len(grid) - 1
        if k == len(grid) - 1:
            return s * grid[-1]
        lo, hi = grid[k], grid[k + 1]
        if a - lo != hi - a:
            return s * (lo if a - lo < hi - a else hi)
        return s * (lo if k % 2 == 0 else hi)  # codes of consecutive magnitudes alternate parity

    x = _blocks(4, 32, 6)
    q = lp.quantize(x, "nvfp4")
    for r in range(4):
        for b in range(2):
            blk = x[r, 16 * b:16 * b + 16].astype(np.float64)
            bs = _f32(np.float32(np.abs(blk).max()) / np.float32(6.0))
            bs = min(max(bs, 2.0**-6), 448.0)
            s8 = float(rne(bs, e4))
            inv = _f32(np.float32(1.0) / np.float32(s8))
            for i in range(16):
                y = min(max(_f32(np.float32(blk[i]) * np.float32(inv)), -6.0), 6.0)
                want = _f32(float(rne(y, e2)) * s8)
                got = float(q[r, 16 * b + i])
                assert got == want or (got == 0 and want == 0), (r, b, i, got, want)


def test_nvfp4_recipes_and_errors():
    x = np.random.default_rng(7).standard_normal((8, 64)).astype(np.float32)
    for recipe in ("torchao", "te"):
        y = lp.quantize(x, "nvfp4", recipe=recipe, tensor_scale="amax")
        rel = np.abs(y - x) / np.maximum(np.abs(x), 1e-30)
        assert np.median(rel[x != 0]) < 0.2
    with pytest.raises(ValueError, match="recipe"):
        lp.encode(x, "nvfp4", recipe="cublas")
    with pytest.raises(ValueError, match="positive"):
        lp.encode(x, "nvfp4", tensor_scale=-1.0)
    q = lp.encode(np.array([[np.nan] + [1.0] * 15], np.float32), "nvfp4")
    assert int(q.scales[0, 0]) == 0x7F and np.isnan(lp.decode(q)).all()


# ------------------------------------------------------------------------------------------
# INT4 / UINT4 and packing


@pytest.mark.parametrize("fmt", ["int4", "uint4"])
def test_int4_values_and_codes(fmt):
    t = ml_dtypes.int4 if fmt == "int4" else ml_dtypes.uint4
    nib = np.arange(16, dtype=np.uint8)
    assert np.array_equal(lp.get_format(fmt).values(), nib.view(t).astype(np.float32))
    x = _blocks(16, 64, 8)
    q = lp.encode(x, fmt, granularity="per_channel", axis=0)
    lo, hi = (-7, 7) if fmt == "int4" else (0, 15)
    want = np.clip(np.rint(x.astype(np.float64) / q.scales.astype(np.float64)), lo, hi)
    assert np.array_equal(q.codes.astype(np.float64), want)
    # the codes are ml_dtypes int4/uint4 values; packed bytes hold their nibbles, low first
    assert np.array_equal(q.codes.astype(t).astype(np.int64), q.codes.astype(np.int64))
    p = lp.encode(x, fmt, granularity="per_channel", axis=0, packed=True)
    nibs = q.codes.astype(t).view(np.uint8) & 0x0F
    assert np.array_equal(p.codes, nibs[:, 0::2] | (nibs[:, 1::2] << 4))
    assert np.array_equal(lp.decode(p), lp.decode(q))


def test_packed_float_codes():
    x = _blocks(4, 64, 9)
    p = lp.encode(x, "e2m1", packed=True)
    c = lp.encode(x, "e2m1")
    assert p.shape == (4, 32) and np.array_equal(p, c[:, 0::2] | (c[:, 1::2] << 4))
    assert np.array_equal(lp.decode(p, "e2m1", packed=True), lp.decode(c, "e2m1"))
    with pytest.raises(ValueError, match="even"):
        lp.encode(x[:, :3], "e2m1", packed=True)
    with pytest.raises(ValueError, match="4-bit"):
        lp.encode(x, "e4m3", packed=True)
