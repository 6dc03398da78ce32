"""IntAttention's fused device kernel: ``intattention`` (IndexSoftmax between two exact int8
GEMMs) for one program per block of query rows, in three passes over the keys, no
``L x L`` plane in memory (docs/design.md "Attention on the device").

It computes what :func:`lowprec.kernels.intattention_device.intattention` computes step by step
in torch operations (and the CPU's ``_fused_rows`` in Numba), for calls without a mask and
without deploy mode (the fast path; the others keep the torch path):

1. the row max ``m`` of the visible integer scores ``S = q8 k8^T`` (``tl.dot`` of int8 codes
   into int32: exact in any order, gpu.md section 3);
2. every visible key's index ``idx`` from its distance ``m - S`` clipped at ``c_int``
   (``"floor"``: ``trunc(fp32(nb D') / fp32(c_int))`` with ``tl.math.div_rn``; ``"nearest"``:
   the exact integer quotient rounded half to even), the exact sum ``Z`` of ``LUT[idx]`` and
   the clipped / zero counters (``LUT[idx]`` gathered from the table held in registers:
   3.95 ms for the kernel at (1, 32, 4096, 128) on the H100, 4.2 ms read from global
   memory);
3. ``P = RNE(fp32(fp64(fp32(LUT[idx] pmax)) / fp64(fp32(Z))))`` (one float64 division
   rounded to float32, then to the nearest integer by integer operations; computed once per
   row and index, ``nb + 1`` values, a register table gathered from), its row sum, and
   ``P v8``: per key tile a float16 ``tl.dot`` of the integers (``P <= 255`` and ``|v8| <=
   127`` are exact in float16, their products in float32, and a tile's sums are integers
   below ``2**24``, so every order gives the exact integer), converted to int32 and summed;
   the output ``fp32((fp64(acc) fp64(s_v)) / fp64(pmax))``.

The scores are recomputed in each pass (int8 GEMMs are cheap; the max must be known before
an index can be taken, and ``Z`` before a probability).  Launched with
``enable_fp_fusion=False``; no approximate division or conversion (the PTX check of
``tests/test_device_rows_ptx.py``).  Under ``TRITON_INTERPRET=1`` it runs on CPU tensors
(CI).  Per-row counters are written as the CPU kernel's ``info`` rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard
from ._tiles import kv_tile, pow2, q_tile, row_range, scores

#: |P v8| partial sums stay below 2**31 for Lk up to this (255 * 127 * Lk); beyond, int64.
ACC32_MAX_KEYS = (2**31 - 1) // (255 * 127)
_INT32_MIN = tl.constexpr(-(2**31))


@triton.jit
def _index(dd, c, c32, c64, nb, MODE: tl.constexpr, WIDE: tl.constexpr):
    """LUT index of the distances ``dd`` (int32, >= 0) clipped at ``c`` (``_index_of``)."""
    ddc = tl.minimum(dd, c)
    if MODE == 0:
        if WIDE:
            numf = (ddc.to(tl.int64) * nb).to(tl.float32)
        else:  # nb * c < 2**31 (the launcher checks): the int32 product is exact
            numf = (ddc * nb).to(tl.float32)
        qf = tl.math.div_rn(numf, c32)
        idx = tl.minimum(qf.to(tl.int32), nb)
    else:
        num = ddc.to(tl.int64) * nb
        qq = num // c64
        rr = num - qq * c64
        up = (2 * rr > c64) | ((2 * rr == c64) & ((qq & 1) == 1))
        idx = (qq + up.to(tl.int64)).to(tl.int32)
    return idx


@triton.jit
def _intattention_kernel(Q8, K8, V8, CINT, LUT, SV, OUT, INFO, Lq, Lk, D, DV, shift, nb, iz,
                         CAUSAL: tl.constexpr, MODE: tl.constexpr, PMAX: tl.constexpr,
                         ACC64: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BD: tl.constexpr, BDV: tl.constexpr, NBP: tl.constexpr,
                         WIDE: tl.constexpr):
    """One block of ``BM`` query rows of entry ``b``: ``OUT[b, rows]`` float32 and
    ``INFO[b, rows, 0:8]`` int64 (clipped, zero, empty, wrap, nsovf, dovf, visible, psum)."""
    b = tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m, rok, lim, n_end = row_range(r0, Lq, Lk, shift, CAUSAL, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    c = tl.load(CINT + b.to(tl.int64) * Lq + offs_m, mask=rok, other=1)
    c32 = c.to(tl.float32)[:, None]
    c64 = c.to(tl.int64)[:, None]
    c2 = c[:, None]

    # pass 1: the visible row max
    m = tl.full([BM], _INT32_MIN, tl.int32)
    for n0 in range(0, n_end, BN):
        cols = n0 + offs_n
        s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
        vis = cols[None, :] <= lim[:, None]
        m = tl.maximum(m, tl.max(tl.where(vis, s, _INT32_MIN), axis=1))

    # pass 2: indices, Z and the counters
    offs_j = tl.arange(0, NBP)
    ej = tl.load(LUT + offs_j, mask=offs_j <= nb, other=0)
    lut_rows = tl.broadcast_to(ej[None, :], [BM, NBP])
    z = tl.zeros([BM], dtype=tl.int64)
    clipped = tl.zeros([BM], dtype=tl.int32)
    zero = tl.zeros([BM], dtype=tl.int32)
    for n0 in range(0, n_end, BN):
        cols = n0 + offs_n
        s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
        vis = cols[None, :] <= lim[:, None]
        dd = tl.where(vis, m[:, None] - s, 0)
        idx = tl.where(vis, _index(dd, c2, c32, c64, nb, MODE, WIDE), nb)
        e = tl.gather(lut_rows, idx, axis=1)  # from the table in registers
        z += tl.sum(e, axis=1).to(tl.int64)
        clipped += tl.sum((vis & (dd >= c2)).to(tl.int32), axis=1)
        zero += tl.sum((vis & (idx >= iz)).to(tl.int32), axis=1)

    # the row's probability of every index (nb + 1 values: one division each), a register
    # table that pass 3 gathers from
    zf = z.to(tl.float32).to(tl.float64)[:, None]
    zf = tl.where(zf == 0.0, 1.0, zf)  # (rows without a visible key: P = 0 below)
    num = (ej * PMAX).to(tl.float32).to(tl.float64)[None, :]
    qf = (num / zf).to(tl.float32)
    t = qf.to(tl.int32)  # qf >= 0: truncation; then half to even by the exact remainder
    fr = qf - t.to(tl.float32)
    pt = t + ((fr > 0.5) | ((fr == 0.5) & ((t & 1) == 1))).to(tl.int32)

    # pass 3: probabilities, their sum and P v8
    psum = tl.zeros([BM], dtype=tl.int64)
    if ACC64:
        acc = tl.zeros([BM, BDV], dtype=tl.int64)
    else:
        acc = tl.zeros([BM, BDV], dtype=tl.int32)
    for n0 in range(0, n_end, BN):
        cols = n0 + offs_n
        s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
        vis = cols[None, :] <= lim[:, None]
        dd = tl.where(vis, m[:, None] - s, 0)
        idx = tl.where(vis, _index(dd, c2, c32, c64, nb, MODE, WIDE), nb)
        p = tl.where(vis, tl.gather(pt, idx, axis=1), 0)
        psum += tl.sum(p, axis=1).to(tl.int64)
        v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
        # integers in float16 (|p| <= 255, |v| <= 127: exact), products exact in float32 and
        # the tile's sums integers below 2**24 (BN * 255 * 127): exact in any order
        part = tl.dot(p.to(tl.float16), v.to(tl.float16), out_dtype=tl.float32).to(tl.int32)
        if ACC64:
            acc += part.to(tl.int64)
        else:
            acc += part

    sv = tl.load(SV + b).to(tl.float64)
    o = ((acc.to(tl.float64) * sv) / PMAX).to(tl.float32)
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], o,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    nvis = tl.maximum(tl.minimum(lim + 1, Lk), 0)
    ib = INFO + (b.to(tl.int64) * Lq + offs_m) * 8
    tl.store(ib + 0, clipped.to(tl.int64), mask=rok)
    tl.store(ib + 1, zero.to(tl.int64), mask=rok)
    tl.store(ib + 2, (nvis == 0).to(tl.int64), mask=rok)
    tl.store(ib + 6, nvis.to(tl.int64), mask=rok)
    tl.store(ib + 7, psum, mask=rok)


def intattention_rows(q8, k8, v8, cint, lut, sv, *, causal: bool, mode: int, nb: int, iz: int,
                      pmax: int, c_max: int):
    """Run the fused kernel.

    Args:
        q8: int8 ``(B, Lq, d)`` codes; k8, v8: int8 ``(B, Lk, d)``, ``(B, Lk, dv)`` (one per
            query entry); cint: int32 ``(B, Lq)`` thresholds (>= 1); lut: int32 ``(nb + 1,)``;
            sv: float32 ``(B,)``; all contiguous, on one device.
        causal: key ``j`` visible to row ``i`` iff ``j <= i + Lk - Lq``.
        mode: 0 floor, 1 nearest; nb, iz: the LUT's last index and first zero entry;
        pmax: 255 (uint8 P) or 127 (int8 P).
        c_max: the largest threshold (the index product ``nb * D'`` is taken in int64 when
            ``nb * c_max`` does not fit int32).

    Returns:
        ``(out float32 (B, Lq, dv), info int64 (B, Lq, 8))``.
    """
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v8.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    info = torch.zeros((B, Lq, 8), dtype=torch.int64, device=q8.device)
    if B == 0 or Lq == 0:
        return out, info
    nbp = pow2(nb + 1, 2)
    wide = int(c_max) * nb >= 2**31
    # the fastest of the settings measured on an H100; 3 stages: Triton 3.6 pipelines the key
    # and value loads (3.63 against 4.00 ms at (1, 32, 4096, 128)), 3.7 compiles the loop
    # unpipelined (its pipeliner declines the int8 warp-group dots)
    bm, bn, warps, stages = 64, 64, 4, 3
    assert bn * 255 * 127 < 2**24  # the float16 P v8 tile sums stay exact
    grid = (triton.cdiv(Lq, bm), B)
    with device_guard(q8):
        _intattention_kernel[grid](
            q8, k8, v8, cint, lut, sv, out, info, Lq, Lk, d, dv, Lk - Lq, nb, iz,
            CAUSAL=bool(causal), MODE=int(mode), PMAX=int(pmax),
            ACC64=Lk > ACC32_MAX_KEYS, BM=bm, BN=bn, BD=pow2(d, 32), BDV=pow2(dv, 16),
            NBP=nbp, WIDE=wide,
            num_warps=warps, num_stages=stages, **LAUNCH_OPTS)
    return out, info


__all__ = ["intattention_rows", "ACC32_MAX_KEYS"]
