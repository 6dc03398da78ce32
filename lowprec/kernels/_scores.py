"""Float-score plumbing of the row-wise schemes that soften float32 scores (``index_softmax_only``
of IntAttention, ``exaq``): the scores ``fp32(fp32(fp64(q . k) * scale) + mask)`` of a chunk of
rows (float64 GEMM, one float32 rounding, the mask added in float32), the visible row maximum
and the output ``O = P v`` in float64.  Each scheme's row kernel sits between the two.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._jit import jit
from .problem import Problem, scratch, sized

ALL_VISIBLE = np.ones((1, 1), np.bool_)  # the visibility argument when every key is visible


@jit
def row_max(x, r, top, vis, has_vis):
    """Max of the visible, finite-or--inf entries of row ``r`` (``-inf`` when none)."""
    m = -np.inf
    for j in range(top + 1):
        if has_vis and not vis[r, j]:
            continue
        if x[r, j] > m:
            m = x[r, j]
    return m


@jit(parallel=True)
def _scale_scores(G, scale, add, has_add, x):
    """float32 scores ``fl32(fl32(G * scale) + add)`` of the float64 products ``G``."""
    n, L = G.shape
    for r in prange(n):
        for j in range(L):
            t = np.float32(G[r, j] * scale)
            if has_add:
                t = np.float32(t + add[r, j])
            x[r, j] = t


def float_scores(prob: Problem, g0: int, g1: int, r0: int, r1: int, add, q64, k64t,
                 keep: bool = False) -> np.ndarray:
    """float32 scores ``fp32(fp64(q . k) * scale) + mask`` of a chunk ``(n, Lk)`` (the mask
    added as one float32 addition; masked entries are handled by the visibility arrays): a
    :func:`~.problem.scratch` array of the chunk unless ``keep``."""
    n = (g1 - g0) * (r1 - r0)
    G = scratch("float_scores.G", (g1 - g0, r1 - r0, prob.Lk), np.float64)
    np.matmul(q64[g0:g1, r0:r1], k64t[g0:g1], out=G)
    G = G.reshape((n, prob.Lk))
    x = np.empty(G.shape, dtype=np.float32) if keep else \
        scratch("float_scores.x", G.shape, np.float32)
    addr = add.reshape(G.shape) if add is not None else x
    sized(_scale_scores, G.size)(G, float(prob.scale), addr, add is not None, x)
    return x


def float64_operands(prob: Problem):
    """q (B, Lq, d), k transposed (B, d, Lk) and v in float64, for the float score schemes."""
    return (prob.q.astype(np.float64),
            np.ascontiguousarray(prob.k.transpose(0, 2, 1), dtype=np.float64),
            prob.v.astype(np.float64))


def float_rows_output(P: np.ndarray, v64: np.ndarray, g0: int, g1: int) -> np.ndarray:
    """``O = P v`` in float64 (``P`` float64 holding the float32 probabilities)."""
    return np.matmul(P, v64[g0:g1])


def nan_rows(P: np.ndarray) -> int:
    """Rows of a probability chunk ``(n, Lk)`` that the row kernel set to NaN (no visible key,
    or NaN/+inf among the scores); every row when ``Lk == 0``."""
    return int(np.count_nonzero(np.isnan(P[:, 0]))) if P.shape[1] else P.shape[0]


__all__ = ["nan_rows", "float_scores", "float64_operands", "float_rows_output", "row_max",
           "ALL_VISIBLE"]
