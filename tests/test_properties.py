"""Property tests of the 8-bit float codecs (hif8, e4m3, e5m2) under every rounding mode.

Each hypothesis example is a numpy array of about a thousand values (log-uniform over and beyond
the format's range, the format's own values, the midpoints between neighbours, and each of these
nudged by one float32 / float64 ulp), so the Numba kernels, not hypothesis, do the work.

Properties (formats.md 1.2-1.4, 2.1-2.2; design.md "Formats"):
- results are members of the format's value set, or +-Inf / NaN exactly as the overflow rules say;
- nearest modes: the result is one of the two neighbours of x, within half their spacing, and an
  exact tie goes to the even code (nearest_even) or away from zero (nearest_away);
- directed modes: down(x) <= x <= up(x) with no format value strictly in between, toward_zero
  never grows the magnitude, up(x) == -down(-x); overflow follows IEEE 754 7.4;
- deterministic modes are monotone and sign-symmetric; every mode is idempotent and keeps the sign;
- decode(encode(x)) == quantize(x) bit for bit (NaN by class), every mode, float32 and float64;
- float32 input and the same values as float64 give the same result (fast path = generic kernel);
- saturate=True never produces Inf or NaN for non-NaN input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lowprec as lp

FORMATS = ["hif8", "e4m3", "e5m2"]
DETERMINISTIC = ["nearest_even", "nearest_away", "toward_zero", "up", "down"]
NEAREST = ["nearest_even", "nearest_away"]
MODES = DETERMINISTIC + ["stochastic"]
DTYPES = [np.float32, np.float64]

# The value a nearest-mode overflow is decided against: the midpoint between max and the next
# value the exponent/mantissa grid would have (formats.md 2.2 thresholds; HiF8 1.4 step 4), and
# whether nearest_even sends that exact tie to overflow (the even code is the missing one).
OVF_MID = {"e4m3": 464.0, "e5m2": 61440.0, "hif8": 40960.0}
RNE_TIE_OVERFLOWS = {"e4m3": False, "e5m2": True, "hif8": False}
# The missing next grid value above max (480 = the e4m3 NaN pattern, 65536 = the e5m2 Inf
# pattern, 49152 = the HiF8 Inf pattern): stochastic/hybrid results between max and it are
# max or overflow, beyond it always overflow.
VIRTUAL_NEXT = {"e4m3": 480.0, "e5m2": 65536.0, "hif8": 49152.0}

PROPS = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------------
# helpers


def grid(fmt: str) -> np.ndarray:
    """Sorted distinct finite values of ``fmt`` as float64 (-0 merged into 0)."""
    v = lp.get_format(fmt).values().astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def value_bits(fmt: str) -> np.ndarray:
    """float32 bit patterns of every non-NaN value of ``fmt`` (incl. -0 and +-Inf if present)."""
    v = lp.get_format(fmt).values()
    return np.unique(v[~np.isnan(v)].view(np.uint32))


def neighbours(fmt: str, x: np.ndarray):
    """``lo`` = largest finite format value <= x (-inf if none), ``hi`` = smallest >= x (+inf)."""
    g = grid(fmt)
    i = np.searchsorted(g, x, side="right") - 1
    j = np.searchsorted(g, x, side="left")
    lo = np.where(i >= 0, g[np.clip(i, 0, len(g) - 1)], -np.inf)
    hi = np.where(j < len(g), g[np.clip(j, 0, len(g) - 1)], np.inf)
    return lo, hi


def overflow_value(fmt: str, negative: np.ndarray, saturate: bool) -> np.ndarray:
    """What an overflow becomes: +-max (saturate), +-Inf (e5m2, hif8) or NaN (e4m3)."""
    info = lp.get_format(fmt).info
    if saturate:
        mag = info.max
    elif info.has_inf:
        mag = math.inf
    else:
        return np.full(negative.shape, np.nan)
    return np.where(negative, -mag, mag)


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical float32 bit patterns, or both NaN."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def same_value(a, b) -> np.ndarray:
    """Elementwise: equal values (so -0 == +0), or both NaN."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a == b) | (np.isnan(a) & np.isnan(b))


