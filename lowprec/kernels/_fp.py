"""Scalar float helpers shared by the kernels: float16/bfloat16 rounding on the bits, the float32
``exp2`` and one-rounding float32 arithmetic (inside Numba code only).

Every helper is exact to the bit and documented with the rounding it performs; the kernels of
several schemes call them, so they live here and not in one scheme's module.
"""

from __future__ import annotations

import numpy as np

from ..formats._bits import (
    BF16_DROP,
    BF16_KEEP,
    F16_DROP,
    F16_KEEP,
    F16_MAX,
    F16_MIN_NORMAL,
    F32_ABS,
    F32_EXP,
    F32_SIGN,
    f32_as_u32,
    f64_as_u64,
    u32_as_f32,
)
from ..formats._jit import jit

_F16_HALF_ULP = (1 << (F16_DROP - 1)) - 1  # 0xFFF: half a float16 step, minus one (ties even)
_BF16_HALF_ULP = (1 << (BF16_DROP - 1)) - 1  # 0x7FFF


@jit(inline="always")
def round_f16(x):
    """float32 -> nearest float16 (ties to even) -> float32, Inf/NaN kept."""
    u = f32_as_u32(x)
    a = np.uint32(u & np.uint32(F32_ABS))
    if a >= np.uint32(F32_EXP):
        return x
    if a < np.uint32(F16_MIN_NORMAL):  # below 2**-14: fixed spacing 2**-24 (add-and-subtract)
        half = np.float32(0.5)
        r = np.float32(np.float32(abs(x) + half) - half)
        return -r if x < 0 else r
    lsb = np.uint32((a >> np.uint32(F16_DROP)) & np.uint32(1))
    r = np.uint32(np.uint32(a + np.uint32(_F16_HALF_ULP) + lsb) & np.uint32(F16_KEEP))
    if r > np.uint32(F16_MAX):  # above 65504
        r = np.uint32(F32_EXP)
    return u32_as_f32(np.uint32(r | np.uint32(u & np.uint32(F32_SIGN))))


