"""The Triton kernels of ``lowprec.gpu`` in Triton's interpreter, bit for bit against the Numba
path (issue 14, CI acceptance; gpu.md section 4).

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` on machines without a CUDA GPU before any
kernel is decorated; the kernels then take CPU tensors.  With a GPU these tests skip (the ``gpu``
tests and ``scripts/gpu_exhaustive.py`` run the compiled kernels against the same Numba path).

Per float format x rounding mode x saturate: every binade edge and special value
(``gpu_cases.edge_bits32``) and 2**17 random float32 bit patterns, codes and fused values;
float64 (edges within 2 ulp and random 53-bit values), every float16 and every bfloat16 pattern;
stochastic rounding for every ``sr_bits`` in 1..32 with large seeds and offsets.  MX: random and
edge blocks for every element format, scale mode, rounding mode, non-finite policy, input dtype,
axis and block length (partial and long blocks).  INT: every granularity, symmetric or not,
explicit or data scales, narrow, every mode.  The public API through the CUDA code path
(``ops.TRITON_ON_CPU``): out=, overlap, offset chunks, QuantizedArray round trips.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import lowprec as lp
from lowprec.formats import _arrays as A
from lowprec.formats import integer as _int
from lowprec.formats import mx as _mx

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the Triton interpreter is off (a CUDA GPU is present: see tests/conftest.py)",
                allow_module_level=True)

import gpu_cases as C  # noqa: E402

from lowprec.formats.hif8 import HIF8_SPEC  # noqa: E402
from lowprec.formats.minifloat import SPECS  # noqa: E402
from lowprec.formats.minifloat import run_kernel as cpu_run  # noqa: E402
from lowprec.gpu import codecs, ops  # noqa: E402
from lowprec.gpu.minifloat import run_kernel as gpu_run  # noqa: E402

SPEC = {"hif8": HIF8_SPEC, **SPECS}
N_RANDOM = 1 << 17
SEED = 0xFEDCBA9876543210  # a seed above 2**63
OFFSET = (1 << 63) + 12345  # and an offset above it


@pytest.fixture(autouse=True)
def _quiet():
    # the interpreter runs NumPy on NaN lanes whose results are then discarded
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _run_both(fmt, bits, xt, mode, sat, want_value, sr_bits=32, seed=SEED, offset=OFFSET):
    """(Numba output, Triton output) for the same input (``bits``: the CPU's uint32/uint64
    view; ``xt``: the tensor the kernel reads)."""
    m = int(lp.Rounding[mode.upper()])
    dt = np.float32 if want_value else np.uint8
    want = np.empty(bits.size, dt)
    # the reference in chunks below PARALLEL_MIN: the serial Numba kernels the other tests
    # compile anyway (a parallel kernel costs seconds of compilation each); the counter offset
    # of each chunk keeps stochastic rounding equal to one call
    step = A.PARALLEL_MIN // 2
    for s0 in range(0, bits.size, step):
        cpu_run(SPEC[fmt], bits[s0:s0 + step], want[s0:s0 + step], m, sat, seed, sr_bits,
                (offset + s0) % 2**64)
    got = torch.empty(bits.size, dtype=torch.float32 if want_value else torch.uint8)
    gpu_run(SPEC[fmt], xt, got, m, sat, seed, sr_bits, offset)
    return want, got.numpy()


def _check(fmt, bits, xt, mode, sat, sr_bits=32):
    for want_value in (False, True):
        want, got = _run_both(fmt, bits, xt, mode, sat, want_value, sr_bits)
        bad = (C.count_value_mismatches(got, want) if want_value
               else C.count_code_mismatches(got, want))
        if bad:
            i = np.flatnonzero((got != want) & ~(np.isnan(got) & np.isnan(want))
                               if want_value else got != want)[:5]
            raise AssertionError(f"{fmt} {mode} sat={sat} values={want_value}: {bad} "
                                 f"mismatches, e.g. inputs {[hex(int(bits[j])) for j in i]} "
                                 f"got {got[i]} want {want[i]}")


# --------------------------------------------------------------------------------------------
# float formats


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt,mode", [(f, m) for f in C.FLOAT_FORMATS for m in C.modes(f)])
def test_float32_edges_and_random(fmt, mode, sat):
    bits = np.concatenate([C.edge_bits32(fmt), C.random_bits32(N_RANDOM, 1, fmt)])
    _check(fmt, bits, torch.from_numpy(bits.view(np.float32)), mode, sat)


@pytest.mark.parametrize("fmt", C.FLOAT_FORMATS)
def test_stochastic_every_sr_bits(fmt):
    bits = np.concatenate([C.edge_bits32(fmt)[::7], C.random_bits32(1 << 11, 2, fmt)])
    xt = torch.from_numpy(bits.view(np.float32))
    for k in range(1, 33):
        for want_value in (False, True):
            want, got = _run_both(fmt, bits, xt, "stochastic", k % 2 == 1, want_value, k,
                                  seed=k * 0x9E3779B97F4A7C15 % 2**64, offset=2**64 - k)
            bad = (C.count_value_mismatches(got, want) if want_value
                   else C.count_code_mismatches(got, want))
            assert bad == 0, (fmt, k, want_value, bad)


@pytest.mark.parametrize("fmt,mode", [(f, m) for f in C.FLOAT_FORMATS for m in C.modes(f)
                                      if m != "hybrid"])
def test_float64_direct_rounding(fmt, mode):
    x = np.concatenate([C.edge_bits64(fmt).view(np.float64), C.random_float64(1 << 13, 3, fmt)])
    bits = A.float_bits(x)
    for sat in (False, True):
        _check(fmt, bits, torch.from_numpy(x), mode, sat)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt,mode", [(f, m) for f in C.FLOAT_FORMATS for m in C.modes(f)])
def test_every_16_bit_pattern(fmt, mode, dtype):
    """All 65536 float16 / bfloat16 patterns, widened exactly by the kernel's bit operations."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    tdt = getattr(torch, dtype)
    xt = torch.from_numpy(h.view(np.int16)).view(tdt)
    bits = xt.to(torch.float32).numpy().view(np.uint32).copy()  # the CPU's exact widening
    _check(fmt, bits, xt, mode, mode in ("nearest_even", "up", "hybrid"))


