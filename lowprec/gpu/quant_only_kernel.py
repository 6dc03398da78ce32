"""The fused device kernel of ``quant_only`` (IntAttention's baseline: int8 q, k, v, a float
softmax, ``P8 = RNE(127 p)``) for calls without a mask: one program per block of query rows of
one entry, three passes over the keys, no ``L x L`` plane in memory (docs/design.md "Fused
Triton kernels of the row-wise schemes").

It computes what :func:`lowprec.kernels.intattention_device.quant_only` computes in torch
operations and the CPU's ``intattention._quant_only_rows`` in Numba, row by row, the same IEEE
operations in the same order::

    S   = q8 k8^T                          int8 tl.dot into int32 (exact in any order)
    t   = fp32(fp32(fp32(fp32(S) scale32) s_q) s_k)   separate float32 products
    m   = max t over the visible keys      (causal: key j visible to row i iff
                                            j <= i + Lk - Lq; order-free)
    e_j = exp(fp64(t_j) - fp64(m))         float64 (not pinned: below)
    z   = sum_j e_j, j ascending           float64, one add at a time (_tiles.seq_cols)
    p   = fp32(e_j / z)                    IEEE float64 division rounded to float32
    P8  = RNE(fp64(fp32(fp64(p) 127)))     half to even, on integers
    acc = P8 v8                            int8 tl.dot into int32 (P8 <= 127: exact in any
                                           order; |acc| <= 127 sum P8 stays far from 2**31)
    out = fp32((fp64(acc) fp64(s_v)) / 127)

Pass 1 takes ``m`` over key tiles of ``BN`` keys, pass 2 ``z`` over sub-tiles of ``SUB``
keys (the chain of :func:`~._tiles.seq_cols`: the CPU's left-to-right float64 sum, not a
tree; hidden keys add ``+0.0``, which changes no sum), pass 3 ``p``, ``P8``, their row sum and
``P8 v8`` over tiles of ``BN3`` keys; each pass recomputes the scores (int8 GEMMs are cheap;
``z`` needs every ``e`` before any ``p``).  Rows whose visible scores are all ``-inf`` (or
that see no key) give ``P8 = 0`` and output 0, as on the CPU; a row whose maximum is ``+inf``
(scores that overflow float32) has ``z`` NaN, every ``p`` NaN, and gives a NaN output row, as
the CPU's NaN ``P8`` does through its GEMM.

Exact: every step but one is an integer operation or a correctly rounded float32/float64
operation, launched with ``enable_fp_fusion=False`` (no product contracts into an FMA;
checked with the other forbidden instructions by ``tests/test_device_rows_ptx.py``).  **Not
pinned bit for bit:** the float64 ``exp``.  In a compiled kernel ``tl.exp`` of a float64 is
libdevice's ``__nv_exp`` (the CUDA math library's ``exp``, within 1 ulp, the function torch's
CUDA ``exp`` calls; its ``fma.rn.f64`` polynomial is its own, not a contraction of ours); in
Triton's interpreter it is NumPy's ``exp``; the CPU calls the C library's (glibc).  An ulp of
``e`` reaches the output only if it moves ``fp32(e / z)`` across a float32 rounding boundary
(about 2**-28 per probability) and that moves ``RNE(127 p)``: measured agreement in
docs/design.md.

Per row the kernel writes the integer sum of ``P8`` and the row's state (no visible key,
normal, NaN) for the statistics (``empty_rows``, ``unnormalized_rows``), which the caller
reduces on the device (no read-back in the call).  Under ``TRITON_INTERPRET=1`` it runs on
CPU tensors (CI).
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard
from ._tiles import grid_entries, kv_tile, pow2, q_tile, row_range, scores, seq_cols

_F127 = tl.constexpr(127.0)
#: the row states of the kernel's second counter column
STATE_EMPTY, STATE_ROW, STATE_NAN = 0, 1, 2


@triton.jit
def _t(q, K8, b, Lk, D, cols, offs_d, sq, sk, c):
    """``t = fp32(fp32(fp32(fp32(S) c) s_q) s_k)`` of the rows ``q`` against keys ``cols``
    (keys past ``Lk`` score 0; the caller masks them)."""
    s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
    return ((s.to(tl.float32) * c) * sq[:, None]) * sk


@triton.jit
def _e(t, m64, live):
    """``exp(fp64(t) - fp64(m))`` where ``live``, else ``+0.0`` (the other lanes take
    ``exp(0)``)."""
    x = tl.where(live, t.to(tl.float64) - m64[:, None], 0.0)
    return tl.where(live, tl.exp(x), 0.0)


@triton.jit(do_not_specialize=("scale_bits",))
def _quant_only_kernel(Q8, K8, V8, SQ, SK, SV, OUT, INFO, b0, Lq, Lk, D, DV, shift, sq_b, sq_l,
                       scale_bits, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       SUB: tl.constexpr, BN3: tl.constexpr, BD: tl.constexpr,
                       BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b = b0 + program_id(1)``: ``OUT[b, rows]`` float32 and
    ``INFO[b, rows, 0:2]`` int32 (the row sum of ``P8``, the row state).  q8 ``(B, Lq, D)``,
    its scales ``SQ`` (element ``(b, i)`` at ``b sq_b + i sq_l``); k8 ``(B, Lk, D)``, v8 ``(B,
    Lk, DV)`` (one per query entry), ``SK``, ``SV`` ``(B,)`` float32; ``scale_bits`` the bits
    of the float32 ``scale``."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m, rok, lim, n_end = row_range(r0, Lq, Lk, shift, CAUSAL, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    sq = tl.load(SQ + b.to(tl.int64) * sq_b + offs_m.to(tl.int64) * sq_l, mask=rok, other=0.0)
    sk = tl.load(SK + b)
    c = scale_bits.to(tl.float32, bitcast=True)

    # pass 1: the row max of the visible scores (order-free; no score is NaN)
    m = tl.full([BM], float("-inf"), tl.float32)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        t = _t(q, K8, b, Lk, D, cols, offs_d, sq, sk, c)
        vis = cols[None, :] <= lim[:, None]
        m = tl.maximum(m, tl.max(tl.where(vis, t, float("-inf")), axis=1))

    # pass 2: z = sum of e over the visible keys, left to right in float64 (rows whose max is
    # -inf: none visible, or every visible score -inf: skipped, z = 0, as on the CPU)
    has = m != float("-inf")
    m64 = m.to(tl.float64)
    z = tl.zeros([BM], dtype=tl.float64)
    for n0 in range(0, n_end, SUB):
        cols = n0 + tl.arange(0, SUB)
        t = _t(q, K8, b, Lk, D, cols, offs_d, sq, sk, c)
        live = (cols[None, :] <= lim[:, None]) & has[:, None]
        z = seq_cols(z, _e(t, m64, live), BM, SUB)

    # pass 3: p, P8, their row sums and P8 v8
    isnan = z != z  # the max was +inf: exp(inf - inf) is NaN, so is every p of the row
    zs = tl.where(has, z, 1.0)
    psum = tl.zeros([BM], dtype=tl.int32)
    acc = tl.zeros([BM, BDV], dtype=tl.int32)
    for n0 in range(0, n_end, BN3):
        cols = n0 + tl.arange(0, BN3)
        t = _t(q, K8, b, Lk, D, cols, offs_d, sq, sk, c)
        live = (cols[None, :] <= lim[:, None]) & has[:, None]
        p = (_e(t, m64, live) / zs[:, None]).to(tl.float32)
        y = (p.to(tl.float64) * _F127).to(tl.float32)  # in [0, 127], or NaN
        y = tl.where(y == y, y, 0.0)  # (a NaN row's output is NaN below)
        w = y.to(tl.int32)  # y >= 0: truncation; then half to even by the exact remainder
        fr = y - w.to(tl.float32)
        p8 = w + ((fr > 0.5) | ((fr == 0.5) & ((w & 1) == 1))).to(tl.int32)
        psum += tl.sum(p8, axis=1)
        v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
        acc = tl.dot(p8.to(tl.int8), v, acc, out_dtype=tl.int32)

    sv = tl.load(SV + b).to(tl.float64)
    o = ((acc.to(tl.float64) * sv) / _F127).to(tl.float32)
    o = tl.where(isnan[:, None], float("nan"), o)
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], o,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    state = tl.where(lim >= 0, tl.where(isnan, 2, 1), 0)  # STATE_EMPTY / _ROW / _NAN
    ib = INFO + (b.to(tl.int64) * Lq + offs_m) * 2
    tl.store(ib, psum, mask=rok)
    tl.store(ib + 1, state, mask=rok)


@triton.jit
def _exp_f64_kernel(X, OUT, n, BLOCK: tl.constexpr):
    """``OUT[i] = exp(X[i])`` in float64: ``tl.exp`` alone (the PTX test counts the
    instructions of one libdevice ``exp`` with it)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(OUT + offs, tl.exp(tl.load(X + offs, mask=ok, other=0.0)), mask=ok)


