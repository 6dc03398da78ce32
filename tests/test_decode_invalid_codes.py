"""Decode of formats whose codes are narrower than the integers holding them (e2m1, e2m3, e3m2,
MXFP4, MXFP6, NVFP4, int4, uint4, user formats of 5 and 12 bits).

An invalid code raises the same ValueError, with the same message, on every path: NumPy, CPU
tensors (the custom ops' Numba implementation), and the device path (the CUDA implementation:
Triton kernels, here in the interpreter on CPU tensors through ``ops.TRITON_ON_CPU``); plain and
packed codes; eager and under ``torch.compile(fullgraph=True)``.  Every valid code decodes to the
same bits on each path.  The decode kernels called without the check (what a CUDA graph capture
does) read nothing past their tables: an invalid code gives NaN.  The CUDA twins are in
``tests/test_gpu_cuda.py``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import lowprec as lp
from lowprec.formats import _arrays as A

torch = pytest.importorskip("torch")

from lowprec.gpu import ops  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
PATHS = ("numpy", "cpu", pytest.param("device", marks=pytest.mark.skipif(
    not INTERPRETING, reason="the device path runs in Triton's interpreter (no GPU)")))
FLOATS = ("e2m1", "e2m3", "e3m2")
SCALED = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4", "int4", "uint4")
FOUR_BIT = ("e2m1", "mxfp4", "nvfp4", "int4", "uint4")
SHAPE = (4, 64)  # every code of a 6-bit format in each row
POS = 37  # flat index of the first invalid code


@pytest.fixture(autouse=True)
def _quiet():
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.fixture
def device_path(monkeypatch):
    """``set(path)``: route torch tensors to the Numba ("cpu") or Triton ("device") ops."""
    def set_path(path):
        monkeypatch.setattr(ops, "TRITON_ON_CPU", path == "device")
    return set_path


def _signed(fmt: str) -> bool:
    return fmt == "int4"


def _valid_codes(fmt: str, seed: int = 0) -> np.ndarray:
    """Codes of ``SHAPE`` holding every code of the format, in a random order per row."""
    lo, hi = A.code_range(lp.get_format(fmt))
    rng = np.random.default_rng(seed)
    n = hi - lo + 1
    rows = [rng.permutation(np.resize(np.arange(lo, hi + 1), SHAPE[1])) for _ in range(SHAPE[0])]
    assert n <= SHAPE[1]
    return np.array(rows, np.int8 if _signed(fmt) else np.uint8)


def _invalid(fmt: str) -> list[int]:
    lo, hi = A.code_range(lp.get_format(fmt))
    return [hi + 1, lo - 1, -128, 127] if lo < 0 else [hi + 1, 0x80, 0xFF]


def _template(fmt: str):
    """A QuantizedArray of ``fmt`` (numpy fields) whose codes the tests replace."""
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    kw = dict(granularity="per_channel", axis=0, symmetric=False) if fmt in ("int4", "uint4") \
        else dict(tensor_scale=0.37) if fmt == "nvfp4" else {}
    return lp.encode(x, fmt, **kw)


def _as(path: str, a):
    return a if path == "numpy" else torch.from_numpy(np.ascontiguousarray(a))


def _decode(path: str, fmt: str, codes: np.ndarray, q=None, packed: bool = False):
    """lp.decode of ``codes`` on ``path``: plain codes of a float format, or the codes of the
    QuantizedArray ``q`` (``_template``) replaced."""
    if q is None:
        return lp.decode(_as(path, codes), fmt, packed=packed)
    fields = dict(vars(q), codes=_as(path, codes), scales=_as(path, np.asarray(q.scales)))
    if q.zero_points is not None:
        fields["zero_points"] = _as(path, np.asarray(q.zero_points))
    if packed:
        fields["packed"] = True
    return lp.decode(lp.QuantizedArray(**fields))


def _host(v) -> np.ndarray:
    return v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)


def _error(fn) -> tuple[type, str]:
    with pytest.raises(Exception) as e:
        fn()
    return e.type, str(e.value)


def _cases():
    return [(f, None) for f in FLOATS] + [(f, "q") for f in SCALED]


@pytest.mark.parametrize(("fmt", "kind"), _cases(), ids=[c[0] for c in _cases()])
def test_invalid_code_raises_the_same_error_on_every_path(fmt, kind, device_path):
    q = _template(fmt) if kind else None
    base = _valid_codes(fmt)
    lo, hi = A.code_range(lp.get_format(fmt))
    for bad in _invalid(fmt):
        codes = base.copy()
        codes.reshape(-1)[POS] = np.array(bad).astype(codes.dtype)
        codes.reshape(-1)[POS + 5] = np.array(hi + 1).astype(codes.dtype)  # not the first
        v = int(np.array(bad).astype(codes.dtype))
        want = (f"{fmt} code {v} at flat index {POS} is out of range: {fmt} codes are "
                f"{lp.get_format(fmt).info.bits}-bit, {lo}..{hi}")
        errors = set()
        for path in ("numpy", "cpu") + (("device",) if INTERPRETING else ()):
            device_path(path)
            t, msg = _error(lambda p=path, c=codes: _decode(p, fmt, c, q))
            assert t is ValueError and msg.startswith(want), (path, msg)
            errors.add((t, msg))
        assert len(errors) == 1, errors
        if fmt in FOUR_BIT:
            assert "packed=True" in msg  # the likely cause: packed bytes given as codes


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("fmt", "kind"), _cases(), ids=[c[0] for c in _cases()])
def test_every_valid_code_decodes_to_the_same_bits(fmt, kind, path, device_path):
    q = _template(fmt) if kind else None
    codes = _valid_codes(fmt, 2)
    want = _host(_decode("numpy", fmt, codes, q))
    if kind is None:  # the table itself, code by code
        assert np.array_equal(want.view(np.uint32),
                              lp.get_format(fmt).values()[codes].view(np.uint32))
    device_path(path)
    got = _host(_decode(path, fmt, codes, q))
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FOUR_BIT)
def test_packed_codes_are_always_valid_and_decode_alike(fmt, path, device_path):
    """Every byte is two valid 4-bit codes: packed decode equals the unpacked one, bit for bit,
    on every path."""
    q = None if fmt == "e2m1" else _template(fmt)
    packed = np.resize(np.arange(256, dtype=np.uint8), (SHAPE[0], SHAPE[1] // 2))
    unpacked = A.unpack_codes(packed, _signed(fmt))
    want = _host(_decode("numpy", fmt, unpacked, q))
    device_path(path)
    got = _host(_decode(path, fmt, packed, q, packed=True))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("path", PATHS)
def test_packed_needs_a_four_bit_format_on_every_path(path, device_path):
    device_path(path)
    c = np.zeros(SHAPE, np.uint8)
    with pytest.raises(ValueError, match="packs 4-bit codes two per byte; this format has 6-bit"):
        _decode(path, "e2m3", c, packed=True)
    with pytest.raises(ValueError, match="packs 4-bit codes two per byte; this format has 6-bit"):
        _decode(path, "mxfp6_e2m3", c, _template("mxfp6_e2m3"), packed=True)
    if path != "numpy":
        with pytest.raises(TypeError, match="packed codes must have dtype uint8, got int8"):
            _decode(path, "e2m1", c.view(np.int8), packed=True)


@pytest.mark.parametrize("path", PATHS)
def test_user_formats_narrower_than_their_storage(path, device_path):
    """A 5-bit user format (uint8 codes, 32 values) and a 12-bit one (uint16, 4096)."""
    for name, e, m in (("t17c_u5", 2, 2), ("t17c_u12", 5, 6)):
        f = lp.float_format(e, m, name=name)
        n = len(f.values())
        dt = np.uint16 if f.info.bits > 8 else np.uint8
        codes = np.arange(n, dtype=dt)
        want = f.values()
        device_path(path)
        got = _host(lp.decode(_as(path, codes), name))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        bad = codes.copy()
        bad[3] = n
        bad[4] = np.iinfo(dt).max
        with pytest.raises(ValueError, match=f"{name} code {n} at flat index 3 is out of "
                                             f"range: {name} codes are {f.info.bits}-bit, "
                                             f"0..{n - 1}$"):
            lp.decode(_as(path, bad), name)


def test_empty_codes_and_out(device_path):
    for path in ("numpy", "cpu") + (("device",) if INTERPRETING else ()):
        device_path(path)
        assert _host(lp.decode(_as(path, np.zeros((0, 4), np.uint8)), "e2m1")).shape == (0, 4)
        out = _as(path, np.full(3, 7.0, np.float32))
        with pytest.raises(ValueError, match="e2m1 code 16 at flat index 1"):
            lp.decode(_as(path, np.array([1, 16, 2], np.uint8)), "e2m1", out=out)
        assert np.array_equal(_host(out), np.full(3, 7.0, np.float32))  # nothing written


# --------------------------------------------------------------------------------------------
# torch.compile: the check runs inside the custom op, so the compiled call raises the same
# error as eager mode (the fake implementation checks nothing)


@pytest.mark.parametrize("path", PATHS)
def test_compiled_decode_raises_the_same_error(path, device_path):
    device_path(path)
    torch._dynamo.reset()

    def plain(c):
        return lp.decode(c, "e2m1")

    def scaled(c, s):
        return lp.decode(lp.QuantizedArray(codes=c, scales=s, format="mxfp4", axis=-1,
                                           block_size=32))

    c = torch.from_numpy(_valid_codes("e2m1"))
    s = torch.full((SHAPE[0], SHAPE[1] // 32), 127, dtype=torch.uint8)
    bad = c.clone()
    bad.view(-1)[POS] = 0x20
    for f, args, bargs in ((plain, (c,), (bad,)), (scaled, (c, s), (bad, s))):
        g = torch.compile(f, fullgraph=True)
        assert torch.equal(g(*args), f(*args))
        want = _error(lambda f=f, bargs=bargs: f(*bargs))
        assert want[0] is ValueError
        assert _error(lambda g=g, bargs=bargs: g(*bargs)) == want


# --------------------------------------------------------------------------------------------
# The kernels without the check: every uint8 code reads inside the table (NaN beyond it)


def _nan_beyond(got: np.ndarray, values: np.ndarray, codes: np.ndarray) -> bool:
    n = len(values)
    ok = codes < n
    want = np.where(ok, values[np.minimum(codes, n - 1)], np.float32(np.nan))
    return bool(np.array_equal(got.view(np.uint32)[ok], want.view(np.uint32)[ok])
                and np.isnan(got[~ok]).all())


ALL8 = np.arange(256, dtype=np.uint8)


@pytest.mark.parametrize("fmt", FLOATS)
def test_numba_lookup_is_memory_safe(fmt):
    vals = lp.get_format(fmt).values()
    out = np.empty(256, np.float32)
    A.lookup(ALL8, vals, out)
    assert _nan_beyond(out, vals, ALL8)
    assert len(A.full_table(vals)) == 256 and A.full_table(vals) is A.full_table(vals)


def test_numba_mx_decode_kernel_is_memory_safe():
    from lowprec.formats import mx

    vals = mx._ELEM["mxfp4"][2]
    out = np.empty((1, 256), np.float32)
    mx._decode_blocks(ALL8.reshape(1, 256), np.full((1, 8), 127, np.uint8), 32,
                      A.full_table(vals), out)
    assert _nan_beyond(out.reshape(-1), vals, ALL8)


needs_interpreter = pytest.mark.skipif(not INTERPRETING, reason="kernels in the interpreter")


@needs_interpreter
@pytest.mark.parametrize("fmt", FLOATS + ("e4m3",))
def test_lookup_kernel_masks_its_table(fmt):
    from lowprec.gpu import minifloat

    vals = lp.get_format(fmt).values()
    out = torch.empty(256)
    minifloat.lookup(torch.from_numpy(ALL8), vals, out)
    assert _nan_beyond(out.numpy(), vals, ALL8)


@needs_interpreter
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"])
def test_mx_decode_kernel_masks_its_table(fmt):
    from lowprec.formats import mx as cmx
    from lowprec.gpu import mx

    vals = cmx._ELEM[fmt][2]
    out = torch.empty(1, 256)
    mx.decode_blocks(torch.from_numpy(ALL8).reshape(1, 256),
                     torch.full((1, 8), 127, dtype=torch.uint8), fmt, 32, out)
    assert _nan_beyond(out.numpy().reshape(-1), vals, ALL8)


@needs_interpreter
def test_nvfp4_decode_rows_masks_its_table():
    from lowprec.gpu import nvfp4

    vals = lp.get_format("e2m1").values()
    got = nvfp4.decode_rows(torch.from_numpy(ALL8).reshape(16, 16),
                            torch.full((16, 1), 0x38, dtype=torch.uint8), torch.tensor(1.0), 16)
    assert _nan_beyond(got.numpy().reshape(-1), vals, ALL8)  # scale 1 * tensor scale 1


@needs_interpreter
@pytest.mark.parametrize("fmt", ["int4", "uint4", "int8"])
def test_int_decode_kernel_gives_nan_for_an_unchecked_code(fmt):
    from lowprec.formats import integer
    from lowprec.gpu import integer as gint

    lo, _nlo, hi, dt = integer.RANGES[fmt]
    codes = torch.from_numpy(ALL8.view(np.int8) if dt == np.int8 else ALL8)
    lay = integer._Layout((256,), "per_tensor", None, None)
    out = torch.empty(256)
    gint.run_decode(codes, torch.tensor([0.5]), None, lay, out, lo, hi)
    c = codes.numpy().astype(np.int64)
    ok = (c >= lo) & (c <= hi)
    assert np.array_equal(out.numpy()[ok], (c[ok] * 0.5).astype(np.float32))
    assert np.isnan(out.numpy()[~ok]).all() and ok.sum() == hi - lo + 1
