"""HCCS calibration (section III-C, eq. 10): the reference softmax of the int8 logits (one
value per code), per-row histograms of the clamped distances, the objective and the
coarse-then-refine search over ``(B, S, Dmax)`` described in :mod:`lowprec.kernels.hccs` (whose
:func:`~lowprec.kernels.hccs.calibrate` calls it), and the pipeline's per-call calibration from
its int8 logits' code histograms (no float64 copy of the logits), kept apart so that
``hccs.py`` stays under the kernels' 900-line limit.  Only ``hccs.py`` and its device
companion ``hccs_device.py`` import this module.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._jit import jit
from ._surrogate import NO_VIS, fill_logits
from .problem import sized

DMAX_MAX = 127  # section IV-C: clamped distances stay in int8
Z_MIN = 256  # eq. 11: row sum floor that keeps the int8 reciprocal in int16
INT16_MAX = 32767  # eq. 11: n * B <= 32767
I16_T = 32767  # eq. 6: int16 output target scale
DELTA_BINS = 255  # m - x of int8 logits lies in [0, 254]
X8_MAX = 127  # symmetric int8 logits
OBJECTIVES = ("sum", "scale")
RATIO_GRID = 48  # ratio grid points per Dmax before the golden-section step
GOLDEN_STEPS = 40
REFINE_HALF_WIDTH = 2  # S candidates per B: floor(r B) - 1 .. floor(r B) + 2


@jit
def _histograms(x8, vis, qref, qraw, N, M):
    """Per-row statistics of the clamped distances for every Dmax in 0..127, with the float
    reference ``qref (R, n)`` (one probability per entry, ``reference="float"``).

    qraw[d] += mass of the reference softmax at raw distance d (summed over rows); N[r] =
    visible count; M[r, D] = sum over visible entries of min(m - x, D).  Returns the summed
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
        _distance_sums(cnt, nv, M[r])
    return ent


@jit(inline="always")
def _distance_sums(cnt, nv, Mr):
    """``Mr[D] = sum_d cnt[d] min(d, D)`` for D in 0..127 from the counts of each distance
    ``cnt`` of a row with ``nv`` entries: ``M(D) = M(D - 1) + #{d >= D}``."""
    ge = nv - cnt[0]  # entries with d >= 1
    acc = 0
    Mr[0] = 0
    for D in range(1, DMAX_MAX + 1):
        acc += ge
        Mr[D] = acc
        ge -= cnt[D]


@jit(parallel=True)
def code_histograms(x8, vis, hist):
    """``hist[r, c + 127]`` = how many visible entries of row ``r`` of the int8 logits ``x8``
    have code ``c`` (``vis`` boolean like ``x8``, or ``(0, 0)``: every entry); ``hist`` is a
    zeroed integer ``(R, 255)`` array."""
    R, n = x8.shape
    use_vis = vis.shape[0] > 0
    for r in prange(R):
        for j in range(n):
            if not use_vis or vis[r, j]:
                hist[r, np.int64(x8[r, j]) + X8_MAX] += 1


@jit
def _row_sums(hist, etab, z):
    """``z[r]`` = the reference row sum ``sum_c hist[r, c] etab[r, c]`` in float64, one product
    and one addition per code present, codes from the highest down (the documented order:
    independent of the order of the keys)."""
    R, C = hist.shape
    for r in range(R):
        s = 0.0
        for c in range(C - 1, -1, -1):
            k = hist[r, c]
            if k != 0:
                s += np.float64(k) * etab[r, c]
        z[r] = s


@jit
def _hist_moments(hist, mcode, q, ent_tab, qraw, N, M):
    """:func:`_histograms` from the rows' code histograms ``hist (R, 255)`` (each row with a
    visible entry; ``mcode[r]`` its highest code's index), with the reference ``q (R, 255)``
    one value per code and ``ent_tab = q log q``: rows in order, each code's mass added once
    as ``count * value`` (codes from the row max down).  Returns the summed ``sum q log q``."""
    R = hist.shape[0]
    cnt = np.zeros(DELTA_BINS, np.int64)
    ent = 0.0
    for r in range(R):
        m = mcode[r]
        nv = 0
        for d in range(DELTA_BINS):
            k = hist[r, m - d] if d <= m else 0
            cnt[d] = k
            if k == 0:
                continue
            qv = q[r, m - d]
            qraw[d] += np.float64(k) * qv
            if qv > 0:
                ent += np.float64(k) * ent_tab[r, m - d]
            nv += k
        N[r] = nv
        _distance_sums(cnt, nv, M[r])
    return ent


