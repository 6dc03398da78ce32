"""The grid search of HCCS calibration (section III-C, eq. 10): per-row histograms of the
clamped distances, the objective and the coarse-then-refine search over ``(B, S, Dmax)``
described in :mod:`lowprec.kernels.hccs` (whose :func:`~lowprec.kernels.hccs.calibrate` calls
it), kept apart so that ``hccs.py`` stays under the kernels' 900-line limit.  Only ``hccs.py``
imports this module.
"""

from __future__ import annotations

import numpy as np

from ..formats._jit import jit

DMAX_MAX = 127  # section IV-C: clamped distances stay in int8
Z_MIN = 256  # eq. 11: row sum floor that keeps the int8 reciprocal in int16
INT16_MAX = 32767  # eq. 11: n * B <= 32767
I16_T = 32767  # eq. 6: int16 output target scale
DELTA_BINS = 255  # m - x of int8 logits lies in [0, 254]
RATIO_GRID = 48  # ratio grid points per Dmax before the golden-section step
GOLDEN_STEPS = 40
REFINE_HALF_WIDTH = 2  # S candidates per B: floor(r B) - 1 .. floor(r B) + 2


@jit
def _histograms(x8, vis, qref, qraw, N, M):
    """Per-row statistics of the clamped distances for every Dmax in 0..127.

    qraw[d] += mass of softmax(qref) at raw distance d (summed over rows); N[r] = visible
    count; M[r, D] = sum over visible entries of min(m - x, D).  Returns the summed
    ``sum q log q`` over rows.
    """
    R, n = x8.shape
    cnt = np.zeros(DELTA_BINS, np.int64)
    ent = 0.0
    for r in range(R):
        m = -129
        for j in range(n):
            if vis[r, j] and x8[r, j] > m:
                m = np.int64(x8[r, j])
        for d in range(DELTA_BINS):
            cnt[d] = 0
        nv = 0
        for j in range(n):
            if not vis[r, j]:
                continue
            d = m - np.int64(x8[r, j])
            cnt[d] += 1
            qv = qref[r, j]
            qraw[d] += qv
            if qv > 0:
                ent += qv * np.log(qv)
            nv += 1
        N[r] = nv
        # M[r, D] = sum_d cnt[d] * min(d, D); M(D) = M(D-1) + #{d >= D}
        ge = nv - cnt[0]  # entries with d >= 1
        acc = 0
        M[r, 0] = 0
        for D in range(1, DMAX_MAX + 1):
            acc += ge
            M[r, D] = acc
            ge -= cnt[D]
    return ent


@jit
def _groups(N, MD, width):
    """Unique (N, M) pairs with counts (keys N * width + M, sorted)."""
    R = N.shape[0]
    keys = np.empty(R, np.int64)
    for r in range(R):
        keys[r] = N[r] * width + MD[r]
    keys.sort()
    Nu = np.empty(R, np.int64)
    Mu = np.empty(R, np.int64)
    wu = np.empty(R, np.float64)
    u = -1
    last = -1
    for r in range(R):
        if keys[r] != last:
            u += 1
            last = keys[r]
            Nu[u] = keys[r] // width
            Mu[u] = keys[r] % width
            wu[u] = 0.0
        wu[u] += 1.0
    return Nu[:u + 1], Mu[:u + 1], wu[:u + 1] / R