@jit(inline="always")
def round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even) -> float32, NaN kept."""
    u = f32_as_u32(x)
    if np.uint32(u & np.uint32(F32_ABS)) > np.uint32(F32_EXP):
        return x
    lsb = np.uint32((u >> np.uint32(BF16_DROP)) & np.uint32(1))
    return u32_as_f32(np.uint32(np.uint32(u + np.uint32(_BF16_HALF_ULP) + lsb)
                                & np.uint32(BF16_KEEP)))


@jit(inline="always")
def exp2_f32(x):
    """``float32(exp2(float64(x)))``: the correctly rounded float32 ``2**x`` (for float32 x)."""
    return np.float32(np.exp2(np.float64(x)))


#: Taylor coefficients ``ln(2)**n / n!`` of ``2**f`` (float64, n = 0 .. 13): truncation below
#: 1e-17 relative on ``|f| <= 1/2``
_EXP2_C = (1.0, 0.6931471805599453, 0.24022650695910072, 0.05550410866482158,
           0.009618129107628477, 0.0013333558146428443, 0.0001540353039338161,
           1.5252733804059841e-05, 1.321548679014431e-06, 1.01780860092397e-07,
           7.054911620801123e-09, 4.4455382718708116e-10, 2.5678435993488206e-11,
           1.3691488853904128e-12)
_EXP2_DROP = 29  # float64 fraction bits that a float32 rounding drops
_EXP2_GUARD = 256  # float64 ulps around a float32 rounding midpoint where it defers (> 20x
# the error bound of both evaluations: Horner's few ulps here, glibc's exp2 1 ulp)
_EXP2_UNSURE = np.float32(-1.0)


@jit(inline="always")
def exp2_f32_or_unsure(x):
    """:func:`exp2_f32` of a float32 ``x`` without a libm call, so that loops of it vectorize:
    ``2**x = 2**k 2**f`` (``k = rint(x)``, ``f = x - k`` exact) with ``2**f`` by a degree-13
    polynomial (relative error a few float64 ulps), rounded to float32.  Where that rounding
    cannot be told apart from :func:`exp2_f32`'s (the float64 value within
    ``_EXP2_GUARD`` ulps of a float32 midpoint, about one ``x`` in 10**6) and outside
    ``[-126, 127]`` (subnormal, overflowing or NaN results) it returns -1 and the caller calls
    :func:`exp2_f32` (the fast path's results are those bits: both evaluations are within a
    few ulps of ``2**x``, so one on the far side of every midpoint rounds alike).  Checked
    exhaustively over every float32 ``x`` (tests/test_exhaustive.py)."""
    xd = np.float64(x)
    inside = (xd >= -126.0) & (xd <= 127.0)
    xc = xd if inside else 0.0
    k = np.rint(xc)
    f = xc - k
    c = _EXP2_C
    p = c[13]
    p = p * f + c[12]
    p = p * f + c[11]
    p = p * f + c[10]
    p = p * f + c[9]
    p = p * f + c[8]
    p = p * f + c[7]
    p = p * f + c[6]
    p = p * f + c[5]
    p = p * f + c[4]
    p = p * f + c[3]
    p = p * f + c[2]
    p = p * f + c[1]
    p = p * f + c[0]
    r = p * np.float64(u32_as_f32(np.uint32((np.int64(k) + 127) << 23)))  # exact scaling
    low = np.int64(f64_as_u64(r) & np.uint64((1 << _EXP2_DROP) - 1))
    sure = inside & (abs(low - (1 << (_EXP2_DROP - 1))) > _EXP2_GUARD)
    return np.float32(r) if sure else _EXP2_UNSURE


# one correctly rounded float32 operation each.  On float32 operands Numba computes them as
# float32 instructions (which LLVM can vectorize); that is the same bits as computing in float64
# and rounding once (exact for +, -, *, / of float32 operands since 53 >= 2 * 24 + 2).  An
# operand of another type is promoted as NumPy does and the result rounded once to float32.


@jit(inline="always")
def add32(a, b):
    """``fl32(a + b)``."""
    return np.float32(a + b)


@jit(inline="always")
def sub32(a, b):
    """``fl32(a - b)``."""
    return np.float32(a - b)


@jit(inline="always")
def mul32(a, b):
    """``fl32(a * b)``."""
    return np.float32(a * b)


@jit(inline="always")
def div32(a, b):
    """``fl32(a / b)``."""
    return np.float32(a / b)


@jit(inline="always")
def floor32(a):
    """``floor(a)`` as float32 (exact)."""
    return np.float32(np.floor(a))


@jit(inline="always")
def order_key(b):
    """An integer key of float32 bits ``b`` (int64) ordered as the floats (its own inverse)."""
    return b ^ ((b >> 31) & F32_ABS)


@jit(inline="always")
def dense_max(x, r):
    """``(ok, max)`` of float32 row ``x[r]``, taken on the bits (branch-free: LLVM vectorizes
    it): ``ok`` when every entry is finite and the maximum is not zero (the rows a kernel's
    dense path takes; a zero maximum leaves the sign of the first maximal zero to the general
    path)."""
    L = x.shape[1]
    fin = True
    mk = np.int64(-(2**31))
    for j in range(L):
        b = np.int64(np.int32(f32_as_u32(x[r, j])))
        mk = max(mk, order_key(b))
        fin &= (b & F32_EXP) != F32_EXP
    mx = u32_as_f32(np.uint32(order_key(mk) & 0xFFFFFFFF))
    return fin and L > 0 and mx != 0, mx


__all__ = ["order_key", "dense_max", "round_f16", "round_bf16", "exp2_f32", "exp2_f32_or_unsure",
           "add32", "sub32",
           "mul32", "div32", "floor32"]
