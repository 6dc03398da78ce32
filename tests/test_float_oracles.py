"""The float codecs (hif8, e4m3, e5m2) against exact and independent oracles.

(a) every midpoint, eighth-point and value of each format's rounding grid, their float32 /
    float64 neighbours, overflow / underflow neighbourhoods, float32 subnormals, zeros, NaNs and
    random values, in every mode and saturation, against ``reference.py`` (exact Fractions);
(b) ~1M random float32 bit patterns against ml_dtypes (E4M3/E5M2 RNE) and en-dtypes (HiF8 TA),
    saturating variants as clamp-then-convert;
(c) gfloat ``round_float`` + ``encode_float`` in every rounding mode (StochasticFastest with our
    random integers) for E4M3/E5M2, saturating and not;
(d) float16 / bfloat16 inputs (all 65536 patterns, numpy and torch) equal float32 input;
(e) torch 2.13 ``.to(float8_e4m3fn)`` == our saturating E4M3, ``.to(float8_e5m2)`` == our
    non-saturating E5M2.

Codes are compared as integers, NaN results by class (any NaN code).  Each codec variant is a
separate Numba compilation (about 1 s each when the disk cache is cold), so the full
(format x mode x saturate x input path x output kind) matrix is split: :func:`in_default`
selects about 90 compiled variants for the default run (every format, mode and saturation on
the production float32 path; every path for each format's own rounding convention; a rotation
over the other paths); everything else is marked ``slow`` (``pytest -m slow``).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from itertools import pairwise

import en_dtypes
import ml_dtypes
import numpy as np
import pytest
from naive import formats as R

import lowprec as lp
from lowprec.formats.hif8 import HIF8_SPEC
from lowprec.formats.minifloat import SPECS, run_kernel
from lowprec.formats.rounding import sr_hash as lib_sr_hash

KERNEL_SPECS = {"hif8": HIF8_SPEC, **SPECS}
DEFAULT_MODE = {"hif8": "nearest_away", "e4m3": "nearest_even", "e5m2": "nearest_even"}
DET_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
SEED = 0x5EED_1234_ABCD
SR_BITS = (1, 13, 32)
CHUNK = 1 << 16  # below lowprec's PARALLEL_MIN: reuse the serial kernels (no extra compiles)

# (input path, output kind) of every codec variant: "f32" = public API with float32 input (the
# vectorized fast path for deterministic modes), "f32_generic" = run_kernel(generic=True) on the
# float32 bits, "f64" = public API with float64 input (generic 64-bit kernel).
KINDS = [("f32", "codes"), ("f32", "values"), ("f32_generic", "codes"),
         ("f32_generic", "values"), ("f64", "codes"), ("f64", "values")]


def in_default(fmt: str, mode: str, sat: bool, path: str, out: str) -> bool:
    """True if the codec variant (format, mode, saturate, path, output) is compiled and tested
    in the default (non-slow) run.  One place decides the compile budget."""
    if mode == "stochastic" and path == "f32":
        path = "f32_generic"  # float32 stochastic input runs the generic kernel
    kind = (path, out)
    if mode == DEFAULT_MODE[fmt]:
        return kind != ("f32_generic", "values")
    if mode == "stochastic":
        if kind == ("f32_generic", "codes"):
            return True
        extra = {"hif8": ("f32_generic", "values"), "e4m3": ("f64", "codes"),
                 "e5m2": ("f64", "codes")}
        return not sat and kind == extra[fmt]
    if kind == ("f32", "codes"):
        return True
    # one more kind per (format, mode, saturate), rotating so that every kind meets every
    # format and both saturation flags
    others = [k for k in KINDS if k != ("f32", "codes")]
    det = [m for m in DET_MODES if m != DEFAULT_MODE[fmt]]
    k = det.index(mode) + R.FORMATS.index(fmt) + (2 if sat else 0)
    return kind == others[k % len(others)]


def _param(fmt, mode, sat, path, out, *rest):
    marks = () if in_default(fmt, mode, sat, path, out) else (pytest.mark.slow,)
    sid = f"{fmt}-{mode}-{'sat' if sat else 'nonsat'}-{path}-{out}"
    sid = "-".join([sid] + [str(r) for r in rest])
    return pytest.param(fmt, mode, sat, path, out, *rest, marks=marks, id=sid)


# ------------------------------------------------------------------------------------------
# Running the library and comparing


def run_lib(x: np.ndarray, fmt: str, mode: str, sat: bool, path: str, out: str,
            seed: int = SEED, sr_bits: int = 32) -> np.ndarray:
    """Codes (uint8) or values (float32) from one codec variant.  ``x`` is float32 for the f32
    paths and float64 for "f64"."""
    want_value = out == "values"
    if path in ("f32", "f64"):
        f = lp.quantize if want_value else lp.encode
        return np.asarray(f(x, fmt, mode, sat, seed=seed, sr_bits=sr_bits))
    assert x.dtype == np.float32
    res = np.empty(x.shape, np.float32 if want_value else np.uint8)
    mode_id = int(lp.Rounding[mode.upper()])
    run_kernel(KERNEL_SPECS[fmt], x.reshape(-1).view(np.uint32), res.reshape(-1), mode_id, sat,
               seed, sr_bits, generic=True)
    return res


def _hex(v) -> str:
    v = np.asarray(v)
    if v.dtype == np.float32:
        return f"{float(v)!r} ({int(v.view(np.uint32)):#010x})"
    if v.dtype == np.float64:
        return f"{float(v)!r} ({int(v.view(np.uint64)):#018x})"
    return repr(v)


def assert_codes(fmt: str, x: np.ndarray, got: np.ndarray, exp: np.ndarray, what: str = ""):
    """Codes equal as integers; where the expected code is NaN any NaN code is accepted."""
    got = np.asarray(got).astype(np.int64).reshape(-1)
    exp = np.asarray(exp).astype(np.int64).reshape(-1)
    nan_tab = np.array([R.REF[fmt].is_nan_code(c) for c in range(256)])
    ok = (got == exp) | (nan_tab[exp] & nan_tab[got])
    if not ok.all():
        bad = np.flatnonzero(~ok)
        lines = [f"x={_hex(x.reshape(-1)[i])}: expected {exp[i]:#04x}, got {got[i]:#04x}"
                 for i in bad[:12]]
        raise AssertionError(
            f"{what}: {bad.size} of {ok.size} codes differ:\n" + "\n".join(lines))


def assert_values(x: np.ndarray, got: np.ndarray, exp: np.ndarray, what: str = ""):
    """float32 values equal bit for bit (so -0.0 != 0.0); NaN equals any NaN."""
    got = np.asarray(got).reshape(-1)
    exp = np.asarray(exp, dtype=np.float32).reshape(-1)
    assert got.dtype == np.float32, got.dtype
    nan_g, nan_e = np.isnan(got), np.isnan(exp)
    ok = (got.view(np.uint32) == exp.view(np.uint32)) | (nan_g & nan_e)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        lines = [f"x={_hex(x.reshape(-1)[i])}: expected {_hex(exp[i])}, got {_hex(got[i])}"
                 for i in bad[:12]]
        raise AssertionError(
            f"{what}: {bad.size} of {ok.size} values differ:\n" + "\n".join(lines))


def codes_to_values(fmt: str, codes: np.ndarray) -> np.ndarray:
    table = np.array([R.decode_ref(c, fmt) for c in range(256)], dtype=np.float32)
    return table[np.asarray(codes, dtype=np.int64)]


# ------------------------------------------------------------------------------------------
# (a) grid points and their neighbourhoods vs reference.py


def _grid_fractions(fmt: str) -> list[Fraction]:
    """Grid points, the 1/8, 3/8, 1/2 (midpoint) and 3/4 points between consecutive grid points,
    and a few points far below / above the grid."""
    g = R.REF[fmt].grid
    pts = set(g)
    for lo, hi in pairwise(g):
        for k in (1, 3, 4, 6):
            pts.add(lo + (hi - lo) * Fraction(k, 8))
    tiny, virtual = g[1], g[-1]
    pts.update([tiny / 4, tiny * Fraction(3, 16), tiny / 1024,
                virtual * 2, virtual * 3, virtual * 1024])
    return sorted(pts)


_F32_SPECIAL_BITS = [
    0x00000001, 0x00000002, 0x003FFFFF, 0x00400000, 0x007FFFFF, 0x00800000, 0x00800001,
    0x7F7FFFFF, 0x7F000000, 0x7F800000,  # float32 subnormals, min normal, max, Inf
]
_F32_NAN_BITS = [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000]
_F64_SPECIAL_BITS = [
    0x0000000000000001, 0x000FFFFFFFFFFFFF, 0x0010000000000000, 0x01A56E1FC2F8F359,
    0x7FEFFFFFFFFFFFFF, 0x7E37E43C8800759C, 0x7FF0000000000000,
]
_F64_NAN_BITS = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF]


def _with_signs(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, -a])


@functools.cache
def points(fmt: str, width: int) -> np.ndarray:
    """The (a) test points of ``fmt`` as float32 (width 32) or float64 (width 64), both signs.

    float64 points are the float32 points plus float64 neighbours of every grid point and
    midpoint, points within a float32 half-ulp of midpoints (double-rounding traps), random
    53-bit values and float64 extremes.
    """
    fr = _grid_fractions(fmt)
    g = R.REF[fmt].grid
    gm = np.array([float(p) for p in g] + [float((a + b) / 2) for a, b in pairwise(g)])
    mids = gm[len(g):]
    base = np.array([float(p) for p in fr], dtype=np.float64)
    b32 = base.astype(np.float32)
    assert np.array_equal(b32.astype(np.float64), base), "grid points must be float32-exact"
    rng = np.random.default_rng(1000 + R.FORMATS.index(fmt))
    lo_e = math.log2(float(R.REF[fmt].grid[1])) - 3
    hi_e = math.log2(float(R.REF[fmt].grid[-1])) + 2
    rand = np.exp2(rng.uniform(lo_e, hi_e, 600))
    p32 = np.concatenate([
        b32,
        np.nextafter(b32, np.float32(np.inf)),
        np.nextafter(b32, np.float32(0)),
        np.array(_F32_SPECIAL_BITS, dtype=np.uint32).view(np.float32),
        rand.astype(np.float32),
    ])
    nan32 = np.array(_F32_NAN_BITS + [b | 0x80000000 for b in _F32_NAN_BITS],
                     dtype=np.uint32).view(np.float32)
    p32 = np.concatenate([_with_signs(p32), nan32])
    if width == 32:
        return p32
    p64 = np.concatenate([
        np.abs(p32[:-nan32.size].astype(np.float64)),
        np.nextafter(gm, np.inf),
        np.nextafter(gm, 0.0),
        mids * (1 + 2.0**-26), mids * (1 - 2.0**-26), mids * (1 + 2.0**-40),
        np.array(_F64_SPECIAL_BITS, dtype=np.uint64).view(np.float64),
        rand,
        [1e-300, 1e-50, 2.0**-1074, 1e50, 1e300],
    ])
    nan64 = np.array(_F64_NAN_BITS + [b | (1 << 63) for b in _F64_NAN_BITS],
                     dtype=np.uint64).view(np.float64)
    p64 = np.unique(p64)
    p64 = np.concatenate([_with_signs(p64), nan64])
    return p64


@functools.cache
def ref_codes(fmt: str, width: int, mode: str, sat: bool, seed: int, sr_bits: int) -> np.ndarray:
    """reference.py codes for :func:`points` (the stochastic random integer of element ``i``
    recomputed from the SplitMix64 hash of ``(seed, i)``)."""
    x = points(fmt, width)
    out = np.empty(x.size, dtype=np.uint8)
    for i, v in enumerate(x):
        if mode == "stochastic":
            out[i] = R.round_ref(v, fmt, mode, sat, R.sr_random(seed, i, sr_bits), sr_bits)
        else:
            out[i] = R.round_ref(v, fmt, mode, sat)
    return out


def _points_params():
    for fmt in R.FORMATS:
        for mode in R.MODES:
            for sat in (False, True):
                for path, out in KINDS:
                    yield _param(fmt, mode, sat, path, out)


@pytest.mark.parametrize("fmt, mode, sat, path, out", list(_points_params()))
def test_points_vs_reference(fmt, mode, sat, path, out):
    x = points(fmt, 64 if path == "f64" else 32)
    for k in SR_BITS if mode == "stochastic" else (32,):
        exp = ref_codes(fmt, 64 if path == "f64" else 32, mode, sat, SEED, k)
        got = run_lib(x, fmt, mode, sat, path, out, SEED, k)
        what = f"{fmt} {mode} sat={sat} {path} {out} sr_bits={k}"
        if out == "codes":
            assert got.dtype == np.uint8
            assert_codes(fmt, x, got, exp, what)
        else:
            assert_values(x, got, codes_to_values(fmt, exp), what)


@pytest.mark.parametrize("sat, out", [(False, "codes"), (False, "values"), (True, "codes")])
def test_hif8_hybrid_points_vs_reference(sat, out):
    """Provisional hybrid rounding (formats.md 1.6) on the (a) points, float32 input."""
    x = points("hif8", 32)
    exp = np.array([R.round_ref(v, "hif8", "hybrid", sat) for v in x], dtype=np.uint8)
    got = run_lib(x, "hif8", "hybrid", sat, "f32", out)
    what = f"hif8 hybrid sat={sat} {out}"
    if out == "codes":
        assert_codes("hif8", x, got, exp, what)
    else:
        assert_values(x, got, codes_to_values("hif8", exp), what)


def test_sr_hash_matches_reference():
    """The pure-Python SplitMix64 of reference.py equals the library's jitted hash."""
    for seed in (0, 1, SEED, 2**63 + 12345, 2**64 - 1):
        for i in (0, 1, 2, 1000, 2**31, 2**40 + 7):
            assert R.sr_hash(seed, i) == int(lib_sr_hash(np.uint64(seed), np.uint64(i)))


