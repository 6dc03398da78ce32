"""Codecs on CUDA tensors (issue 14): computed on the tensor's device by the Triton kernels,
bit-identical to the CPU (Numba) path, without host synchronisation, as custom operators that
``torch.compile(fullgraph=True)`` and ``torch.library.opcheck`` accept.  Marked ``gpu``: skipped
without a CUDA device.  The full sweeps (all 2**32 float32 patterns...) are
``scripts/gpu_exhaustive.py``; these are the quick checks of every entry point and option.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowprec as lp

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import gpu_cases as C  # noqa: E402

from lowprec.formats import mx as _mx  # noqa: E402  (lp.formats.mx exists only once imported)

DEV = "cuda"
SR = dict(rounding="stochastic", seed=0xFEDCBA9876543210, sr_bits=13, offset=2**63 + 7)


def _np(t):
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return t.cpu().numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", C.FLOAT_FORMATS)
def test_float_formats_match_the_cpu(fmt, dtype):
    bits = np.concatenate([C.edge_bits32(fmt), C.random_bits32(1 << 16, 5, fmt)])
    x = torch.from_numpy(bits.view(np.float32)).to(getattr(torch, dtype))
    xg = x.to(DEV)
    xc = _np(x)
    modes = C.modes(fmt) if dtype == "float32" else ("nearest_even", "nearest_away",
                                                         "toward_zero", "stochastic")
    for mode in modes:
        for sat in (False, True):
            kw = SR if mode == "stochastic" else dict(rounding=mode)
            gc = lp.encode(xg, fmt, saturate=sat, **kw)
            gv = lp.quantize(xg, fmt, saturate=sat, **kw)
            assert gc.device.type == "cuda" and gv.device.type == "cuda"
            assert gc.dtype == torch.uint8 and gv.dtype == torch.float32
            wc = lp.encode(xc, fmt, saturate=sat, **kw)
            assert C.count_code_mismatches(gc.cpu().numpy(), wc) == 0, (mode, sat)
            assert C.count_value_mismatches(gv.cpu().numpy(),
                                            lp.quantize(xc, fmt, saturate=sat, **kw)) == 0
            assert C.count_value_mismatches(lp.decode(gc, fmt).cpu().numpy(),
                                            lp.decode(wc, fmt)) == 0


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_mx_matches_the_cpu(fmt):
    x = C.mx_blocks(64, 300, 3)
    xg = torch.from_numpy(x).to(DEV)
    for smode in _mx.SCALE_MODES:
        for mode in C.DET_MODES + ("stochastic",):
            for nonfinite in ("nan", "saturate"):
                for axis, k in ((-1, 32), (0, 7), (1, 1000)):
                    kw = dict(axis=axis, block_size=k, scale_mode=smode, rounding=mode,
                              nonfinite=nonfinite, seed=5, sr_bits=9)
                    q = lp.encode(xg, fmt, **kw)
                    w = lp.encode(x, fmt, **kw)
                    assert C.count_code_mismatches(q.codes.cpu().numpy(), w.codes) == 0, kw
                    assert C.count_code_mismatches(q.scales.cpu().numpy(), w.scales) == 0, kw
                    v = lp.decode(w)
                    assert C.count_value_mismatches(lp.decode(q).cpu().numpy(), v) == 0, kw
                    assert C.count_value_mismatches(
                        lp.quantize(xg, fmt, **kw).cpu().numpy(), v) == 0, kw


@pytest.mark.parametrize("fmt", ["int8", "uint8"])
def test_int_matches_the_cpu(fmt):
    x = C.int_inputs((8, 16, 40), 9)
    xg = torch.from_numpy(x).to(DEV)
    grans = [("per_tensor", {}), ("per_channel", {"axis": 1}), ("per_token", {}),
             ("per_block", {"axis": -1, "block_size": 6}), ("per_block", {"axis": 0,
                                                                         "block_size": 3})]
    for g, gkw in grans:
        for sym in (True, False):
            for mode in C.DET_MODES + ("stochastic",):
                kw = dict(granularity=g, symmetric=sym, rounding=mode, seed=2, **gkw)
                want = lp.quantize(x, fmt, **kw)
                assert C.count_value_mismatches(lp.quantize(xg, fmt, **kw).cpu().numpy(),
                                                want) == 0, kw
                q, w = lp.encode(xg, fmt, **kw), lp.encode(x, fmt, **kw)
                assert C.count_code_mismatches(q.codes.cpu().numpy(), w.codes) == 0, kw
                assert C.count_value_mismatches(q.scales.cpu().numpy(), w.scales) == 0, kw
                assert C.count_value_mismatches(lp.decode(q).cpu().numpy(),
                                                lp.decode(w)) == 0, kw
    s = np.full((8, 1, 1), 0.05, np.float32)
    for scale in (s, torch.from_numpy(s), torch.from_numpy(s).to(DEV), 0.05):
        got = lp.quantize(xg, fmt, granularity="per_channel", axis=0, scale=scale)
        want = lp.quantize(x, fmt, granularity="per_channel", axis=0, scale=s)
        assert C.count_value_mismatches(got.cpu().numpy(), want) == 0


@pytest.mark.parametrize(("recipe", "ts"), [("torchao", None), ("torchao", "amax"),
                                            ("torchao", 0.37), ("torchao", 3e-5),
                                            ("te", "amax"), ("te", 0.37)])
def test_nvfp4_matches_the_cpu(recipe, ts):
    for x in (C.nvfp4_rows(256, 3), C.nvfp4_ties()):
        xg = torch.from_numpy(x).to(DEV)
        for mode in C.DET_MODES + ("stochastic",):
            kw = dict(recipe=recipe, tensor_scale=ts, rounding=mode)
            if mode == "stochastic":
                kw.update(seed=SR["seed"], sr_bits=SR["sr_bits"], offset=SR["offset"])
            assert C.nvfp4_mismatches(x, xg, kw) == 0, kw


def test_nvfp4_layouts_and_dtypes_match_the_cpu():
    x = C.nvfp4_rows(64, 4)[:, :120].reshape(64, 4, 30)
    xg = torch.from_numpy(x).to(DEV)
    for kw in (dict(axis=1), dict(axis=0, block_size=4, tensor_scale="amax"),
               dict(block_size=7, recipe="te", rounding="stochastic", seed=1),
               dict(block_size=1000, rounding="down")):
        assert C.nvfp4_mismatches(x, xg, kw) == 0, kw
    x = C.nvfp4_rows(64, 5)
    for dtype in ("float64", "float16", "bfloat16"):
        t = torch.from_numpy(x).to(getattr(torch, dtype))
        assert C.nvfp4_mismatches(_np(t), t.to(DEV), dict(tensor_scale="amax")) == 0, dtype


def test_out_and_overlap_on_the_device():
    x = torch.from_numpy(C.mx_blocks(1, 4097, 8).reshape(-1)).to(DEV)
    for fmt in C.FLOAT_FORMATS:
        want = lp.quantize(x.cpu().numpy(), fmt)
        o = torch.empty_like(x)
        assert lp.quantize(x, fmt, out=o) is o
        assert C.count_value_mismatches(o.cpu().numpy(), want) == 0
        buf = x.clone()
        lp.quantize(buf[:-1], fmt, out=buf[1:])  # overlapping: through a temporary
        assert C.count_value_mismatches(buf[1:].cpu().numpy(), want[:-1]) == 0
        c = torch.empty(x.shape, dtype=torch.uint8, device=DEV)
        lp.encode(x, fmt, out=c)
        d = torch.empty_like(x)
        lp.decode(c, fmt, out=d)
        assert C.count_value_mismatches(d.cpu().numpy(), want) == 0
    with pytest.raises(ValueError, match="device"):
        lp.quantize(x, "e4m3", out=torch.empty(x.shape))


def test_offset_chunks_equal_whole_on_the_device():
    x = torch.from_numpy(C.mx_blocks(1, 10000, 9).reshape(-1)).to(DEV)
    sr = dict(rounding="stochastic", seed=3, sr_bits=10)
    for fmt in C.FLOAT_FORMATS:
        whole = lp.quantize(x, fmt, **sr)
        parts = torch.cat([lp.quantize(x[a:b], fmt, offset=a, **sr)
                           for a, b in ((0, 4096), (4096, 4097), (4097, 10000))])
        assert torch.equal(torch.nan_to_num(parts), torch.nan_to_num(whole))
        assert C.count_value_mismatches(whole.cpu().numpy(),
                                        lp.quantize(x.cpu().numpy(), fmt, **sr)) == 0


def test_no_host_synchronisation():
    """``torch.cuda.set_sync_debug_mode("error")`` raises on any synchronising CUDA call."""
    x = torch.randn(64, 96, device=DEV)
    calls = [lambda: lp.quantize(x, "hif8"), lambda: lp.encode(x, "e4m3", **SR),
             lambda: lp.decode(lp.encode(x, "e5m2"), "e5m2"),
             lambda: lp.decode(lp.encode(x, "mxfp8_e4m3", axis=0)),
             lambda: lp.quantize(x, "mxfp8_e5m2", rounding="stochastic", seed=1),
             lambda: lp.decode(lp.encode(x, "int8", granularity="per_channel", axis=1,
                                         symmetric=False)),
             lambda: lp.quantize(x, "uint8", scale=0.1),
             lambda: lp.quantize(x, "int8", granularity="per_block", block_size=5),
             lambda: lp.decode(lp.encode(x, "nvfp4", tensor_scale="amax", packed=True)),
             lambda: lp.quantize(x, "nvfp4", recipe="te", rounding="stochastic", seed=1)]
    for call in calls:
        call()  # first call: kernels compiled, tables uploaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_torch_compile_fullgraph_on_cuda():
    def f(x):
        a = lp.quantize(x * 2, "hif8")
        b = lp.quantize(x, "e4m3", "stochastic", seed=7, sr_bits=8)
        c = lp.quantize(x, "mxfp8_e4m3")
        d = lp.quantize(x, "int8", granularity="per_token")
        e = lp.quantize(x, "nvfp4", tensor_scale="amax")
        return a + b + c + d + e

    x = torch.randn(16, 64, device=DEV)
    g = torch.compile(f, fullgraph=True)
    assert torch.equal(g(x), f(x))


def test_opcheck_on_cuda():
    x = torch.randn(4, 40, device=DEV)
    ops = torch.ops.lowprec
    cases = [
        (ops.float_codec.default, (x, "hif8", 5, True, -5, 7, 3, False)),
        (ops.float_codec.default, (x, "e4m3", 0, False, 0, 32, 0, True)),
        (ops.float_codec_out.default, (x, torch.empty_like(x), "e5m2", 1, False, 0, 32, 0)),
        (ops.float_decode.default, (torch.arange(120, dtype=torch.uint8, device=DEV), "e4m3")),
        (ops.mx_encode.default, (x, "mxfp8_e4m3", 1, 32, 0, False, 0, 0, 32, 0)),
        (ops.mx_quantize.default, (x, "mxfp8_e5m2", 0, 3, 1, True, 5, 9, 8, 0)),
        (ops.int_encode.default, (x, "int8", "per_channel", 1, None, False, None, None, None,
                                  0, 0, 32, 0)),
        (ops.int_quantize.default, (x, "uint8", "per_block", 1, 7, True, None, None, None, 5, 3,
                                    9, 0)),
        (ops.nvfp4_encode.default, (x, 1, 16, "torchao", "amax", 0.0, 0, 0, 32, 0)),
        (ops.nvfp4_quantize.default, (x, 0, 3, "te", "value", 0.25, 5, 9, 8, 0)),
        (ops.nvfp4_decode.default, (torch.randint(0, 16, (4, 40), dtype=torch.uint8, device=DEV),
                                    torch.randint(0, 127, (4, 3), dtype=torch.uint8, device=DEV),
                                    torch.tensor(0.5, device=DEV), 1, 16)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.multigpu
def test_each_tensor_on_its_own_device():
    x = torch.randn(1000)
    for i in range(2):
        y = lp.quantize(x.to(f"cuda:{i}"), "hif8", "stochastic", seed=1)
        assert y.device == torch.device(f"cuda:{i}")
        assert C.count_value_mismatches(y.cpu().numpy(),
                                        lp.quantize(x.numpy(), "hif8", "stochastic",
                                                    seed=1)) == 0
        y = lp.quantize(x.to(f"cuda:{i}"), "nvfp4", tensor_scale="amax")
        assert y.device == torch.device(f"cuda:{i}")
        assert C.count_value_mismatches(y.cpu().numpy(),
                                        lp.quantize(x.numpy(), "nvfp4", tensor_scale="amax")) == 0
