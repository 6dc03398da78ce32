"""HiFloat8 (HiF8): Huawei's tapered 8-bit float (formats.md section 1).

Bit layout ``S | Dot (prefix code) | Exponent (D bits, sign-magnitude, hidden MSB) | Mantissa``::

    Dot  D    exponent field   mantissa w   exponents E      positive codes
    11   4    Se + 3 bits      1            +-[8, 15]        0x60-0x7F
    10   3    Se + 2 bits      2            +-[4, 7]         0x40-0x5F
    01   2    Se + 1 bit       3            +-[2, 3]         0x20-0x3F
    001  1    Se               3            +-1              0x10-0x1F
    0001 0    -                3            0                0x08-0x0F
    0000 DML  -                (3 bits = M) 2^(M-23)         0x01-0x07 (0x00 = zero)

    normal value = (-1)^S * 2^E * (1 + M / 2^w);  E = (-1)^Se * (2^(D-1) + tail)
    0x00 = 0 (no -0), 0x80 = NaN (the only NaN), 0x6F / 0xEF = +-Inf, max finite 2^15 (0x6E),
    min normal 2^-15 (0x7E), DML powers of two 2^-22 .. 2^-16 (0x01 .. 0x07).

Code order is not monotonic in value: compare decoded values, never codes.

Encoding reuses the generic float codec of ``minifloat.py`` (the rounding arithmetic is the same;
only ``m(E)`` and the code of each binade differ, given here as tables).  Default rounding is
``nearest_away`` (the paper's TA, formats.md 1.4).  Non-saturating overflow (|x| >= 40960 under
TA) gives +-Inf; ``saturate=True`` gives +-32768 for overflow and +-Inf (formats.md 1.4; which
inputs count as overflow in saturating mode is our reading: exactly those TA sends to Inf).
NaN always encodes to 0x80 (the Ascend "NaN -> 0" saturation option is not offered).

``hybrid`` rounding is provisional (formats.md 1.6, our reading, not a Huawei-verified rule):
for float32 sources with ``4 <= |E|`` (E the source exponent, E >= -22) the magnitude rounds up
iff ``F14 >= T14`` and the input is not exact, where F14 = the 14 most significant discarded
fraction bits and T14 = the 14 least significant fraction bits; otherwise ties away.  It is
only implemented for float32 (and float16/bfloat16, widened to float32) inputs; float64 input
raises.  The fp16/bf16 "SR2" variant of the paper is not implemented.
"""

from __future__ import annotations

import math

import numpy as np

from ._bits import shl32, shr32
from ._jit import jit
from .core import Format, FormatInfo, Rounding, _register
from .minifloat import FloatSpec

HIF8_MAX = 32768.0  # 2^15, code 0x6E (formats.md 1.2)
HIF8_MIN_NORMAL = 2.0**-15  # code 0x7E
HIF8_MIN_SUBNORMAL = 2.0**-22  # DML code 0x01
HIF8_INF = 0x6F
HIF8_NAN = 0x80
HIF8_MAX_CODE = 0x6E
HIF8_E_LO = -22  # lowest binade (DML 2^-22)
HIF8_EMAX = 15


def mantissa_bits(e: int) -> int:
    """Mantissa width ``w`` of the HiF8 binade with exponent ``e`` (formats.md 1.1)."""
    a = abs(e)
    if a <= 3:
        return 3
    if a <= 7:
        return 2
    if a <= 15:
        return 1
    if -22 <= e <= -16:
        return 0
    raise ValueError(f"HiF8 has no binade with exponent {e}")


def binade_code(e: int) -> int:
    """Positive HiF8 code of ``2**e`` (mantissa 0), ``-22 <= e <= 15`` (formats.md 1.1)."""
    if -22 <= e <= -16:
        return e + 23  # DML
    a, se = abs(e), (1 if e < 0 else 0)
    if a == 0:
        return 0x08
    if a == 1:
        return 0x10 | (se << 3)
    if a <= 3:
        return 0x20 | (se << 4) | ((a - 2) << 3)
    if a <= 7:
        return 0x40 | (se << 4) | ((a - 4) << 2)
    if a <= 15:
        return 0x60 | (se << 4) | ((a - 8) << 1)
    raise ValueError(f"HiF8 has no binade with exponent {e}")


