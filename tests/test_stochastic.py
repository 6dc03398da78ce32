"""Stochastic rounding of the 8-bit float formats (hif8, e4m3, e5m2).

The contract (design.md "Formats", lowprec.formats.rounding): element ``i`` (flat C-order index of
the array passed) draws ``r``, the top ``sr_bits`` bits of ``sr_hash(seed, i)`` (SplitMix64
finaliser), and its magnitude rounds up iff ``floor(frac * 2**sr_bits) + r >= 2**sr_bits``, where
``frac`` is the discarded fraction of a quantum.  Consequences tested here: unbiasedness (and the
documented truncation bias for small ``sr_bits``), the exact rule itself against a numpy
re-implementation, independence from thread count, array shape and the other elements' values,
float32 == float64 input, and validation of ``seed`` and ``sr_bits``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from conftest import same_bits as _same_bits

import lowprec as lp

FORMATS = ["hif8", "e4m3", "e5m2"]
N_DRAWS = 10**6

# values strictly between two neighbours: normal, subnormal / DML, below the smallest value,
# negative, and just below max
CASES = {
    "e4m3": {
        "normal": 1.3,
        "subnormal": 5.3 * 2.0**-9,
        "below_min": 0.6 * 2.0**-9,
        "negative": -37.7,
        "near_max": 441.0,
    },
    "e5m2": {
        "normal": 3.3,
        "subnormal": 2.7 * 2.0**-16,
        "below_min": 0.25 * 2.0**-16,
        "negative": -1000.3,
        "near_max": 50000.0,
    },
    "hif8": {
        "w3": 1.3,
        "w2_exact_quarter": 21.0,  # 20 .. 24, fraction exactly 1/4
        "w1": 300.0,
        "dml": 1.3 * 2.0**-19,
        "below_dml": 0.7 * 2.0**-22,
        "negative": -0.1,
        "near_max": 30000.0,
    },
}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def sr_random(seed: int, n: int, sr_bits: int) -> np.ndarray:
    """numpy twin of ``rounding.sr_draw``: the top ``sr_bits`` bits of SplitMix64(seed, i)."""
    i = np.arange(n, dtype=np.uint64)
    z = np.uint64(seed) + (i + np.uint64(1)) * _GOLDEN  # uint64 arrays wrap silently
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return z >> np.uint64(64 - sr_bits)


def magnitude_neighbours(fmt: str, a: np.ndarray):
    """Largest format magnitude <= a and smallest >= a (a >= 0, a <= max)."""
    v = lp.get_format(fmt).values().astype(np.float64)
    g = np.unique(np.abs(v[np.isfinite(v)]))
    lo = g[np.searchsorted(g, a, side="right") - 1]
    hi = g[np.searchsorted(g, a, side="left")]
    return lo, hi


def expected_sr(fmt: str, x: np.ndarray, seed: int, sr_bits: int) -> np.ndarray:
    """The documented stochastic rule, evaluated exactly in float64 (in-range x only)."""
    xv = x.astype(np.float64).reshape(-1)
    a = np.abs(xv)
    lo, hi = magnitude_neighbours(fmt, a)
    span = np.where(hi > lo, hi - lo, 1.0)  # a power of two; a - lo is exact (Sterbenz)
    t = np.floor((a - lo) / span * 2.0**sr_bits)
    r = sr_random(seed, xv.size, sr_bits).astype(np.float64)
    up = t + r >= 2.0**sr_bits
    mag = np.where(up, hi, lo)
    out = np.where(np.signbit(xv), -mag, mag)
    if not lp.get_format(fmt).info.has_neg_zero:
        out = np.where(out == 0, 0.0, out)
    return out.astype(np.float32).reshape(x.shape)


def random_in_range(fmt: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Log-uniform magnitudes from below the smallest value up to max, random signs (float64)."""
    info = lp.get_format(fmt).info
    e = rng.uniform(math.log2(info.min_subnormal) - 3, math.log2(info.max), n)
    x = np.exp2(e) * rng.choice([-1.0, 1.0], n)
    return np.clip(x, -info.max, info.max)


