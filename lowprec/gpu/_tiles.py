"""Tile loads, the int8 score GEMM, the sequential float32 tile product and the sequential row
sums of a tile shared by the fused attention kernels (:mod:`.index_attention`,
:mod:`.qflash_kernel`, :mod:`.intflash_kernel`, :mod:`.quant_only_kernel`,
:mod:`.ivit_kernel`):
one program holds a block of query rows of one entry and walks key tiles; q, k and v are
C-contiguous ``(B, L, d)`` arrays (int8 codes, or float16 values for :func:`seq_dot`)."""

from __future__ import annotations

import contextlib

import numpy as np
import triton
import triton.language as tl

#: CUDA's largest grid y dimension: the kernels put one entry per program along y
GRID_Y_MAX = 65535


def grid_entries(B: int):
    """``(b0, n)`` chunks of ``B`` entries that fit CUDA's grid y dimension (a kernel launched
    per chunk adds ``b0`` to ``program_id(1)``)."""
    for b0 in range(0, B, GRID_Y_MAX):
        yield b0, min(B - b0, GRID_Y_MAX)


@triton.jit
def row_range(r0, Lq, Lk, shift, CAUSAL: tl.constexpr, BM: tl.constexpr):
    """``(offs_m, rok, lim, n_end)`` of the block of ``BM`` query rows from ``r0``: the rows,
    which exist, the last key each sees (causal: ``i + shift``, ``shift = Lk - Lq``; ``-1``
    for rows past ``Lq``) and the end of the keys any of them sees."""
    offs_m = r0 + tl.arange(0, BM)
    rok = offs_m < Lq
    if CAUSAL:
        lim = offs_m + shift
        n_end = tl.minimum(Lk, r0 + BM + shift)
    else:
        lim = tl.zeros([BM], dtype=tl.int32) + (Lk - 1)
        n_end = Lk
    return offs_m, rok, tl.where(rok, lim, -1), n_end


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


@triton.jit
def seq_dot(a, b, acc):
    """float32 ``acc + a @ b`` with every output summed in the CPU's order, ``acc =
    fl(acc + a[:, k] b[k, :])`` for ``k`` ascending, provided every product is exact in
    float32 (specs/gpu.md section 3): ``input_precision="ieee"`` lowers the dot to FMAs on
    the GPU, one per product, k ascending from the given accumulator (Triton's
    ``parametricConvertFMADot``), and an FMA of an exact product is the unfused multiply-add;
    chained over chunks of k it continues the same sequence.  (A row sum of ``a`` is
    ``seq_dot(a, ones, 0)``.)  The interpreter's dot is NumPy's matmul, in BLAS order: launch
    under :func:`sequential_interpreter_dots`."""
    return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def _seq2(z, x):
    """``(z + x[:, 0]) + x[:, 1]`` of a ``(BM, 2)`` tile."""
    a, b = tl.split(x)
    return (z + a) + b


@triton.jit
def _halves(x, BM: tl.constexpr, N: tl.constexpr):
    """Columns ``[0, N/2)`` and ``[N/2, N)`` of a ``(BM, N)`` tile (moves of values only)."""
    return tl.split(tl.permute(tl.reshape(x, [BM, 2, N // 2]), (0, 2, 1)))


@triton.jit
def _seq4(z, x, BM: tl.constexpr):
    a, b = _halves(x, BM, 4)
    return _seq2(_seq2(z, a), b)


@triton.jit
def _seq8(z, x, BM: tl.constexpr):
    a, b = _halves(x, BM, 8)
    return _seq4(_seq4(z, a, BM), b, BM)


@triton.jit
def _seq16(z, x, BM: tl.constexpr):
    a, b = _halves(x, BM, 8 * 2)
    return _seq8(_seq8(z, a, BM), b, BM)


@triton.jit
def _seq32(z, x, BM: tl.constexpr):
    a, b = _halves(x, BM, 16 * 2)
    return _seq16(_seq16(z, a, BM), b, BM)


@triton.jit
def seq_cols(z, x, BM: tl.constexpr, N: tl.constexpr):
    """``z + x[:, 0] + x[:, 1] + ... + x[:, N - 1]`` per row, added one column at a time left
    to right (the CPU's ``z += x[j]``: each add one rounding, in x's float dtype, any
    products exact or not, float64 included) for a ``(BM, N)`` tile, ``N`` 16 or 32.  The
    columns are taken apart by halving the tile (reshape, permute, split: moves of values,
    no arithmetic; in the PTX for sm_90 of Triton 3.7, one exchange through shared memory
    per tile, after which a thread holds whole rows), then added in a chain.  Unlike
    :func:`seq_dot` it needs no exact products (a float64 ``tl.dot`` would run on the float64
    tensor cores, in the hardware's order)."""
    if N == 16:
        r = _seq16(z, x, BM)
    else:
        tl.static_assert(N == 32, "seq_cols takes 16 or 32 columns")
        r = _seq32(z, x, BM)
    return r


@contextlib.contextmanager
def sequential_interpreter_dots():
    """Within the context, the Triton interpreter's float ``tl.dot`` sums as the GPU's FMA dot
    does (:func:`seq_dot`): ``acc = fl(acc + fl(a_k b_k))``, k ascending, each product checked
    to be exact (AssertionError otherwise: then the GPU's fused order would differ); integer
    dots keep the interpreter's own (exact) matmul.  The launchers of the kernels that use
    :func:`seq_dot` enter it when interpreting; nothing changes on a GPU."""
    from triton.runtime import interpreter as ti

    orig = ti.InterpreterBuilder.create_dot

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (a.dtype.scalar.is_floating() and b.dtype.scalar.is_floating()):
            return orig(self, a, b, d, input_precision, max_num_imprecise_acc)
        A = a.data.astype(np.float32)
        Bm = b.data.astype(np.float32)
        acc = d.data.astype(np.float32).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for kk in range(A.shape[-1]):
                x, y = A[..., :, kk, None], Bm[..., None, kk, :]
                p32 = x * y
                p64 = x.astype(np.float64) * y.astype(np.float64)
                ok = (p32.astype(np.float64) == p64) | (np.isnan(p32) & np.isnan(p64))
                if not ok.all():
                    raise AssertionError("seq_dot was given an inexact product")
                acc = acc + p32
        return ti.TensorHandle(acc, d.dtype.scalar)

    ti.InterpreterBuilder.create_dot = dot
    try:
        yield
    finally:
        ti.InterpreterBuilder.create_dot = orig


def pow2(n: int, lo: int) -> int:
    """The launch width of a dimension ``n``: a power of two, at least ``lo`` (``tl.dot``
    needs K >= 32 for int8 on sm_90)."""
    return max(lo, triton.next_power_of_2(max(int(n), 1)))


__all__ = ["GRID_Y_MAX", "grid_entries", "row_range", "q_tile", "kv_tile", "scores", "seq_dot",
           "seq_cols", "sequential_interpreter_dots", "pow2"]
