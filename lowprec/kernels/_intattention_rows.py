"""IndexSoftmax's row kernels (specs/attention.md section 3 steps 1-4 and the deploy model of
the authors' NEON kernel), the Numba code behind :func:`lowprec.kernels.intattention.index_softmax`
and the ``intattention`` pipeline (whose module docstring gives every rounding), kept apart so
that ``intattention.py`` stays under the kernels' 900-line limit.  Only ``intattention.py``
imports this module.
"""

from __future__ import annotations

import numpy as np

from ..formats._jit import jit

INT32_MAX = 2**31 - 1
DEPLOY_SHIFT = 26  # Q26 index multiplier of the authors' NEON kernel
DEPLOY_ROUND = 1 << (DEPLOY_SHIFT - 1)  # rounding term of vrshrq_n_s32(x, 26)
DEPLOY_NORM = 255 * 256  # 65280: numerator of the 8-bit reciprocal ns (Q8)
UINT16_MOD = 1 << 16
_MODE_FLOOR = 0
_MODE_NEAREST = 1
# per-row counters written by the core kernel
_I_CLIPPED, _I_ZERO, _I_EMPTY, _I_WRAP, _I_NSOVF, _I_DOVF, _I_VIS, _I_PSUM = range(8)
_N_INFO = 8


@jit(inline="always")
def _index_of(dd, c, c32, nb, mode, deploy, mr, vector):
    """LUT index of a clipped distance ``dd`` in ``[0, c]`` (attention.md 3 step 3)."""
    if deploy:
        prod = dd * mr
        if vector:
            return (prod + DEPLOY_ROUND) >> DEPLOY_SHIFT
        return prod >> DEPLOY_SHIFT
    if mode == _MODE_FLOOR:
        # trunc(fp32(nb * D') / fp32(c_int)): one float32 rounding of the product, one float32
        # division (LLVM's fdiv float is correctly rounded)
        return min(np.int64(np.float32(np.float32(nb * dd) / c32)), nb)
    num = nb * dd  # "nearest": the exact quotient rounded half to even
    qq = num // c
    rr = num - qq * c
    if 2 * rr > c or (2 * rr == c and (qq & 1) == 1):
        qq += 1
    return qq


@jit
def _index_rows(s, cint, lim, vis, has_vis, lut, nb, mode, pmax, deploy, mult, tail_from, out,
                info):
    """IndexSoftmax of every row of ``s`` (N, L) int32 into ``out`` (N, L) uint8.

    ``cint`` (N,) int64 thresholds (``T`` in deploy mode); key ``j`` of row ``r`` is visible iff
    ``j <= lim[r]`` and (``vis[r, j]`` when ``has_vis``); ``lut`` (nb + 1,) int64, non-increasing
    with ``lut[nb] = 0``; ``mult`` (N,) int64 (deploy); columns ``>= tail_from`` use the NEON
    scalar tail (deploy); ``info`` (N, 8) int64 per-row counters (see ``_I_*``).

    Each row takes three passes: the visible max; the index of every key (stored in ``out``;
    masked keys get ``nb``, whose LUT value is 0) with the exact sum ``Z``; the map from index
    to probability through a per-row table (E takes at most ``nb + 1`` values, so the one
    division of eq. 15 per table entry gives every element's result).
    """
    N, L = s.shape
    ne = nb + 1
    iz = nb  # first index whose LUT value is 0 (the LUT is non-increasing)
    while iz > 0 and lut[iz - 1] == 0:
        iz -= 1
    ptab = np.zeros(ne, np.int64)
    ttab = np.zeros(ne, np.int64)
    for r in range(N):
        for t in range(_N_INFO):
            info[r, t] = 0
        c = cint[r]
        c32 = np.float32(c)
        top = min(lim[r], L - 1)
        m = np.int64(0)
        nvis = 0
        for j in range(top + 1):
            if has_vis and not vis[r, j]:
                continue
            x = np.int64(s[r, j])
            if nvis == 0 or x > m:
                m = x
            nvis += 1
        if nvis == 0:
            for j in range(L):
                out[r, j] = 0
            info[r, _I_EMPTY] = 1
            continue
        z = np.int64(0)
        clipped = 0
        zero = 0
        dovf = 0
        mr = mult[r] if deploy else np.int64(0)
        for j in range(top + 1):
            if has_vis and not vis[r, j]:
                out[r, j] = nb
                continue
            dd = m - np.int64(s[r, j])
            dovf += dd > INT32_MAX
            clipped += dd >= c
            idx = _index_of(min(dd, c), c, c32, nb, mode, deploy, mr, j < tail_from)
            out[r, j] = idx
            z += lut[idx]
            zero += idx >= iz
        for j in range(top + 1, L):
            out[r, j] = nb
        wrap = 0
        nsovf = 0
        if deploy:
            z16 = z & (UINT16_MOD - 1)
            if z >= UINT16_MOD:
                wrap = 1
            if z16 == pmax:  # the kernel's early exit: P = E
                for i in range(ne):
                    ptab[i] = lut[i]
                    ttab[i] = lut[i]
            else:
                if z16 == 0:
                    ns = np.int64(255)
                    nsovf = 1
                else:
                    q = np.float32(np.float64(DEPLOY_NORM) / np.float64(z16))
                    nsi = np.int64(np.float32(np.float64(q) + 0.5))
                    if nsi > 255:
                        nsovf = 1
                    ns = nsi & 255
                for i in range(ne):
                    ptab[i] = (lut[i] * ns + 128) >> 8
                    ttab[i] = (lut[i] * ns) >> 8
        else:
            zf = np.float64(np.float32(z))
            for i in range(ne):
                q = np.float32(np.float64(np.float32(lut[i] * pmax)) / zf)
                ptab[i] = np.int64(np.rint(np.float64(q)))
        psum = np.int64(0)
        for j in range(min(L, tail_from)):
            p = ptab[out[r, j]]
            out[r, j] = p
            psum += p
        for j in range(tail_from, L):
            p = ttab[out[r, j]]
            out[r, j] = p
            psum += p
        info[r, _I_CLIPPED] = clipped
        info[r, _I_ZERO] = zero
        info[r, _I_WRAP] = wrap
        info[r, _I_NSOVF] = nsovf
        info[r, _I_DOVF] = dovf
        info[r, _I_VIS] = nvis
        info[r, _I_PSUM] = psum


