"""The attention pipeline around an integer softmax surrogate, written once for ``ivit``,
``ibert`` and ``hccs`` (specs/attention.md sections 5 and 7):

1. q, k, v to per-tensor symmetric int8 (:func:`lowprec.kernels._int8.quantize_qkv`);
2. the exact int32 scores ``S = q8 k8^T`` in row chunks, each turned into the surrogate's
   logits by the scheme's ``fill`` (:func:`fill_logits`), with the visibility of every row
   (:func:`visibility`: causal limits and mask combined, or an empty array when every key is
   visible);
3. the surrogate on all rows (the scheme's core; I-BERT and HCCS calibration need the whole
   tensor), giving integer-valued probabilities ``P`` (0 where masked);
4. the exact ``O = P v8`` in row chunks (:func:`exact_attend`), dequantised by the scheme.

Memory: one ``(B * Lq, Lk)`` buffer for the logits/probabilities (the surrogates work in
place), no int64 or float64 copy of it.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._jit import jit
from ._int8 import QKV8, exact_pv, int_scores
from .problem import Problem, chunk_threads, row_chunks, run_chunks

NO_VIS = np.zeros((0, 0), dtype=np.bool_)  # "every key visible" for the row kernels


@jit(inline="always")
def row_block(t, R, nb):
    """Rows ``(r0, r1)`` of block ``t`` of ``nb`` (the parallel row drivers of the surrogates:
    each block has its own counters, so the counts do not race)."""
    per = (R + nb - 1) // nb
    r0 = min(R, t * per)
    return r0, min(R, r0 + per)


@jit(inline="always")
def vis_block(vis, r0, r1):
    """The rows ``r0 .. r1 - 1`` of a visibility array (:data:`NO_VIS` stays as it is)."""
    return vis[r0:r1] if vis.shape[0] > 0 else vis


def chunk_rows(g0: int, g1: int, r0: int, r1: int, Lq: int) -> slice:
    """Flat rows ``(entry * Lq + row)`` of a chunk of :func:`row_chunks` (whole entries, or a
    row range of one entry)."""
    if r0 == 0 and r1 == Lq:
        return slice(g0 * Lq, g1 * Lq)
    return slice(g0 * Lq + r0, g0 * Lq + r1)


def visibility(prob: Problem) -> np.ndarray:
    """Boolean ``(B * Lq, Lk)``: the keys each row sees, or :data:`NO_VIS` when every row sees
    every key."""
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    vis = None
    for g0, g1, r0, r1 in row_chunks(B, Lq, Lk):
        vp = prob.rows(g0, g1, r0, r1).visible(Lk)
        if vp is not None and vis is None:
            vis = np.ones((B * Lq, Lk), dtype=np.bool_)
        if vp is not None:
            vis[chunk_rows(g0, g1, r0, r1, Lq)] = vp
    return NO_VIS if vis is None else vis


def _chunks(prob: Problem):
    """The row chunks of a call and the threads that run them (:func:`run_chunks`)."""
    threads = chunk_threads(prob.B * prob.Lq * prob.Lk)
    return list(row_chunks(prob.B, prob.Lq, prob.Lk, parts=threads)), threads


def fill_logits(prob: Problem, qz: QKV8, fill, then=None, out: np.ndarray | None = None):
    """Call ``fill(rows, S, add)`` for every row chunk: ``rows`` a slice of the flat rows,
    ``S`` the exact scores ``(n, Lk)`` (float), ``add`` the finite additive mask ``(n, Lk)``
    float32 or None; ``then(result)`` in chunk order on the calling thread.  With ``out``
    (float32 ``(B * Lq, Lk)``) and float32 scores (``127 * 127 * d <= 2**24``) ``S`` is
    ``out[rows]`` itself (no copy of the scores; ``fill`` then works in place).  Large calls
    run the chunks in parallel (:func:`~.problem.run_chunks`: ``fill`` calls its parallel
    kernels through :func:`~.problem.sized`)."""
    Lq, Lk = prob.Lq, prob.Lk
    into = out is not None and qz.q8.dtype == np.float32

    def work(g0, g1, r0, r1):
        rm = prob.rows(g0, g1, r0, r1)
        rows = chunk_rows(g0, g1, r0, r1, Lq)
        q8, k8t = qz.q8[g0:g1, r0:r1], qz.k8t[g0:g1]
        if into:
            S = out[rows]
            np.matmul(q8, k8t, out=S.reshape((g1 - g0, r1 - r0, Lk)))
        else:
            S = int_scores(q8, k8t).reshape((-1, Lk))
        add = rm.add.reshape((-1, Lk)) if rm.add is not None else None
        return fill(rows, S, add)

    chunks, threads = _chunks(prob)
    run_chunks(chunks, work, then, threads)


@jit(parallel=True)
def logits_f32(x, s_in, add, has_add, S, from_s):
    """``x = fl32(S * s_in[r] (+ add))``: float64 product and sum, one rounding (``S``
    exact); ``s_in`` is the float64 logit unit of each row.  ``from_s=False``: ``x`` itself
    holds ``S`` (float32 scores, computed in place; ``S`` is not read)."""
    n, L = x.shape
    for r in prange(n):
        c = s_in[r]
        if from_s:
            for j in range(L):
                t = np.float64(S[r, j]) * c
                if has_add:
                    t += np.float64(add[r, j])
                x[r, j] = np.float32(t)
        elif has_add:
            for j in range(L):
                x[r, j] = np.float32(np.float64(x[r, j]) * c + np.float64(add[r, j]))
        else:
            for j in range(L):
                x[r, j] = np.float32(np.float64(x[r, j]) * c)


@jit
def _row_sums(P, out):
    """``out[r] = sum P[r]`` of integer-valued float32 rows (an int64 sum: exact, so the same
    as any float64 summation while the sums stay below 2**53)."""
    n, L = P.shape
    for r in range(n):
        t = np.int64(0)
        for j in range(L):
            t += np.int64(P[r, j])
        out[r] = np.float64(t)


def exact_attend(P: np.ndarray, prob: Problem, v8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(O, rowsum)``: the exact ``O = P v8`` (float64 ``(B, Lq, dv)``) of integer-valued
    probabilities ``P (B * Lq, Lk)`` (float32; NaN rows must be zeroed by the caller) and each
    row's ``sum P`` (float64 ``(B, Lq)``: exact, integers).  Each chunk's GEMM is exact
    (:func:`~._int8.exact_pv`, chosen from the chunk's largest row sum)."""
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    P3 = P.reshape((B, Lq, Lk))
    O = np.empty((B, Lq, prob.dv), dtype=np.float64)
    rs = np.empty((B, Lq), dtype=np.float64)

    def work(g0, g1, r0, r1):
        Pc = P3[g0:g1, r0:r1]
        _row_sums(Pc.reshape((-1, Lk)), rs[g0:g1, r0:r1].reshape(-1))
        psum = int(rs[g0:g1, r0:r1].max()) if Pc.size else 0
        O[g0:g1, r0:r1] = exact_pv(Pc, v8[g0:g1], psum)

    chunks, threads = _chunks(prob)
    run_chunks(chunks, work, None, threads)
    return O, rs


__all__ = ["visibility", "fill_logits", "logits_f32", "exact_attend", "chunk_rows", "row_block",
           "vis_block", "NO_VIS"]