@pytest.mark.parametrize("fmt", R.FORMATS)
def test_stochastic_seed_generator_and_determinism(fmt):
    """Same seed, same result; a Generator seed draws one 64-bit seed."""
    x = points(fmt, 32)
    a = lp.encode(x, fmt, "stochastic", seed=7)
    assert np.array_equal(a, lp.encode(x, fmt, "stochastic", seed=7))
    s = int(np.random.default_rng(3).integers(0, 2**63, dtype=np.int64))
    b = lp.encode(x, fmt, "stochastic", seed=np.random.default_rng(3))
    assert np.array_equal(b, lp.encode(x, fmt, "stochastic", seed=s))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_stochastic_parallel_kernel_indices(fmt):
    """Arrays large enough for the parallel kernel use the flat index of each element."""
    rng = np.random.default_rng(5)
    n = 1 << 18
    x = (rng.standard_normal(n) * rng.choice([1e-6, 1e-2, 1.0, 300.0], n)).astype(np.float32)
    got = lp.encode(x, fmt, "stochastic", seed=SEED, sr_bits=13)
    idx = rng.choice(n, 3000, replace=False)
    exp = [R.round_ref(x[i], fmt, "stochastic", False, R.sr_random(SEED, int(i), 13), 13)
           for i in idx]
    assert_codes(fmt, x[idx], got[idx], np.array(exp), "parallel stochastic")