def _decode_code(c: int) -> float:
    """Value of one HiF8 code, read from its bit fields (formats.md 1.1, 1.2)."""
    if c == HIF8_NAN:
        return math.nan
    s = -1.0 if c & 0x80 else 1.0
    b = c & 0x7F
    if b == HIF8_INF:
        return s * math.inf
    if b >> 5 == 0b11:
        d, w, rest = 4, 1, b & 0x1F
    elif b >> 5 == 0b10:
        d, w, rest = 3, 2, b & 0x1F
    elif b >> 5 == 0b01:
        d, w, rest = 2, 3, b & 0x1F
    elif b >> 4 == 0b001:
        d, w, rest = 1, 3, b & 0x0F
    elif b >> 3 == 0b0001:
        d, w, rest = 0, 3, b & 0x07
    else:  # DML
        return 0.0 if b == 0 else s * 2.0 ** ((b & 7) - 23)
    mant = rest & ((1 << w) - 1)
    expfield = rest >> w  # d bits: Se then d-1 tail bits
    if d == 0:
        e = 0
    else:
        se = expfield >> (d - 1)
        tail = expfield & ((1 << (d - 1)) - 1)
        e = (-1 if se else 1) * ((1 << (d - 1)) + tail)
    return s * 2.0**e * (1 + mant / (1 << w))


@jit(inline="always")
def _code_of_bits32(r):
    """Positive HiF8 code of a float32 magnitude on the HiF8 grid, from its bits ``r`` (uint32),
    in branch-free 32-bit arithmetic for the vectorized encoders.

    ``r`` may carry nonzero bits below the binade's ``w`` mantissa bits (they are ignored:
    truncation), so a ties-away encoder can pass ``|x| + half`` unshifted.  Valid for
    ``2**-22 <= value < 2**16``; Inf/overflow/NaN are the caller's (tested equal to
    :func:`binade_code` plus the mantissa on every binade).

    With ``a = |E|`` and ``w`` the binade's mantissa width, ``x = a << 3 | m3`` (``m3`` the top
    3 mantissa bits): for ``|E| >= 2`` (``D = 5 - w`` exponent bits) the code
    ``(D - 1) << 5 | Se << 4 | (a - 2**(D-1)) << w | m3 >> (3 - w)`` equals
    ``(x >> (3 - w)) + ((4 - w) << 5) + 16 * Se - 16``, because ``2**(D-1) << w == 16``;
    ``|E| <= 1`` (prefixes 001 and 0001) is ``x + 8 + 8 * Se`` and the DML binades are ``E + 23``.
    """
    U = np.uint32
    I = np.int32
    e = I(I(shr32(r, U(23))) - I(127))
    a = max(e, I(-e))
    w = I(I(I(I(3) - I(a >= I(4))) - I(a >= I(8))) - I(a >= I(16)))
    se16 = shl32(shr32(U(e), U(31)), U(4))  # 16 * Se
    x = U(shl32(U(a), U(3)) | U(shr32(r, U(20)) & U(7)))
    c = U(U(shr32(x, U(I(3) - w)) + shl32(U(I(4) - w), U(5))) + U(se16 - U(16)))
    c = U(U(x + U(8)) + shr32(se16, U(1))) if a <= I(1) else c
    return U(e + I(23)) if e <= I(-16) else c


HIF8_VALUES = np.array([_decode_code(c) for c in range(256)], dtype=np.float32)

_E_RANGE = range(HIF8_E_LO, HIF8_EMAX + 2)
HIF8_SPEC = FloatSpec(
    name="hif8",
    e_lo=HIF8_E_LO,
    emax=HIF8_EMAX,
    fracmax=0,
    m=-1,
    # e = 16 only occurs on overflow; any width works there
    m_tab=[mantissa_bits(e) if e <= HIF8_EMAX else 1 for e in _E_RANGE],
    base_tab=[binade_code(e) if e <= HIF8_EMAX else 0 for e in _E_RANGE],
    taper=(4, 8, 16),  # w = 3 - #{4, 8, 16 <= |E|}
    code_fn=_code_of_bits32,
    neg_zero=False,
    inf_code=HIF8_INF,
    nan_code=HIF8_NAN,
    nan_signed=False,
    max_code=HIF8_MAX_CODE,
    max_value=HIF8_MAX,
)

HIF8_INFO = FormatInfo(
    name="hif8", bits=8, kind="float", max=HIF8_MAX, min_normal=HIF8_MIN_NORMAL,
    min_subnormal=HIF8_MIN_SUBNORMAL, has_inf=True, has_nan=True, has_neg_zero=False,
    nan_codes=(HIF8_NAN,), inf_codes=(HIF8_INF, HIF8_INF | 0x80), nan_code=HIF8_NAN,
    max_code=HIF8_MAX_CODE, default_rounding=Rounding.NEAREST_AWAY,
    doc="HiFloat8: tapered precision (3/2/1 mantissa bits), exponents -22..15 (formats.md 1)",
)

_register(Format(HIF8_INFO, HIF8_VALUES, HIF8_SPEC))
