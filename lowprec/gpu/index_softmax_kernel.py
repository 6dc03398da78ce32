"""The fused device kernel of ``index_softmax_only`` (IntAttention's baseline: float32 scores,
the IndexSoftmax LUT softmax, a float64 ``P v``) for calls without a mask: one program per
block of query rows of one entry, three passes over the keys, no ``L x L`` plane in memory
(docs/design.md "Fused Triton kernels of the row-wise schemes").

It computes what :func:`lowprec.kernels.intattention_device.index_softmax_only` computes in
torch operations and the CPU's ``intattention._index_softmax_only`` (``float_scores``,
``_float_index_rows``, ``float_rows_output``), row by row::

    G   = fp64(q) . fp64(k)                float64 tl.dot of float32 values (not pinned: below)
    x   = fp32(G scale)                    float64 product, rounded once to float32
    m   = max x over the visible keys      (causal: key j visible to row i iff
                                            j <= i + Lk - Lq; NaN and -inf left out;
                                            order-free)
    NaN row: a visible score NaN or +inf, or no visible finite score
    dd  = min(fp32(m - x), fp32(c))        float32, for every visible finite score
    q   = fp32(fp32(dd nb) / fp32(c))      float32 product and correctly rounded division
                                           (``tl.math.div_rn``: ``div.rn.f32``)
    idx = min(trunc(q), nb)                ``index_rounding="floor"``; ``"nearest"``: q
                                           rounded half to even on the exact remainder
    z   = sum LUT[idx]                     integers (int64): exact in any order
    P   = fp32(fp32(LUT[idx]) / fp32(z))   ``div.rn.f32`` (the CPU's ``ptab[idx]``); hidden
                                           keys and ``-inf`` scores give 0
    O   = fp32(fp64(P) . fp64(v))          float64 tl.dot of float32 values (not pinned)

Pass 1 takes ``m`` (and the NaN verdict) over key tiles of ``BN`` keys, pass 2 ``z``, pass 3
``P`` and ``P v``; each pass recomputes the scores with the same tile shape (the same dot, so
the same ``x`` in every pass).  The LUT (``nb + 1`` int32 entries) is read from global memory
(cached).  A causal program's ``P v`` stops at its last visible key unless the entry's ``v``
holds a non-finite value (``VBAD``): then it runs to ``Lk`` with ``P = 0`` there, since the
CPU's full GEMM turns ``0 * inf`` into NaN.  NaN rows are written NaN (as the CPU's NaN ``P``
row gives through its GEMM) and flagged per row for ``empty_rows``, which the caller sums on
the device (no read-back in the call).

Exact: the LUT softmax between the GEMMs (float32 operations correctly rounded, launched with
``enable_fp_fusion=False``, no ``fma``; integers), as the CPU's Numba kernel does it.  **Not
pinned bit for bit:** the two float64 GEMMs.  Every product of float32 values is exact in
float64; the kernel sums them in ``tl.dot``'s order (float64 tensor-core ``mma`` on sm_90,
key tiles added to the accumulator in turn; NumPy's matmul per tile in Triton's interpreter),
the CPU in BLAS's, the torch path in cuBLAS's: the same standard as the module docstring of
:mod:`lowprec.kernels.intattention_device`.  A float64 sum differs between orders in its last
bits only, which reaches a float32 result when it lies within about 2**-29 of a float32
rounding boundary.  Under ``TRITON_INTERPRET=1`` it runs on CPU tensors (CI).
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, halves
from ._tiles import pow2

_GRID_Y_MAX = 65535


@triton.jit
def _x(q64, K, kb, Lk, D, cols, offs_d, sc64):
    """float32 scores ``fp32(fp64(q . k) scale)`` of the rows ``q64`` (float64 values of
    float32) against keys ``cols`` of kv entry ``kb`` (keys past ``Lk`` score 0: the caller
    hides them)."""
    k = tl.load(K + kb * Lk * D + cols[:, None].to(tl.int64) * D + offs_d[None, :],
                mask=(cols[:, None] < Lk) & (offs_d[None, :] < D), other=0.0)
    g = tl.dot(q64, tl.trans(k.to(tl.float64)), out_dtype=tl.float64)
    return (g * sc64).to(tl.float32)


@triton.jit
def _idx(x, m, use, cf, nb, MODE: tl.constexpr):
    """LUT index of the scores ``x`` (where ``use``: visible, finite; else 0)
    (``intattention._index_of_score``)."""
    dd = tl.minimum(tl.where(use, m[:, None] - x, 0.0), cf)
    qf = tl.math.div_rn(dd * nb.to(tl.float32), cf)  # >= 0 (or -0)
    t = qf.to(tl.int32)  # truncation
    if MODE == 1:  # nearest: half to even on the exact remainder
        fr = qf - t.to(tl.float32)
        t = t + ((fr > 0.5) | ((fr == 0.5) & ((t & 1) == 1))).to(tl.int32)
    return tl.minimum(t, nb)


@triton.jit(do_not_specialize=("sc_lo", "sc_hi", "cf_bits", "nb"))
def _index_softmax_kernel(Q, K, V, KV, LUT, VBAD, OUT, NANF, b0, Lq, Lk, D, DV, shift, sc_lo,
                          sc_hi, cf_bits, nb, CAUSAL: tl.constexpr, MODE: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                          BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b = b0 + program_id(1)``: ``OUT[b, rows]`` float32 and
    ``NANF[b, rows]`` int32 (1: a NaN row).  Q float32 ``(B, Lq, D)``; K, V float32 ``(Bk,
    Lk, D)``, ``(Bk, Lk, DV)``, entry ``KV[b]`` for query entry ``b``; LUT int32 ``(nb + 1,)``;
    VBAD int32 ``(Bk,)`` (1: v holds a non-finite value); the float64 ``scale`` as two int32
    halves, ``c`` as float32 bits."""
    b = b0 + tl.program_id(1)
    kb = tl.load(KV + b).to(tl.int64)
    r0 = tl.program_id(0) * BM
    offs_m = r0 + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    rok = offs_m < Lq
    q = tl.load(Q + b.to(tl.int64) * Lq * D + offs_m[:, None].to(tl.int64) * D
                + offs_d[None, :], mask=rok[:, None] & (offs_d[None, :] < D), other=0.0)
    q64 = q.to(tl.float64)
    sc64 = ((sc_hi.to(tl.int64) << 32) | (sc_lo.to(tl.int64) & 0xFFFFFFFF)).to(
        tl.float64, bitcast=True)
    cf = cf_bits.to(tl.float32, bitcast=True)
    if CAUSAL:
        lim = offs_m + shift  # the last key each row sees
        n_end = tl.minimum(Lk, r0 + BM + shift)
    else:
        lim = tl.zeros([BM], dtype=tl.int32) + (Lk - 1)
        n_end = Lk
    lim = tl.where(rok, lim, -1)

    # pass 1: the max of the visible finite scores, and whether one is NaN or +inf
    m = tl.full([BM], float("-inf"), tl.float32)
    bad = tl.zeros([BM], dtype=tl.int32)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        x = _x(q64, K, kb, Lk, D, cols, offs_d, sc64)
        vis = cols[None, :] <= lim[:, None]
        bad = tl.maximum(bad, tl.max((vis & ((x != x) | (x == float("inf")))).to(tl.int32),
                                     axis=1))
        m = tl.maximum(m, tl.max(tl.where(vis & (x == x), x, float("-inf")), axis=1))
    nanrow = (bad != 0) | (m == float("-inf"))

    # pass 2: z, the integer sum of LUT[idx] over the visible finite scores
    z = tl.zeros([BM], dtype=tl.int64)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        x = _x(q64, K, kb, Lk, D, cols, offs_d, sc64)
        use = (cols[None, :] <= lim[:, None]) & (x != float("-inf")) & ~nanrow[:, None]
        idx = _idx(x, m, use, cf, nb, MODE)
        e = tl.load(LUT + idx)
        z += tl.sum(tl.where(use, e, 0), axis=1).to(tl.int64)

    # pass 3: P = fp32(LUT[idx]) / fp32(z) and P v in float64
    zf = tl.where(z == 0, 1, z).to(tl.float32)[:, None]  # (z = 0: NaN rows, replaced below)
    n_pv = n_end
    if CAUSAL:
        if tl.load(VBAD + kb) != 0:
            n_pv = Lk  # P = 0 past the last visible key: 0 * inf is NaN, as in the CPU's GEMM
    acc = tl.zeros([BM, BDV], dtype=tl.float64)
    for n0 in range(0, n_pv, BN):
        cols = n0 + tl.arange(0, BN)
        x = _x(q64, K, kb, Lk, D, cols, offs_d, sc64)
        use = (cols[None, :] <= lim[:, None]) & (x != float("-inf")) & ~nanrow[:, None]
        idx = _idx(x, m, use, cf, nb, MODE)
        e = tl.load(LUT + idx)
        p = tl.where(use, tl.math.div_rn(e.to(tl.float32), zf), 0.0)
        v = tl.load(V + kb * Lk * DV + cols[:, None].to(tl.int64) * DV + offs_v[None, :],
                    mask=(cols[:, None] < Lk) & (offs_v[None, :] < DV), other=0.0)
        acc = tl.dot(p.to(tl.float64), v.to(tl.float64), acc, out_dtype=tl.float64)

    o = tl.where(nanrow[:, None], float("nan"), acc.to(tl.float32))
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], o,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    tl.store(NANF + b.to(tl.int64) * Lq + offs_m, nanrow.to(tl.int32), mask=rok)