@pytest.mark.parametrize("fmt", C.FLOAT_FORMATS)
def test_decode_every_code(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(3)
    out = torch.empty(codes.shape, dtype=torch.float32)
    codecs.float_decode(codes, out, fmt)
    want = np.tile(lp.get_format(fmt).values(), 3)
    assert C.count_value_mismatches(out.numpy(), want) == 0


# --------------------------------------------------------------------------------------------
# MX


MX_MODES = C.DET_MODES + ("stochastic",)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_mx_blocks(fmt, dtype):
    """Every scale mode, rounding mode (float32; two for the other input dtypes) and
    non-finite policy on random and edge blocks, the OCP block length and partial last
    blocks."""
    x = C.mx_blocks(24, 100, 4, np.float64)
    if dtype == "float16":
        x = np.clip(np.nan_to_num(x, nan=np.nan, posinf=np.inf, neginf=-np.inf), -6e4, 6e4)
    xn = x.astype(np.float32) if dtype != "float64" else x
    xt = torch.from_numpy(xn).to(getattr(torch, dtype))
    xn = xt.float().numpy() if dtype in ("bfloat16", "float16") else xn
    # every mode for float32; the other dtypes only change how elements are read
    modes = MX_MODES if dtype == "float32" else ("nearest_even", "stochastic")
    for smode in _mx.SCALE_MODES:
        for mode in modes:
            for nonfinite in ("nan", "saturate"):
                kw = dict(block_size=32, scale_mode=smode, nonfinite=nonfinite, rounding=mode,
                          seed=SEED, sr_bits=11, offset=OFFSET)
                _mx_check(fmt, xn, xt, kw)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_mx_axes_and_block_lengths(fmt):
    """Any axis; block lengths 1, 7, 32, 33 (the middle tile shape), 1500 (a long block read in
    chunks) and one over the whole axis."""
    x = C.mx_blocks(12, 1600, 5).reshape(12, 2, 800)
    xt = torch.from_numpy(x)
    for axis in (0, 1, 2, -1):
        for k in (1, 7, 32, 33, 1500, 2**63):
            if axis in (0, 1) and k > 32:
                continue
            for mode in ("nearest_even", "stochastic"):
                kw = dict(axis=axis, block_size=k, rounding=mode, seed=9, sr_bits=32,
                          scale_mode="even" if k == 7 else "floor")
                _mx_check(fmt, x, xt, kw)


def _mx_check(fmt, xn, xt, kw):
    q = lp.encode(xn, fmt, **kw)
    o = _mx.options(kw.get("rounding"), kw.get("seed"), kw.get("sr_bits", 32), None,
                              kw.get("axis", -1), kw["block_size"], kw.get("scale_mode", "floor"),
                              kw.get("nonfinite", "nan"), kw.get("offset", 0), xn.ndim)
    ax = o["axis"]
    kk = _mx.block_len(o["block_size"], xn.shape[ax])
    args = (fmt, ax, kk, o["smode"], o["sat_inf"], o["mode"], o["seed"], o["sr_bits"],
            o["offset"])
    codes, scales = codecs.mx_codec(xt, *args, False)
    assert C.count_code_mismatches(codes.numpy(), q.codes) == 0, kw
    assert C.count_code_mismatches(scales.numpy(), q.scales) == 0, kw
    vals = codecs.mx_codec(xt, *args, True)
    want = lp.decode(q)
    assert C.count_value_mismatches(vals.numpy(), want) == 0, kw
    dec = codecs.mx_decode(torch.from_numpy(q.codes), torch.from_numpy(q.scales), fmt, ax, kk)
    assert C.count_value_mismatches(dec.numpy(), want) == 0, kw


# --------------------------------------------------------------------------------------------
# INT


INT_GRANS = [("per_tensor", {}), ("per_channel", {"axis": 0}), ("per_channel", {"axis": 2}),
             ("per_token", {}), ("per_block", {"axis": -1, "block_size": 5}),
             ("per_block", {"axis": 1, "block_size": 3})]


@pytest.mark.parametrize("fmt", ["int8", "uint8"])
@pytest.mark.parametrize("gran,gkw", INT_GRANS, ids=[f"{g}{k}" for g, k in INT_GRANS])
def test_int_granularities(fmt, gran, gkw):
    x = C.int_inputs((6, 7, 13), 6)
    xt = torch.from_numpy(x)
    cases = [dict(symmetric=True), dict(symmetric=False)]
    if fmt == "int8":
        cases += [dict(symmetric=True, narrow=False), dict(symmetric=False, narrow=True)]
    for extra in cases:
        for mode in MX_MODES:
            kw = dict(granularity=gran, rounding=mode, seed=SEED, sr_bits=17, offset=OFFSET,
                      **gkw, **extra)
            _int_check(fmt, x, xt, kw)
    # explicit scales (and zero points)
    lay = _int._Layout(x.shape, gran, gkw.get("axis"), gkw.get("block_size"))
    s = np.random.default_rng(7).uniform(0.01, 0.2, lay.scale_shape).astype(np.float32)
    _int_check(fmt, x, xt, dict(granularity=gran, scale=s, **gkw))
    z = np.full(lay.scale_shape, 3 if fmt == "int8" else 130, np.int32)
    _int_check(fmt, x, xt, dict(granularity=gran, scale=s, zero_point=z, symmetric=False,
                                rounding="stochastic", seed=5, **gkw))


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_int_input_dtypes(dtype):
    x = C.int_inputs((5, 40), 8)
    xt = torch.from_numpy(x.astype(np.float64) * (1 + 2.0**-30)).to(getattr(torch, dtype))
    xn = xt.numpy() if dtype == "float64" else xt.float().numpy()
    for fmt in ("int8", "uint8"):
        for mode in ("nearest_even", "down", "stochastic"):
            _int_check(fmt, xn, xt, dict(granularity="per_token", symmetric=False,
                                         rounding=mode, seed=3))


def _int_check(fmt, xn, xt, kw):
    kw = dict(kw)
    f = lp.get_format(fmt)
    o = _int.options(
        f, kw.pop("rounding", None), kw.pop("seed", None), kw.pop("sr_bits", 32), None,
        kw.get("granularity", "per_tensor"), kw.get("axis"), kw.get("block_size"),
        kw.get("symmetric", True), kw.get("scale"), kw.get("zero_point"), kw.get("narrow"),
        kw.pop("offset", 0), xn.shape)
    lay = o["lay"]
    ref_kw = dict(kw, rounding=lp.Rounding(o["mode"]), seed=o["seed"], sr_bits=o["sr_bits"],
                  offset=o["offset"] % 2**64)
    s = None if kw.get("scale") is None else torch.from_numpy(
        np.ascontiguousarray(np.broadcast_to(kw["scale"], lay.scale_shape)))
    z = None if kw.get("zero_point") is None else torch.from_numpy(
        np.ascontiguousarray(np.broadcast_to(kw["zero_point"], lay.scale_shape)))
    args = (fmt, lay.granularity, lay.axis, lay.block_len, kw.get("symmetric", True),
            kw.get("narrow"), s, z, o["mode"], o["seed"], o["sr_bits"], o["offset"])
    want = lp.quantize(xn, fmt, **ref_kw)
    got = codecs.int_codec(xt, *args, True)
    assert C.count_value_mismatches(got.numpy(), want) == 0, kw
    q = lp.encode(xn, fmt, **ref_kw)
    codes, scales, zps = codecs.int_codec(xt, *args, False)
    assert C.count_code_mismatches(codes.numpy(), q.codes) == 0, kw
    assert C.count_value_mismatches(scales.numpy(), q.scales) == 0, kw
    if q.zero_points is not None:
        assert C.count_code_mismatches(zps.numpy(), q.zero_points) == 0, kw
    dec = codecs.int_decode(codes, scales, zps, lay, fmt)
    assert C.count_value_mismatches(dec.numpy(), lp.decode(q)) == 0, kw


# --------------------------------------------------------------------------------------------
# The public API through the CUDA code path (validation, dispatch, glue, kernels)


@pytest.fixture
def triton_on_cpu(monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    yield


def _np_and_torch(x):
    return x, torch.from_numpy(x.copy())


# the design's seven formats and one of each kind from issue 17 (the rest: -m slow; the Formats
# II kernels themselves are checked in tests/test_gpu_formats2.py)
_API_FORMATS = [pytest.param(f, marks=() if i < 7 or f in (
    "e2m1", "e8m0", "e4m3fnuz", "binary8p3", "bfloat16", "mxfp4", "mxint8", "nvfp4", "int4")
    else (pytest.mark.slow,)) for i, f in enumerate(lp.available_formats())]


@pytest.mark.parametrize("fmt", _API_FORMATS)
def test_public_api_through_the_device_path(fmt, triton_on_cpu):
    x, xt = _np_and_torch(C.mx_blocks(6, 64, 10).reshape(6, 8, 8))
    if lp.get_format(fmt).info.kind == "int":
        x, xt = _np_and_torch(C.int_inputs((6, 8, 8), 11))
    kws = [dict(), dict(rounding="stochastic", seed=4, sr_bits=5, offset=99)]
    if lp.get_format(fmt).info.kind == "mx":
        kws.append(dict(axis=1, block_size=3, scale_mode="ceil"))
    if lp.get_format(fmt).info.kind == "int":
        kws.append(dict(granularity="per_channel", axis=1, symmetric=False))
    for kw in kws:
        want = lp.quantize(x, fmt, **kw)
        got = lp.quantize(xt, fmt, **kw)
        assert C.count_value_mismatches(got.numpy(), want) == 0, kw
        enc = lp.encode(x, fmt, **kw)
        genc = lp.encode(xt, fmt, **kw)
        if lp.get_format(fmt).info.kind == "float":
            assert C.count_code_mismatches(genc.numpy(), enc) == 0
            assert C.count_value_mismatches(lp.decode(genc, fmt).numpy(),
                                            lp.decode(enc, fmt)) == 0
        else:
            assert C.count_code_mismatches(genc.codes.numpy(), enc.codes) == 0
            assert C.count_value_mismatches(lp.decode(genc).numpy(), lp.decode(enc)) == 0
        out = torch.empty(xt.shape)
        assert lp.quantize(xt, fmt, out=out, **kw) is out
        assert C.count_value_mismatches(out.numpy(), want) == 0


@pytest.mark.parametrize("fmt", ["hif8", "e4m3", "e5m2"])
def test_out_overlap_and_offset_chunks_on_the_device_path(fmt, triton_on_cpu):
    buf = torch.from_numpy(C.mx_blocks(1, 257, 12).reshape(-1))
    want = lp.quantize(buf[:-1].numpy().copy(), fmt)
    lp.quantize(buf[:-1], fmt, out=buf[1:])
    assert C.count_value_mismatches(buf[1:].numpy(), want) == 0
    x = torch.from_numpy(C.mx_blocks(1, 300, 13).reshape(-1))
    sr = dict(rounding="stochastic", seed=77, sr_bits=9)
    whole = lp.quantize(x, fmt, **sr)
    parts = torch.cat([lp.quantize(x[a:b], fmt, offset=a, **sr)
                       for a, b in ((0, 100), (100, 101), (101, 300))])
    assert C.count_value_mismatches(parts.numpy(), whole.numpy()) == 0
    assert C.count_value_mismatches(whole.numpy(), lp.quantize(x.numpy(), fmt, **sr)) == 0
