"""QFlash's Numba code (specs/attention.md section 4; seed ``qflash.txt`` Algorithms 1 and 2,
equations 13-16): the int32 scalar primitives (ShiftExp2, requantization, ScaleRelease and the
Scale Accumulation step, two's-complement wraps, the GPU's clamped shifts and saturating
float-to-int conversion) and the row kernel of Algorithm 1, kept apart so that ``qflash.py``
(whose module docstring gives every choice) stays under the kernels' 900-line limit.  The
kernel's functions are private to ``qflash.py``; ``qflash_device.py`` (their torch twin) reads
the constants and counter columns here.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._jit import jit
from ._gemm import RED, ROWS, pv_tile
from ._int8 import F32_EXACT

SHIFT_EXP = 16  # attention.md 4 / Alg. 2 eq. 16: fixed-point bits of exp_M and req_M
SHIFT_RELEASE = 30  # attention.md 4: fixed-point bits of l_M and acc_M (ScaleRelease)
MASK_BIAS = -(1 << 20)  # int32 score of a padded key / bias of a masked key (authors' NEG_INF)
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
# counter columns of the kernel (per batch entry)
(_C_TILES, _C_RESCALES, _C_EXP_OVF, _C_REQ_WRAP, _C_I32_WRAP, _C_OUT_WRAP, _C_ZERO_DEN,
 _C_NEG_EXP, _C_M_INIT) = range(9)
_NCOUNT = 9
_ROWS_PER_TASK = 16
_TILE32_KEYS = (1 << 31) // (128 * 128) - 1  # keys whose int8 products P8 v8 sum in int32


# ------------------------------------------------------------------------------------------
# scalar integer primitives (int64 holding int32 values)


@jit(inline="always")
def _wrap32(x):
    return ((x + 0x80000000) & 0xFFFFFFFF) - 0x80000000


@jit(inline="always")
def _wrap8(x):
    return ((x + 128) & 0xFF) - 128


@jit(inline="always")
def _ashr(a, n):
    """Arithmetic shift of an int32 value with the GPU's clamped count: a count outside
    [0, 31] fills with the sign (a shift by 63 of the int64 holding it; no branch)."""
    return a >> (n if (n >= 0) & (n <= 31) else np.int64(63))


@jit(inline="always")
def _tdiv(a, b):
    """C (truncating) integer division, b != 0."""
    qq = abs(a) // abs(b)
    return -qq if (a < 0) != (b < 0) else qq


@jit(inline="always")
def _shexp(x, R, exp_M, division):
    """ShiftExp2 of an int32 ``x``: ``(y, overflow of x * exp_M, other int32 wraps)``.  Written
    without branches (the counts are sums of comparisons), so that loops of it vectorize."""
    if division:
        nx = _wrap32(-x)
        wr = np.int64(nx != -x)
        q = _tdiv(nx, R)
        ovf = np.int64(0)
    else:
        prod = x * exp_M
        w = _wrap32(prod)
        ovf = np.int64(w != prod)
        q = w >> SHIFT_EXP
        wr = np.int64(0)
    t = q * R
    qr = _wrap32(t)
    wr += qr != t
    t = x + qr
    r = _wrap32(t)
    wr += r != t
    t = (r >> 1) + R
    u = _wrap32(t)
    wr += u != t
    return _ashr(u, q), ovf, wr


@jit(inline="always")
def _requant(p, req_M):
    """``(int8 value, wrapped to int8, other int32 wraps)`` (no branches)."""
    t = p * req_M
    a = _wrap32(t)
    wr = np.int64(a != t)
    t = a + (1 << (SHIFT_EXP - 1))
    b = _wrap32(t)
    wr += b != t
    c = b >> SHIFT_EXP
    y = _wrap8(c)
    return y, np.int64(y != c), wr


@jit(inline="always")
def _release(x, alpha, M):
    """ScaleRelease: int64 product (wrapping), rounding shift by 30, int32 wrap."""
    t = np.int64(x) * np.int64(alpha)
    t = t * np.int64(M)
    t = t + np.int64(1 << (SHIFT_RELEASE - 1))
    t = t >> SHIFT_RELEASE
    y = _wrap32(t)
    return y, (1 if y != t else 0)


@jit(inline="always")
def _carry(x, alpha, M, term, f, accumulate):
    """One update of the running ``l`` or ``acc`` by a tile's ``term`` (its ``rowsum(P8)`` or
    ``P8 v8``): ``int32(ScaleRelease(x, alpha, M) + term)`` (eq. 14), or with ``accumulate``
    Scale Accumulation (eq. 13): ``int32(int32(x * alpha) + int32(term * f))`` where ``f`` is
    the tile's accumulated scale ``R**t`` (int32).  Returns ``(value, int32 wraps)``."""
    if accumulate:
        t = x * alpha
        a = _wrap32(t)
        wr = np.int64(a != t)
        t = term * f
        b = _wrap32(t)
        wr += b != t
    else:
        a, wr = _release(x, alpha, M)
        b = term
    raw = a + b
    y = _wrap32(raw)
    return y, wr + (y != raw)


