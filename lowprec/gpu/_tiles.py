"""Tile loads and the int8 score GEMM shared by the fused attention kernels
(:mod:`.index_attention`, :mod:`.qflash_kernel`): one program holds a block of query rows of one
entry and walks key tiles; q, k and v are C-contiguous int8 ``(B, L, d)`` arrays."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def q_tile(Q8, b, offs_m, rok, Lq, D, offs_d):
    """int8 ``(BM, BD)``: rows ``offs_m`` of entry ``b``'s q (zeros outside ``rok`` / ``D``)."""
    return tl.load(Q8 + b.to(tl.int64) * Lq * D + offs_m[:, None].to(tl.int64) * D
                   + offs_d[None, :], mask=rok[:, None] & (offs_d[None, :] < D), other=0)


@triton.jit
def kv_tile(X8, b, L, W, cols, colok, offs_w):
    """int8 ``(BN, BW)``: rows ``cols`` of entry ``b``'s k or v (width ``W``), zeros where
    ``colok`` is false or past ``W``."""
    p = X8 + b.to(tl.int64) * L * W + cols[:, None].to(tl.int64) * W + offs_w[None, :]
    return tl.load(p, mask=colok[:, None] & (offs_w[None, :] < W), other=0)


@triton.jit
def scores(q, K8, b, Lk, D, cols, colok, offs_d):
    """Exact int32 scores ``(BM, BN)`` of the query tile ``q`` against keys ``cols`` (keys
    outside ``colok`` score 0): an int8 ``tl.dot`` into int32, exact in any order."""
    k = kv_tile(K8, b, Lk, D, cols, colok, offs_d)
    return tl.dot(q, tl.trans(k), out_dtype=tl.int32)


def pow2(n: int, lo: int) -> int:
    """The launch width of a dimension ``n``: a power of two, at least ``lo`` (``tl.dot``
    needs K >= 32 for int8 on sm_90)."""
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


__all__ = ["q_tile", "kv_tile", "scores", "pow2"]
