"""Slow, obviously correct reference for the INT8/UINT8 codec (``lowprec.formats.integer``).

Everything is per element and in Python: the quotient ``x / s`` is an exact
:class:`fractions.Fraction` (or, where the codec's documented convention says so, the Fraction of
the float64 quotient), rounding is done on that Fraction by the textbook definition of each mode,
and the stochastic random bits come from a pure-Python SplitMix64 of ``(seed, flat index)``.
Scales follow the documented float64-then-float32 convention, written with Python floats.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
F32_TINY = 2.0**-149
F32_MAX = float(np.finfo(np.float32).max)
HALF = Fraction(1, 2)


def splitmix64(seed: int, i: int) -> int:
    """SplitMix64 finaliser of ``seed + (i + 1) * golden`` (all mod 2**64)."""
    z = (seed + (i + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def sr_random(seed: int, i: int, sr_bits: int) -> int:
    """The ``sr_bits`` random bits of element ``i``: the top bits of the hash."""
    return splitmix64(seed, i) >> (64 - sr_bits)


def round_fraction(q: Fraction, mode: str, rnd: int = 0, sr_bits: int = 32) -> int:
    """Round the exact rational ``q`` to an integer.

    Stochastic: the magnitude ``n + f`` (``0 <= f < 1``) rounds up iff
    ``floor(f * 2**sr_bits) + rnd >= 2**sr_bits``; the sign is applied afterwards.
    """
    neg = q < 0
    a = -q if neg else q
    n = math.floor(a)
    f = a - n
    if f == 0:
        up = False
    elif mode == "nearest_even":
        up = f > HALF or (f == HALF and n % 2 == 1)
    elif mode == "nearest_away":
        up = f >= HALF
    elif mode == "toward_zero":
        up = False
    elif mode == "up":
        up = not neg
    elif mode == "down":
        up = neg
    elif mode == "stochastic":
        up = math.floor(f * 2**sr_bits) + rnd >= 2**sr_bits
    else:
        raise ValueError(mode)
    m = n + (1 if up else 0)
    return -m if neg else m


def qrange(fmt: str, symmetric: bool, narrow) -> tuple[int, int]:
    if fmt == "uint8":
        return 0, 255
    if narrow is None:
        narrow = symmetric
    return (-127 if narrow else -128), 127


def group_key(idx: tuple, granularity: str, axis, block_size) -> tuple:
    """Index into the stored scale array of the element at multi-index ``idx``."""
    nd = len(idx)
    if granularity == "per_tensor":
        return (0,) * nd
    if granularity == "per_token":
        return tuple(idx[:-1]) + (0,)
    a = axis % nd
    if granularity == "per_channel":
        return tuple(idx[a] if d == a else 0 for d in range(nd))
    return tuple(idx[a] // block_size if d == a else idx[d] for d in range(nd))


def scale_shape(shape: tuple, granularity: str, axis, block_size) -> tuple:
    nd = len(shape)
    if granularity == "per_tensor":
        return (1,) * nd
    if granularity == "per_token":
        return tuple(shape[:-1]) + (1,)
    a = axis % nd
    if granularity == "per_channel":
        return tuple(shape[a] if d == a else 1 for d in range(nd))
    return tuple(-(-shape[a] // block_size) if d == a else shape[d] for d in range(nd))


def ref_scales(x: np.ndarray, fmt: str, granularity: str, axis, block_size, symmetric: bool,
               narrow=None):
    """Scales (float32) and zero points (int, or None) computed from the data."""
    qmin, qmax = qrange(fmt, symmetric, narrow)
    sshape = scale_shape(x.shape, granularity, axis, block_size)
    vals: dict = {k: [] for k in itertools.product(*[range(n) for n in sshape])}
    x64 = x.astype(np.float64)
    for idx in np.ndindex(*x.shape):
        v = float(x64[idx])
        if math.isfinite(v):
            vals[group_key(idx, granularity, axis, block_size)].append(v)
    s = np.empty(sshape, np.float32)
    z = None if symmetric else np.empty(sshape, np.int64)
    with np.errstate(over="ignore"):
        _fill_scales(vals, s, z, fmt, symmetric, qmin, qmax)
    return s, z


def _fill_scales(vals, s, z, fmt, symmetric, qmin, qmax):
    for k, vs in vals.items():
        lo = min(vs + [0.0])
        hi = max(vs + [0.0])
        if symmetric:
            amax = max(-lo, hi)
            q = 255 if fmt == "uint8" else 127
            s[k] = 1.0 if amax == 0 else min(max(np.float32(amax / q), F32_TINY), F32_MAX)
        else:
            s[k] = 1.0 if hi == lo else min(max(np.float32((hi - lo) / (qmax - qmin)), F32_TINY),
                                            F32_MAX)
            z[k] = min(max(qmin - round(lo / float(s[k])), qmin), qmax)  # round: half even


def ref_zero_points(x, s, fmt, granularity, axis, block_size, narrow=None):
    """Asymmetric zero points computed from the data with given float32 scales ``s``."""
    qmin, qmax = qrange(fmt, False, narrow)
    lo = np.zeros(s.shape)
    x64 = x.astype(np.float64)
    for idx in np.ndindex(*x.shape):
        v = float(x64[idx])
        k = group_key(idx, granularity, axis, block_size)
        if math.isfinite(v):
            lo[k] = min(lo[k], v)
    z = np.empty(s.shape, np.int64)
    for k in np.ndindex(*s.shape):
        z[k] = min(max(qmin - round(lo[k] / float(s[k])), qmin), qmax)
    return z


def ref_code(v: float, s: float, z: int, qmin: int, qmax: int, mode: str, seed: int = 0,
             idx: int = 0, sr_bits: int = 32, quotient: str = "exact"):
    """Code of one element (None for NaN).  ``quotient``: ``exact`` or ``float64`` (the
    Fraction of the float64 quotient)."""
    if math.isnan(v):
        return None
    if math.isinf(v):
        return qmax if v > 0 else qmin
    if quotient == "exact":
        q = Fraction(v) / Fraction(float(s))
    else:
        q = Fraction(float(np.float64(v) / np.float64(s)))
    rnd = sr_random(seed, idx, sr_bits) if mode == "stochastic" else 0
    return min(max(round_fraction(q, mode, rnd, sr_bits) + z, qmin), qmax)


def ref_value(code, s: float, z: int) -> np.float32:
    """Float32 rounding of the exact ``(code - z) * s`` (NaN for a NaN element)."""
    if code is None:
        return np.float32(np.nan)
    with np.errstate(over="ignore"):
        return np.float32(float((code - z) * Fraction(float(s))))


def ref_quantize(x: np.ndarray, fmt: str, *, rounding="nearest_even", seed=0, sr_bits=32,
                 granularity="per_tensor", axis=None, block_size=None, symmetric=True,
                 scale=None, zero_point=None, narrow=None, quotient=None):
    """Reference encode: ``(codes as int64 array (NaN elements -> 0), nan mask, scales, zero
    points, values)``.  ``quotient`` defaults to the codec's convention: ``float64`` for
    float64 input or stochastic rounding, ``exact`` otherwise."""
    if quotient is None:
        quotient = "float64" if (x.dtype == np.float64 or rounding == "stochastic") else "exact"
    if granularity == "per_channel" and axis is None:
        axis = 0
    if granularity == "per_block" and axis is None:
        axis = -1
    qmin, qmax = qrange(fmt, symmetric, narrow)
    sshape = scale_shape(x.shape, granularity, axis, block_size)
    if scale is None:
        s, z = ref_scales(x, fmt, granularity, axis, block_size, symmetric, narrow)
    else:
        s = np.broadcast_to(np.asarray(scale, np.float64), sshape).astype(np.float32)
        if symmetric:
            z = None
        elif zero_point is None:
            z = ref_zero_points(x, s, fmt, granularity, axis, block_size, narrow)
        else:
            z = np.broadcast_to(np.asarray(zero_point), sshape).astype(np.int64)
    x64 = x.astype(np.float64)
    codes = np.zeros(x.shape, np.int64)
    nan = np.zeros(x.shape, bool)
    vals = np.empty(x.shape, np.float32)
    for flat, idx in enumerate(np.ndindex(*x.shape)):
        k = group_key(idx, granularity, axis, block_size)
        zz = 0 if z is None else int(z[k])
        c = ref_code(float(x64[idx]), float(s[k]), zz, qmin, qmax, rounding, seed, flat,
                     sr_bits, quotient)
        nan[idx] = c is None
        codes[idx] = 0 if c is None else c
        vals[idx] = ref_value(c, float(s[k]), zz)
    return codes, nan, s, z, vals
