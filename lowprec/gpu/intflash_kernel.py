"""INT-FlashAttention's Algorithm 1 as one Triton kernel (the device path of ``intflash`` for
calls without a mask, both variants; docs/design.md "Attention on the device"): one program
per block of query rows of one entry walks the key tiles of ``block_k`` keys with the online
float32 softmax, the P requantisation (full) or float16 P (half), the tile's ``P v`` and the
``l`` / ``acc`` updates, and writes the float16-rounded output and per-row counters.

It mirrors :func:`lowprec.kernels.intflash_device._chunk` (the torch twin, whose docstring lists
the CPU's steps) and the CPU's ``intflash._intflash_kernel`` row by row, every step one
correctly rounded float32 operation in the CPU's order (launched with
``enable_fp_fusion=False``; divisions ``tl.math.div_rn``)::

    S     = q8 k8^T                 int8 tl.dot into int32 (exact in any order)
    Y     = fp32(fp32(fp32(fp32(S) s_q) s_k) c)
    m_new = max(m, rowmax Y)        over the row's keys (causal: j <= i + Lk - Lq); NaN ignored
    p     = exp2_f32(fp32(Y - m_new))           the CPU's float32 exp2 (:mod:`.exp2f`)
    l_t   = sum_j p_j, j ascending             seq_dot(p, ones): FMA dot of exact products
    full: P8 = trunc(f16(f16(f16(p) 127) + 0.5))  (float16 roundings on the bits)
          T  = fp32(fp32(fp32(P8 v8) s_v) / 127)  (P8 v8: int8 tl.dot into int32, exact)
    half: T  = sum_j fp32(f16(p_j) v_j), j ascending  (seq_dot: the products are exact)
    alpha = exp2_f32(fp32(m - m_new)); l = fp32(fp32(l alpha) + l_t);
    acc   = fp32(fp32(acc alpha) + T)              only on rows whose tile holds a visible
                                                   key (the others are left untouched)
    O     = f16(fp32(acc / l)), NaN for a row that saw no key

The two sequential sums are :func:`~._tiles.seq_dot` (``tl.dot`` with
``input_precision="ieee"``: FMAs, k ascending from the accumulator, specs/gpu.md section 3;
under the interpreter the launch runs inside :func:`~._tiles.sequential_interpreter_dots`,
which sums in that order and checks that every product is exact).  A key tile of
``block_k`` keys is walked in sub-tiles of ``SUB`` keys (a power of two; keys past ``Lk`` and
lanes past ``block_k`` take no part), twice: the row maximum first, then ``p`` and the sums,
whose dots chain from one sub-tile to the next (the scores are recomputed; the registers of a
whole tile's float64 exp2 would spill).  Per row the kernel counts the rescales (a finite
running max that grew) and the float16 overflows of the output; the tile counts follow from
the shape alone (the caller's).  PTX: ``tests/test_device_rows_ptx.py``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, interpreting
from ._tiles import (
    grid_entries,
    kv_tile,
    pow2,
    q_tile,
    scores,
    seq_dot,
    sequential_interpreter_dots,
)
from .engine import _round_f16
from .exp2f import exp2_f32, near_table

_F127 = tl.constexpr(127.0)


@triton.jit
def _round_f16_unit(x):
    """:func:`~.engine._round_f16` of an ``x`` in ``[0, 65504]`` (no sign, no overflow, no NaN
    to keep): below ``2**-14`` the add-and-subtract of 0.5 (spacing ``2**-24``), above it
    round to nearest even on the bits."""
    a = x.to(tl.int32, bitcast=True)
    r = ((a + 0xFFF + ((a >> 13) & 1)) & -8192).to(tl.float32, bitcast=True)
    return tl.where(a < 0x38800000, (x + 0.5) - 0.5, r)


@triton.jit
def _p8_of(p):
    """``trunc(f16(f16(f16(p) 127) + 0.5))`` of ``p`` in [0, 1] as int32 (``intflash._p8_of``;
    the float16 roundings on the bits, every operand in ``[0, 128]``); 0 for NaN (whose row's
    output is NaN either way)."""
    r = _round_f16_unit(_round_f16_unit(_round_f16_unit(p) * _F127) + 0.5)
    return tl.where(p == p, r, 0.0).to(tl.int32)


@triton.jit
def _y(q, K8, SK, kvb, Lk, D, cols, real, offs_d, sq, c):
    """``Y = fp32(fp32(fp32(fp32(S) s_q) s_k) c)`` of the rows ``q`` against keys ``cols``
    (the exact int8 scores; keys outside ``real`` score 0 and are masked by the caller)."""
    s = scores(q, K8, kvb, Lk, D, cols, real, offs_d)
    sk = tl.load(SK + kvb * Lk + cols, mask=real, other=0.0)
    return ((s.to(tl.float32) * sq[:, None]) * sk[None, :]) * c


@triton.jit(do_not_specialize=("c_bits",))
def _intflash_kernel(Q8, K8, V, KV, SQ, SK, SV, KEYS, VALS, OUT, CNT, b0, Lq, Lk, D, DV,
                     shift, bk, nk, c_bits, CAUSAL: tl.constexpr, HALF: tl.constexpr,
                     BM: tl.constexpr, SUB: tl.constexpr, SUBM: tl.constexpr,
                     BD: tl.constexpr, BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b = b0 + program_id(1)``: ``OUT[b, rows]`` float32 (float16 values),
    ``CNT[b, rows, 0:2]`` int32 (rescales, float16 overflows).  q8 ``(B, Lq, D)`` and its
    scales ``SQ (B, Lq)``; k8 ``(Bk, Lk, D)``, ``SK (Bk, Lk)`` and V (int8 codes, or float16
    values for ``HALF``) ``(Bk, Lk, DV)`` of the stored head ``KV[b]``; ``SV (B,)``.  A key
    tile of ``bk`` keys is walked in sub-tiles of ``SUB`` keys, twice: its row maximum, then
    ``p``, ``l_t`` and ``T`` (the scores are recomputed: int8 GEMMs are cheap, registers
    are not; the sequential sums chain their dots from sub-tile to sub-tile)."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m = r0 + tl.arange(0, BM)
    sl = tl.arange(0, SUB)
    slm = tl.arange(0, SUBM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    rok = offs_m < Lq
    kvb = tl.load(KV + b)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    sq = tl.load(SQ + b.to(tl.int64) * Lq + offs_m, mask=rok, other=0.0)
    c = c_bits.to(tl.float32, bitcast=True)
    if CAUSAL:  # the keys the CPU's loop visits: j <= i + Lk - Lq
        lim = offs_m + shift
        last = tl.minimum(r0 + BM, Lq) - 1 + shift  # the block's last row sees the most
        t_end = tl.minimum(nk, (tl.maximum(last, -1) + bk) // bk)
    else:
        lim = tl.zeros([BM], dtype=tl.int32) + (Lk - 1)
        t_end = nk
    if HALF:
        sv = 0.0
    else:
        sv = tl.load(SV + b)
    nsub = (bk + SUB - 1) // SUB
    nsubm = (bk + SUBM - 1) // SUBM
    # a column of ones (and zeros beside it: a dot needs N >= 16) for the row sums
    ones = tl.where(tl.arange(0, 16)[None, :] == 0, 1.0, 0.0) + tl.zeros([SUB, 16], tl.float32)
    vrow = kvb * Lk * DV
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.full([BM], 1.0, tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    resc = tl.zeros([BM], dtype=tl.int32)
    for t in range(0, t_end):
        j0 = t * bk
        rmax = tl.full([BM], float("-inf"), tl.float32)
        for u in range(0, nsubm):  # the tile's row maximum (order-free; NaN ignored)
            lane = u * SUBM + slm
            cols = j0 + lane
            real = (lane < bk) & (cols < Lk)
            y = _y(q, K8, SK, kvb, Lk, D, cols, real, offs_d, sq, c)
            incl = real[None, :] & (cols[None, :] <= lim[:, None])
            ymax = tl.max(tl.where(incl & (y == y), y, float("-inf")), axis=1)
            rmax = tl.where(ymax > rmax, ymax, rmax)
        upd = rmax != float("-inf")  # rows this tile updates
        mn = tl.where(rmax > m, rmax, m)
        lt = tl.zeros([BM, 16], dtype=tl.float32)  # column 0: the sum, the others 0
        if HALF:
            T = tl.zeros([BM, BDV], dtype=tl.float32)
        else:
            ti = tl.zeros([BM, BDV], dtype=tl.int32)
        for u in range(0, nsub):
            lane = u * SUB + sl
            cols = j0 + lane
            real = (lane < bk) & (cols < Lk)
            y = _y(q, K8, SK, kvb, Lk, D, cols, real, offs_d, sq, c)
            incl = real[None, :] & (cols[None, :] <= lim[:, None])
            live = incl & upd[:, None]  # the other lanes' exp2 of 0 never takes the branch
            p = tl.where(live, exp2_f32(tl.where(live, y - mn[:, None], 0.0), KEYS, VALS), 0.0)
            lt = seq_dot(p, ones, lt)
            if HALF:
                vp = V + vrow + cols[:, None].to(tl.int64) * DV + offs_v[None, :]
                vt = tl.load(vp, mask=real[:, None] & (offs_v[None, :] < DV), other=0.0)
                T = seq_dot(_round_f16(p), vt.to(tl.float32), T)
            else:
                v8 = kv_tile(V, kvb, Lk, DV, cols, real, offs_v)
                ti = tl.dot(_p8_of(p).to(tl.int8), v8, ti, out_dtype=tl.int32)
        if not HALF:
            T = tl.math.div_rn(ti.to(tl.float32) * sv, tl.full([BM, BDV], 127.0, tl.float32))
        alpha = exp2_f32(m - mn, KEYS, VALS)
        resc += (upd & (m != float("-inf")) & (mn != m)).to(tl.int32)
        lsum = tl.where(upd, (lsum * alpha) + tl.sum(lt, axis=1), lsum)
        acc = tl.where(upd[:, None], (acc * alpha[:, None]) + T, acc)
        m = mn

    never = m == float("-inf")
    o = tl.math.div_rn(acc, lsum[:, None])
    oh = _round_f16(o)
    dvok = offs_v[None, :] < DV
    big = (oh == float("inf")) | (oh == float("-inf"))
    was = (o == float("inf")) | (o == float("-inf"))
    ovf = tl.sum((dvok & big & ~was & ~never[:, None]).to(tl.int32), axis=1)
    res = tl.where(never[:, None], float("nan"), oh)
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], res,
             mask=rok[:, None] & dvok)
    cp = CNT + (b.to(tl.int64) * Lq + offs_m) * 2
    tl.store(cp, resc, mask=rok)
    tl.store(cp + 1, ovf, mask=rok)


def launch_config(half: bool, block_k: int = 64) -> tuple[int, int, int, int]:
    """``(BM, SUB, SUBM, num_warps)``: 64 rows a program; key sub-tiles of ``SUB`` = 32 (full;
    its int8 ``P8 v8`` dot needs K >= 32) or 16 (half: the FMA dot holds ``SUB`` values of
    each operand row and column per thread) for ``p`` and the sums, and of ``SUBM`` = the
    tile's launch width up to 64 for the row maximum (scores and ``Y`` only); 4 warps (full)
    or 8 (half).  Timed on the H100 at (1, 32, 4096, 128): docs/design.md "Session 6
    measurements"."""
    sub = 16 if half else 32
    return 64, sub, max(sub, min(pow2(block_k, 16), 64)), 8 if half else 4


