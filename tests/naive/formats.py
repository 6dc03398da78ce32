"""Slow, obviously-correct references for the 8-bit float formats hif8, e4m3 and e5m2.

Everything here is exact (``fractions.Fraction``) and written from the bit-field definitions of
formats.md sections 1.1-1.2 (HiF8) and 2.1 (OCP E4M3 / E5M2), independently of ``lowprec``: no
library table, constant or kernel is imported.  Tests compare the fast Numba codecs with these
functions element by element.

Conventions (the ones ``lowprec`` implements; formats.md 1.4, 1.6, 2.2 and design.md "Formats")
---------------------------------------------------------------------------------------------
* **Value-space rounding.**  A finite input ``x`` is rounded to the set of finite values of the
  format, with gradual underflow: the *rounding grid* of a format is ``0``, its positive finite
  values, and one *virtual* point above ``max`` (the value the pattern just above ``max`` would
  have if it were an ordinary finite code: 480 for E4M3 ``S.1111.111``, 65536 for E5M2
  ``S.11111.00``, 49152 for HiF8 ``0x6F``).  ``|x|`` lies between two consecutive grid points
  ``lo <= |x| < hi`` and the mode picks one of them.  HiF8 consequences: binade ``E`` has
  ``w(E)`` mantissa bits (3 for ``|E| <= 3``, 2 for ``|E| <= 7``, 1 for ``|E| <= 15``, 0 for the
  DML binades ``-22 <= E <= -16``), and below ``2^-22`` the only grid points are ``0`` and
  ``2^-22``.
* **Modes.**  ``nearest_even``: nearest; on a tie the neighbour with the even *code* (the
  virtual point has code ``max_code + 1``; for HiF8 DML binades without mantissa bits this is
  the parity of the code itself).  ``nearest_away``: nearest, ties to the larger magnitude.
  ``toward_zero``: ``lo``.  ``up`` / ``down``: toward +inf / -inf.  ``stochastic`` with ``k``
  random bits and random integer ``r`` in ``[0, 2^k)``: with ``frac = (|x| - lo) / (hi - lo)``
  round to ``hi`` iff ``floor(frac * 2^k) + r >= 2^k`` (gfloat's ``StochasticFastest``).
  The random integer of flat element ``i`` is ``sr_hash(seed, i) >> (64 - k)`` where
  ``sr_hash`` is SplitMix64's finaliser of ``seed + (i + 1) * golden`` (:func:`sr_random`).
* **Overflow** is decided after rounding: the result is the virtual point (or ``|x|`` is at
  or beyond it).  Non-saturating: nearest and stochastic modes give Inf (E5M2, HiF8) or NaN
  (E4M3); directed modes follow IEEE 754 7.4: ``toward_zero`` gives ``+-max``, ``up`` gives
  Inf/NaN for positive and ``-max`` for negative inputs, ``down`` the mirror image (the same as
  gfloat's ``round_float``).  Saturating: ``+-max`` for every overflow and for ``+-Inf``.
* **Specials.**  ``+-Inf`` input: Inf (E5M2, HiF8) or NaN (E4M3) non-saturating, ``+-max``
  saturating, in every mode.  NaN input: the NaN code, ``0x7F | sign`` (E4M3), ``0x7E | sign``
  (E5M2), ``0x80`` (HiF8, unsigned), also when saturating.
* **Zero.**  HiF8 has one zero (code 0x00) for every zero result, whatever the sign; E4M3 and
  E5M2 keep the sign of the input (``-0`` is 0x80), including results that round to zero.
* **HiF8 hybrid rounding (provisional, formats.md 1.6).**  Defined on float32 bits only.  With
  ``E`` the exponent of the float32 source: if ``|E| < 4``, or ``E < -22`` (including float32
  subnormals and zero), TA (``nearest_away``).  Otherwise the binade of ``|x|`` has ``w`` mantissa
  bits, ``d = 23 - w`` fraction bits are discarded; ``F14`` = the 14 most significant discarded
  bits, ``T14`` = the 14 least significant fraction bits; the magnitude rounds up iff the
  discarded bits are not all zero and ``F14 >= T14``.  Carry and overflow as in TA.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction

FORMATS = ("hif8", "e4m3", "e5m2")
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")

_M64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------------
# Decoding from the bit fields


def _decode_ocp(code: int, ebits: int, mbits: int, bias: int, ieee_specials: bool):
    """Value of an OCP FP8 code (formats.md 2.1): Fraction, or a float for NaN / Inf.

    ``ieee_specials``: E5M2 (all-ones exponent = Inf / NaN).  Otherwise E4M3 "fn" (only
    ``S.1111.111`` is NaN, no Inf).
    """
    sign = -1 if code >> 7 else 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    all_e = (1 << ebits) - 1
    if ieee_specials and e == all_e:
        return sign * math.inf if m == 0 else math.nan
    if not ieee_specials and e == all_e and m == (1 << mbits) - 1:
        return math.nan
    if e == 0:  # subnormal: 0.M * 2^(1 - bias)
        mag = Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    else:
        mag = (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)
    return sign * mag


def _hif8_fields(code: int):
    """Split a HiF8 code (formats.md 1.1) into ``(sign, kind, E, w, M)``.

    ``kind`` is "normal", "dml", "zero", "nan" or "inf".  For normal codes the Dot prefix gives
    ``D``; the exponent field has ``D`` bits and the mantissa the remaining ``7 - len(dot) - D``
    bits.
    """
    sign = code >> 7
    b = code & 0x7F
    if code == 0x80:
        return sign, "nan", None, None, None
    if b == 0:
        return sign, "zero", None, None, None
    if b == 0x6F:
        return sign, "inf", None, None, None
    # Dot prefix code after the sign bit: 11 -> 4, 10 -> 3, 01 -> 2, 001 -> 1, 0001 -> 0,
    # 0000 -> DML
    if b >> 5 == 0b11:
        d, dot_len = 4, 2
    elif b >> 5 == 0b10:
        d, dot_len = 3, 2
    elif b >> 5 == 0b01:
        d, dot_len = 2, 2
    elif b >> 4 == 0b001:
        d, dot_len = 1, 3
    elif b >> 3 == 0b0001:
        d, dot_len = 0, 4
    else:  # DML: the 3 low bits are M, value 2^(M - 23)
        m = b & 0b111
        return sign, "dml", m - 23, 0, 0
    w = 7 - dot_len - d
    mant = b & ((1 << w) - 1)
    field = (b >> w) & ((1 << d) - 1)
    if d == 0:
        e = 0
    else:
        se = field >> (d - 1)  # sign of the exponent (1 = negative)
        magnitude = (1 << (d - 1)) + (field & ((1 << (d - 1)) - 1))  # hidden MSB
        e = -magnitude if se else magnitude
    return sign, "normal", e, w, mant


def _decode_hif8(code: int):
    """Value of a HiF8 code (formats.md 1.2): Fraction, or a float for NaN / Inf."""
    sign, kind, e, w, mant = _hif8_fields(code)
    s = -1 if sign else 1
    if kind == "nan":
        return math.nan
    if kind == "zero":
        return Fraction(0)
    if kind == "inf":
        return s * math.inf
    if kind == "dml":
        return s * Fraction(2) ** e
    return s * (1 + Fraction(mant, 1 << w)) * Fraction(2) ** e


def _hif8_virtual() -> Fraction:
    # the Inf pattern S.11.0111.1 read as an ordinary normal number: E = 15, M = 1, w = 1
    return (1 + Fraction(1, 2)) * Fraction(2) ** 15


# ------------------------------------------------------------------------------------------
# Format tables


@dataclass(frozen=True)
class RefFormat:
    """One format, as the references see it.

    Attributes:
        name: "hif8", "e4m3" or "e5m2".
        decoded: the 256 code values (Fraction; ``math.nan`` / ``+-math.inf`` for specials).
        values: sorted positive finite values (no zero).
        grid: ``[0] + values + [virtual]`` (see the module docstring).
        code_of: positive code of each grid point (the virtual point gets ``max_code + 1``).
        max: the largest finite value; max_code its code.
        has_inf: Inf codes exist (overflow -> Inf, else NaN).
        inf_code: positive Inf code (None for E4M3).
        nan_code: positive NaN code; nan_signed: NaN carries the input sign.
        neg_zero: the format has -0 (0x80).
    """

    name: str
    decoded: tuple
    values: tuple
    grid: tuple
    code_of: dict
    max: Fraction
    max_code: int
    has_inf: bool
    inf_code: int | None
    nan_code: int
    nan_signed: bool
    neg_zero: bool

    def is_nan_code(self, code: int) -> bool:
        v = self.decoded[code]
        return isinstance(v, float) and math.isnan(v)

    def value(self, code: int) -> float:
        """Exact value of ``code`` as a Python float (every value fits float32), -0.0 for 0x80
        where the format has -0."""
        v = self.decoded[code]
        if isinstance(v, float):
            return v
        if v == 0:
            return -0.0 if (code == 0x80 and self.neg_zero) else 0.0
        return float(v)


def _build(name: str) -> RefFormat:
    if name == "hif8":
        decoded = tuple(_decode_hif8(c) for c in range(256))
        virtual = _hif8_virtual()
        inf_code, nan_code, nan_signed, neg_zero = 0x6F, 0x80, False, False
    elif name == "e4m3":
        decoded = tuple(_decode_ocp(c, 4, 3, 7, False) for c in range(256))
        virtual = (1 + Fraction(7, 8)) * Fraction(2) ** (15 - 7)  # S.1111.111 read as normal
        inf_code, nan_code, nan_signed, neg_zero = None, 0x7F, True, True
    elif name == "e5m2":
        decoded = tuple(_decode_ocp(c, 5, 2, 15, True) for c in range(256))
        virtual = Fraction(2) ** (31 - 15)  # S.11111.00 read as normal
        inf_code, nan_code, nan_signed, neg_zero = 0x7C, 0x7E, True, True
    else:
        raise ValueError(f"unknown format {name!r}; expected one of {FORMATS}")
    code_of = {}
    for c in range(128):
        v = decoded[c]
        if isinstance(v, Fraction):
            assert v not in code_of, (name, c, v)
            code_of[v] = c
    values = tuple(sorted(v for v in code_of if v > 0))
    vmax = values[-1]
    max_code = code_of[vmax]
    assert virtual > vmax
    code_of[virtual] = max_code + 1
    grid = (Fraction(0),) + values + (virtual,)
    return RefFormat(name, decoded, values, grid, code_of, vmax, max_code,
                     inf_code is not None, inf_code, nan_code, nan_signed, neg_zero)


REF = {name: _build(name) for name in FORMATS}


def finite_values(fmt: str) -> list[Fraction]:
    """Sorted list of every finite value of ``fmt`` (both signs, one zero)."""
    v = REF[fmt].values
    return [-x for x in reversed(v)] + [Fraction(0)] + list(v)


def decode_ref(code: int, fmt: str) -> float:
    """Exact value of ``code`` as a float (NaN / +-Inf / -0.0 where the format has them)."""
    return REF[fmt].value(code)


# ------------------------------------------------------------------------------------------
# Stochastic rounding random bits


def sr_hash(seed: int, i: int) -> int:
    """SplitMix64 finaliser of ``seed`` and counter ``i`` (64-bit), as lowprec documents it."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def sr_random(seed: int, i: int, sr_bits: int) -> int:
    """The random integer in ``[0, 2^sr_bits)`` used for flat element ``i``."""
    return sr_hash(seed, i) >> (64 - sr_bits)