@jit(inline="always")
def _f32_to_i32(v):
    """float32 -> int32 toward zero, saturating, NaN -> 0 (the GPU's cvt.rzi.s32.f32)."""
    if v != v:
        return 0
    if v >= 2147483648.0:
        return INT32_MAX
    if v < -2147483648.0:
        return INT32_MIN
    return np.int64(v)


# ------------------------------------------------------------------------------------------
# elementwise kernels behind the public primitives


@jit
def _shift_exp2_arr(x, R, exp_M, division, out):
    for i in range(x.size):
        y, _, _ = _shexp(np.int64(x[i]), R, exp_M, division)
        out[i] = y


@jit
def _requant_arr(p, req_M, out):
    for i in range(p.size):
        y, _, _ = _requant(np.int64(p[i]), req_M)
        out[i] = y


@jit
def _release_arr(x, alpha, M, out):
    for i in range(x.size):
        y, _ = _release(np.int64(x[i]), np.int64(alpha[i]), M)
        out[i] = y


# ------------------------------------------------------------------------------------------
# the attention kernel


@jit(inline="always")
def _acc_update(acc, r, tile, alpha, acc_M, f, accumulate):
    """``acc[r] = _carry(acc[r], alpha, acc_M, tile, f, accumulate)``; returns the int32
    wraps."""
    wraps = 0
    for c in range(acc.shape[1]):
        a32, wr = _carry(acc[r, c], alpha, acc_M, tile[c], f, accumulate)
        wraps += wr
        acc[r, c] = a32
    return wraps