def same_bits(a, b) -> bool:
    return _same_bits(a, b, dtype=False)


# --------------------------------------------------------------------------------------------
# statistics


def _draws(fmt: str, xs: np.ndarray, sr_bits: int, seed: int) -> np.ndarray:
    """N_DRAWS stochastic roundings of each value in ``xs`` (one row each, one call)."""
    x = np.repeat(xs.astype(np.float32), N_DRAWS).reshape(len(xs), N_DRAWS)
    return lp.quantize(x, fmt, "stochastic", seed=seed, sr_bits=sr_bits).astype(np.float64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unbiased_with_32_random_bits(fmt):
    """Mean of 10^6 draws equals x within 3 standard errors, in every part of the range."""
    names = list(CASES[fmt])
    xs = np.array([CASES[fmt][k] for k in names], np.float32)
    q = _draws(fmt, xs, 32, seed=20240917)
    failures = []
    for row, name, x32 in zip(q, names, xs, strict=True):
        x = float(x32)
        lo, hi = magnitude_neighbours(fmt, np.array([abs(x)]))
        lo, hi = float(lo[0]), float(hi[0])
        assert lo < abs(x) < hi, f"{name}: {x} is not strictly between two {fmt} values"
        mags = np.abs(row)
        assert np.all((mags == lo) | (mags == hi)), f"{fmt} {name}: a draw is not a neighbour"
        assert np.all((row == 0) | (np.signbit(row) == (x < 0))), f"{fmt} {name}: sign changed"
        p = (abs(x) - lo) / (hi - lo)
        se = (hi - lo) * math.sqrt(p * (1 - p) / N_DRAWS)
        err = row.mean() - x
        if abs(err) > 3 * se:
            failures.append(f"{name}: x={x!r} mean={row.mean()!r} error={err:.3g} 3SE={3 * se:.3g}")
    assert not failures, f"{fmt} stochastic rounding biased:\n" + "\n".join(failures)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncation_bias_with_2_random_bits(fmt):
    """With sr_bits=2 the probability of rounding up is the fraction truncated to 2 bits: the
    mean is lo + floor(frac*4)/4 * (hi - lo) in magnitude (biased toward zero), not x."""
    names = list(CASES[fmt])
    xs = np.array([CASES[fmt][k] for k in names], np.float32)
    q = _draws(fmt, xs, 2, seed=7)
    failures = []
    biased = 0
    for row, name, x32 in zip(q, names, xs, strict=True):
        x = float(x32)
        lo, hi = magnitude_neighbours(fmt, np.array([abs(x)]))
        lo, hi = float(lo[0]), float(hi[0])
        frac = (abs(x) - lo) / (hi - lo)
        p = math.floor(frac * 4) / 4
        biased += p != frac
        want = math.copysign(lo + p * (hi - lo), x)
        se = (hi - lo) * math.sqrt(p * (1 - p) / N_DRAWS)
        err = row.mean() - want
        if abs(err) > 3 * se:
            failures.append(f"{name}: x={x!r} mean={row.mean()!r} want={want!r} "
                            f"error={err:.3g} 3SE={3 * se:.3g}")
    assert not failures, f"{fmt} sr_bits=2 mean is not the truncated fraction:\n" + "\n".join(
        failures)
    assert biased >= 3  # the cases really exercise truncation


# --------------------------------------------------------------------------------------------
# the exact rule


@pytest.mark.parametrize("sr_bits", [1, 2, 13, 32])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_documented_rule(fmt, dtype, sr_bits):
    """Bit-exact agreement with floor(frac * 2^k) + r >= 2^k, r = top k bits of
    SplitMix64(seed, flat index), over the whole finite range (incl. ties, exact values)."""
    rng = np.random.default_rng(sr_bits)
    x = random_in_range(fmt, 20000, rng)
    v = lp.get_format(fmt).values().astype(np.float64)
    g = np.unique(v[np.isfinite(v)])
    x = np.concatenate([x, g, (g[:-1] + g[1:]) / 2, [0.0, -0.0, 1e-30, -1e-45]])
    x = x.astype(dtype)
    seed = 0xDEADBEEF12345 + sr_bits
    q = lp.quantize(x, fmt, "stochastic", seed=seed, sr_bits=sr_bits)
    want = expected_sr(fmt, x, seed, sr_bits)
    bad = np.flatnonzero(q.view(np.uint32).reshape(-1) != want.view(np.uint32).reshape(-1))
    detail = [
        f"i={i} x={float(x.reshape(-1)[i])!r} got={q.reshape(-1)[i]!r} want={want.reshape(-1)[i]!r}"
        for i in bad[:6]
    ]
    assert bad.size == 0, f"{fmt} sr_bits={sr_bits}: {bad.size} mismatches\n" + "\n".join(detail)


# --------------------------------------------------------------------------------------------
# determinism: threads, shape, other elements, seeds, input width


@pytest.fixture
def restore_threads():
    n = numba.get_num_threads()
    yield
    numba.set_num_threads(n)


@pytest.mark.parametrize("fmt", FORMATS)
def test_identical_for_any_thread_count(fmt, restore_threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    rng = np.random.default_rng(1)
    x = random_in_range(fmt, 1 << 20, rng).astype(np.float32)  # parallel kernel
    out = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        out.append((lp.quantize(x, fmt, "stochastic", seed=99),
                    lp.encode(x, fmt, "stochastic", seed=99)))
    (q1, c1), (q2, c2) = out
    assert same_bits(q1, q2)
    assert np.array_equal(c1, c2)
    # and the parallel kernel equals the documented rule
    assert same_bits(q1, expected_sr(fmt, x, 99, 32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_counter_is_the_flat_index(fmt):
    """A prefix (serial kernel) equals the start of the whole (parallel kernel); reshaping and
    non-contiguous views use the flat C-order index of the array as passed."""
    rng = np.random.default_rng(2)
    x = random_in_range(fmt, 1 << 18, rng).astype(np.float32)
    whole = lp.encode(x, fmt, "stochastic", seed=5)
    assert np.array_equal(lp.encode(x[:1000], fmt, "stochastic", seed=5), whole[:1000])
    x2 = x[:1 << 16].reshape(256, 256)
    c2 = lp.encode(x2, fmt, "stochastic", seed=5)
    assert np.array_equal(c2.reshape(-1), whole[:1 << 16])
    t = x2.T
    assert np.array_equal(lp.encode(t, fmt, "stochastic", seed=5),
                          lp.encode(np.ascontiguousarray(t), fmt, "stochastic", seed=5))
    r = x2[::-1, ::2]
    assert np.array_equal(lp.encode(r, fmt, "stochastic", seed=5),
                          lp.encode(np.ascontiguousarray(r), fmt, "stochastic", seed=5))


@pytest.mark.parametrize("fmt", FORMATS)
def test_element_independent_of_other_elements(fmt):
    rng = np.random.default_rng(3)
    x = random_in_range(fmt, 50000, rng).astype(np.float32)
    y = x.copy()
    changed = rng.random(x.size) < 0.5
    y[changed] = random_in_range(fmt, int(changed.sum()), rng)
    qx = lp.quantize(x, fmt, "stochastic", seed=11)
    qy = lp.quantize(y, fmt, "stochastic", seed=11)
    assert same_bits(qx[~changed], qy[~changed])


@pytest.mark.parametrize("fmt", FORMATS)
def test_seeds(fmt):
    """Same seed: same output (encode and quantize); different seeds: different draws."""
    rng = np.random.default_rng(4)
    x = random_in_range(fmt, 50000, rng).astype(np.float32)
    x = x[~np.isin(x, lp.get_format(fmt).values())]  # only values that really round
    a = lp.encode(x, fmt, "stochastic", seed=123)
    assert np.array_equal(a, lp.encode(x, fmt, "stochastic", seed=123))
    assert same_bits(lp.decode(a, fmt), lp.quantize(x, fmt, "stochastic", seed=123))
    for other in (124, 0, 2**64 - 1, 123 + 2**32):
        b = lp.encode(x, fmt, "stochastic", seed=other)
        # about a third of the decisions differ for uniformly spread fractions
        assert np.mean(a != b) > 0.2, f"seed {other} gives nearly the same draws as 123"
    assert np.array_equal(lp.encode(x, fmt, "stochastic", seed=np.int64(123)), a)
    assert np.array_equal(lp.encode(x, fmt, "stochastic", seed=np.uint64(123)), a)


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_and_float64_inputs_use_the_same_counter(fmt):
    rng = np.random.default_rng(5)
    x = random_in_range(fmt, 50000, rng).astype(np.float32)
    for sr_bits in (3, 32):
        q32 = lp.quantize(x, fmt, "stochastic", seed=8, sr_bits=sr_bits)
        q64 = lp.quantize(x.astype(np.float64), fmt, "stochastic", seed=8, sr_bits=sr_bits)
        assert same_bits(q32, q64)
        c32 = lp.encode(x, fmt, "stochastic", seed=8, sr_bits=sr_bits)
        c64 = lp.encode(x.astype(np.float64), fmt, "stochastic", seed=8, sr_bits=sr_bits)
        assert np.array_equal(c32, c64)


# --------------------------------------------------------------------------------------------
# validation


X = np.array([1.3, -2.7, 100.0], np.float32)


@pytest.mark.parametrize("fn", [lp.encode, lp.quantize], ids=["encode", "quantize"])
@pytest.mark.parametrize(
    ("sr_bits", "exc"),
    [(0, ValueError), (33, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
     ("8", TypeError)],
)
def test_sr_bits_validation(fn, sr_bits, exc):
    with pytest.raises(exc, match="sr_bits"):
        fn(X, "e4m3", "stochastic", seed=1, sr_bits=sr_bits)


@pytest.mark.parametrize("sr_bits", [1, 32, np.int32(8)])
def test_sr_bits_accepted(sr_bits):
    q = lp.quantize(X, "hif8", "stochastic", seed=1, sr_bits=sr_bits)
    assert q.dtype == np.float32 and q.shape == X.shape


@pytest.mark.parametrize("fn", [lp.encode, lp.quantize], ids=["encode", "quantize"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_required(fn, fmt):
    with pytest.raises(ValueError, match="seed"):
        fn(X, fmt, "stochastic")
    with pytest.raises(ValueError, match="seed"):
        fn(X, fmt, lp.Rounding.STOCHASTIC, seed=None)


@pytest.mark.parametrize(("seed", "exc"), [(-1, ValueError), (1.5, TypeError),
                                           (True, TypeError), ("1", TypeError)])
def test_seed_validation(seed, exc):
    with pytest.raises(exc, match="seed"):
        lp.encode(X, "e5m2", "stochastic", seed=seed)


def test_seed_from_generator():
    x = random_in_range("hif8", 10000, np.random.default_rng(6)).astype(np.float32)
    a = lp.encode(x, "hif8", "stochastic", seed=np.random.default_rng(42))
    b = lp.encode(x, "hif8", "stochastic", seed=np.random.default_rng(42))
    assert np.array_equal(a, b)  # deterministic for a fixed Generator seed
    g = np.random.default_rng(42)
    first = lp.encode(x, "hif8", "stochastic", seed=g)
    second = lp.encode(x, "hif8", "stochastic", seed=g)
    assert np.array_equal(first, a)
    assert not np.array_equal(first, second)  # the Generator advances: fresh draws each call


def test_seed_ignored_for_deterministic_modes():
    a = lp.encode(X, "e4m3", "nearest_even")
    assert np.array_equal(lp.encode(X, "e4m3", "nearest_even", seed=3), a)
    assert np.array_equal(lp.encode(X, "e4m3", "nearest_even", sr_bits=5), a)


def test_seed_must_fit_64_bits():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        lp.encode(x, "e4m3", rounding="stochastic", seed=2**64)
    lp.encode(x, "e4m3", rounding="stochastic", seed=2**64 - 1)
