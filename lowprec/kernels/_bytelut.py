"""Table-driven float32 -> 8-bit-float rounding for the attention engine's hot loop.

Every 8-bit float format the engine rounds to (HiF8, E4M3, E5M2) has at most 3 mantissa bits, and
within one float32 binade (one value of the 8-bit exponent field ``E``) its grid has a fixed width
``w(E)`` (3, 2, 1, 0 mantissa bits, or -1 for the binade just below the smallest subnormal).
Rounding ``|x|`` to that grid is then one integer add on the float32 bits followed by a
truncation to the top 11 magnitude bits (8 exponent + 3 mantissa):

* ties away from zero (HiF8): ``a + half(E)``;
* ties to even (E4M3/E5M2): ``a + half(E) - 1 + lsb``, where ``lsb`` is the grid's last kept bit
  (bit ``23 - w`` of ``a``) or, where the grid has no mantissa bit (``w <= 0``), the constant parity
  of the code in that binade folded into the add;

where ``half(E)`` is half a grid step in float32 bit units.  A carry out of the mantissa moves
into the next binade with zeros where the grid has bits, so truncation stays correct.  A
4096-entry table (sign, 11 bits) then gives the 8-bit code, with saturation/overflow, signed
zero and NaN already decided by the format's own scalar encoder.  NaN inputs take a separate
branch (their top mantissa bits may be zero).

The tables are built from the verified scalar encoders (``formats.minifloat.scalar_code32``),
and :func:`verify` compares the table path with them on every float32 bit pattern (run by
``tests/test_bytelut.py`` on a sample and by ``scripts/`` exhaustively).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._bits import F32_ABS, F32_EXP
from ..formats._jit import jit

NO_LSB = np.uint32(31)  # shift that always yields lsb 0 (|x| < 2**31)
IDX_NAN_BITS = np.uint32(0x7FF)  # index of a positive NaN (exponent 255, mantissa 111)


@jit(inline="always")
def lut_index(u, addm1, sh):
    """Table index of the float32 bit pattern ``u`` (uint32): sign bit 11, then the rounded
    top 11 magnitude bits."""
    a = np.uint32(u & np.uint32(F32_ABS))
    sign = np.uint32((u >> np.uint32(20)) & np.uint32(0x800))
    if a > np.uint32(F32_EXP):
        return np.uint32(sign | IDX_NAN_BITS)
    e = a >> np.uint32(23)
    r = np.uint32(a + addm1[e] + ((a >> sh[e]) & np.uint32(1)))
    return np.uint32(sign | (r >> np.uint32(20)))


def _widths(values: np.ndarray) -> list:
    """Grid width w(E) per float32 exponent field E: 0..3, -1 (half-min binade), or None
    (nothing representable: below the range, or above the largest finite value)."""
    pos = np.unique(values[np.isfinite(values) & (values > 0)].astype(np.float64))
    tiny = pos.min()
    out = []
    for E in range(256):
        if E == 0 or E == 255:
            out.append(None)
            continue
        lo, hi = 2.0 ** (E - 127), 2.0 ** (E - 126)
        n = int(((pos >= lo) & (pos < hi)).sum())
        if n:
            w = int(np.ceil(np.log2(n)))
            if w > 3:
                raise ValueError("format has more than 3 mantissa bits")
            out.append(w)
        elif tiny == hi:
            out.append(-1)
        else:
            out.append(None)
    return out


def build_tables(values: np.ndarray, encode, ties_even: bool, extra_points=()):
    """``(addm1 uint32[256], sh uint32[256], lut uint8[4096])`` for a format.

    Args:
        values: float values of the format's 256 codes (NaN where a code is NaN).
        encode: the format's encoder on a float32 numpy array (-> uint8 codes), with the
            rounding and saturation wanted.
        ties_even: ties to even (True) or away from zero (False).
        extra_points: positive grid points that are not finite codes but take part in
            rounding (HiF8: the virtual 49152 standing for Inf, formats.md 1.4).
    """
    widths = _widths(np.concatenate([values, np.asarray(extra_points, dtype=np.float64)]))
    fmax = float(np.max(values[np.isfinite(values)]))
    addm1 = np.zeros(256, dtype=np.uint32)
    sh = np.full(256, NO_LSB, dtype=np.uint32)
    for E, w in enumerate(widths):
        if w is None:
            continue
        p = 23 - w  # bit of one grid step
        half = 1 << (p - 1)
        if not ties_even:
            addm1[E] = half
        elif w >= 1:
            addm1[E] = half - 1
            sh[E] = p
        else:
            # one grid point below (2**e for w = 0, zero for w = -1): its code parity decides
            below = 0.0 if w < 0 else 2.0 ** (E - 127)
            lsb = int(encode(np.array([below], dtype=np.float32))[0]) & 1
            addm1[E] = half - 1 + lsb
    reps = np.zeros(4096, dtype=np.float32)
    for idx in range(4096):
        sign = -1.0 if idx & 0x800 else 1.0
        E = (idx >> 3) & 0xFF
        m3 = idx & 7
        if E == 255:
            val = np.inf if m3 == 0 else np.nan
        elif E == 0:
            val = 0.0
        else:
            w = widths[E]
            if w is None:
                # below the range: rounds to zero; above it: the encoder decides (overflow)
                val = 2.0 ** (E - 127) if 2.0 ** (E - 127) > fmax else 0.0
            elif w < 0:
                val = 0.0
            else:
                keep = (m3 >> (3 - w)) << (3 - w)
                val = (1.0 + keep / 8.0) * 2.0 ** (E - 127)
        reps[idx] = sign * val
    # NaN: the encoder's answer for a quiet NaN of each sign (the index keeps the sign)
    reps.view(np.uint32)[0x7FF] = 0x7FC00000
    reps.view(np.uint32)[0xFFF] = 0xFFC00000
    with np.errstate(invalid="ignore"):
        lut = np.asarray(encode(reps), dtype=np.uint8)
    return addm1, sh, lut


@jit(parallel=True)
def _count_mismatch(encode_bits, addm1, sh, lut, start, stop, nchunks):
    bad = np.zeros(nchunks, dtype=np.int64)
    step = (stop - start + nchunks - 1) // nchunks
    for c in prange(nchunks):
        lo = start + c * step
        hi = min(stop, lo + step)
        n = 0
        for x in range(lo, hi):
            u = np.uint32(x)
            if lut[lut_index(u, addm1, sh)] != encode_bits(u):
                n += 1
        bad[c] = n
    return bad.sum()


@jit
def _codes_of(u, addm1, sh, lut, encode_bits, got, want):
    for i in range(u.shape[0]):
        got[i] = lut[lut_index(u[i], addm1, sh)]
        want[i] = encode_bits(u[i])


def codes_of(u: np.ndarray, addm1, sh, lut, encode_bits):
    """``(table codes, encoder codes)`` of the float32 bit patterns ``u`` (uint32 array)."""
    got = np.empty(u.shape[0], dtype=np.uint8)
    want = np.empty(u.shape[0], dtype=np.uint8)
    _codes_of(np.ascontiguousarray(u, dtype=np.uint32), addm1, sh, lut, encode_bits, got, want)
    return got, want


def verify(encode_bits, tables, start: int = 0, stop: int = 1 << 32) -> int:
    """Number of float32 bit patterns in ``[start, stop)`` where the table path differs from
    ``encode_bits`` (0 expected; the full range takes ~10 s per format on 2 cores)."""
    addm1, sh, lut = tables
    return int(_count_mismatch(encode_bits, addm1, sh, lut, start, stop, 256))



__all__ = ["lut_index", "build_tables", "verify", "codes_of"]
