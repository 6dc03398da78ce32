"""Slow exact references for the element formats of issue 17 ("Formats II").

Value tables come from independent decoders (ml_dtypes for the types it has, gfloat for P3109);
nothing here imports lowprec.  Rounding is exact in value space with ``fractions.Fraction``,
with the conventions of ``naive/formats.py`` (grid ``[0] + values + [virtual]``, the virtual
point being the value the code after ``max`` would have; ties to the even code; overflow after
rounding; directed overflow per IEEE 754 7.4; saturation clamps overflow and Inf).  Additions:

* formats without NaN and Inf (OCP FP4/FP6) always saturate; NaN input gives the -0 code
  (lowprec's documented choice; ml_dtypes gives -0 for +NaN and +0 for -NaN);
* formats whose NaN is the -0 code ("fnuz", P3109) have one zero and an unsigned NaN;
* ``e8m0`` (unsigned powers of two, no zero): its own reference, :func:`round_e8m0`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction

import ml_dtypes
import numpy as np

ML_TYPES = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn,
            "e3m2": ml_dtypes.float6_e3m2fn, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
            "e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e4m3_ieee": ml_dtypes.float8_e4m3,
            "e3m4": ml_dtypes.float8_e3m4}
P3109 = tuple(f"binary8p{p}" for p in range(1, 8))
FORMATS = tuple(ML_TYPES) + P3109


def _exact(v: float):
    return v if (math.isnan(v) or math.isinf(v)) else Fraction(v)


def _table(fmt: str) -> tuple[list, int, int]:
    """``(float value of every code, code bits, mantissa bits)`` from the peer decoder."""
    if fmt in ML_TYPES:
        t = ML_TYPES[fmt]
        info = ml_dtypes.finfo(t)
        bits = 1 + info.nexp + info.nmant
        codes = np.arange(1 << bits, dtype=np.uint8)
        vals = codes.view(t).astype(np.float64)
        return [float(v) for v in vals], bits, int(info.nmant)
    import gfloat
    from gfloat.formats import format_info_p3109

    p = int(fmt.removeprefix("binary8p"))
    fi = format_info_p3109(8, p)
    return [float(gfloat.decode_float(fi, c).fval) for c in range(256)], 8, p - 1


@dataclass(frozen=True)
class Ref:
    """One format as the reference sees it (see :func:`build`)."""

    decoded: tuple
    sign: int
    grid: tuple
    code_of: dict
    max: Fraction
    max_code: int
    inf_code: int | None
    nan_code: int | None  # None: no NaN code
    nan_signed: bool
    neg_zero: bool

    def is_nan(self, code: int) -> bool:
        v = self.decoded[code]
        return isinstance(v, float) and math.isnan(v)


def build(fmt: str) -> Ref:
    """The reference description of ``fmt`` from its peer's value table."""
    raw, bits, m = _table(fmt)
    dec = [_exact(v) for v in raw]
    sign = 1 << (bits - 1)
    code_of = {}
    for c in range(sign):
        v = dec[c]
        if isinstance(v, Fraction) and v not in code_of:
            code_of[v] = c
    values = sorted(v for v in code_of if v > 0)
    vmax = values[-1]
    max_code = code_of[vmax]
    e = math.floor(math.log2(vmax))
    while Fraction(2) ** e > vmax:
        e -= 1
    while Fraction(2) ** (e + 1) <= vmax:
        e += 1
    virtual = vmax + Fraction(2) ** (e - m)
    code_of[virtual] = max_code + 1
    infs = [c for c in range(sign) if dec[c] == math.inf]
    nans = [c for c in range(1 << bits) if isinstance(dec[c], float) and math.isnan(dec[c])]
    neg_zero_is_nan = sign in nans
    nan_code = None
    if nans:
        pos = [c for c in nans if c < sign]
        # the quiet NaN with the top fraction bit: the all-ones exponent with fraction 100...
        nan_code = pos[len(pos) // 2] if len(pos) > 1 else (pos[0] if pos else sign)
    neg_zero = not neg_zero_is_nan and raw[sign] == 0 and math.copysign(1, raw[sign]) < 0
    return Ref(tuple(dec), sign, tuple([Fraction(0)] + values + [virtual]), code_of, vmax,
               max_code, infs[0] if infs else None, nan_code, bool(nans) and not neg_zero_is_nan,
               neg_zero)


REF = {}


def ref(fmt: str) -> Ref:
    """Cached :func:`build`."""
    if fmt not in REF:
        REF[fmt] = build(fmt)
    return REF[fmt]


def _split(x):
    if isinstance(x, Fraction):
        return False, False, x < 0, abs(x)
    xf = float(x)
    if math.isnan(xf):
        return True, False, math.copysign(1, xf) < 0, None
    neg = math.copysign(1, xf) < 0
    if math.isinf(xf):
        return False, True, neg, None
    return False, False, neg, abs(Fraction(xf))


def _up(mode, a, lo, hi, neg, lo_code, hi_code, sr_r, sr_bits):
    if a == lo:
        return False
    if mode == "nearest_even":
        if a - lo != hi - a:
            return hi - a < a - lo
        return hi_code % 2 == 0
    if mode == "nearest_away":
        return hi - a <= a - lo
    if mode == "toward_zero":
        return False
    if mode == "up":
        return not neg
    if mode == "down":
        return neg
    frac = (a - lo) / (hi - lo)
    return math.floor(frac * (1 << sr_bits)) + sr_r >= (1 << sr_bits)


def round_ref(x, fmt: str, mode: str = "nearest_even", saturate: bool = False,
              sr_r: int = 0, sr_bits: int = 32) -> int:
    """Exact reference code of ``x`` (float or Fraction) in ``fmt`` (module docstring)."""
    f = ref(fmt)
    is_nan, is_inf, neg, a = _split(x)
    sgn = f.sign if neg else 0
    if is_nan:
        if f.nan_code is None:
            return f.sign  # no NaN code: the -0 code
        return (f.nan_code | sgn) if f.nan_signed else f.nan_code
    sat = saturate or (f.inf_code is None and f.nan_code is None)
    ovf = (f.inf_code if f.inf_code is not None else f.nan_code)
    ovf = ovf | sgn if f.inf_code is not None or f.nan_signed else ovf
    if is_inf:
        return (f.max_code | sgn) if sat else ovf
    grid = f.grid
    if a >= grid[-1]:
        r = grid[-1]
    else:
        k = bisect_right(grid, a) - 1
        lo, hi = grid[k], grid[k + 1]
        r = hi if _up(mode, a, lo, hi, neg, f.code_of[lo], f.code_of[hi], sr_r, sr_bits) else lo
    if r > f.max:
        if sat or mode == "toward_zero" or (mode == "up" and neg) or (mode == "down" and not neg):
            return f.max_code | sgn
        return ovf
    code = f.code_of[r]
    if code == 0 and not f.neg_zero:
        return 0
    return code | sgn


def round_e8m0(x, mode: str = "nearest_away", saturate: bool = False, sr_r: int = 0,
               sr_bits: int = 32) -> int:
    """Exact reference code of ``x`` in E8M0 (unsigned ``2**(c - 127)``, c = 0..254; 255 NaN):
    NaN, zeros and negatives give 255; below 2**-127 gives 0; overflow 255 (254 saturating or
    under toward_zero / down); +inf 255 (254 saturating)."""
    is_nan, is_inf, neg, a = _split(x)
    if is_nan or neg or (a is not None and a == 0):
        return 255
    if is_inf:
        return 254 if saturate else 255
    e = math.floor(math.log2(a))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    lo, hi = Fraction(2) ** e, Fraction(2) ** (e + 1)
    c = e + 127
    if c < 0:
        return 0
    c = c + (1 if _up(mode, a, lo, hi, False, c, c + 1, sr_r, sr_bits) else 0)
    if c > 254:
        return 254 if (saturate or mode in ("toward_zero", "down")) else 255
    return c