# ------------------------------------------------------------------------------------------
# (b) random float32 bit patterns vs ml_dtypes / en-dtypes

PEERS = {"hif8": en_dtypes.hifloat8, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2}


@functools.cache
def random_patterns(fmt: str) -> np.ndarray:
    """2^19 uniform float32 bit patterns and 2^19 with the exponent near the format's range."""
    rng = np.random.default_rng(2000 + R.FORMATS.index(fmt))
    n = 1 << 19
    uniform = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    lo = int(math.log2(float(R.REF[fmt].grid[1]))) - 4 + 127
    hi = int(math.log2(float(R.REF[fmt].grid[-1]))) + 3 + 127
    e = rng.integers(lo, hi + 1, n, dtype=np.uint64).astype(np.uint32)
    near = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) & np.uint32(0x807FFFFF))
    near |= e << np.uint32(23)
    return np.concatenate([uniform, near]).view(np.float32)


def peer_codes(x: np.ndarray, fmt: str, sat: bool) -> np.ndarray:
    """Peer library conversion (RNE / TA, non-saturating); saturating = clamp, then convert."""
    if sat:
        m = np.float32(R.REF[fmt].max)
        x = np.clip(x, -m, m)  # NaN stays NaN
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(PEERS[fmt]).view(np.uint8)


