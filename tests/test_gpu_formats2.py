"""Issue 17 item 6: the Formats II element formats through the Triton kernels (Triton's
interpreter on the CPU, as tests/test_gpu_interpreter.py), bit for bit against the Numba path:
codes and fused values for float32 (grid points, midpoints, random patterns) and float64 input,
every deterministic mode and stochastic rounding, saturating or not; MX blocks with the new
elements; a user format; NVFP4 (both recipes, one and two levels, every element rounding mode,
packed codes) on random rows of many magnitudes, zero and non-finite blocks, partial last
blocks, and blocks on the recipes' rounding boundaries."""

from __future__ import annotations

import os
import warnings

import ml_dtypes
import numpy as np
import pytest

import lowprec as lp

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the Triton interpreter is off (a CUDA GPU is present)", allow_module_level=True)

import gpu_cases as C  # noqa: E402

from lowprec.formats.minifloat import run_kernel as cpu_run  # noqa: E402
from lowprec.gpu import ops  # noqa: E402
from lowprec.gpu.minifloat import run_kernel as gpu_run  # noqa: E402

FORMATS = ("e2m1", "e2m3", "e3m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e4m3_ieee", "e3m4",
           "binary8p1", "binary8p3", "binary8p7", "bfloat16", "float16")
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
SEED = 0xFEDCBA9876543210
OFFSET = (1 << 63) + 12345


@pytest.fixture(autouse=True)
def _quiet():
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _inputs(fmt):
    v = lp.get_format(fmt).values().astype(np.float64)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    if v.size > 4096:
        v = v[:: v.size // 4096]
    mids = (v[1:] + v[:-1]) / 2
    pts = np.concatenate([v, mids, (3 * v[1:] + v[:-1]) / 4, v * 1.5, v * 4]).astype(np.float32)
    rnd = np.random.default_rng(1).integers(0, 2**32, 1 << 12, dtype=np.uint64)
    x = np.concatenate([pts, -pts, rnd.astype(np.uint32).view(np.float32),
                        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32)])
    return x


def _compare(fmt, x, mode, sat):
    spec = lp.get_format(fmt).spec
    m = int(lp.Rounding[mode.upper()])
    wide = lp.get_format(fmt).info.bits > 8
    bits = np.ascontiguousarray(x).reshape(-1).view(np.uint64 if x.dtype == np.float64
                                                    else np.uint32)
    xt = torch.from_numpy(np.ascontiguousarray(x))
    for want_value in (False, True):
        dt = np.float32 if want_value else (np.uint16 if wide else np.uint8)
        want = np.empty(bits.size, dt)
        cpu_run(spec, bits, want, m, sat, SEED, 13, OFFSET)
        tdt = torch.float32 if want_value else (torch.uint16 if wide else torch.uint8)
        got = torch.empty(bits.size, dtype=tdt)
        gpu_run(spec, xt, got, m, sat, SEED, 13, OFFSET)
        got = got.numpy()
        bad = (C.count_value_mismatches(got, want) if want_value
               else int((got != want).sum()))
        assert bad == 0, (fmt, mode, sat, want_value, x.dtype)


# default run: one format of each kind of specials in a deterministic mode and stochastic
# rounding (the interpreter runs each kernel variant in NumPy, seconds per call); the full
# matrix is ``-m slow``
DEFAULT = {("e2m1", "nearest_even"), ("e8m0", "nearest_away"), ("binary8p1", "nearest_even"),
           ("bfloat16", "stochastic")}


@pytest.mark.parametrize(("fmt", "mode"), [
    pytest.param(f, m, marks=() if (f, m) in DEFAULT else (pytest.mark.slow,))
    for f in FORMATS for m in MODES])
def test_float32_new_formats(fmt, mode):
    x = _inputs(fmt)
    for sat in (False, True):
        _compare(fmt, x, mode, sat)


@pytest.mark.parametrize("fmt", [
    "e2m1", *(pytest.param(f, marks=pytest.mark.slow)
              for f in ("e8m0", "binary8p1", "bfloat16", "e4m3fnuz"))])
def test_float64_new_formats(fmt):
    x = _inputs(fmt).astype(np.float64)
    for mode in ("nearest_even", "stochastic", "down"):
        _compare(fmt, x, mode, False)