#: ``(BM, BN, num_warps, num_stages)``: 64 query rows a program, key tiles of 32 (one tile
#: shape for all three passes, so that every pass computes the same scores), 8 warps (the
#: float64 accumulator of ``P v``, ``BM x dv``, is 64 registers a thread at dv = 128), 2
#: stages.  Not yet timed on a GPU; every setting gives the same bits up to the unpinned
#: float64 GEMM order (module docstring).
LAUNCH = (64, 32, 8, 2)


def index_softmax_rows(q, k, v, kv, lut, vbad, scale: float, c: float, *, nb: int, mode: int,
                       causal: bool, launch: tuple | None = None):
    """Run the fused ``index_softmax_only`` kernel (module docstring).

    Args:
        q: float32 ``(B, Lq, d)``; k, v: float32 ``(Bk, Lk, d)``, ``(Bk, Lk, dv)``; kv: int64
            ``(B,)``, the k/v entry of each query entry; all C-contiguous, on one device.
        lut: int32 ``(nb + 1,)``, the IndexSoftmax table (``intattention.index_lut``).
        vbad: int32 ``(Bk,)``: 1 where the entry's v holds a NaN or an infinity (read by
            causal calls only).
        scale: the softmax scale (float64, as the CPU multiplies by it).
        c: the clipping threshold (rounded to float32 here, as the CPU's ``cf``).
        nb: ``2**bits - 1``; mode: 0 floor, 1 nearest.
        causal: key ``j`` visible to row ``i`` iff ``j <= i + Lk - Lq``.
        launch: ``(BM, BN, num_warps, num_stages)`` in place of :data:`LAUNCH` (``BN >= 16``).

    Returns:
        ``(out float32 (B, Lq, dv), nanf int32 (B, Lq))``: ``nanf`` 1 on the NaN rows.
    """
    import torch

    B, Lq, d = q.shape
    Lk, dv = k.shape[1], v.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q.device)
    nanf = torch.empty((B, Lq), dtype=torch.int32, device=q.device)
    if B == 0 or Lq == 0:
        return out, nanf
    bm, bn, warps, stages = LAUNCH if launch is None else launch
    lo, hi = halves(int(np.array(float(scale), dtype=np.float64).view(np.int64)))
    cf_bits = int(np.array(c, dtype=np.float32).view(np.int32))
    with device_guard(q):
        for b0 in range(0, B, _GRID_Y_MAX):  # CUDA's grid y dimension
            _index_softmax_kernel[(triton.cdiv(Lq, bm), min(B - b0, _GRID_Y_MAX))](
                q, k, v, kv, lut, vbad, out, nanf, b0, Lq, Lk, d, dv, Lk - Lq, lo, hi,
                cf_bits, int(nb), CAUSAL=bool(causal), MODE=int(mode), BM=bm, BN=bn,
                BD=pow2(d, 16), BDV=pow2(dv, 16), num_warps=warps, num_stages=stages,
                **LAUNCH_OPTS)
    return out, nanf


__all__ = ["index_softmax_rows", "LAUNCH"]