# ------------------------------------------------------------------------------------------
# Rounding


def _split(x):
    """``(is_nan, is_inf, negative, |x| as Fraction or None)`` for a float, int or Fraction."""
    if isinstance(x, Fraction):
        return False, False, x < 0, abs(x)
    if isinstance(x, int):
        return False, False, x < 0, Fraction(abs(x))
    xf = float(x)  # numpy scalars (float16/32/64) convert exactly
    if math.isnan(xf):
        return True, False, math.copysign(1.0, xf) < 0, None
    neg = math.copysign(1.0, xf) < 0
    if math.isinf(xf):
        return False, True, neg, None
    return False, False, neg, abs(Fraction(xf))


def _f32_bits(x) -> int:
    xf = float(x)
    b = struct.pack("<f", xf)
    if struct.unpack("<f", b)[0] != xf and not math.isnan(xf):
        raise ValueError(f"hybrid rounding reference needs a float32 value, got {x!r}")
    return struct.unpack("<I", b)[0]


def _hybrid_up(x, f: RefFormat, lo: Fraction, hi: Fraction, a: Fraction):
    """HiF8 hybrid (formats.md 1.6, provisional): True/False, or None when TA applies."""
    u = _f32_bits(x)
    ef = (u >> 23) & 0xFF
    if ef == 0:
        return None  # zero or float32 subnormal: E < -22
    e = ef - 127
    if abs(e) < 4 or e < -22:
        return None
    spacing = hi - lo
    # w = E - log2(spacing); the grid spacing in binade E is a power of two
    assert spacing.numerator == 1 or spacing.denominator == 1
    log2_spacing = (spacing.numerator.bit_length() - 1) - (spacing.denominator.bit_length() - 1)
    w = e - log2_spacing
    assert 0 <= w <= 2, (x, w)
    d = 23 - w
    frac = u & 0x7FFFFF
    if frac & ((1 << d) - 1) == 0:
        return False  # exact: no rounding
    f14 = (frac >> (d - 14)) & 0x3FFF
    t14 = frac & 0x3FFF
    return f14 >= t14


