"""Per-row ``max |x|`` on the device in one pass over ``x``, read in its stored dtype (bfloat16,
float16 or float32): the row maxima the row-wise schemes' int8 scales start from, and their
NaN / Inf test (:func:`lowprec.kernels.device_rows.row_amax`, whose torch twin is
``x.abs().amax(dim=-1)``).

Exact by construction, on the bits: ``|x|`` is the pattern with its sign bit cleared, and the
patterns of non-negative floats order as integers, +Inf above every finite value and every NaN
above +Inf (bfloat16 ``0x7F80``, float16 ``0x7C00``, float32 ``0x7F800000``).  So one integer
max per row gives ``max |x|`` exactly, +Inf when the row holds an Inf and no NaN, and a value
above the Inf pattern when it holds a NaN, written as NaN: a NaN cannot be lost to a float max
that ignores it (specs/gpu.md section 2: ``tl.max`` of floats may drop NaN on the GPU).  The
row maximum is widened to float32 on the bits (bfloat16: a shift; float16: the exact widening
conversion) and stored as float64 (exact).  No float arithmetic at all.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, interpreting

#: the largest row the kernel takes (longer rows, e.g. a whole entry flattened, stay on torch's
#: reduction: a program walks its row alone)
MAX_ROW = 8192
#: elements per program: 4Ki on a GPU (32 rows of 128), 64Ki in the interpreter (gpu.md 4)
_TILE_GPU, _TILE_INTERP = 4096, 1 << 16
#: the stored dtypes (the kernel's ``KIND``)
_BF16, _F16, _F32 = 0, 1, 2


@triton.jit
def _row_amax_kernel(X, OUT, R, L, D, s_n, s_l, s_d, KIND: tl.constexpr,
                     BLOCK_R: tl.constexpr, BD: tl.constexpr):
    """``OUT[r] = max_j |X[r // L, r % L, j]|`` (float64; NaN if the row holds a NaN) for rows
    ``r < R``; ``X`` holds the bit patterns (int16 for bfloat16/float16, int32 for float32)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rok = rows < R
    r64 = rows.to(tl.int64)
    base = (r64 // L) * s_n + (r64 % L) * s_l
    if KIND == 2:
        mask_bits = 0x7FFFFFFF
        inf_bits = 0x7F800000
    elif KIND == 1:
        mask_bits = 0x7FFF
        inf_bits = 0x7C00
    else:
        mask_bits = 0x7FFF
        inf_bits = 0x7F80
    m = tl.zeros([BLOCK_R], dtype=tl.int32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        ok = rok[:, None] & (cols[None, :] < D)
        b = tl.load(X + base[:, None] + cols[None, :].to(tl.int64) * s_d, mask=ok, other=0)
        m = tl.maximum(m, tl.max(b.to(tl.int32) & mask_bits, axis=1))
    if KIND == 2:
        val = m.to(tl.float32, bitcast=True)
    elif KIND == 1:
        val = m.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        val = (m << 16).to(tl.float32, bitcast=True)
    res = tl.where(m > inf_bits, float("nan"), val.to(tl.float64))
    tl.store(OUT + rows, res, mask=rok)


def kernel_takes(x) -> bool:
    """Whether :func:`row_amax` runs on ``x``: a bfloat16, float16 or float32 ``(N, L, D)``
    tensor with ``0 < D <= MAX_ROW`` (other dtypes stay on torch's reduction)."""
    import torch

    return x.dim() == 3 and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and \
        0 < x.shape[2] <= MAX_ROW


def row_amax(x):
    """float64 ``(N, L)``: ``max |x|`` of every row of ``x (N, L, D)`` (any strides; see
    :func:`kernel_takes`), NaN where a row holds a NaN, +Inf where it holds an Inf and no NaN
    (``x.abs().amax(dim=-1)``'s values).

    Example:
        >>> row_amax(torch.tensor([[[1.0, -3.0], [float("nan"), 0.0]]]))  # doctest: +SKIP
        tensor([[3., nan]], dtype=torch.float64)
    """
    import torch

    N, L, D = x.shape
    out = torch.empty((N, L), dtype=torch.float64, device=x.device)
    R = N * L
    if R == 0:
        return out
    kind = {torch.bfloat16: _BF16, torch.float16: _F16, torch.float32: _F32}[x.dtype]
    bits = x.view(torch.int32 if kind == _F32 else torch.int16)
    tile = _TILE_INTERP if interpreting() else _TILE_GPU
    bd = min(triton.next_power_of_2(D), tile)
    br = max(1, tile // bd)
    with device_guard(x):
        _row_amax_kernel[(triton.cdiv(R, br),)](
            bits, out, R, L, D, bits.stride(0), bits.stride(1), bits.stride(2), KIND=kind,
            BLOCK_R=br, BD=bd, **LAUNCH_OPTS)
    return out


__all__ = ["row_amax", "kernel_takes", "MAX_ROW"]
