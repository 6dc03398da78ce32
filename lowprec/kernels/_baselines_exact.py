"""The exact-integer evaluation (``exact=True``) of I-ViT Shiftmax and I-BERT i-exp: the
Numba kernels behind :func:`lowprec.kernels.baselines.ivit_shiftmax` and
:func:`~lowprec.kernels.baselines.ibert_softmax` (whose module docstring gives the arithmetic),
kept apart so that ``baselines.py`` stays under the kernels' 900-line limit.  Only
``baselines.py`` imports this module.
"""

from __future__ import annotations

import math

import numpy as np

from ..formats._jit import jit

IVIT_SUM_MAX = 2**31 - 1  # I-ViT clamps the row sum to the int32 range
IBERT_E16_MAX = 32767  # I-BERT requantises e to 16 bits
IBERT_E16_MIN = -32768
_LOW31 = (1 << 31) - 1  # the low 31 bits of an int64 (the 93-bit product of _mul_shift_rne)
# count slots of the kernels (BaselineStats)
_C_EMPTY, _C_NAN, _C_FLOOR, _C_SUM, _C_REQ, _C_ZERO = range(6)
_NCOUNT = 6


@jit(inline="always")
def _visible(x, vis, use_vis, r, j):
    if use_vis and not vis[r, j]:
        return False
    return x[r, j] != -np.inf


@jit(inline="always")
def _row_scan_exact(x, vis, use_vis, r, s, xi, used):
    """Exact ``RNE(x / s)`` of the visible entries of row r; returns (count, max, bad)."""
    L = x.shape[1]
    cnt = 0
    bad = False
    m = np.int64(-(2**62))
    for j in range(L):
        u = _visible(x, vis, use_vis, r, j)
        used[j] = u
        if not u:
            continue
        v = np.float64(x[r, j])
        if not v < np.inf:
            bad = True
            xi[j] = 0
            cnt += 1
            continue
        t = np.int64(np.rint(v / s))
        xi[j] = t
        if t > m:
            m = t
        cnt += 1
    return cnt, m, bad


@jit
def _ivit_exact(x, vis, s, x0, n, out_bits, y, counts):
    R, L = x.shape
    use_vis = vis.shape[0] > 0
    xi = np.empty(L, np.int64)
    e = np.empty(L, np.int64)
    used = np.empty(L, np.bool_)
    nx0 = np.int64(n) * x0
    sh_out = 32 - out_bits
    for r in range(R):
        cnt, m, bad = _row_scan_exact(x, vis, use_vis, r, s, xi, used)
        if cnt == 0 or bad:
            counts[_C_EMPTY if cnt == 0 else _C_NAN] += 1
            for j in range(L):
                y[r, j] = np.nan
            continue
        z = np.int64(0)
        for j in range(L):
            if not used[j]:
                continue
            t = xi[j] - m
            t = t + (t >> 1) - (t >> 4)  # floor(t/2), floor(t/16): arithmetic shifts
            if t < nx0:
                t = nx0
                counts[_C_FLOOR] += 1
            q = t // x0  # floor division (Python semantics)
            rr = t - x0 * q
            w = rr - 2 * x0  # (r/2 - x0) * 2**(n-q) = w * 2**(n-q-1), w > 0
            k = n - q
            if k >= 1:
                ev = w << (k - 1)
            else:
                ev = w >> (1 - k)
            if ev < 0:
                ev = 0
            e[j] = ev
            if z < IVIT_SUM_MAX:  # saturating sum (no int64 overflow)
                z += ev
        if z >= IVIT_SUM_MAX:
            z = IVIT_SUM_MAX
            counts[_C_SUM] += 1
        f = np.int64(2**31) // z
        for j in range(L):
            if not used[j]:
                y[r, j] = 0.0
                continue
            v = (e[j] * f) >> sh_out
            y[r, j] = np.float32(v)
            if v == 0:
                counts[_C_ZERO] += 1


