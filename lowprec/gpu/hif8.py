"""Triton twin of :func:`lowprec.formats.hif8._code_of_bits32`: the positive HiF8 code of a
float32 magnitude on the HiF8 grid, from its bits, in 32-bit integer arithmetic.

The derivation (prefix-code fields as one shift and two adds) is in the CPU function's docstring;
this is the same expression, line for line.  The binade widths come from ``HIF8_SPEC.taper``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..formats.hif8 import HIF8_SPEC

_T0 = tl.constexpr(HIF8_SPEC.taper[0])
_T1 = tl.constexpr(HIF8_SPEC.taper[1])
_T2 = tl.constexpr(HIF8_SPEC.taper[2])
_M_MAX = tl.constexpr(int(HIF8_SPEC.m_tab.max()))
_DML_TOP = tl.constexpr(-16)  # binades E <= -16 are the DML powers of two, code E + 23
_DML_OFF = tl.constexpr(23)


@triton.jit
def _code_of_bits32(r):
    """Positive HiF8 code of uint32 float32 bits ``r`` on the grid (bits below the binade's
    mantissa width are ignored); valid for ``2**-22 <= value < 2**16``."""
    e = (r >> 23).to(tl.int32) - 127
    a = tl.maximum(e, -e)
    w = _M_MAX - (a >= _T0).to(tl.int32) - (a >= _T1).to(tl.int32) - (a >= _T2).to(tl.int32)
    se16 = ((e.to(tl.uint32, bitcast=True) >> 31) << 4)  # 16 * Se
    x = (a.to(tl.uint32) << 3) | ((r >> 20) & 7)
    c = (x >> (3 - w).to(tl.uint32)) + ((4 - w).to(tl.uint32) << 5) + (se16 - 16)
    c = tl.where(a <= 1, x + 8 + (se16 >> 1), c)
    return tl.where(e <= _DML_TOP, (e + _DML_OFF).to(tl.uint32), c)
