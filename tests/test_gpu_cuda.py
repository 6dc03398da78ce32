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
    """``torch.cuda.set_sync_debug_mode("error")`` raises on any synchronising CUDA call.
    (Decode of sub-byte codes synchronises once, by design: test_sub_byte_decode_...)"""
    x = torch.randn(64, 96, device=DEV)
    calls = [lambda: lp.quantize(x, "hif8"), lambda: lp.encode(x, "e4m3", **SR),
             lambda: lp.decode(lp.encode(x, "e5m2"), "e5m2"),
             lambda: lp.decode(lp.encode(x, "mxfp8_e4m3", axis=0)),
             lambda: lp.quantize(x, "mxfp8_e5m2", rounding="stochastic", seed=1),
             lambda: lp.decode(lp.encode(x, "int8", granularity="per_channel", axis=1,
                                         symmetric=False)),
             lambda: lp.quantize(x, "uint8", scale=0.1),
             lambda: lp.quantize(x, "int8", granularity="per_block", block_size=5),
             lambda: lp.encode(x, "nvfp4", tensor_scale="amax", packed=True),
             lambda: lp.quantize(x, "nvfp4", recipe="te", rounding="stochastic", seed=1),
             lambda: lp.quantize(x, "mxfp4"), lambda: lp.quantize(x, "int4")]
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
        (ops.float_decode.default, (torch.randint(0, 64, (4, 40), dtype=torch.uint8,
                                                  device=DEV), "e3m2")),
        (ops.mx_decode.default, (torch.randint(0, 16, (4, 40), dtype=torch.uint8, device=DEV),
                                 torch.randint(100, 140, (4, 2), dtype=torch.uint8, device=DEV),
                                 "mxfp4", 1, 32)),
        (ops.int_decode.default, (torch.randint(-8, 8, (4, 40), dtype=torch.int8, device=DEV),
                                  torch.rand(4, 1, device=DEV) + 0.1, None, "int4", "per_token",
                                  None, None)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


# --------------------------------------------------------------------------------------------
# Sub-byte codes (tests/test_decode_invalid_codes.py on the CPU): checked on the device as on
# the CPU, one synchronisation; the kernels read nothing past their tables


SUB_BYTE = ("e2m1", "e2m3", "e3m2", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4", "int4",
            "uint4")


def _sub_byte_case(fmt: str, seed: int = 0):
    """``(decode, codes)``: codes of every valid value (a (4, 64) array) and ``decode(c,
    dev)``, which decodes a codes array on ``dev`` ("numpy", or "cuda") -- plain codes, or
    a QuantizedArray of ``fmt`` (scales of an encode) holding them."""
    from lowprec.formats import _arrays as A

    f = lp.get_format(fmt)
    lo, hi = A.code_range(f)
    rng = np.random.default_rng(seed)
    dt = np.int8 if lo < 0 else np.uint8
    codes = np.array([rng.permutation(np.resize(np.arange(lo, hi + 1), 64)) for _ in range(4)],
                     dt)
    if f.info.kind == "float":
        def dec(c, dev):
            return lp.decode(c if dev == "numpy" else torch.as_tensor(c).to(DEV), fmt)
        return dec, codes
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    kw = dict(granularity="per_channel", axis=0, symmetric=False) if f.info.kind == "int" \
        else dict(tensor_scale=0.37) if fmt == "nvfp4" else {}
    q = lp.encode(x, fmt, **kw)
    on_dev = {k: torch.from_numpy(np.asarray(v)).to(DEV) for k, v in vars(q).items()
              if k in ("scales", "zero_points") and v is not None}

    def dec(c, dev):
        if dev == "numpy":
            return lp.decode(lp.QuantizedArray(**dict(vars(q), codes=c)))
        return lp.decode(lp.QuantizedArray(**dict(vars(q), **on_dev,
                                                  codes=torch.as_tensor(c).to(DEV))))
    return dec, codes


@pytest.mark.parametrize("fmt", SUB_BYTE)
def test_sub_byte_decode_matches_the_cpu_and_raises_alike(fmt):
    from lowprec.formats import _arrays as A

    dec, codes = _sub_byte_case(fmt)
    want = dec(codes, "numpy")
    assert C.count_value_mismatches(dec(codes, DEV).cpu().numpy(), want) == 0
    lo, hi = A.code_range(lp.get_format(fmt))
    for bad in ([hi + 1, lo - 1, -128, 127] if lo < 0 else [hi + 1, 0x80, 0xFF]):
        c = codes.copy()
        c.reshape(-1)[37] = np.array(bad).astype(c.dtype)
        c.reshape(-1)[99] = np.array(hi + 1).astype(c.dtype)
        with pytest.raises(ValueError) as e_np:
            dec(c, "numpy")
        with pytest.raises(ValueError) as e_dev:
            dec(c, DEV)
        assert str(e_dev.value) == str(e_np.value)
        assert "at flat index 37 is out of range" in str(e_dev.value)


@pytest.mark.parametrize("fmt", SUB_BYTE)
def test_sub_byte_decode_synchronises_once(fmt):
    """The documented cost of the check: one read-back per decode call of valid codes."""
    import warnings

    dec, codes = _sub_byte_case(fmt)
    c = torch.from_numpy(codes).to(DEV)
    dec(c, DEV)  # compiled, tables uploaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            dec(c, DEV)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [x for x in w if "synchroniz" in str(x.message)]
    assert len(syncs) == 1, [str(x.message) for x in syncs]


@pytest.mark.parametrize("fmt", ["e2m1", "mxfp4", "nvfp4", "int4"])
def test_sub_byte_decode_in_a_cuda_graph_gives_nan(fmt):
    """Nothing can be read back while a CUDA graph is captured: the check is skipped there
    (documented) and the kernels give NaN for an invalid code, without reading past a table."""
    dec, codes = _sub_byte_case(fmt)
    good = np.asarray(dec(codes, "numpy")).reshape(-1)
    ct = torch.from_numpy(codes).to(DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture (compile, tables), valid codes
        dec(ct, DEV)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ct.view(-1)[37] = -128 if fmt == "int4" else 0xFF
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dec(ct, DEV)
    g.replay()
    torch.cuda.synchronize()
    got = out.cpu().numpy().reshape(-1)
    assert np.isnan(got[37])
    keep = np.arange(got.size) != 37
    assert C.count_value_mismatches(got[keep], good[keep]) == 0
    with pytest.raises(ValueError, match="at flat index 37 is out of range"):
        dec(ct, DEV)  # eager again: checked


def test_sub_byte_decode_under_torch_compile_raises_alike():
    c = torch.randint(0, 16, (4, 64), dtype=torch.uint8, device=DEV)

    def f(c):
        return lp.decode(c, "e2m1") * 2

    g = torch.compile(f, fullgraph=True)
    assert torch.equal(g(c), f(c))
    bad = c.clone()
    bad[0, 5] = 0x20
    with pytest.raises(ValueError) as e_eager:
        f(bad)
    with pytest.raises(ValueError) as e_comp:
        g(bad)
    assert str(e_comp.value) == str(e_eager.value)


def test_decode_kernels_read_only_their_tables():
    """Every uint8 code through the kernels themselves (no check): NaN beyond the table."""
    from lowprec.formats import integer
    from lowprec.formats import mx as cmx
    from lowprec.gpu import integer as gint
    from lowprec.gpu import minifloat as gmf
    from lowprec.gpu import mx as gmx

    allc = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEV)
    for fmt in ("e2m1", "e2m3", "e3m2"):
        vals = lp.get_format(fmt).values()
        out = torch.empty(256, device=DEV)
        gmf.lookup(allc, vals, out)
        o = out.cpu().numpy()
        n = len(vals)
        assert C.count_value_mismatches(o[:n], vals) == 0
        assert np.isnan(o[n:]).all(), fmt
    for fmt in ("mxfp4", "mxfp6_e3m2"):
        vals = cmx._ELEM[fmt][2]
        out = torch.empty(1, 256, device=DEV)
        gmx.decode_blocks(allc.reshape(1, 256), torch.full((1, 8), 127, dtype=torch.uint8,
                                                           device=DEV), fmt, 32, out)
        o = out.cpu().numpy().reshape(-1)
        assert C.count_value_mismatches(o[:len(vals)], vals) == 0
        assert np.isnan(o[len(vals):]).all(), fmt
    lay = integer._Layout((256,), "per_tensor", None, None)
    for fmt in ("int4", "uint4"):
        lo, _nlo, hi, dt = integer.RANGES[fmt]
        codes = allc.view(torch.int8) if dt == np.int8 else allc
        out = torch.empty(256, device=DEV)
        gint.run_decode(codes, torch.tensor([0.5], device=DEV), None, lay, out, lo, hi)
        cv = codes.cpu().numpy().astype(np.int64)
        ok = (cv >= lo) & (cv <= hi)
        o = out.cpu().numpy()
        assert C.count_value_mismatches(o[ok], (cv[ok] * 0.5).astype(np.float32)) == 0
        assert np.isnan(o[~ok]).all(), fmt


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
