"""Symmetric int8 codes on the device in one pass: ``clamp(RNE(fl64(x) / fl64(s)), -127,
127)`` (``-128`` as the lower clamp for QFlash; the CPU's ``_int8`` rule,
:func:`lowprec.kernels.device_rows.codes` in torch operations), read from bfloat16, float16 or
float32 rows in their stored dtype and written as int8, for the row-wise schemes' q, k and v.

The quotient's rounding needs the IEEE float64 quotient ``fl64(x / s)`` only near a tie.  Each
row divides once, ``r = fl64(1 / s)`` (``div.rn.f64``), and each value takes ``q = fl64(x r)``.
Both ``q`` and ``fl64(x / s)`` lie within ``2**-52 |x / s|`` of the exact quotient (two and one
roundings), so within ``2**-44`` of each other wherever the code does not saturate (``|x / s|
<= 129``; beyond, both saturate).  Where ``q`` is farther than :data:`TIE_TOL` ``= 2**-40`` from
every half-integer, both round to the same integer (neither can be a half-integer nor cross
one); where it is not (a tie or a near-tie: about ``2**-39`` of random values, more for values
that are exact multiples of half a step), or ``q`` is NaN, the block's values take the IEEE
division itself (one branch per block).  So the codes are the division's for every input
value and every positive scale (float32 or float64) with a finite reciprocal.

The rounding to an integer is done on the quotient's integer and fractional parts (exact:
``|q|`` is clamped to 128 first, where float64 holds every step exactly), so no libdevice call
or float conversion rounds (specs/gpu.md section 2; PTX checked by
``tests/test_device_rows_ptx.py``).  bfloat16 values are widened on their bits (the
interpreter's bfloat16 loads flush subnormals).  Inputs must be finite and scales positive (the
callers check both first).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._bits import IN_16, float_bits32
from ._launch import LAUNCH_OPTS, device_guard, interpreting

_IN_16 = tl.constexpr(IN_16)

#: elements per program on a GPU (8 rows of 128: float64 temporaries of larger tiles spill;
#: measured on the H100 at (32, 4096, 128) bfloat16, 44 us against 57-206 us for 4-8Ki)
_TILE_GPU = 1024
#: distance from a half-integer below which a value's code is taken from the IEEE division
#: (``2**-40``: the two quotients differ by at most ``2**-44`` where codes do not saturate)
TIE_TOL = 2.0**-40
_TIE_TOL = tl.constexpr(TIE_TOL)


@triton.jit
def _int8_codes_kernel(X, SRC, S, OUT, L, D, nl, s_b, s_l, QMIN: tl.constexpr,
                       BF16: tl.constexpr, HAS_SRC: tl.constexpr, BLOCK_L: tl.constexpr,
                       BD: tl.constexpr):
    """``OUT[b, l, :] = codes(X[SRC[b], l, :] / S[b * s_b + l * s_l])`` for rows ``l < L``
    (``SRC[b] = b`` without ``HAS_SRC``); program ``pid`` takes entry ``pid // nl``, rows block
    ``pid % nl``; ``X`` holds bfloat16 values as int16 bits with ``BF16``."""
    pid = tl.program_id(0)
    b = (pid // nl).to(tl.int64)
    rows = (pid % nl) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.arange(0, BD)
    rok = rows < L
    ok = rok[:, None] & (cols[None, :] < D)
    src = b
    if HAS_SRC:
        src = tl.load(SRC + b).to(tl.int64)
    raw = tl.load(X + (src * L + rows[:, None].to(tl.int64)) * D + cols[None, :], mask=ok,
                  other=0)
    if BF16:  # widened on its bits (_bits.float_bits32)
        x = float_bits32(raw, _IN_16, 1).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        x = raw.to(tl.float64)
    s = tl.load(S + b * s_b + rows.to(tl.int64) * s_l, mask=rok, other=1.0).to(tl.float64)
    q = x * (1.0 / s)[:, None]
    bad = q != q
    q = tl.minimum(tl.maximum(q, -128.0), 128.0)
    t = q.to(tl.int32)  # toward zero; q - t is exact
    fr = q - t.to(tl.float64)
    near = bad | ~(tl.abs(tl.abs(fr) - 0.5) >= _TIE_TOL)
    if tl.max(near.to(tl.int32)) > 0:  # a (near-)tie in the block: the IEEE quotient there
        q = tl.where(near, tl.minimum(tl.maximum(x / s[:, None], -128.0), 128.0), q)
        t = q.to(tl.int32)
        fr = q - t.to(tl.float64)
    odd = (t & 1) != 0
    up = (fr > 0.5) | ((fr == 0.5) & odd)
    down = (fr < -0.5) | ((fr == -0.5) & odd)
    r = t + up.to(tl.int32) - down.to(tl.int32)
    r = tl.minimum(tl.maximum(r, QMIN), 127)
    tl.store(OUT + (b * L + rows[:, None].to(tl.int64)) * D + cols[None, :], r.to(tl.int8),
             mask=ok)


def int8_codes(x, scales, src=None, qmin: int = -127):
    """int8 codes ``(B, L, D)`` of ``x`` ``(Bx, L, D)`` (bfloat16, float16 or float32),
    clamped to ``[qmin, 127]`` (``qmin`` -127 or -128).

    Args:
        x: tensor; entry ``b`` of the result reads ``x[src[b]]`` (``src`` None: ``x[b]``,
            ``B = Bx``).
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
    bf16 = x.dtype == torch.bfloat16
    xs = x.contiguous()
    if bf16:
        xs = xs.view(torch.int16)
    s = scales.contiguous()
    s_b, s_l = (s.stride(0), s.stride(1)) if s.dim() == 2 else (1, 0)
    bd = max(16, triton.next_power_of_2(D))
    bl = max(1, (1 << 16 if interpreting() else _TILE_GPU) // bd)
    nl = triton.cdiv(L, bl)
    with device_guard(x):
        _int8_codes_kernel[(nl * B,)](
            xs, xs if src is None else src.contiguous(), s, out, L, D, nl, s_b, s_l,
            QMIN=int(qmin), BF16=bf16, HAS_SRC=src is not None, BLOCK_L=bl, BD=bd,
            **LAUNCH_OPTS)
    return out


__all__ = ["int8_codes", "TIE_TOL"]