def _chunks(n: int):
    for s in range(0, n, CHUNK):
        yield slice(s, min(n, s + CHUNK))


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_reference_vs_peer_on_points(fmt, sat):
    """reference.py itself agrees with the peer library on the (a) points (own mode)."""
    x = points(fmt, 32)
    exp = peer_codes(x, fmt, sat)
    ref = ref_codes(fmt, 32, DEFAULT_MODE[fmt], sat, SEED, 32)
    assert_codes(fmt, x, ref, exp, f"reference {fmt} sat={sat} vs peer")


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_random_patterns_vs_peer(fmt, sat):
    x = random_patterns(fmt)
    mode = DEFAULT_MODE[fmt]
    exp = peer_codes(x, fmt, sat)
    got = np.empty(x.size, np.uint8)
    val = np.empty(x.size, np.float32)
    for s in _chunks(x.size):
        got[s] = lp.encode(x[s], fmt, mode, sat)
        val[s] = lp.quantize(x[s], fmt, mode, sat)
    assert_codes(fmt, x, got, exp, f"{fmt} sat={sat} codes vs peer")
    assert_values(x, val, exp.view(PEERS[fmt]).astype(np.float32), f"{fmt} sat={sat} values")


# ------------------------------------------------------------------------------------------
# (c) gfloat round_float / encode_float, every RoundMode

