"""EXAQ: clipped low-bit quantisation of the exponent input before softmax (specs/attention.md
section 3, the IntAttention paper's EXAQ baseline; seed ``exaq`` section 2.3, Table 1).

Per call: the scores ``x = fp32(s - rowmax)`` of every visible key are max-centred, their
population standard deviation ``sigma`` (from the sum and the sum of squares rounded once to
float64 from their exact values: :func:`exact_moments`) gives the clipping
value ``C = a sigma + b`` (:func:`exaq_clip`, ``(a, b)`` per bit width from EXAQ Table 1), and
``x`` is clipped to ``[lo, 0]`` (``lo = max(C, min x)``) and quantised to ``2**bits`` levels
``lo + q delta`` with ``delta = -lo / (2**bits - 1)`` and ``q = RNE((x - lo) / delta)``
(float64); the softmax of the levels is computed in float64 and rounded to float32.

* softmax surrogate ``exaq`` (:func:`exaq_softmax`): ``sigma`` over the whole input;
* attention scheme ``exaq``: float32 scores ``fp32(fp32(fp64(q . k) * scale) + mask)``
  (:mod:`._scores`), ``sigma`` over every visible score of the call (first pass; the scores are
  kept), the quantised softmax (second pass), ``O = P v`` in float64.  Statistics: the
  IntAttention family's :class:`~lowprec.stats.IntAttentionStats` (``rows``, ``empty_rows``,
  ``logits`` and ``exaq_clip = [sigma, C, lo]`` per call), as the paper compares them.

Choices: the authors calibrate ``C`` over 25 calls and then freeze the mean; each call here is
one "instantaneous" calibration.  A ``C`` that is not finite or not negative becomes ``-1e-6``
(the authors' safeguard).  Masked keys give 0; a row without a visible key gives NaN.  On
CUDA tensors the attention scheme runs on their device (:mod:`.exaq_device`; its float64 GEMMs
are the device's).
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..formats._jit import for_size, jit
from ..stats import IntAttentionStats
from . import Scheme, register
from ._check import check_bool, check_choice, check_int
from ._fp import dense_max
from ._scores import (
    ALL_VISIBLE,
    float64_operands,
    float_rows_output,
    float_scores,
    nan_rows,
    row_max,
)
from .problem import (
    MASK_FLOOR,
    SCALE_SCOPES,
    Problem,
    each_chunk,
    scratch,
    sized,
    softmax_rows,
)

#: EXAQ's clipping rule ``C = a * sigma + b`` per bit width (attention.md 3, EXAQ Table 1).
EXAQ_AB = {2: (-1.66, -1.85), 3: (-1.75, -2.06), 4: (-1.83, -2.27)}
EXAQ_BITS_DEFAULT = 3
EXAQ_C_FALLBACK = -1e-6  # used when C is not finite or not negative (authors' safeguard)


def _check_exaq_bits(bits) -> int:
    return check_int(bits, "exaq bits", min(EXAQ_AB), max(EXAQ_AB), what="one of 2, 3, 4")


# --------------------------------------------------------------------------------------------
# kernels


@jit(parallel=True)
def _row_maxes(x, lim, vis, has_vis, m):
    """``m[r]`` = :func:`_row_max` of every row (in parallel)."""
    N, L = x.shape
    for r in prange(N):
        m[r] = row_max(x, r, min(lim[r], L - 1), vis, has_vis)


#: bins of the exact moment sums (:func:`exact_moments`): a float32 magnitude ``y = M
#: 2**(i - 149)`` (``M < 2**24`` an integer) goes to bin ``i`` (0 for subnormals and the
#: smallest binade, else its biased exponent minus one)
N_BINS = 256
#: rows of the bins: ``M``, ``hi * hi``, ``hi * lo``, ``lo * lo`` (``M = hi 2**12 + lo``): each
#: term below 2**24, so an int64 bin holds 2**39 of them exactly
_SPLIT = 12


@jit
def _exaq_accumulate(x, m, lim, vis, has_vis, acc, bins):
    """The terms of :func:`exact_moments` of the max-centred visible finite scores: ``acc``
    (3,) float64 ``[count, infinite count, min]`` and ``bins`` (4, :data:`N_BINS`) int64
    integer sums of each ``|xc|``'s significand by binade (exact: any order gives the same
    values)."""
    N, L = x.shape
    n, ninf, mn = acc[0], acc[1], acc[2]
    low = (1 << _SPLIT) - 1
    for r in range(N):
        mr = m[r]
        if mr == -np.inf or mr != mr or mr == np.inf:
            continue
        for j in range(min(lim[r], L - 1) + 1):
            if has_vis and not vis[r, j]:
                continue
            v = x[r, j]
            if v == -np.inf or v != v:
                continue
            xc = np.float64(np.float32(np.float64(v) - np.float64(mr)))
            n += 1.0
            if xc < mn:
                mn = xc
            if xc == -np.inf:  # (|v - m| beyond float32's range)
                ninf += 1.0
                continue
            y = -xc
            if y == 0.0:
                continue
            i = max(math.frexp(y)[1] + 125, 0)
            M = np.int64(math.ldexp(y, 149 - i))  # exact: y is a float32 value
            hi, lo = M >> _SPLIT, M & low
            bins[0, i] += M
            bins[1, i] += hi * hi
            bins[2, i] += hi * lo
            bins[3, i] += lo * lo
    acc[0], acc[1], acc[2] = n, ninf, mn
    return acc


def _maxes(x, lim, vis, has_vis):
    """float64 row maxima of :func:`row_max` (in parallel, serial in a chunk worker)."""
    m = np.empty(x.shape[0], dtype=np.float64)
    sized(_row_maxes, x.size)(x, lim, vis, has_vis, m)
    return m


def _exaq_moments(x, lim, vis, has_vis, acc, bins):
    """Accumulate the count, infinite count and min (``acc``) and the binned sums (``bins``)
    of the max-centred visible finite scores (float32 ``x - rowmax``): row maxima in
    parallel, then :func:`_exaq_accumulate`."""
    return _exaq_accumulate(x, _maxes(x, lim, vis, has_vis), lim, vis, has_vis, acc, bins)


def new_moments(groups: int = 1):
    """Empty accumulators of :func:`_exaq_accumulate` for ``groups`` groups: ``(acc (groups,
    3) float64, bins (groups, 4, N_BINS) int64)``."""
    acc = np.tile(np.array([0.0, 0.0, np.inf]), (groups, 1))
    return acc, np.zeros((groups, 4, N_BINS), dtype=np.int64)


def exact_moments(acc, bins) -> tuple[float, float, float, float]:
    """``(n, s1, s2, min)``: the count, ``s1 = sum xc`` and ``s2 = sum xc**2`` of the
    max-centred scores ``xc <= 0``, each the float64 nearest their exact value (Python
    integers, one correctly rounded division), and their minimum, from the accumulators of
    one group.  Exact sums make sigma independent of the order of the scores, so that a
    device computes the same value in parallel (:mod:`.exaq_device`); a ``-inf`` among them
    gives ``s1 = -inf``, ``s2 = inf`` (sigma NaN: the fallback ``C``)."""
    n, ninf, mn = (float(a) for a in acc)
    if ninf:
        return n, -math.inf, math.inf, mn
    t1 = t2 = 0
    for i in np.flatnonzero(bins[0]):
        b = [int(v) for v in bins[:, i]]
        t1 += b[0] << int(i)
        t2 += ((b[1] << (2 * _SPLIT)) + (b[2] << (_SPLIT + 1)) + b[3]) << (2 * int(i))
    return n, -(t1 / (1 << 149)), t2 / (1 << 298), mn


#: a key more than this many nats below its row's max whose quantised value lies within half
#: of it of the max counts as merged (``exaq_merged``): the quantiser gives it more than
#: exp(-1/2) of the max's weight where softmax gives less than 1/e (the top level, or every
#: level when C falls back to EXAQ_C_FALLBACK because sigma overflowed)
MERGE_NATS = 1.0


#: rows whose sums run interleaved in the dense path of :func:`_exaq_rows`
EXAQ_GROUP = 4


@jit(inline="always")
def _exaq_row(x, r, lim, vis, has_vis, lo, delta, nlev, out, merged, xq, lev, ev):
    """One row of :func:`_exaq_rows`, entry by entry (masks, NaN, Inf, no quantisation)."""
    L = x.shape[1]
    quant = delta > 0.0 and np.isfinite(delta)
    nl = int(nlev)
    top = min(lim[r], L - 1)
    m = row_max(x, r, top, vis, has_vis)
    if m == -np.inf or m != m or m == np.inf:
        for j in range(L):
            out[r, j] = np.nan
        return
    mq = -np.inf
    nmerged = 0
    for j in range(L):
        if j > top or (has_vis and not vis[r, j]) or x[r, j] == -np.inf:
            lev[j] = -1
            continue
        xc = np.float64(np.float32(np.float64(x[r, j]) - np.float64(m)))
        if xc != xc:
            lev[j] = -2
            xq[j] = np.nan
            continue
        xv = min(max(xc, lo), 0.0)
        lev[j] = -3
        if quant:
            q = np.rint((xv - lo) / delta)
            q = min(max(q, 0.0), nlev - 1.0)
            lev[j] = np.int64(q)
            xv = lo + q * delta
            if xc < -MERGE_NATS and xv > -0.5 * MERGE_NATS:
                nmerged += 1
        xq[j] = xv
        if xv > mq:
            mq = xv
    if quant:
        for u in range(nl):
            ev[u] = np.exp((lo + np.float64(u) * delta) - mq)
    z = 0.0
    for j in range(L):
        u = lev[j]
        if u >= 0:
            xq[j] = ev[u]  # xq now holds the exponentials
        elif u != -1:
            xq[j] = np.exp(xq[j] - mq)
        if u != -1:
            z += xq[j]
    for j in range(L):
        out[r, j] = 0.0 if lev[j] == -1 else np.float32(xq[j] / z)
    merged[r] = nmerged


@jit(inline="always")
def _exaq_levels(x, r, m, lo, delta, nlev, lev, ev):
    """The levels of a dense row (every key visible, finite scores) into ``lev`` and the
    exponential of each level into ``ev`` (the general path's values, without branches);
    returns the merged keys."""
    top = nlev - 1.0
    nmerged = 0
    qmax = np.int64(0)
    for j in range(x.shape[1]):
        xc = np.float64(np.float32(np.float64(x[r, j]) - m))
        q = min(max(np.rint((min(max(xc, lo), 0.0) - lo) / delta), 0.0), top)
        lev[j] = np.int64(q)
        qmax = max(qmax, np.int64(q))
        nmerged += (lo + q * delta > -0.5 * MERGE_NATS) & (xc < -MERGE_NATS)
    mq = lo + np.float64(qmax) * delta  # the largest level value (monotone in q)
    for u in range(ev.shape[0]):
        ev[u] = np.exp((lo + np.float64(u) * delta) - mq)
    return nmerged


@jit(parallel=True)
def _exaq_rows(x, lim, vis, has_vis, lo, delta, nlev, out, merged):
    """EXAQ softmax of float32 scores ``x`` (N, L): max-centred scores clipped to ``[lo, 0]``,
    quantised to ``nlev`` levels ``lo + q delta`` (``q = RNE((x - lo) / delta)``), float64
    softmax rounded to float32; masked keys give 0, rows without a visible key NaN.  Rows run
    in parallel; with quantisation the exponential of each level is computed once per row (the
    same float64 values, summed in key order).  ``merged[r]``: keys of row r more than
    :data:`MERGE_NATS` below the max quantised to within ``MERGE_NATS / 2`` of it.  Rows
    with every key visible and finite scores take a branch-free path, :data:`EXAQ_GROUP` at a
    time so that their key-order sums (a chain of dependent additions each) interleave."""
    N, L = x.shape
    nl = int(nlev)
    G = EXAQ_GROUP
    dense_ok = delta > 0.0 and np.isfinite(delta) and not has_vis
    for g in prange((N + G - 1) // G):
        xq = np.empty(L, np.float64)
        lev = np.empty((G, L), np.int64)
        ev = np.empty((G, nl), np.float64)
        dense = np.zeros(G, np.bool_)
        r0 = g * G
        nd = 0
        for k in range(min(G, N - r0)):
            r = r0 + k
            ok = dense_ok and lim[r] >= L - 1
            if ok:
                ok, mx = dense_max(x, r)
            if ok:
                dense[k] = True
                nd += 1
                merged[r] = _exaq_levels(x, r, np.float64(mx), lo, delta, nlev, lev[k], ev[k])
            else:
                _exaq_row(x, r, lim, vis, has_vis, lo, delta, nlev, out, merged, xq, lev[k],
                          ev[k])
        z = np.zeros(G)
        if nd == G:  # four independent key-order sums at once
            z0, z1, z2, z3 = 0.0, 0.0, 0.0, 0.0
            for j in range(L):
                z0 += ev[0, lev[0, j]]
                z1 += ev[1, lev[1, j]]
                z2 += ev[2, lev[2, j]]
                z3 += ev[3, lev[3, j]]
            z[0], z[1], z[2], z[3] = z0, z1, z2, z3
        else:
            for k in range(G):
                if dense[k]:
                    zk = 0.0
                    for j in range(L):
                        zk += ev[k, lev[k, j]]
                    z[k] = zk
        for k in range(G):
            if dense[k]:
                r = r0 + k
                for u in range(nl):
                    ev[k, u] = np.float32(ev[k, u] / z[k])  # the output of each level
                for j in range(L):
                    out[r, j] = ev[k, lev[k, j]]


# --------------------------------------------------------------------------------------------
# public softmax


def exaq_clip(sigma: float, bits: int = EXAQ_BITS_DEFAULT) -> float:
    """EXAQ's clipping value ``C = a * sigma + b`` (attention.md 3; EXAQ Table 1), with
    ``(a, b)`` = (-1.66, -1.85), (-1.75, -2.06), (-1.83, -2.27) for 2, 3, 4 bits; a ``C`` that
    is not finite or not negative is replaced by ``-1e-6`` (the authors' safeguard).

    Example:
        >>> round(exaq_clip(1.0, 3), 2)
        -3.81
    """
    a, b = EXAQ_AB[_check_exaq_bits(bits)]
    cval = a * float(sigma) + b
    if not math.isfinite(cval) or cval >= 0.0:
        cval = EXAQ_C_FALLBACK
    return cval


def _exaq_params(acc: np.ndarray, bins: np.ndarray, bits: int
                 ) -> tuple[float, float, float, float]:
    """(sigma, C, lo, delta) from the accumulated moments of one group."""
    n, s1, s2, mn = exact_moments(acc, bins)
    if n == 0:
        return float("nan"), EXAQ_C_FALLBACK, EXAQ_C_FALLBACK, float("nan")
    mean = s1 / n
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf at |scores| ~ 1e154
        var = float(s2 / n - mean * mean)
    sigma = math.sqrt(var) if var > 0.0 else (0.0 if var == var else math.nan)
    cval = exaq_clip(sigma, bits)
    lo = max(cval, float(mn))
    delta = (0.0 - lo) / float((1 << bits) - 1)
    return sigma, cval, lo, delta


def exaq_softmax(scores, axis: int = -1, *, bits: int = EXAQ_BITS_DEFAULT,
                 return_stats: bool = False):
    """EXAQ softmax (the ``exaq`` softmax surrogate): clipped ``bits``-bit quantisation of the
    max-centred scores before a float softmax (attention.md 3; seed section 2.3).

    ``x = fp32(s - rowmax)``; ``sigma`` = population std of every visible finite ``x`` of the
    whole input (one value per call, as the authors' code; float64 ``sqrt(s2 / n - (s1 /
    n)**2)`` of the exactly rounded sums, :func:`exact_moments`); ``C = exaq_clip(sigma,
    bits)``; ``lo = max(C, min x)``; ``delta = -lo / (2**bits - 1)``; ``x' = lo + delta *
    clamp(RNE((clamp(x, lo, 0) - lo) / delta), 0, 2**bits - 1)`` (float64); ``softmax(x')``
    computed in float64 and rounded to float32.  The authors calibrate ``C`` over 25 calls and
    then freeze the mean; this function is one call of it (the "instantaneous" ``C``).

    Args:
        scores: float array or CPU tensor (float32/float16/bfloat16; float64 is rounded to
            float32).
        axis: the softmax axis.
        bits: 2, 3 or 4.
        return_stats: also return an :class:`~lowprec.stats.IntAttentionStats` (``rows``,
            ``empty_rows``, ``logits`` and ``exaq_clip = [sigma, C, lo]``).

    Returns:
        float32 probabilities, same shape and kind; ``-inf`` entries give 0; rows with no finite
        entry, or with NaN or ``+inf``, give NaN.  With ``return_stats``: ``(p, stats)``.

    Example:
        >>> exaq_softmax(np.array([0.0, -1.0, -2.0, -30.0], np.float32), bits=2)
        array([3.3333334e-01, 3.3333334e-01, 3.3333334e-01, 4.4887313e-11], dtype=float32)
    """
    b = _check_exaq_bits(bits)
    rows, restore = softmax_rows(scores, axis)
    lim = np.full(rows.shape[0], rows.shape[1] - 1, dtype=np.int64)
    dummy = np.ones((1, 1), np.bool_)
    check_bool(return_stats, "return_stats")
    acc, bins = new_moments()
    _exaq_moments(rows, lim, dummy, False, acc[0], bins[0])
    sigma, C, lo, delta = _exaq_params(acc[0], bins[0], b)
    out = np.empty(rows.shape, dtype=np.float32)
    merged = np.zeros(rows.shape[0], dtype=np.int64)
    for_size(_exaq_rows, rows.size)(rows, lim, dummy, False, lo, delta, float(1 << b), out,
                                    merged)
    res = restore(out)
    if not return_stats:
        return res
    fin = np.isfinite(rows)
    empty = int(np.count_nonzero(~fin.any(axis=1))) if rows.shape[1] else rows.shape[0]
    st = IntAttentionStats(calls=1, rows=rows.shape[0], empty_rows=empty,
                           logits=int(np.count_nonzero(fin)), exaq_merged=int(merged.sum()),
                           exaq_clip=[[float(sigma), float(C), float(lo)]])
    return res, st


# --------------------------------------------------------------------------------------------
# the attention scheme


def exaq_options(prob, bits, scale_scope: str):
    """Scheme ``exaq``'s option checks (shared with its device path, :mod:`.exaq_device`):
    ``(bits, group, part)`` for a problem (a :class:`Problem` or a device problem): the
    sigma group of each entry (its sequence with ``scale_scope="visible"``, else 0 for all)
    and the rows that take part (``(B, Lq)`` boolean; None: all rows count)."""
    b = _check_exaq_bits(bits)
    if check_choice(scale_scope, "scale_scope", SCALE_SCOPES) == "visible":
        return b, prob.sequences(), prob.taking_part()[0]
    return b, prob.sequences() * 0, None


def _exaq(prob: Problem, return_stats: bool, bits: int = EXAQ_BITS_DEFAULT,
          scale_scope: str = "visible"):
    """Scheme ``exaq``: float32 scores as ``index_softmax_only``, ``sigma`` over every visible
    score of each sequence (``scale_scope="visible"``: the rows that take part of one batch
    element) or of the whole call (``"tensor"``, the authors' per-call calibration) in a first
    pass (the scores kept), :func:`exaq_softmax`'s quantisation in a second."""
    b, group, part = exaq_options(prob, bits, scale_scope)
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    ng = int(group.max()) + 1 if B else 1
    acc, bins = new_moments(ng)
    q64, k64t, v64 = float64_operands(prob)
    scores = {}

    def entries(g0, g1, r0, r1, lim):
        """(group, row slice of the chunk, limits with rows not taking part at -1)."""
        n = r1 - r0
        for e in range(g0, g1):
            rs = slice((e - g0) * n, (e - g0 + 1) * n)
            lm = lim[rs] if part is None else np.where(part[e, r0:r1], lim[rs], -1)
            yield group[e], rs, lm

    def moments(g0, g1, r0, r1, rm):  # pass 1: the scores and their row maxima (parallel)
        lim, vis, add = rm
        sc = float_scores(prob, g0, g1, r0, r1, add, q64, k64t, keep=True)
        scores[g0, r0] = sc
        vv = ALL_VISIBLE if vis is None else vis
        return 0.0, (sc, lim, vv, vis is not None, _maxes(sc, lim, vv, vis is not None),
                     g0, g1, r0, r1)

    def accumulate(chunk):  # sigma and min of each group: exact sums (any order)
        sc, lim, vv, has_vis, m, g0, g1, r0, r1 = chunk
        if ng == 1 and part is None:  # one sequence over the chunk
            _exaq_accumulate(sc, m, lim, vv, has_vis, acc[0], bins[0])
        else:
            for g, rs, lm in entries(g0, g1, r0, r1, lim):
                _exaq_accumulate(sc[rs], m[rs], np.ascontiguousarray(lm),
                                 vv[rs] if has_vis else vv, has_vis, acc[g], bins[g])

    each_chunk(prob, moments, accumulate)
    params = [_exaq_params(acc[g], bins[g], b) for g in range(ng)]  # (sigma, C, lo, delta)
    counts = np.zeros(2, dtype=np.int64)  # empty rows, merged keys

    def quantise(g0, g1, r0, r1, rm):  # pass 2: quantise and normalise
        lim, vis, add = rm
        sc = scores.pop((g0, r0))
        P = scratch("exaq.P", sc.shape, np.float64)
        mg = np.zeros(sc.shape[0], dtype=np.int64)
        n = r1 - r0
        for e in range(g0, g1):
            if ng == 1 and e > g0:
                break  # one group: the whole chunk at once
            rs = slice(0, sc.shape[0]) if ng == 1 else slice((e - g0) * n, (e - g0 + 1) * n)
            _, _, lo, delta = params[group[e]]
            sized(_exaq_rows, sc[rs].size)(
                sc[rs], lim[rs], ALL_VISIBLE if vis is None else vis[rs], vis is not None, lo,
                delta, float(1 << b), P[rs], mg[rs])
        return (float_rows_output(P.reshape((g1 - g0, r1 - r0, Lk)), v64, g0, g1),
                (nan_rows(P), int(mg.sum())))

    def then(cnt):
        counts[:] += cnt

    out = each_chunk(prob, quantise, then)
    st = None
    if return_stats:
        st = IntAttentionStats(calls=1, rows=B * Lq, empty_rows=int(counts[0]),
                               logits=int(acc[:, 0].sum()), exaq_merged=int(counts[1]),
                               exaq_clip=[[sg, cv, lo] for sg, cv, lo, _ in params])
    return out, st


def _softmax_exaq(scores, axis, return_stats, **opts):
    return exaq_softmax(scores, axis, return_stats=True, **opts)


register(Scheme(
    "exaq",
    "EXAQ: 2/3/4-bit clipped quantisation of the max-centred scores (C = a sigma + b)",
    _exaq, options=("bits", "scale_scope"), stats=IntAttentionStats, order=75, error_bound=0.3,
    mask_floor=MASK_FLOOR, device="exaq_device:exaq",
))
register(Scheme("exaq", "EXAQ clipped low-bit exponent quantisation softmax (bits 2/3/4)",
                _softmax_exaq, options=("bits",), kind="softmax", stats=IntAttentionStats,
                mask_floor=MASK_FLOOR))

__all__ = ["exaq_softmax", "exaq_clip", "exaq_options", "exact_moments", "EXAQ_AB",
           "EXAQ_BITS_DEFAULT", "N_BINS"]