@jit(inline="always")
def _cost(qbar, tail, D, Nu, Mu, wu, B, S, objective):
    """Mean over rows of ``- sum q log s + log Z`` (plus the constant entropy term)."""
    c = 0.0
    for d in range(D):
        if qbar[d] > 0:
            c -= qbar[d] * np.log(B - S * d)
    if tail[D] > 0:
        c -= tail[D] * np.log(B - S * D)
    if objective == 0:
        for u in range(Nu.shape[0]):
            c += wu[u] * np.log(B * Nu[u] - S * Mu[u])
    else:
        for u in range(Nu.shape[0]):
            z = B * Nu[u] - S * Mu[u]
            c += wu[u] * (np.log(I16_T) - np.log(I16_T // z))
    return c


@jit
def _ratio_opt(qbar, tail, D, Nu, Mu, wu, rmax):
    """Minimise the ``"sum"`` objective over the real ratio ``r = S / B`` in [0, rmax] for one
    Dmax (it depends on (B, S) only through r): a grid of RATIO_GRID points, then golden
    section around the best.  Returns (r, cost)."""
    g = RATIO_GRID
    best_r = 0.0
    best_c = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, 0.0, 0)
    for i in range(1, g + 1):
        r = rmax * i / g
        c = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, r, 0)
        if c < best_c:
            best_c = c
            best_r = r
    lo = max(0.0, best_r - rmax / g)
    hi = min(rmax, best_r + rmax / g)
    inv_phi = 0.6180339887498949
    a = hi - inv_phi * (hi - lo)
    b = lo + inv_phi * (hi - lo)
    ca = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, a, 0)
    cb = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, b, 0)
    for _ in range(GOLDEN_STEPS):
        if ca < cb:
            hi = b
            b = a
            cb = ca
            a = hi - inv_phi * (hi - lo)
            ca = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, a, 0)
        else:
            lo = a
            a = b
            ca = cb
            b = lo + inv_phi * (hi - lo)
            cb = _cost(qbar, tail, D, Nu, Mu, wu, 1.0, b, 0)
    if ca < best_c:
        best_c = ca
        best_r = a
    if cb < best_c:
        best_c = cb
        best_r = b
    return best_r, best_c


@jit
def _search(qbar, N, M, n, objective, exhaustive, refine):
    """Grid search over integer (B, S, Dmax); returns (B, S, Dmax, cost)."""
    lo_add = (Z_MIN + n - 1) // n
    bmax = INT16_MAX // n
    tail = np.zeros(DMAX_MAX + 1)
    for D in range(DMAX_MAX + 1):
        t = 0.0
        for d in range(D, DELTA_BINS):
            t += qbar[d]
        tail[D] = t
    width = np.int64(n) * DELTA_BINS + 1
    best = (np.int64(bmax), np.int64(0), np.int64(1), np.inf)
    if exhaustive:
        for D in range(1, DMAX_MAX + 1):
            Nu, Mu, wu = _groups(N, M[:, D], width)
            for B in range(lo_add, bmax + 1):
                for S in range((B - lo_add) // D + 1):
                    c = _cost(qbar, tail, D, Nu, Mu, wu, B, S, objective)
                    if c < best[3]:
                        best = (np.int64(B), np.int64(S), np.int64(D), c)
        return best
    # 1. per Dmax, the best real ratio S / B (ranks the Dmax values)
    ropt = np.zeros(DMAX_MAX + 1)
    copt = np.full(DMAX_MAX + 1, np.inf)
    for D in range(1, DMAX_MAX + 1):
        Nu, Mu, wu = _groups(N, M[:, D], width)
        rmax = (bmax - lo_add) / (bmax * D)
        ropt[D], copt[D] = _ratio_opt(qbar, tail, D, Nu, Mu, wu, rmax)
    # 2. for the best `refine` Dmax values: every B with the integers S next to ratio * B
    order = np.argsort(copt[1:]) + 1
    for t in range(min(refine, DMAX_MAX)):
        D = order[t]
        Nu, Mu, wu = _groups(N, M[:, D], width)
        for B in range(lo_add, bmax + 1):
            s_mid = np.int64(np.floor(ropt[D] * B))
            s_cap = (B - lo_add) // D
            for S in range(max(s_mid - REFINE_HALF_WIDTH + 1, 0),
                           min(s_mid + REFINE_HALF_WIDTH, s_cap) + 1):
                c = _cost(qbar, tail, D, Nu, Mu, wu, B, S, objective)
                if c < best[3]:
                    best = (np.int64(B), np.int64(S), np.int64(D), c)
    return best