def round_ref(x, fmt: str, mode: str = "nearest_even", saturate: bool = False,
              sr_r: int | None = None, sr_bits: int | None = None) -> int:
    """Exact reference conversion of one value to a code of ``fmt``.

    Args:
        x: a Fraction, int or float (Python or numpy scalar, any width; ``-0.0``, ``+-inf`` and
            NaN allowed).  ``mode="hybrid"`` needs a float32-representable float.
        fmt: "hif8", "e4m3" or "e5m2".
        mode: one of :data:`MODES`, or "hybrid" (hif8 only).
        saturate: clamp overflow and +-Inf to +-max.
        sr_r, sr_bits: stochastic only: the random integer (``0 <= sr_r < 2^sr_bits``) and the
            number of random bits.

    Returns:
        the code (int, 0..255) of the correctly rounded result, per the module docstring.
    """
    f = REF[fmt]
    if mode == "hybrid" and fmt != "hif8":
        raise ValueError("hybrid rounding exists only for hif8")
    if mode not in MODES and mode != "hybrid":
        raise ValueError(f"unknown mode {mode!r}")
    is_nan, is_inf, neg, a = _split(x)
    sgn = 0x80 if neg else 0
    if is_nan:
        return (f.nan_code | sgn) if f.nan_signed else f.nan_code
    overflow_code = ((f.inf_code if f.has_inf else f.nan_code) | sgn)
    if is_inf:
        return (f.max_code | sgn) if saturate else overflow_code
    grid = f.grid
    virtual = grid[-1]
    if a >= virtual:
        r = virtual  # rounds to or beyond the virtual point in every mode
    else:
        k = bisect_right(grid, a) - 1
        lo, hi = grid[k], grid[k + 1]
        if a == lo:
            up = False
        elif mode == "nearest_even":
            d_lo, d_hi = a - lo, hi - a
            if d_lo != d_hi:
                up = d_hi < d_lo
            else:
                even_lo = f.code_of[lo] % 2 == 0
                even_hi = f.code_of[hi] % 2 == 0
                assert even_lo != even_hi, (fmt, lo, hi)
                up = even_hi
        elif mode == "nearest_away":
            up = (hi - a) <= (a - lo)
        elif mode == "toward_zero":
            up = False
        elif mode == "up":
            up = not neg
        elif mode == "down":
            up = neg
        elif mode == "stochastic":
            if sr_r is None or sr_bits is None:
                raise ValueError("stochastic rounding needs sr_r and sr_bits")
            if not 0 <= sr_r < (1 << sr_bits):
                raise ValueError(f"sr_r={sr_r} is not in [0, 2^{sr_bits})")
            frac = (a - lo) / (hi - lo)
            up = math.floor(frac * (1 << sr_bits)) + sr_r >= (1 << sr_bits)
        else:  # hybrid
            up = _hybrid_up(x, f, lo, hi, a)
            if up is None:
                up = (hi - a) <= (a - lo)
        r = hi if up else lo
    if r > f.max:
        directed_to_max = (
            mode == "toward_zero" or (mode == "up" and neg) or (mode == "down" and not neg)
        )
        if saturate or directed_to_max:
            return f.max_code | sgn
        return overflow_code
    code = f.code_of[r]
    if code == 0 and not f.neg_zero:
        return 0
    return code | sgn


def round_ref_value(x, fmt: str, mode: str = "nearest_even", saturate: bool = False,
                    sr_r: int | None = None, sr_bits: int | None = None) -> float:
    """The value of :func:`round_ref` (a float exactly equal to a value of ``fmt``; NaN, +-Inf
    and -0.0 where the format produces them)."""
    return REF[fmt].value(round_ref(x, fmt, mode, saturate, sr_r, sr_bits))


def clamp_then(x: float, fmt: str) -> float:
    """``x`` clamped to ``[-max, max]`` (NaN unchanged): the input that makes a non-saturating
    converter produce the saturating result."""
    m = float(REF[fmt].max)
    if math.isnan(x):
        return x
    return max(-m, min(m, x))