def check(ok: np.ndarray, what: str, x: np.ndarray, *results: np.ndarray) -> None:
    """Assert ``ok`` everywhere; otherwise show the first offending inputs (hex) and results."""
    ok = np.asarray(ok, bool)
    if ok.all():
        return
    bad = np.flatnonzero(~ok)
    lines = []
    for k in bad[:8]:
        xv = float(x.reshape(-1)[k])
        rs = ", ".join(repr(float(np.asarray(r).reshape(-1)[k])) for r in results)
        lines.append(f"  x = {xv!r} ({xv.hex()}) -> {rs}")
    head = f"{what}: {bad.size} of {ok.size} elements fail, e.g.\n"
    raise AssertionError(head + "\n".join(lines))


def no_neg_zero_in(fmt: str, v: np.ndarray) -> np.ndarray:
    """Map -0.0 to +0.0 where the format has no -0 (HiF8), for comparing with negated results."""
    if lp.get_format(fmt).info.has_neg_zero:
        return v
    return np.where(v == 0, np.float32(0), v).astype(np.float32)


@st.composite
def float_inputs(draw, fmt: str, dtype, specials: bool = False) -> np.ndarray:
    """About a thousand finite values of ``dtype`` around and beyond the range of ``fmt``.

    With ``specials``, +-0, +-Inf and NaN (both signs) are included too.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**63 - 1)))
    info = lp.get_format(fmt).info
    lo_e = math.log2(info.min_subnormal) - 4
    hi_e = math.log2(VIRTUAL_NEXT[fmt]) + 3
    n = 400
    bulk = np.exp2(rng.uniform(lo_e, hi_e, n)) * rng.choice([-1.0, 1.0], n)
    g = grid(fmt)
    g = g[g >= 0]
    pts = np.concatenate([g, [VIRTUAL_NEXT[fmt]]])
    mids = (pts[:-1] + pts[1:]) / 2  # ties (exact in float32 and float64)
    on_grid = np.concatenate([pts, mids, [VIRTUAL_NEXT[fmt] * 2, 1e5, 1e30]])
    picked = rng.choice(on_grid, 300)
    nudged = [picked]
    for w in (np.float32, np.float64):
        p = picked.astype(w)
        nudged += [np.nextafter(p, w(np.inf)), np.nextafter(p, w(0))]
    near = np.concatenate(nudged).astype(np.float64)
    near = near * rng.choice([-1.0, 1.0], near.size)
    width = 32 if dtype == np.float32 else 64
    extra = draw(
        st.lists(
            st.floats(allow_nan=False, allow_infinity=False, width=width)
            | st.sampled_from([0.0, -0.0, 1e-45, -1e-40, 2.0**-126, 3e38, -1e300, 2.0**-1074]),
            max_size=20,
        )
    )
    x = np.concatenate([bulk, near, np.asarray(extra, np.float64)])
    if specials:
        x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]])
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    if not specials:
        x = x[np.isfinite(x)]
    rng.shuffle(x)
    return x


def run_q(x, fmt, mode, saturate=False, seed=None, sr_bits=32):
    kw = {"seed": seed, "sr_bits": sr_bits} if mode == "stochastic" else {}
    return lp.quantize(x, fmt, mode, saturate, **kw)


def run_e(x, fmt, mode, saturate=False, seed=None, sr_bits=32):
    kw = {"seed": seed, "sr_bits": sr_bits} if mode == "stochastic" else {}
    return lp.encode(x, fmt, mode, saturate, **kw)


# --------------------------------------------------------------------------------------------
# value set and rounding to neighbours


def check_neighbour_result(fmt, mode, x, q, codes, saturate):
    """The heart of the file: where ``q = quantize(x)`` may land, for every mode."""
    info = lp.get_format(fmt).info
    xv = x.astype(np.float64)
    qv = q.astype(np.float64)
    a = np.abs(xv)
    neg = np.signbit(xv)
    lo, hi = neighbours(fmt, xv)
    inside = a <= info.max
    ovf = overflow_value(fmt, neg, saturate)
    smax = np.where(neg, -info.max, info.max)

    # members of the value set, or Inf/NaN only where overflow (non-saturating) is possible
    member = np.isin(q.view(np.uint32), value_bits(fmt))
    special = np.isinf(q) | np.isnan(q)
    check(member | np.isnan(q), f"{fmt} {mode}: result is not a format value", x, q)
    check(~special | (~inside & (not saturate)), f"{fmt} {mode}: Inf/NaN for in-range x", x, q)
    if not info.has_inf:
        check(~np.isinf(q), f"{fmt} {mode}: Inf in a format without Inf", x, q)

    if mode in NEAREST:
        # one of the two neighbours, within half their spacing (= half an ulp of the format)
        i_x, i_q, i_lo, i_hi = xv[inside], qv[inside], lo[inside], hi[inside]
        check((i_q == i_lo) | (i_q == i_hi), f"{fmt} {mode}: not a neighbour", i_x, i_q)
        err2 = 2 * np.abs(i_q - i_x)  # exact: q and x are within a factor 2 of each other
        check(err2 <= i_hi - i_lo, f"{fmt} {mode}: error above half an ulp", i_x, i_q)
        tie = (err2 == i_hi - i_lo) & (i_hi != i_lo)
        if mode == "nearest_away":
            check(~tie | (np.abs(i_q) == np.maximum(np.abs(i_lo), np.abs(i_hi))),
                  f"{fmt} {mode}: tie not away from zero", i_x, i_q)
        else:
            check(~tie | ((codes[inside] & 1) == 0), f"{fmt} {mode}: tie not to the even code",
                  i_x, i_q, codes[inside])
        # beyond max: max below the overflow midpoint, overflow above it; ties per mode
        mid = OVF_MID[fmt]
        if mode == "nearest_away":
            tie_ovf = True
        else:
            tie_ovf = RNE_TIE_OVERFLOWS[fmt]
        want_ovf = (a > mid) | ((a == mid) & tie_ovf)
        want = np.where(want_ovf, ovf, smax)
        check(same_value(qv, want) | inside, f"{fmt} {mode}: wrong overflow", x, q, want)
    elif mode in ("up", "down", "toward_zero"):
        # down(x) <= x <= up(x), with no format value strictly in between; toward_zero shrinks
        if mode == "up":
            want = hi
        elif mode == "down":
            want = lo
        else:
            want = np.where(neg, hi, lo)
        # a neighbour at +-inf means the rounded value is beyond the format: IEEE 754 7.4
        want = np.where(np.isinf(want), ovf, want)
        check(same_value(qv, want), f"{fmt} {mode}: not the directed neighbour", x, q, want)
        fin = np.isfinite(qv) & (inside | (not saturate))  # saturation clamps below |x|
        if mode == "up":
            check(~fin | (qv >= xv), f"{fmt} up: q < x", x, q)
        elif mode == "down":
            check(~fin | (qv <= xv), f"{fmt} down: q > x", x, q)
        else:
            check(np.abs(qv) <= a, f"{fmt} toward_zero: |q| > |x|", x, q)
    else:  # stochastic and hybrid: one of the two neighbours; beyond max, max or overflow
        check(((qv == lo) | (qv == hi)) | ~inside, f"{fmt} {mode}: not a neighbour", x, q)
        below_next = a < VIRTUAL_NEXT[fmt]
        ok_out = np.where(below_next, same_value(qv, smax) | same_value(qv, ovf),
                          same_value(qv, ovf))
        check(ok_out | inside, f"{fmt} {mode}: wrong overflow", x, q)

    # rounding never changes the sign; HiF8 has a single (positive) zero
    nn = ~np.isnan(q)
    if info.has_neg_zero:
        check(~nn | (np.signbit(q) == neg), f"{fmt} {mode}: sign changed", x, q)
    else:
        check(q.view(np.uint32) != 0x80000000, f"{fmt} {mode}: -0 produced", x, q)
        check(~nn | (q == 0) | (np.signbit(q) == neg), f"{fmt} {mode}: sign changed", x, q)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_result_is_a_neighbour_or_overflow(fmt, mode, dtype, data):
    x = data.draw(float_inputs(fmt, dtype))
    seed = data.draw(st.integers(0, 2**64 - 1))
    sr_bits = data.draw(st.integers(1, 32))
    q = run_q(x, fmt, mode, seed=seed, sr_bits=sr_bits)
    codes = run_e(x, fmt, mode, seed=seed, sr_bits=sr_bits)
    assert q.dtype == np.float32 and q.shape == x.shape
    check_neighbour_result(fmt, mode, x, q, codes, saturate=False)


@PROPS
@given(data=st.data())
def test_hif8_hybrid_rounds_to_a_neighbour(data):
    """hybrid (provisional, formats.md 1.6) lands on a neighbour and equals ties-away where the
    source exponent satisfies |E| < 4, i.e. 2^-3 <= |x| < 2^4."""
    x = data.draw(float_inputs("hif8", np.float32))
    q = lp.quantize(x, "hif8", "hybrid")
    codes = lp.encode(x, "hif8", "hybrid")
    check_neighbour_result("hif8", "hybrid", x, q, codes, saturate=False)
    ta = lp.quantize(x, "hif8", "nearest_away")
    a = np.abs(x)
    small_e = (a >= 2.0**-3) & (a < 2.0**4)
    check(~small_e | same(q, ta), "hif8 hybrid != ties-away for |E| < 4", x, q, ta)


# --------------------------------------------------------------------------------------------
# monotone, idempotent, symmetric


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_monotone(fmt, mode, dtype, data):
    x = np.sort(data.draw(float_inputs(fmt, dtype)))
    q = run_q(x, fmt, mode).astype(np.float64)
    # e4m3's non-saturating overflow is NaN: order it like the infinity it stands for
    q = np.where(np.isnan(q), np.copysign(np.inf, x), q)
    prev = np.concatenate([[-np.inf], q[:-1]])
    check(q >= prev, f"{fmt} {mode}: not monotone (x sorted; shown: x, q(x), q(previous x))",
          x, q, prev)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_idempotent(fmt, mode, dtype, data):
    x = data.draw(float_inputs(fmt, dtype))
    seed = data.draw(st.integers(0, 2**64 - 1))
    seed2 = data.draw(st.integers(0, 2**64 - 1))
    sat = data.draw(st.booleans())
    q = run_q(x, fmt, mode, sat, seed=seed)
    qq = run_q(q, fmt, mode, sat, seed=seed2)  # float32 values, any seed: nothing to round
    check(same(qq, q), f"{fmt} {mode} sat={sat}: q(q(x)) != q(x)", x, q, qq)
    q64 = run_q(q.astype(np.float64), fmt, mode, sat, seed=seed2)
    check(same(q64, q), f"{fmt} {mode} sat={sat}: q(float64(q(x))) != q(x)", x, q, q64)


@PROPS
@given(data=st.data())
def test_hif8_hybrid_idempotent(data):
    x = data.draw(float_inputs("hif8", np.float32))
    q = lp.quantize(x, "hif8", "hybrid")
    qq = lp.quantize(q, "hif8", "hybrid")
    check(same(qq, q), "hif8 hybrid: q(q(x)) != q(x)", x, q, qq)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero"])
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_sign_symmetric(fmt, mode, dtype, data):
    x = data.draw(float_inputs(fmt, dtype))
    q = run_q(x, fmt, mode)
    qn = run_q(-x, fmt, mode)
    check(same(qn, no_neg_zero_in(fmt, -q)), f"{fmt} {mode}: q(-x) != -q(x)", x, q, qn)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_up_is_minus_down_of_minus(fmt, dtype, data):
    x = data.draw(float_inputs(fmt, dtype))
    up = run_q(x, fmt, "up")
    down_neg = run_q(-x, fmt, "down")
    check(same(up, no_neg_zero_in(fmt, -down_neg)), f"{fmt}: up(x) != -down(-x)",
          x, up, down_neg)


# --------------------------------------------------------------------------------------------
# encode/decode vs fused quantize, float32 vs float64, saturation


@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_decode_encode_equals_quantize(fmt, mode, dtype, saturate, data):
    x = data.draw(float_inputs(fmt, dtype, specials=True))
    seed = data.draw(st.integers(0, 2**64 - 1))
    sr_bits = data.draw(st.integers(1, 32))
    codes = run_e(x, fmt, mode, saturate, seed=seed, sr_bits=sr_bits)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    dec = lp.decode(codes, fmt)
    q = run_q(x, fmt, mode, saturate, seed=seed, sr_bits=sr_bits)
    check(same(dec, q), f"{fmt} {mode} sat={saturate}: decode(encode(x)) != quantize(x)",
          x, dec, q, codes)


@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@PROPS
@given(data=st.data())
def test_hif8_hybrid_decode_encode_equals_quantize(saturate, data):
    x = data.draw(float_inputs("hif8", np.float32, specials=True))
    codes = lp.encode(x, "hif8", "hybrid", saturate)
    dec = lp.decode(codes, "hif8")
    q = lp.quantize(x, "hif8", "hybrid", saturate)
    check(same(dec, q), f"hif8 hybrid sat={saturate}: decode(encode(x)) != quantize(x)",
          x, dec, q, codes)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_float32_and_float64_inputs_agree(fmt, mode, data):
    """The same values as float32 (vectorized fast path for deterministic modes) and as float64
    (generic kernel) give identical codes and values; stochastic uses the same counters."""
    x = data.draw(float_inputs(fmt, np.float32, specials=True))
    seed = data.draw(st.integers(0, 2**64 - 1))
    sat = data.draw(st.booleans())
    x64 = x.astype(np.float64)
    c32 = run_e(x, fmt, mode, sat, seed=seed)
    c64 = run_e(x64, fmt, mode, sat, seed=seed)
    q32 = run_q(x, fmt, mode, sat, seed=seed)
    q64 = run_q(x64, fmt, mode, sat, seed=seed)
    check(c32 == c64, f"{fmt} {mode} sat={sat}: float32 and float64 codes differ", x, c32, c64)
    check(same(q32, q64), f"{fmt} {mode} sat={sat}: float32 and float64 values differ",
          x, q32, q64)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@PROPS
@given(data=st.data())
def test_saturate_never_inf_or_nan(fmt, mode, dtype, data):
    x = data.draw(float_inputs(fmt, dtype, specials=True))
    x = x[~np.isnan(x)]
    seed = data.draw(st.integers(0, 2**64 - 1))
    info = lp.get_format(fmt).info
    q = run_q(x, fmt, mode, True, seed=seed)
    codes = run_e(x, fmt, mode, True, seed=seed)
    check(np.isfinite(q), f"{fmt} {mode}: saturate=True gave Inf/NaN", x, q)
    check(np.abs(q) <= info.max, f"{fmt} {mode}: saturate=True beyond max", x, q)
    bad_codes = np.array(info.nan_codes + info.inf_codes, np.uint8)
    check(~np.isin(codes, bad_codes), f"{fmt} {mode}: saturate=True gave a NaN/Inf code",
          x, codes)
    # +-Inf inputs clamp to +-max
    inf = np.isinf(x)
    check(~inf | (q == np.copysign(info.max, x)), f"{fmt} {mode}: +-Inf did not clamp", x, q)
    # away from overflow, saturation changes nothing
    q0 = run_q(x, fmt, mode, False, seed=seed)
    check(~np.isfinite(q0) | same(q, q0), f"{fmt} {mode}: saturate changed a finite result",
          x, q, q0)
    check_neighbour_result(fmt, mode, x[~inf], q[~inf], codes[~inf], saturate=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_nan_input_gives_nan(fmt, mode):
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    for sat in (False, True):
        q = run_q(x, fmt, mode, sat, seed=1)
        codes = run_e(x, fmt, mode, sat, seed=1)
        assert np.isnan(q[:2]).all() and q[2] == 1.0
        assert np.isin(codes[:2], lp.get_format(fmt).info.nan_codes).all()