gfloat = pytest.importorskip("gfloat")
from gfloat import RoundMode, encode_float, round_float  # noqa: E402
from gfloat.formats import format_info_ocp_e4m3, format_info_ocp_e5m2  # noqa: E402

GF_FORMATS = {"e4m3": format_info_ocp_e4m3, "e5m2": format_info_ocp_e5m2}
GF_MODES = {
    "nearest_even": RoundMode.TiesToEven,
    "nearest_away": RoundMode.TiesToAway,
    "toward_zero": RoundMode.TowardZero,
    "up": RoundMode.TowardPositive,
    "down": RoundMode.TowardNegative,
    "stochastic": RoundMode.StochasticFastest,
}
GF_SR_BITS = 7


@functools.cache
def gfloat_inputs(fmt: str, width: int) -> np.ndarray:
    """A few thousand random values over (and beyond) the format's range, exact ties, and
    specials; float64 with full 53-bit significands, or float32."""
    rng = np.random.default_rng(3000 + R.FORMATS.index(fmt))
    g = R.REF[fmt].grid
    lo_e = math.log2(float(g[1])) - 3
    hi_e = math.log2(float(g[-1])) + 1
    n = 3000
    mag = np.exp2(rng.integers(int(lo_e), int(hi_e) + 1, n)) * rng.uniform(1.0, 2.0, n)
    ties = np.array([float((a + b) / 2) for a, b in pairwise(g)])
    v = np.concatenate([mag, ties, [0.0, float(g[-2]), float(g[-1]), np.inf, 2.0**-60]])
    v = v * rng.choice([-1.0, 1.0], v.size)
    v = np.concatenate([v, [-0.0, -np.inf, np.nan]])
    return v if width == 64 else v.astype(np.float32)


