"""Reference attention (specs/attention.md section 1).

* ``reference``: exact softmax attention in float64 (the accuracy oracle).  Computed in chunks
  of query rows so that memory stays ``O(chunk x Lk)`` even for 32k-token studies; on CUDA
  tensors in float64 on their device (:mod:`.reference_device`).
* ``flash``: float32 tiled online-softmax attention (FlashAttention-2, base 2), the Numba engine
  of :mod:`lowprec.kernels.online` with float32 inputs and float32 ``exp2``; the order of every
  float32 operation is documented in docs/design.md ("Exact float32 semantics").
"""

from __future__ import annotations

import numpy as np

from ..stats import BapsStats
from . import Scheme, register
from .online import (
    BLOCK_K_DEFAULT,
    BLOCK_Q_DEFAULT,
    EXP_FLOAT,
    FA2,
    EngineConfig,
    run_engine,
    tile_stats,
)
from .problem import Problem, causal_visible, check_block, chunk_threads, run_chunks

REFERENCE_CHUNK = 256  # query rows per float64 chunk


def reference_core(prob: Problem, chunk: int = REFERENCE_CHUNK) -> np.ndarray:
    """Exact float64 attention of a normalized :class:`Problem`: ``(B, Lq, dv)`` float64.

    ``softmax(q k^T * scale + mask)`` per row with the row maximum subtracted first; rows
    without a visible key are NaN.
    """
    q = prob.q.astype(np.float64, copy=False)
    k = prob.k.astype(np.float64, copy=False)
    v = prob.v.astype(np.float64, copy=False)
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    out = np.empty((B, Lq, prob.dv), dtype=np.float64)
    vis_all = causal_visible(Lq, Lk) if prob.causal else None

    def entry(b):  # one (batch, head) entry; entries run in parallel on large calls
        mp = prob.mask[prob.mask_map[b]] if prob.mask is not None else None
        for r0 in range(0, Lq, chunk):
            r1 = min(Lq, r0 + chunk)
            s = (q[b, r0:r1] @ k[b].T) * prob.scale
            if mp is not None:
                s = s + mp[r0:r1].astype(np.float64)
            if vis_all is not None:
                s = np.where(vis_all[r0:r1], s, -np.inf)
            mx = s.max(axis=1, initial=-np.inf, keepdims=True)
            with np.errstate(invalid="ignore"):
                e = np.exp(s - mx)
                out[b, r0:r1] = (e @ v[b]) / e.sum(axis=1, keepdims=True)

    run_chunks([(b,) for b in range(B)], entry, None, chunk_threads(B * Lq * Lk))
    return out


def _reference(prob: Problem, return_stats: bool):
    return reference_core(prob), None


def flash_setup(Lq: int, Lk: int, block_q: int = BLOCK_Q_DEFAULT,
                block_k: int = BLOCK_K_DEFAULT):
    """``(cfg, block_q, block_k, round_inputs_bf16)`` of a ``flash`` call (the engine's
    arguments; shared by the CPU and GPU engines, as :func:`lowprec.kernels.baps.engine_setup`)."""
    bq = check_block(block_q, "block_q", Lq)
    bk = check_block(block_k, "block_k", Lk)
    return EngineConfig(flow=FA2, exp=EXP_FLOAT), bq, bk, False


def _flash(prob: Problem, return_stats: bool, **options):
    cfg, bq, bk, _ = flash_setup(prob.Lq, prob.Lk, **options)
    out, flags, rr = run_engine(prob.q, prob.k, prob.v, scale=prob.scale, causal=prob.causal,
                                mask=prob.mask, mask_map=prob.mask_map, block_q=bq,
                                block_k=bk, cfg=cfg)
    return out, (tile_stats(flags, rr, False) if return_stats else None)


register(Scheme("reference", "exact softmax attention in float64 (the accuracy oracle)",
                _reference, options=(), float64=True, order=0, error_bound=1e-12,
                device="reference_device:reference"))
register(Scheme("flash", "float32 tiled online-softmax attention (FlashAttention-2, base 2)",
                _flash, options=("block_q", "block_k"), stats=BapsStats, order=10,
                error_bound=1e-4, engine=flash_setup))