@jit(parallel=True)
def _qflash_kernel(S, v, bias, bmap, has_bias, causal, g0, r0, Lq, R, exp_M, req_M, l_M, acc_M,
                   bk, m_init, division, accumulate, out):
    """Algorithm 1 per query row of a chunk: ``S (gh, rows, Lk)`` holds the exact int8 score
    products of entries ``g0 ..`` and query rows ``r0 ..`` (float, from the int8 plumbing's
    GEMM); tasks of ``_ROWS_PER_TASK`` rows run in parallel.  Returns per-task counters
    ``(gh * ntr, _NCOUNT)`` (task ``t`` belongs to entry ``g0 + t // ntr``)."""
    gh, rows, Lk = S.shape
    dv = v.shape[2]
    nk = (Lk + bk - 1) // bk
    ntr = (rows + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    ntask = gh * ntr
    cnt = np.zeros((ntask, _NCOUNT), dtype=np.int64)
    bkp = (bk + RED - 1) // RED * RED  # keys of a tile padded for pv_tile (v has them)
    tiled = bkp * 128 * 128 <= F32_EXACT  # |P8 v8| <= 128 * 128: tile sums exact in float32
    for task in prange(ntask):
        gi = task // ntr
        b = g0 + gi
        i0 = (task % ntr) * _ROWS_PER_TASK
        nr = min(rows, i0 + _ROWS_PER_TASK) - i0
        nrp = (nr + ROWS - 1) // ROWS * ROWS
        s = np.empty(bk, dtype=np.int64)
        p8 = np.empty(bk, dtype=np.int64)
        acc = np.zeros((nr, dv), dtype=np.int64)
        tile = np.empty(dv, dtype=np.int64)
        tile32 = np.empty(dv, dtype=np.int32)
        pt = np.zeros((nrp, bkp), dtype=np.float32)  # the tile's P8 of every row
        tt = np.empty((nrp, dv), dtype=np.float32)  # their P8 v8
        alphas = np.empty(nr, dtype=np.int64)
        m_r = np.full(nr, np.int64(m_init), dtype=np.int64)
        lsum_r = np.ones(nr, dtype=np.int64)
        vmax_r = np.full(nr, np.int64(-(1 << 62)), dtype=np.int64)  # largest visible score
        seen_r = np.zeros(nr, dtype=np.bool_)
        c_tiles = 0
        c_resc = 0
        c_ovf = 0
        c_req = 0
        c_wrap = 0
        c_out = 0
        c_zero = 0
        c_neg = 0
        c_minit = 0
        mb = bmap[b]
        f = np.int64(1)  # Scale Accumulation: the tile's accumulated scale R**t (int32)
        f_wrap = np.int64(0)
        for t in range(nk):  # every row of the task through tile t (each row's order as before)
            if accumulate and t > 0:
                ff = f * R
                f = _wrap32(ff)
                f_wrap = np.int64(f != ff)
            j0 = t * bk
            nv = min(bk, Lk - j0)
            for r in range(nr):
                ii = i0 + r
                i = r0 + ii
                m = m_r[r]
                lim = i + Lk - Lq
                for jj in range(nv):  # S = q8 k8^T (exact: d <= D_MAX)
                    s[jj] = np.int64(S[gi, ii, j0 + jj])
                mx = m
                dense = nv == bk and not has_bias and not (causal and j0 + bk - 1 > lim)
                if dense:  # every key of the tile seen, no bias: no branch
                    vmax = vmax_r[r]
                    for jj in range(bk):
                        w = _wrap32(s[jj])
                        c_wrap += w != s[jj]
                        vmax = max(vmax, w)
                        s[jj] = w
                        mx = max(mx, w)
                    vmax_r[r] = vmax
                    seen_r[r] = True
                for jj in range(0 if dense else bk):
                    if jj < nv:
                        j = j0 + jj
                        if causal and j > lim:
                            bij = np.int64(MASK_BIAS)
                        elif has_bias:
                            bij = np.int64(bias[mb, i, j])
                        else:
                            bij = np.int64(0)
                        raw = s[jj] + bij
                        w = _wrap32(raw)
                        if w != raw:
                            c_wrap += 1
                        if bij > MASK_BIAS:  # a key the row sees
                            seen_r[r] = True
                            if w > vmax_r[r]:
                                vmax_r[r] = w
                    else:
                        w = np.int64(MASK_BIAS)
                    s[jj] = w
                    if w > mx:
                        mx = w
                rowsum = np.int64(0)
                for jj in range(bk):  # no branch: LLVM vectorizes it
                    raw = s[jj] - mx
                    x = _wrap32(raw)
                    c_wrap += x != raw
                    y, ovf, wr = _shexp(x, R, exp_M, division)
                    c_ovf += ovf
                    c_wrap += wr
                    pv, rw, wr = _requant(y, req_M)
                    c_neg += (pv < 0) & (rw == 0)
                    c_req += rw
                    c_wrap += wr
                    p8[jj] = pv
                    rowsum += pv
                raw = m - mx
                x = _wrap32(raw)
                if x != raw:
                    c_wrap += 1
                alpha, ovf, wr = _shexp(x, R, exp_M, division)
                c_ovf += ovf
                c_wrap += wr
                if alpha < 0 and t > 0:
                    c_neg += 1
                lsum_r[r], wr = _carry(lsum_r[r], alpha, l_M, rowsum, f, accumulate)
                c_wrap += wr + f_wrap
                if tiled:  # the tile's P8 v8 below, for every row at once
                    for jj in range(nv):
                        pt[r, jj] = np.float32(p8[jj])
                    for jj in range(nv, bkp):
                        pt[r, jj] = 0.0
                    alphas[r] = alpha
                else:
                    tile[:] = 0
                    for js in range(0, nv, _TILE32_KEYS):  # int32 sums (exact), widened per run
                        tile32[:] = 0
                        for jj in range(js, min(nv, js + _TILE32_KEYS)):
                            pj = np.int32(p8[jj])
                            if pj != 0:
                                for c in range(dv):
                                    tile32[c] += pj * np.int64(v[b, j0 + jj, c])
                        for c in range(dv):
                            tile[c] += tile32[c]
                    c_wrap += _acc_update(acc, r, tile, alpha, acc_M, f, accumulate)
                c_tiles += 1
                if t > 0 and mx != m:
                    c_resc += 1
                m_r[r] = mx
            if tiled:
                pv_tile(pt, v[b], tt, j0, nrp, bkp, dv)
                for r in range(nr):
                    for c in range(dv):
                        tile[c] = np.int64(tt[r, c])
                    c_wrap += _acc_update(acc, r, tile, alphas[r], acc_M, f,
                                          accumulate)
        for r in range(nr):
            i = r0 + i0 + r
            lsum = lsum_r[r]
            if lsum == 0:
                c_zero += 1
            if seen_r[r] and vmax_r[r] < m_init:  # every score below m_init: the row stays 0
                c_minit += 1
            fl = np.float32(lsum)
            for c in range(dv):
                o = _f32_to_i32(np.float32(np.float32(acc[r, c]) / fl))
                o8 = _wrap8(o)
                if o8 != o:
                    c_out += 1
                out[b, i, c] = o8
        cnt[task, _C_TILES] = c_tiles
        cnt[task, _C_RESCALES] = c_resc
        cnt[task, _C_EXP_OVF] = c_ovf
        cnt[task, _C_REQ_WRAP] = c_req
        cnt[task, _C_I32_WRAP] = c_wrap
        cnt[task, _C_OUT_WRAP] = c_out
        cnt[task, _C_ZERO_DEN] = c_zero
        cnt[task, _C_NEG_EXP] = c_neg
        cnt[task, _C_M_INIT] = c_minit
    return cnt