@jit
def _q_log_q(q, out):
    """``out = q log q`` where ``q > 0`` (Numba's ``log``)."""
    R, C = q.shape
    for r in range(R):
        for c in range(C):
            qv = q[r, c]
            out[r, c] = qv * np.log(qv) if qv > 0 else 0.0


def code_softmax(hist: np.ndarray, s_x: float):
    """The calibration reference ``softmax(x8 s_x)`` of rows given by their code histograms
    ``hist (R, 255)`` (each row with a visible entry), one value per int8 code:
    ``(q (R, 255), q log q (R, 255), mcode (R,))`` indexed by ``code + 127``, ``mcode`` the
    index of each row's highest code.  ``e = exp(fl64(c s_x) - fl64(m s_x))`` (NumPy's
    ``exp``) for every code ``c`` up to the row max ``m``; the row sum ``Z`` by
    :func:`_row_sums` (``count * e`` per code, codes from the highest down), ``q = e / Z``.
    Since every step reads the histogram, not the keys, the reference does not depend on the
    keys' order, and a device that counts the codes gets the same bits (docs/design.md)."""
    R, C = hist.shape
    present = hist > 0
    mcode = C - 1 - np.argmax(present[:, ::-1], axis=1)
    vals = np.arange(-X8_MAX, X8_MAX + 1, dtype=np.float64) * s_x  # fl64(code * s_x)
    with np.errstate(over="ignore", invalid="ignore"):  # codes above a row's max (unused)
        etab = np.exp(vals[None, :] - vals[mcode][:, None])
    etab[np.arange(C)[None, :] > mcode[:, None]] = 0.0
    z = np.empty(R)
    _row_sums(hist, etab, z)
    q = etab / z[:, None]
    ent = np.empty_like(q)
    _q_log_q(q, ent)
    return q, ent, mcode


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
def _tail(qbar):
    """``tail[D] = sum_{d >= D} qbar[d]`` for every Dmax (the mass clamped at D)."""
    tail = np.zeros(DMAX_MAX + 1)
    for D in range(DMAX_MAX + 1):
        t = 0.0
        for d in range(D, DELTA_BINS):
            t += qbar[d]
        tail[D] = t
    return tail


