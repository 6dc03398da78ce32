"""The rounding arithmetic every codec shares (one implementation of each mode).

All codecs reduce rounding to one question: a non-negative magnitude is ``n + rem / 2**s``
quanta, where ``n`` is the integer part and ``rem`` the ``s`` discarded bits; does it round to
``n`` or to ``n + 1`` quanta?  :func:`round_up` answers it for every mode.  The float
codecs feed it the significand bits of the input (exact for float32 and float64 input); the
integer codecs feed it the bits of ``x / scale``.

Stochastic rounding is counter-based: the random bits of element ``i`` are
``sr_hash(seed, i)``, a stateless SplitMix64 finaliser of ``(seed, i)``, so any chunking or thread
count gives identical output.  With ``sr_bits = k`` the magnitude rounds up iff
``floor(rem * 2**k / 2**s) + r >= 2**k`` for ``r`` uniform on ``[0, 2**k)``: the discarded
fraction truncated to ``k`` bits is the probability of rounding up (exactly unbiased when
``k >= s``, otherwise biased toward zero by less than ``2**-k`` quanta).  This equals gfloat's
``RoundMode.StochasticFastest`` with ``srnumbits = k`` and the same random integer.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit

# Mode codes (same numbers as lowprec.Rounding)
RNE = 0
RNA = 1
RZ = 2
RUP = 3
RDOWN = 4
SR = 5
HYBRID = 6

SR_BITS_MAX = 32  # random bits per element available from one 64-bit hash
SR_BITS_DEFAULT = 32
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@jit(inline="always")
def sr_hash(seed, i):
    """SplitMix64 finaliser of ``seed`` and counter ``i`` (both uint64): 64 random bits."""
    z = np.uint64(seed) + (np.uint64(i) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@jit(inline="always")
def sr_draw(seed, i, sr_bits):
    """``sr_bits`` uniform random bits (as int64) for element ``i``: the top bits of the hash."""
    return np.int64(sr_hash(seed, i) >> np.uint64(64 - sr_bits))


@jit(inline="always")
def round_up(mode, rem, half, odd, neg, sr_up):
    """True if a magnitude whose discarded bits are ``rem`` rounds up by one quantum.

    One implementation of every mode, generic in the integer type (the float32 fast path calls
    it with uint32 lanes, the generic codec with int64).

    Args:
        mode: RNE, RNA, RZ, RUP, RDOWN or SR (a compile-time constant in every caller, so the
            other branches vanish).
        rem: the discarded bits (``0 <= rem < 2**s``).
        half: ``2**(s-1)``, the discarded bits of an exact tie.  Callers that clamp ``s`` keep
            ``half`` above every possible ``rem``.
        odd: the code of the truncated magnitude is odd (RNE ties go to the even code).
        neg: the sign of the value (directed modes depend on it).
        sr_up: the stochastic decision, see :func:`sr_round_up` (read only for SR).
    """
    if mode == RNE:
        return (rem > half) | ((rem == half) & odd)
    elif mode == RNA:
        return rem >= half
    elif mode == RZ:
        return rem != rem
    elif mode == RUP:
        return (rem != 0) & (not neg)
    elif mode == RDOWN:
        return (rem != 0) & neg
    else:
        return sr_up


@jit(inline="always")
def sr_round_up(rem, s, rnd, sr_bits):
    """Stochastic decision: ``floor(rem * 2**k / 2**s) + rnd >= 2**k`` with ``k = sr_bits``.

    ``rem`` (int64) holds the discarded bits; ``s`` may exceed 63 (then ``rem`` is the whole
    significand, < 2**53, and the truncated fraction is 0 whenever ``s - k >= 63``).
    """
    if s >= sr_bits:
        sh = s - sr_bits
        t = (rem >> sh) if sh < 63 else np.int64(0)
    else:
        t = rem << (sr_bits - s)
    return t + rnd >= (np.int64(1) << sr_bits)


def check_sr_bits(sr_bits: int) -> int:
    """Validate ``sr_bits`` (1..32) and return it as an int."""
    if isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)):
        raise TypeError(f"sr_bits must be an integer in [1, {SR_BITS_MAX}], got {sr_bits!r}")
    if not 1 <= int(sr_bits) <= SR_BITS_MAX:
        raise ValueError(f"sr_bits must be in [1, {SR_BITS_MAX}], got {sr_bits}")
    return int(sr_bits)


def check_seed(seed, rounding_is_stochastic: bool) -> int:
    """Resolve ``seed`` to a uint64-compatible int.

    ``seed`` may be an int or a ``numpy.random.Generator`` (one 64-bit draw is taken from it).
    Required for stochastic rounding; ignored otherwise.
    """
    if not rounding_is_stochastic:
        return 0
    if seed is None:
        raise ValueError(
            "stochastic rounding needs a seed: pass seed=<int> or seed=numpy.random.Generator"
        )
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**63, dtype=np.int64))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        hint = ""
        if type(seed).__module__.startswith("torch"):
            hint = ("; a torch.Generator is not accepted (its state is not a counter-based "
                    "seed): pass an int, e.g. int(torch.randint(2**62, (1,), generator=g))")
        raise TypeError(f"seed must be an int in [0, 2**64) or a numpy.random.Generator, got "
                        f"{type(seed).__module__}.{type(seed).__name__}{hint}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


def check_offset(offset) -> int:
    """Validate the stochastic counter ``offset`` (an int in [0, 2**64)) and return it as the
    signed 64-bit integer with the same bits (the kernels add it to the element index in int64,
    which wraps like the uint64 counter the hash reads)."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int in [0, 2**64), got {offset!r}")
    o = int(offset)
    if not 0 <= o < 2**64:
        raise ValueError(f"offset must be in [0, 2**64), got {offset}")
    return o - 2**64 if o >= 2**63 else o


@jit(inline="always")
def round_to_int(y, mode, seed, idx, sr_bits):
    """Round a finite float64 ``y`` to an integer (returned as float64) under ``mode``.

    Works on the exact bits of ``y`` (no ``floor(y + 0.5)`` double rounding), using
    :func:`round_up` / :func:`sr_round_up` like every other codec.  ``seed``/``idx``/``sr_bits``
    are read only for SR.  Values with ``|y| >= 2**52`` are already integers.
    """
    a = abs(y)
    if a >= 4503599627370496.0:  # 2**52
        return y
    neg = y < 0.0
    fl = np.floor(a)
    n = np.int64(fl)
    # discarded fraction a - fl is exact in float64; scale it to a 53-bit integer
    frac = a - fl
    s = np.int64(53)
    rem = np.int64(frac * 9007199254740992.0)  # * 2**53: exact when |y| >= 1
    if rem == 0 and frac != 0.0:
        # |y| < 2**-53: the bits below 2**-53 were truncated; keep them as a sticky bit (the
        # directed modes need it; nearest modes and SR with <= 32 bits cannot see it)
        rem = np.int64(1)
    half = np.int64(1) << (s - 1)
    if mode == SR:
        sr_up = sr_round_up(rem, s, sr_draw(seed, idx, sr_bits), sr_bits)
    else:
        sr_up = False
    up = round_up(mode, rem, half, (n & 1) == 1, neg, sr_up)
    r = np.float64(n + (1 if up else 0))
    return -r if neg else r
