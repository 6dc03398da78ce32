"""Triton twins of :mod:`lowprec.formats.rounding`: the rounding arithmetic every GPU codec shares.

Each function mirrors the Numba helper of the same name, argument for argument (read the two side
by side); the differential tests keep them equal.  What differs is only how Triton spells it:

* every lane evaluates both sides of a choice (``tl.where``), so shift counts on the side that is
  thrown away are clamped into ``[0, 63]`` (a shift by 64 or more is undefined in compiled code,
  gpu.md section 2);
* the mode is a ``tl.constexpr``: the other branches vanish at compile time, as in Numba.

Random bits: ``sr_hash(seed, i)`` is SplitMix64's finaliser of ``seed + (i + 1) * golden`` in
uint64 arithmetic (wrapping), exactly as on the CPU, so a seed gives the same bits on both devices.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..formats import rounding as _cpu

# Mode codes: the same numbers as lowprec.Rounding (read from the CPU module, not retyped)
RNE = tl.constexpr(_cpu.RNE)
RNA = tl.constexpr(_cpu.RNA)
RZ = tl.constexpr(_cpu.RZ)
RUP = tl.constexpr(_cpu.RUP)
RDOWN = tl.constexpr(_cpu.RDOWN)
SR = tl.constexpr(_cpu.SR)
HYBRID = tl.constexpr(_cpu.HYBRID)
_GOLDEN = tl.constexpr(int(_cpu._GOLDEN))
_MIX1 = tl.constexpr(int(_cpu._MIX1))
_MIX2 = tl.constexpr(int(_cpu._MIX2))


@triton.jit
def sr_hash(seed, i):
    """SplitMix64 finaliser of ``seed`` and counter ``i`` (both uint64): 64 random bits."""
    z = seed + (i + 1) * _GOLDEN
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


@triton.jit
def sr_draw(seed, i, sr_bits):
    """``sr_bits`` uniform random bits (as int64) for counter ``i``: the top bits of the hash."""
    return (sr_hash(seed, i) >> (64 - sr_bits).to(tl.uint64)).to(tl.int64)


@triton.jit
def round_up(MODE: tl.constexpr, rem, half, odd, neg, sr_up):
    """True where a magnitude whose discarded bits are ``rem`` rounds up by one quantum
    (``rounding.round_up``; ``half`` = the discarded bits of a tie, ``odd`` = the truncated
    code is odd, ``neg`` = the sign, ``sr_up`` = the stochastic decision)."""
    if MODE == RNE:
        return (rem > half) | ((rem == half) & odd)
    elif MODE == RNA:
        return rem >= half
    elif MODE == RZ:
        return rem != rem
    elif MODE == RUP:
        return (rem != 0) & (neg == 0)
    elif MODE == RDOWN:
        return (rem != 0) & neg
    else:
        return sr_up


@triton.jit
def sr_round_up(rem, s, rnd, sr_bits):
    """Stochastic decision ``floor(rem * 2**k / 2**s) + rnd >= 2**k``, ``k = sr_bits``
    (``rounding.sr_round_up``); ``rem`` int64 holds the ``s`` discarded bits, ``s`` may exceed
    63 (then the truncated fraction is 0 whenever ``s - k >= 63``)."""
    k = sr_bits.to(tl.int64)
    sh = s - k
    t_dn = tl.where(sh < 63, rem >> tl.minimum(tl.maximum(sh, 0), 63), 0)
    t_up = rem << tl.minimum(tl.maximum(-sh, 0), 63)
    t = tl.where(sh >= 0, t_dn, t_up)
    return t + rnd >= (tl.full(t.shape, 1, tl.int64) << k)


@triton.jit
def sr_draw32(seed, i, sr_bits):
    """:func:`sr_draw` as uint32 (``sr_bits <= 32``): the top bits of the hash's high word."""
    hi = (sr_hash(seed, i) >> 32).to(tl.uint32)
    return hi >> (32 - sr_bits).to(tl.uint32)


@triton.jit
def sr_round_up32(rem, s, rnd, sr_bits):
    """:func:`sr_round_up` in 32-bit lanes, for float32 significands (``rem < 2**24``, int32;
    ``rnd``: uint32 from :func:`sr_draw32`).  ``floor(rem * 2**k / 2**s)`` fits in uint32 for
    every ``k <= 32`` (it is below ``2**k``), and ``t + rnd >= 2**k`` is tested as
    ``t >= 1 and t - 1 >= (2**k - 1) - rnd`` so that no sum leaves 32 bits.  The same decision
    as the int64 form on every input (tested)."""
    sh = s - sr_bits
    t_dn = tl.where(sh < 24, rem >> tl.minimum(tl.maximum(sh, 0), 31), 0).to(tl.uint32)
    t_up = rem.to(tl.uint32) << tl.minimum(tl.maximum(-sh, 0), 31).to(tl.uint32)
    t = tl.where(sh >= 0, t_dn, t_up)
    mask = tl.full(t.shape, 0xFFFFFFFF, tl.uint32) >> (32 - sr_bits).to(tl.uint32)
    return (t != 0) & ((t - 1) >= (mask - rnd))


@triton.jit
def round_to_int(y, MODE: tl.constexpr, seed, idx, sr_bits):
    """Round a finite float64 ``y`` to an integer (returned as float64) under ``MODE``
    (``rounding.round_to_int``), from the exact bits of ``y``: no ``floor(y + 0.5)``.

    ``floor`` is a truncating conversion of ``|y| < 2**52`` to int64 (exact there); larger
    magnitudes are already integers and come back unchanged, as do +-Inf.  NaN lanes give
    garbage the caller replaces (the float->int conversion is guarded first, gpu.md section 2).
    """
    a = tl.abs(y)
    big = (a >= 4503599627370496.0) | (a != a)  # 2**52, or NaN
    neg = y < 0.0
    n = tl.where(big, 0.0, a).to(tl.int64)  # floor of a non-negative value < 2**52
    fl = n.to(tl.float64)  # exact
    frac = tl.where(big, 0.0, a) - fl  # exact in float64
    s = 53
    rem = (frac * 9007199254740992.0).to(tl.int64)  # * 2**53: exact when |y| >= 1
    # |y| < 2**-53: the bits below 2**-53 were truncated; keep them as a sticky bit
    rem = tl.where((rem == 0) & (frac != 0.0), 1, rem)
    half = tl.full(rem.shape, 1 << (53 - 1), tl.int64)
    if MODE == SR:
        sr_up = sr_round_up(rem, tl.full(rem.shape, s, tl.int64), sr_draw(seed, idx, sr_bits),
                            sr_bits)
    else:
        sr_up = rem != rem
    up = round_up(MODE, rem, half, (n & 1) == 1, neg, sr_up)
    r = (n + tl.where(up, 1, 0)).to(tl.float64)
    r = tl.where(neg, -r, r)
    return tl.where(big, y, r)
