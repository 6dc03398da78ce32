"""Symmetric int8 codes on the device in one pass: ``clamp(RNE(fl64(x) / fl64(s)), -127,
127)`` (``-128`` as the lower clamp for QFlash; the CPU's ``_int8`` rule,
:func:`lowprec.kernels.device_rows.codes` in torch operations), read from float32 rows and
written as int8, for the row-wise schemes' q, k and v.

The division is IEEE float64 (``div.rn.f64``), the rounding to an integer is done on the
quotient's integer and fractional parts (exact: ``|x / s|`` is clamped to 128 first, where
float64 holds every step exactly), so no libdevice call or float conversion rounds
(specs/gpu.md section 2; PTX checked by ``tests/test_device_rows_ptx.py``).  Inputs must be
finite and scales positive (the callers check both first).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, interpreting


@triton.jit
def _int8_codes_kernel(X, SRC, S, OUT, L, D, s_b, s_l, QMIN: tl.constexpr,
                       BLOCK_L: tl.constexpr, BD: tl.constexpr):
    """``OUT[b, l, :] = codes(X[SRC[b], l, :] / S[b * s_b + l * s_l])`` for rows ``l < L``."""
    b = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.arange(0, BD)
    rok = rows < L
    ok = rok[:, None] & (cols[None, :] < D)
    src = tl.load(SRC + b).to(tl.int64)
    x = tl.load(X + (src * L + rows[:, None].to(tl.int64)) * D + cols[None, :], mask=ok,
                other=0.0).to(tl.float64)
    s = tl.load(S + b.to(tl.int64) * s_b + rows.to(tl.int64) * s_l, mask=rok,
                other=1.0).to(tl.float64)
    q = tl.minimum(tl.maximum(x / s[:, None], -128.0), 128.0)
    t = q.to(tl.int32)  # toward zero; q - t is exact
    fr = q - t.to(tl.float64)
    odd = (t & 1) != 0
    up = (fr > 0.5) | ((fr == 0.5) & odd)
    down = (fr < -0.5) | ((fr == -0.5) & odd)
    r = t + up.to(tl.int32) - down.to(tl.int32)
    r = tl.minimum(tl.maximum(r, QMIN), 127)
    tl.store(OUT + (b.to(tl.int64) * L + rows[:, None].to(tl.int64)) * D + cols[None, :],
             r.to(tl.int8), mask=ok)


def int8_codes(x, scales, src=None, qmin: int = -127):
    """int8 codes ``(B, L, D)`` of float32 ``x`` ``(Bx, L, D)`` (C-contiguous), clamped to
    ``[qmin, 127]`` (``qmin`` -127 or -128).

    Args:
        x: float32 tensor; entry ``b`` of the result reads ``x[src[b]]`` (``src`` None:
            ``x[b]``, ``B = Bx``).
        scales: float32 or float64 ``(B, L)`` (one scale per row) or ``(B,)`` (one per
            entry), > 0.
        src: None or int64 ``(B,)`` tensor on x's device.
    """
    import torch

    B = x.shape[0] if src is None else src.shape[0]
    L, D = x.shape[1], x.shape[2]
    out = torch.empty((B, L, D), dtype=torch.int8, device=x.device)
    if B == 0 or L == 0 or D == 0:
        return out
    if src is None:
        src = torch.arange(B, dtype=torch.int64, device=x.device)
    s = scales.contiguous()
    s_b, s_l = (s.stride(0), s.stride(1)) if s.dim() == 2 else (1, 0)
    bd = max(16, triton.next_power_of_2(D))
    bl = max(1, min(256 if interpreting() else 64, 8192 // bd))
    with device_guard(x):
        _int8_codes_kernel[(triton.cdiv(L, bl), B)](
            x.contiguous(), src.contiguous(), s, out, L, D, s_b, s_l, QMIN=int(qmin),
            BLOCK_L=bl, BD=bd,
            **LAUNCH_OPTS)
    return out


__all__ = ["int8_codes"]