def _gfloat_params():
    for fmt in GF_FORMATS:
        for mode in R.MODES:
            for sat in (False, True):
                for path in ("f32", "f64"):
                    yield _param(fmt, mode, sat, path, "codes")


@pytest.mark.parametrize("fmt, mode, sat, path, out", list(_gfloat_params()))
def test_vs_gfloat(fmt, mode, sat, path, out):
    fi = GF_FORMATS[fmt]
    x = gfloat_inputs(fmt, 64 if path == "f64" else 32)
    got = run_lib(x, fmt, mode, sat, path, out, SEED, GF_SR_BITS)
    exp = np.empty(x.size, np.int64)
    for i, v in enumerate(x):
        v = float(v)
        if mode == "stochastic":
            r = R.sr_random(SEED, i, GF_SR_BITS)
            rounded = round_float(fi, v, GF_MODES[mode], sat, srbits=r, srnumbits=GF_SR_BITS)
        else:
            rounded = round_float(fi, v, GF_MODES[mode], sat)
        exp[i] = encode_float(fi, rounded)
    assert_codes(fmt, x, got, exp, f"gfloat {fmt} {mode} sat={sat} {path}")


# ------------------------------------------------------------------------------------------
# (d) float16 / bfloat16 inputs equal float32 input

HALF_TYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@pytest.mark.parametrize("half", list(HALF_TYPES))
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_half_inputs_equal_float32(fmt, half):
    """All 65536 patterns, every mode and saturation, numpy and torch inputs."""
    torch = pytest.importorskip("torch")
    h = np.arange(2**16, dtype=np.uint16).view(HALF_TYPES[half])
    x32 = h.astype(np.float32)
    th = torch.from_numpy(np.arange(2**16, dtype=np.uint16).view(np.int16))
    th = th.view(torch.float16 if half == "float16" else torch.bfloat16)
    for mode in R.MODES:
        for sat in (False, True):
            kw = dict(seed=SEED, sr_bits=11) if mode == "stochastic" else {}
            ref = lp.encode(x32, fmt, mode, sat, **kw)
            what = f"{fmt} {mode} sat={sat} {half}"
            assert_codes(fmt, h, lp.encode(h, fmt, mode, sat, **kw), ref, what)
            tc = lp.encode(th, fmt, mode, sat, **kw)
            assert isinstance(tc, torch.Tensor) and tc.dtype == torch.uint8
            assert_codes(fmt, h, tc.numpy(), ref, what + " torch")
            if in_default(fmt, mode, sat, "f32", "values"):
                assert_values(h, lp.quantize(h, fmt, mode, sat, **kw),
                              lp.quantize(x32, fmt, mode, sat, **kw), what + " values")


# ------------------------------------------------------------------------------------------
# (e) torch float8 casts


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_vs_torch_float8(fmt):
    """torch 2.13 CPU: e4m3fn always saturates, e5m2 never (formats.md 2.3)."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([random_patterns(fmt)[: 1 << 18], points(fmt, 32)])
    sat = fmt == "e4m3"
    tdt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    for s in _chunks(x.size):
        t = torch.from_numpy(x[s])
        exp = t.to(tdt).view(torch.uint8).numpy()
        got = lp.encode(t, fmt, "nearest_even", sat)
        assert isinstance(got, torch.Tensor)
        assert_codes(fmt, x[s], got.numpy(), exp, f"torch {fmt}")