def intflash_rows(q8, sq, k8, sk, v, sv, kv, c: float, *, causal: bool, block_k: int,
                  half: bool):
    """Run the kernel.

    Args:
        q8: int8 ``(B, Lq, d)``; sq: float32 ``(B, Lq)``; k8: int8 ``(Bk, Lk, d)``; sk:
            float32 ``(Bk, Lk)``; v: int8 codes (full) or float16 values (half) ``(Bk, Lk,
            dv)``; sv: float32 ``(B,)`` (unused for half); kv: int64 ``(B,)``, the stored
            head of each entry; contiguous, on one device.
        c: ``score_unit(scale)`` (a float32 value).
        causal, block_k, half: the call's mask and options (any ``block_k`` the CPU takes:
            its int32 ``P8 v8`` tile sums cannot wrap).

    Returns:
        ``(out float32 (B, Lq, dv) holding float16 values, counters int32 (B, Lq, 2))``:
        per row the rescales and the float16 overflows.
    """
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    cnt = torch.zeros((B, Lq, 2), dtype=torch.int32, device=q8.device)
    if B == 0 or Lq == 0:
        return out, cnt
    bm, sub, subm, warps = launch_config(half, block_k)
    nk = -(-Lk // block_k)
    keys, vals = near_table(q8.device)
    c_bits = int(np.float32(c).view(np.int32))
    seq = sequential_interpreter_dots() if interpreting() else contextlib.nullcontext()
    with device_guard(q8), seq:
        for b0, nb in grid_entries(B):
            _intflash_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, v, kv, sq, sk, sv, keys, vals, out, cnt, b0, Lq, Lk, d, dv, Lk - Lq,
                block_k, nk, c_bits, CAUSAL=bool(causal), HALF=bool(half), BM=bm, SUB=sub,
                SUBM=subm, BD=pow2(d, 32), BDV=pow2(dv, 16), num_warps=warps, num_stages=1,
                **LAUNCH_OPTS)
    return out, cnt


__all__ = ["intflash_rows", "launch_config"]