def test_user_format_on_the_device_path(monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    lp.float_format(5, 6, bias=13, inf="top", nan="neg_zero", name="t17_gpu_user")
    x = _inputs("e3m4")
    xt = torch.from_numpy(x.copy())
    for kw in (dict(rounding="stochastic", seed=3), dict(rounding="up", saturate=True)):
        assert np.array_equal(lp.encode(xt, "t17_gpu_user", **kw).numpy(),
                              lp.encode(x, "t17_gpu_user", **kw))
        assert C.count_value_mismatches(lp.quantize(xt, "t17_gpu_user", **kw).numpy(),
                                        lp.quantize(x, "t17_gpu_user", **kw)) == 0


@pytest.mark.parametrize("fmt", ["mxfp4", "mxint8", *(pytest.param(f, marks=pytest.mark.slow)
                                                     for f in ("mxfp6_e2m3", "mxfp6_e3m2"))])
def test_mx_new_elements_on_the_device_path(fmt, monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    x = C.mx_blocks(6, 64, 10).reshape(6, 8, 8)
    x[0, 0, :] = np.nan
    xt = torch.from_numpy(x.copy())
    for kw in (dict(), dict(rounding="stochastic", seed=4, sr_bits=5, offset=99),
               dict(axis=1, block_size=3, scale_mode="ceil")):
        q, qt = lp.encode(x, fmt, **kw), lp.encode(xt, fmt, **kw)
        assert np.array_equal(q.codes, qt.codes.numpy()), kw
        assert np.array_equal(q.scales, qt.scales.numpy()), kw
        assert C.count_value_mismatches(lp.quantize(xt, fmt, **kw).numpy(),
                                        lp.quantize(x, fmt, **kw)) == 0


@pytest.mark.parametrize("fmt", ["mxint8", "mxfp4", "mxfp6_e2m3"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mx_subnormal_block_maxima(fmt, dtype, monkeypatch):
    """Blocks whose largest magnitude is a float32 subnormal: the shared exponent from the
    exact floor(log2 amax) (MXINT8's element emax 0 puts the scale above the -127 clamp
    there; the kernel once took every subnormal amax as 2**-126: 1550 differing outputs)."""
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    rng = np.random.default_rng(7)
    rows = [(rng.random(32) * 2.0**e).astype(np.float32) for e in range(-149, -120)]
    rows += [np.full(32, 2.0**-149, np.float32), np.r_[np.float32(1.5 * 2.0**-127),
                                                       np.zeros(31, np.float32)]]
    x = np.stack(rows)
    x[::3] *= -1
    x = x.astype(dtype)
    xt = torch.from_numpy(x.copy())
    for kw in (dict(), dict(scale_mode="rceil"), dict(scale_mode="ceil"),
               dict(rounding="stochastic", seed=1)):
        q, qt = lp.encode(x, fmt, **kw), lp.encode(xt, fmt, **kw)
        assert np.array_equal(q.codes, qt.codes.numpy()), kw
        assert np.array_equal(q.scales, qt.scales.numpy()), kw
        assert C.count_value_mismatches(lp.quantize(xt, fmt, **kw).numpy(),
                                        lp.quantize(x, fmt, **kw)) == 0, kw
    if fmt == "mxint8" and dtype == np.float32:  # the case that needs the exact exponent
        assert int(np.asarray(lp.encode(x, fmt).scales).min()) == 0
        assert int(np.asarray(lp.encode(x, fmt).scales).max()) > 1


# --------------------------------------------------------------------------------------------
# NVFP4 through the device path (lp.encode / quantize / decode of CPU tensors with
# TRITON_ON_CPU: gpu/nvfp4.py, the Triton E4M3 and E2M1 codecs) against the NumPy/Numba path

NV_SR = dict(seed=SEED, sr_bits=13, offset=OFFSET)


def _nv_same(x, kw):
    """Device path == CPU path for ``x`` (numpy; ``gpu_cases.nvfp4_mismatches``)."""
    xt = (torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
          if x.dtype == ml_dtypes.bfloat16 else torch.from_numpy(x.copy()))
    assert C.nvfp4_mismatches(x, xt, kw) == 0, kw


NV_LEVELS = [("torchao", None), ("torchao", "amax"), ("torchao", 0.37), ("torchao", 3e-5),
             ("te", "amax"), ("te", 0.37), ("te", 3e-5)]
NV_DEFAULT = {("torchao", None, "nearest_even"), ("torchao", None, "stochastic"),
              ("torchao", "amax", "nearest_even"), ("torchao", 3e-5, "up"),
              ("te", "amax", "nearest_even"), ("te", "amax", "stochastic"),
              ("te", 0.37, "toward_zero"), ("torchao", 0.37, "nearest_away")}


@pytest.mark.parametrize(("recipe", "ts", "mode"), [
    pytest.param(r, t, m, marks=() if (r, t, m) in NV_DEFAULT else (pytest.mark.slow,))
    for r, t in NV_LEVELS for m in MODES])
def test_nvfp4_on_the_device_path(recipe, ts, mode, monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    kw = dict(recipe=recipe, tensor_scale=ts, rounding=mode,
              **(NV_SR if mode == "stochastic" else {}))
    for x in (C.nvfp4_rows(12, 3), C.nvfp4_ties()):
        _nv_same(x, kw)


def test_nvfp4_layouts_and_dtypes_on_the_device_path(monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    x = C.nvfp4_rows(6, 4)[:, :120].reshape(6, 4, 30)
    for kw in (dict(axis=1), dict(axis=0, block_size=4, tensor_scale="amax"),
               dict(block_size=7, recipe="te", rounding="stochastic", seed=1),
               dict(block_size=1000, rounding="down")):
        _nv_same(x, kw)
    for dt in (np.float64, np.float16, ml_dtypes.bfloat16):
        _nv_same(C.nvfp4_rows(6, 5, dt), dict(tensor_scale="amax"))
    for shape in ((0, 16), (4, 0), (3, 5)):
        _nv_same(np.ones(shape, np.float32), dict(tensor_scale="amax"))


def test_nvfp4_offset_chunks_and_device_decode(monkeypatch):
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    xt = torch.from_numpy(C.nvfp4_rows(9, 6))
    sr = dict(rounding="stochastic", seed=5, sr_bits=7, tensor_scale=0.01)
    whole = lp.quantize(xt, "nvfp4", **sr)
    n = xt.shape[1]
    parts = torch.cat([lp.quantize(xt[a:b], "nvfp4", offset=a * n, **sr)
                       for a, b in ((0, 4), (4, 5), (5, 9))])
    assert C.count_value_mismatches(parts.numpy(), whole.numpy()) == 0
    # a QuantizedArray's tensor scale as a float or a 0-dim tensor; an element code above 15
    # raises the same ValueError on both paths (tests/test_decode_invalid_codes.py: every format)
    q = lp.encode(xt, "nvfp4", tensor_scale="amax")
    want = lp.decode(q).numpy()
    for t in (q.tensor_scale, torch.tensor(q.tensor_scale)):
        got = lp.decode(lp.QuantizedArray(**{**vars(q), "tensor_scale": t}))
        assert C.count_value_mismatches(got.numpy(), want) == 0
    bad = q.codes.clone()
    bad[0, 1] = 16
    msg = "nvfp4 code 16 at flat index 1 is out of range: nvfp4 codes are 4-bit, 0..15"
    with pytest.raises(ValueError, match=msg):
        lp.decode(lp.QuantizedArray(**{**vars(q), "codes": bad}))
    with pytest.raises(ValueError, match=msg):
        lp.decode(lp.QuantizedArray(**{**vars(q), "codes": bad.numpy(),
                                       "scales": q.scales.numpy()}))


def test_nvfp4_torch_route_checks_as_the_numpy_route():
    xt = torch.zeros(4, 32)
    for kw, err in ((dict(recipe="cublas"), ValueError), (dict(tensor_scale=-1.0), ValueError),
                    (dict(tensor_scale="max"), TypeError), (dict(saturate=False), ValueError),
                    (dict(rounding="hybrid"), ValueError), (dict(rounding="stochastic"),
                                                            ValueError),
                    (dict(axis=2), ValueError)):
        for x in (xt, xt.numpy()):
            with pytest.raises(err):
                lp.encode(x, "nvfp4", **kw)