#: ``(BM, BN, SUB, BN3, num_warps, num_stages)``: 64 query rows a program; key tiles of 64 for
#: the row maximum, sub-tiles of 16 for the float64 chain of ``z`` (a thread then holds whole
#: rows of 16 float64 values), tiles of 32 for ``p`` and ``P8 v8`` (the int8 dot needs
#: K >= 32; a 64-key tile of float64 ``exp`` holds twice the registers); 4 warps; 3 stages
#: (Triton 3.6 pipelines the key loads; 3.7's pipeliner declines the int8 warp-group dots
#: and compiles the loops unpipelined).  Timed on the H100 at (1, 32, 4096, 128), bf16, the
#: whole ``lp.attention`` call (median of ``do_bench``; non-causal / causal ms): this 6.60 /
#: 4.33; one stage 7.60 / 4.56; SUB 32 7.58 / 4.36; 8 warps 12.4 / 7.07; BM 32 9.77 / 5.60;
#: BM 128 with 8 warps 7.47 / 4.64.  Every setting gives the same bits.
LAUNCH = (64, 64, 16, 32, 4, 3)


def quant_only_rows(q8, k8, v8, sq, sk, sv, scale: float, *, causal: bool,
                    launch: tuple | None = None):
    """Run the fused ``quant_only`` kernel (module docstring).

    Args:
        q8: int8 ``(B, Lq, d)`` codes; k8, v8: int8 ``(B, Lk, d)``, ``(B, Lk, dv)`` (one per
            query entry); sq: float32 ``(B, Lq)``, q's scale of every row (any strides: an
            expanded per-entry scale is read as it is); sk, sv: float32 ``(B,)``; contiguous
            (but ``sq``), on one device.
        scale: the softmax scale (rounded to float32 here, as the CPU's ``scale32``).
        causal: key ``j`` visible to row ``i`` iff ``j <= i + Lk - Lq``.
        launch: ``(BM, BN, SUB, BN3, num_warps, num_stages)`` in place of :data:`LAUNCH`
            (timing; every setting gives the same bits: ``BN3 >= 32``, ``SUB`` 16 or 32).

    Returns:
        ``(out float32 (B, Lq, dv), info int32 (B, Lq, 2))``: per row the sum of its ``P8``
        and its state (:data:`STATE_EMPTY` no visible key, :data:`STATE_ROW`,
        :data:`STATE_NAN` a NaN row).
    """
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v8.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    info = torch.empty((B, Lq, 2), dtype=torch.int32, device=q8.device)
    if B == 0 or Lq == 0:
        return out, info
    bm, bn, sub, bn3, warps, stages = LAUNCH if launch is None else launch
    scale_bits = int(np.array(scale, dtype=np.float32).view(np.int32))
    with device_guard(q8):
        for b0, nb in grid_entries(B):
            _quant_only_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, v8, sq, sk, sv, out, info, b0, Lq, Lk, d, dv, Lk - Lq, sq.stride(0),
                sq.stride(1), scale_bits, CAUSAL=bool(causal), BM=bm, BN=bn, SUB=sub,
                BN3=bn3, BD=pow2(d, 32), BDV=pow2(dv, 16), num_warps=warps,
                num_stages=stages, **LAUNCH_OPTS)
    return out, info


__all__ = ["quant_only_rows", "LAUNCH", "STATE_EMPTY", "STATE_ROW", "STATE_NAN"]
