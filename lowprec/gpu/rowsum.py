"""Sequential row sums on the device: the CPU's pinned order of a float sum, left to right.

The row-wise schemes' Numba kernels sum a row with one accumulator, ``z = 0.0; z += x[j]`` for
``j = 0, 1, ...`` (e.g. ``quant_only``'s float64 softmax denominator).  torch's reductions run
as trees, in orders that differ between the CPU and CUDA, so a float sum taken by torch can
differ from the CPU's in its last bit.  :func:`seq_rowsum` takes each row's sum in the CPU's
order: one program holds a block of rows and adds their columns one at a time (no product, so
no FMA contraction can arise; launched with ``enable_fp_fusion=False`` all the same).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, interpreting


@triton.jit
def _seq_rowsum_kernel(X, OUT, N, L, BLOCK_R: tl.constexpr):
    """``OUT[r] = ((0 + X[r, 0]) + X[r, 1]) + ...`` in X's float dtype, rows ``r < N`` of a
    C-contiguous ``(N, L)`` array."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < N
    base = rows.to(tl.int64) * L
    acc = tl.zeros([BLOCK_R], dtype=X.dtype.element_ty)
    for j in range(0, L):
        acc = acc + tl.load(X + base + j, mask=ok, other=0.0)
    tl.store(OUT + rows, acc, mask=ok)


def seq_rowsum(x):
    """Sums of the rows of a float32 or float64 ``(N, L)`` torch tensor in left-to-right order
    (a tensor of ``N`` sums, x's dtype and device; under ``TRITON_INTERPRET=1`` CPU tensors run
    in Triton's interpreter)."""
    import torch

    x = x.contiguous()
    N, L = x.shape
    out = torch.zeros(N, dtype=x.dtype, device=x.device)
    if N == 0 or L == 0:
        return out
    br = 1024 if interpreting() else 128
    with device_guard(x):
        _seq_rowsum_kernel[(triton.cdiv(N, br),)](x, out, N, L, BLOCK_R=br, **LAUNCH_OPTS)
    return out


__all__ = ["seq_rowsum"]