@jit
def _fused_rows(S, cint, lim, lut, nb, mode, pmax, P, info):
    """IndexSoftmax of unmasked, non-deploy rows (the ``intattention`` fast path): the
    roundings and counters of :func:`_index_rows`, read from the float32/float64 int8-logit
    GEMM ``S`` (N, L) (exact integers) and written as float32 ``P`` (N, L) ready for the
    ``P v8`` GEMM, so neither needs a dtype copy.  Keys ``j > lim[r]`` get ``P = 0``; a row
    without a visible key gets ``P = 0`` and ``info`` empty = 1.

    It is kept apart from :func:`_index_rows` (which handles masks, visibility and deploy mode)
    for speed: the fast path routed through ``_index_rows`` with float32 input and output took
    23 ms instead of 15 ms per (1, 12, 256, 32) call, mostly for lack of the distance -> index
    table below.  Both are tested bit-exact against the same reference.
    """
    N, L = S.shape
    ne = nb + 1
    iz = nb
    while iz > 0 and lut[iz - 1] == 0:
        iz -= 1
    idxs = np.empty(L, np.int64)
    ptab = np.zeros(ne, np.int64)
    ptabf = np.zeros(ne, np.float32)
    tab = np.empty(0, np.uint8)  # idx of every clipped distance 0..tab_c (one threshold)
    tab_c = np.int64(-1)
    run = 0  # end of the last run of equal thresholds examined
    for r in range(N):
        for u in range(_N_INFO):
            info[r, u] = 0
        top = max(min(lim[r], L - 1), -1)
        for j in range(top + 1, L):
            P[r, j] = 0
        if top < 0:
            info[r, _I_EMPTY] = 1
            continue
        m = np.int64(S[r, 0])
        for j in range(1, top + 1):
            x = np.int64(S[r, j])
            if x > m:
                m = x
        c = cint[r]
        c32 = np.float32(c)
        if c != tab_c and r >= run:
            # a table of the index of every distance 0..c costs c + 1 divisions: build it when
            # the run of rows that share this threshold holds at least as many logits
            run = r + 1
            while run < N and cint[run] == c:
                run += 1
            if c + 1 <= (run - r) * L:
                if tab.shape[0] < c + 1:
                    tab = np.empty(c + 1, np.uint8)
                for dd in range(c + 1):
                    tab[dd] = _index_of(np.int64(dd), c, c32, nb, mode, False, np.int64(0), True)
                tab_c = c
        z = np.int64(0)
        clipped = 0
        zero = 0
        dovf = 0
        if c == tab_c:
            for j in range(top + 1):
                dd = m - np.int64(S[r, j])
                dovf += dd > INT32_MAX
                clipped += dd >= c
                idx = np.int64(tab[min(dd, c)])
                idxs[j] = idx
                z += lut[idx]
                zero += idx >= iz
        else:
            for j in range(top + 1):
                dd = m - np.int64(S[r, j])
                dovf += dd > INT32_MAX
                clipped += dd >= c
                idx = _index_of(min(dd, c), c, c32, nb, mode, False, np.int64(0), True)
                idxs[j] = idx
                z += lut[idx]
                zero += idx >= iz
        zf = np.float64(np.float32(z))
        for u in range(ne):
            qq = np.float32(np.float64(np.float32(lut[u] * pmax)) / zf)
            ptab[u] = np.int64(np.rint(np.float64(qq)))
            ptabf[u] = np.float32(ptab[u])
        psum = np.int64(0)
        for j in range(top + 1):
            psum += ptab[idxs[j]]
            P[r, j] = ptabf[idxs[j]]
        info[r, _I_CLIPPED] = clipped
        info[r, _I_ZERO] = zero
        info[r, _I_DOVF] = dovf
        info[r, _I_VIS] = top + 1
        info[r, _I_PSUM] = psum