@jit
def _exhaustive(qbar, tail, N, M, lo_add, bmax, width, objective):
    """Every integer (B, S, Dmax) of the constrained grid; returns (B, S, Dmax, cost)."""
    best = (np.int64(bmax), np.int64(0), np.int64(1), np.inf)
    for D in range(1, DMAX_MAX + 1):
        Nu, Mu, wu = _groups(N, M[:, D], width)
        for B in range(lo_add, bmax + 1):
            for S in range((B - lo_add) // D + 1):
                c = _cost(qbar, tail, D, Nu, Mu, wu, B, S, objective)
                if c < best[3]:
                    best = (np.int64(B), np.int64(S), np.int64(D), c)
    return best


@jit(parallel=True)
def _ratios(qbar, tail, N, M, lo_add, bmax, width, ropt, copt):
    """Stage 1 of the search: per Dmax the best real ratio S / B and its cost (every Dmax on
    its own, in parallel)."""
    for D in prange(1, DMAX_MAX + 1):
        Nu, Mu, wu = _groups(N, M[:, D], width)
        rmax = (bmax - lo_add) / (bmax * D)
        ropt[D], copt[D] = _ratio_opt(qbar, tail, D, Nu, Mu, wu, rmax)


@jit
def _refine(qbar, tail, N, M, lo_add, bmax, width, objective, refine, ropt, copt):
    """Stage 2: for the ``refine`` best Dmax values every B with the integers S next to
    ``ratio * B``, scored exactly; returns (B, S, Dmax, cost)."""
    best = (np.int64(bmax), np.int64(0), np.int64(1), np.inf)
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


def _search(qbar, N, M, n, objective, exhaustive, refine):
    """Grid search over integer (B, S, Dmax); returns (B, S, Dmax, cost)."""
    lo_add = (Z_MIN + n - 1) // n
    bmax = INT16_MAX // n
    tail = _tail(qbar)
    width = np.int64(n) * DELTA_BINS + 1
    if exhaustive:
        return _exhaustive(qbar, tail, N, M, lo_add, bmax, width, objective)
    # 1. per Dmax, the best real ratio S / B (ranks the Dmax values)
    ropt = np.zeros(DMAX_MAX + 1)
    copt = np.full(DMAX_MAX + 1, np.inf)
    sized(_ratios, N.shape[0] * DMAX_MAX)(qbar, tail, N, M, lo_add, bmax, width, ropt, copt)
    # 2. for the best `refine` Dmax values: every B with the integers S next to ratio * B
    return _refine(qbar, tail, N, M, lo_add, bmax, width, objective, refine, ropt, copt)


# --------------------------------------------------------------------------------------------
# one head's calibration (lowprec.kernels.hccs.calibrate and the pipeline's per-call one)


def _quantize_logits(rows: np.ndarray, s_x: float) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 logits ``clamp(RNE(rows / s_x), -127, 127)`` (float64 quotient), visibility
    (finite entries) and the number of clamped entries."""
    vis = np.isfinite(rows)
    with np.errstate(invalid="ignore"):
        t = np.rint(np.where(vis, rows, 0.0) / s_x)
    sat = int(((t > X8_MAX) | (t < -X8_MAX)).sum())
    return np.clip(t, -X8_MAX, X8_MAX).astype(np.int8), vis, sat


def _head_scale(rows: np.ndarray) -> float:
    fin = rows[np.isfinite(rows)]
    amax = float(np.abs(fin).max()) if fin.size else 0.0
    return amax / X8_MAX if amax > 0 else 1.0


def _softmax_ref(vals: np.ndarray, vis: np.ndarray) -> np.ndarray:
    v = np.where(vis, vals, -np.inf)
    m = v.max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(v - m), 0.0)
    z = e.sum(axis=1, keepdims=True)
    return e / np.where(z > 0, z, 1.0)


def _calibrate_rows(rows: np.ndarray, n: int, s_x: float | None, exhaustive: bool, refine: int,
                    objective: str, reference: str):
    s_x = _head_scale(rows) if s_x is None else float(s_x)
    x8, vis, _ = _quantize_logits(rows, s_x)
    keep = vis.any(axis=1)
    x8, vis, rows = x8[keep], vis[keep], rows[keep]
    if x8.shape[0] == 0:
        raise ValueError("calibration logits have no row with a visible (finite) entry")
    if reference == "float":
        return fit_float(x8, vis, rows, s_x, n, exhaustive, refine, objective)
    hist = np.zeros((x8.shape[0], DELTA_BINS), np.int32)
    sized(code_histograms, x8.size)(np.ascontiguousarray(x8), np.ascontiguousarray(vis), hist)
    return fit_hist(hist, s_x, n, exhaustive, refine, objective)


def _fit(qraw, ent, N, M, s_x, n, exhaustive, refine, objective):
    R = N.shape[0]
    qbar = qraw / R
    B, S, D, c = _search(qbar, N, M, n, OBJECTIVES.index(objective), exhaustive, refine)
    return int(B), int(S), int(D), s_x, ent / R + c


def fit_hist(hist: np.ndarray, s_x: float, n: int, exhaustive: bool = False, refine: int = 4,
             objective: str = "sum"):
    """``(B, S, Dmax, s_x, kl)`` of one head from the code histograms ``hist (R, 255)`` of its
    int8 logits (:func:`code_histograms`; each row with a visible entry) at scale ``s_x``: the
    reference softmax of ``x8 s_x`` (:func:`code_softmax`), the distance statistics
    (:func:`_hist_moments`) and the grid search (module docstring of
    :mod:`lowprec.kernels.hccs`)."""
    hist = np.ascontiguousarray(hist)
    q, ent_tab, mcode = code_softmax(hist, s_x)
    R = hist.shape[0]
    qraw = np.zeros(DELTA_BINS)
    N = np.empty(R, np.int64)
    M = np.empty((R, DMAX_MAX + 1), np.int64)
    ent = _hist_moments(hist, mcode, q, ent_tab, qraw, N, M)
    return _fit(qraw, ent, N, M, s_x, n, exhaustive, refine, objective)


def fit_float(x8: np.ndarray, vis: np.ndarray, rows: np.ndarray, s_x: float, n: int,
              exhaustive: bool = False, refine: int = 4, objective: str = "sum"):
    """:func:`fit_hist` with the softmax of the float logits ``rows (R, n)`` as the reference
    (``calibrate(reference="float")``): one probability per entry, summed in the entries'
    order."""
    x8, vis = np.ascontiguousarray(x8), np.ascontiguousarray(vis)
    qref = np.ascontiguousarray(_softmax_ref(rows, vis))
    R = x8.shape[0]
    qraw = np.zeros(DELTA_BINS)
    N = np.empty(R, np.int64)
    M = np.empty((R, DMAX_MAX + 1), np.int64)
    ent = _histograms(x8, vis, qref, qraw, N, M)
    return _fit(qraw, ent, N, M, s_x, n, exhaustive, refine, objective)


# --------------------------------------------------------------------------------------------
# the pipeline's per-call calibration (lowprec.kernels.hccs, params=None)


@jit(parallel=True)
def _logit_amax(S, c, add, has_add, vis, amax):
    """``amax[r]`` = max ``|fl64(S c[r] (+ add))|`` over the visible entries of row ``r`` (the
    logits of ``hccs._quantized_logits``; ``vis`` ``(0, 0)`` = all), 0 when none."""
    n, L = S.shape
    use_vis = vis.shape[0] > 0
    for r in prange(n):
        cr = c[r]
        m = 0.0
        for j in range(L):
            lg = np.float64(S[r, j]) * cr
            if has_add:
                lg = lg + np.float64(add[r, j])
            if not use_vis or vis[r, j]:
                m = max(m, abs(lg))
        amax[r] = m


def _head_rows_of(e0: int, e1: int, h: int, H: int, Lq: int) -> np.ndarray:
    """Flat rows (entry-major) of head ``h`` among entries ``e0 .. e1 - 1``."""
    ents = np.arange(e0 + (h - e0) % H, e1, H)
    return (ents[:, None] * Lq + np.arange(Lq)[None, :]).reshape(-1)


def _head_scales(prob, qz, c_row, vis, spans, H: int, scope: str):
    """``(seen, s_x)``: the flat rows that calibrate (a visible key; taking part with
    ``scope="visible"``) and each (span, head)'s logit scale ``max|logit| / 127`` over their
    visible logits (1.0 without any), as ``hccs.calibrate`` takes it from the float64 logits
    (computed here chunk by chunk, never stored)."""
    Lq = prob.Lq
    amax = np.zeros(prob.B * Lq)

    def scan(rows, S, add):
        sized(_logit_amax, S.size)(S, c_row[rows], S if add is None else add, add is not None,
                                   vis[rows] if vis.shape[0] else NO_VIS, amax[rows])

    fill_logits(prob, qz, scan)
    seen = vis.any(axis=1) if vis.shape[0] else np.ones(prob.B * Lq, dtype=bool)
    if scope == "visible":
        seen &= prob.taking_part()[0].reshape(-1)
    return seen, scales_from_amax(amax, seen, spans, H, Lq)


def scales_from_amax(amax: np.ndarray, seen: np.ndarray, spans, H: int, Lq: int) -> np.ndarray:
    """float64 ``(spans, H)``: each (span, head)'s logit scale ``max|logit| / 127`` from the
    flat rows' maxima ``amax`` over the rows ``seen`` (1.0 without any)."""
    s_x = np.ones((len(spans), H))
    for i, (e0, e1) in enumerate(spans):
        for h in range(H):
            rs = _head_rows_of(e0, e1, h, H, Lq)
            a = amax[rs][seen[rs]]
            m = float(a.max()) if a.size else 0.0
            s_x[i, h] = m / X8_MAX if m > 0 else 1.0
    return s_x


def calibrate_span(hist, seen, s_x, e0: int, e1: int, H: int, Lq: int, Lk: int,
                   scope: str) -> dict:
    """The ``HccsParams`` fields (a dict) of ``hccs.calibrate`` of every head of the entries
    ``e0 .. e1 - 1`` from the code histograms ``hist (B Lq, 255)`` of the pipeline's int8
    logits (:func:`code_histograms`) at the heads' scales ``s_x (H,)``, over the flat rows
    ``seen``.  A head without any visible logit gets the uniform surrogate (S = 0; its rows are
    NaN anyway)."""
    rs = np.arange(e0 * Lq, e1 * Lq)
    rs = rs[seen[rs]]
    # the row length of the constraints (eq. 4, 11): every key of the tensor ("tensor", the
    # paper's n) or the most keys a row of the sequence sees ("visible": padding keys neither
    # enter Z nor tighten the constraints)
    if scope == "tensor":
        n = Lk
    else:
        n = max(1, int(hist[rs].sum(axis=1, dtype=np.int64).max()) if rs.size else 0)
    cols = {"B": [], "S": [], "Dmax": [], "x_scale": [], "kl": []}
    for h in range(H):
        hr = _head_rows_of(e0, e1, h, H, Lq)
        hr = hr[seen[hr]]
        if hr.size:
            fit = fit_hist(hist[hr], float(s_x[h]), n)
        else:
            fit = (INT16_MAX // n, 0, 0, 1.0, 0.0)
        for key, val in zip(cols, fit, strict=True):
            cols[key].append(val)
    return dict(n=n, **cols)