@jit
def _ibert_exp_exact(x, vis, s, x0i, bi, ci, n, zq, qq, rowflag, counts):
    """Pass 1 (exact): z (>= 0) and q per visible entry (z = -1 for entries that take no
    part).  Returns max(z * 2**(n - q)) in float64 (-1 when none)."""
    R, L = x.shape
    use_vis = vis.shape[0] > 0
    xi = np.empty(L, np.int64)
    used = np.empty(L, np.bool_)
    nx0 = np.int64(n) * x0i
    emax = -1.0
    for r in range(R):
        cnt, m, bad = _row_scan_exact(x, vis, use_vis, r, s, xi, used)
        if cnt == 0 or bad:
            rowflag[r] = 1 if cnt == 0 else 2
            counts[_C_EMPTY if cnt == 0 else _C_NAN] += 1
            for j in range(L):
                zq[r, j] = -1
            continue
        rowflag[r] = 0
        for j in range(L):
            if not used[j]:
                zq[r, j] = -1
                continue
            t = xi[j] - m
            if t < nx0:
                t = nx0
                counts[_C_FLOOR] += 1
            q = t // x0i
            rr = t - x0i * q
            zz = rr * (rr + bi) + ci
            if zz < 0:
                zz = 0
            zq[r, j] = zz
            qq[r, j] = q
            ev = np.float64(zz) * math.ldexp(1.0, int(n - q))
            if ev > emax:
                emax = ev
    return emax


@jit(inline="always")
def _mul_shift_rne(z, m, k):
    """``RNE(z * m / 2**k)`` exactly for 0 <= z < 2**62, 0 <= m <= 2**31 and any int k;
    results above about 2**50 are returned as 2**62 (callers clamp far below that)."""
    if z == 0 or m == 0:
        return np.int64(0)
    sat = np.int64(2**62)
    if np.float64(z) * np.float64(m) * math.ldexp(1.0, -k) > 2.0**50:
        return sat
    zh = z >> 31
    zl = z & _LOW31
    hi = zh * m  # z * m = hi * 2**31 + lo, hi and lo < 2**62
    lo = zl * m
    if k <= 0:  # the result (<= 2**50) is z * m << -k: no overflow
        return ((hi << 31) + lo) << (-k)
    if k <= 31:
        qv = (hi << (31 - k)) + (lo >> k)
        rem = lo & ((np.int64(1) << k) - 1)
        halfv = np.int64(1) << (k - 1)
        if rem > halfv or (rem == halfv and (qv & 1) == 1):
            qv += 1
        return qv
    # k > 31: v = c * 2**31 + low with c = hi + (lo >> 31)
    c = hi + (lo >> 31)
    low = lo & _LOW31
    kk = k - 31
    if kk >= 63:
        return np.int64(0)  # v < 2**94 <= 2**(k-1): rounds to 0
    qv = c >> kk
    rem_hi = c & ((np.int64(1) << kk) - 1)
    half_hi = np.int64(1) << (kk - 1)  # half = 2**(k-1) = half_hi * 2**31 (low part 0)
    up = rem_hi > half_hi or (rem_hi == half_hi and (low > 0 or (qv & 1) == 1))
    if up:
        qv += 1
    return qv


@jit
def _ibert_norm_exact(zq, qq, rowflag, m31, shift, n, out_bits, y, counts):
    R, L = zq.shape
    e16 = np.empty(L, np.int64)
    sh_out = 32 - out_bits
    for r in range(R):
        if rowflag[r] != 0:
            for j in range(L):
                y[r, j] = np.nan
            continue
        z = np.int64(0)
        for j in range(L):
            zz = zq[r, j]
            if zz < 0:
                continue
            v = _mul_shift_rne(zz, m31, shift - (n - qq[r, j]))
            if v > IBERT_E16_MAX:
                v = IBERT_E16_MAX
                counts[_C_REQ] += 1
            e16[j] = v
            z += v
        f = np.int64(2**32) // z
        for j in range(L):
            if zq[r, j] < 0:
                y[r, j] = 0.0
                continue
            v = (e16[j] * f) >> sh_out
            y[r, j] = np.float32(v)
            if v == 0:
                counts[_C_ZERO] += 1
