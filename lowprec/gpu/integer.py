"""Triton twins of :mod:`lowprec.formats.integer`: INT8 / UINT8 on the GPU.

=========================  ==================================================================
GPU                        CPU (``formats/integer.py``)
=========================  ==================================================================
:func:`_quantize_one`      ``_quantize_one``: ``clamp(round(x / s) + z)`` of one element
:func:`_rows`              ``_rows`` / ``_segment``: the element loop, codes or values
:func:`_decode_kernel`     ``decode``: ``float32(code - z) * s``
:func:`group_minmax`       ``_group_minmax`` (``_minmax``): torch reductions on the device
:func:`data_scales`        the amax / min-max scale formulas of ``_resolve``
=========================  ==================================================================

The layout is the CPU's: the flat C-order input seen as ``(P, L, Q)``, element ``(o, m, i)``
using scale ``o * so + (m // bm) * sm + (i // bi) * si`` (``integer._Layout``), so one kernel
serves every granularity.  ``x / s`` is the float64 quotient as on the CPU (``/`` on float64
compiles to the IEEE ``div.rn.f64``: checked in the PTX test), rounded to an integer from its
bits by :func:`lowprec.gpu.rounding.round_to_int`.  A value is ``float32(q - z) * s`` in float32:
one correctly rounded product of exact operands, the CPU's float64 product narrowed once.

Scales from data use torch reductions on the device (min and max are exact in any order) and
the CPU's float64 formulas (``/`` and the float64 -> float32 rounding are IEEE in torch's CUDA
kernels), so nothing is copied to the host.  ``decode`` of int4/uint4 checks the codes' range as
the CPU does (``_arrays.check_codes``, one reduction read back; int8/uint8 codes are all valid);
:func:`_decode_kernel` also gives NaN for a code outside the range, should one reach it.
Values the host cannot check without synchronising (a CUDA tensor of explicit scales or zero
points, a QuantizedArray's device scales, NaN met by ``encode``) are not raised on: an invalid
scale or zero point makes its group's values NaN (``quantize``, ``decode``) and codes 0
(``encode``), and NaN inputs encode to code 0.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from ._bits import float_bits32
from .rounding import round_to_int


@triton.jit
def _quantize_one(v, s, z, qmin, qmax, MODE: tl.constexpr, seed, idx, sr_bits):
    """Clamped code (float64; NaN for NaN input) of float64 ``v`` with float64 scale ``s`` and
    zero point ``z`` (``integer._quantize_one``)."""
    y = v / s  # IEEE float64 division (div.rn.f64)
    r = round_to_int(y, MODE, seed, idx, sr_bits)  # +-Inf come back unchanged
    r = tl.where(y != y, y, r)
    q = r + z
    q = tl.where(q < qmin, qmin, q)
    q = tl.where(q > qmax, qmax, q)
    return q


@triton.jit
def _scale_index(k, one_group, small, L, Q, bm, sm, so, bi, si):
    """Scale index of flat element ``k`` (int64): ``o * so + (m // bm) * sm + (i // bi) * si``
    for ``k = (o * L + m) * Q + i`` (``integer._Layout``); 0 for a single group.  ``small``:
    every index of the tensor fits in int32, and the divisions run in 32 bits (64-bit integer
    division is emulated and several times slower)."""
    if one_group != 0:
        j = tl.zeros_like(k)
    elif small != 0:  # (names of their own: both branches of a Triton `if` must agree)
        k32 = k.to(tl.int32)
        r32 = k32 // Q
        o32 = r32 // L
        m32 = r32 - o32 * L
        i32 = k32 - r32 * Q
        j = (o32 * so + (m32 // bm) * sm + (i32 // bi) * si).to(tl.int64)
    else:
        row = k // Q
        o = row // L
        m = row - o * L
        i = k - row * Q
        j = o * so + (m // bm) * sm + (i // bi) * si
    return j


@triton.jit(do_not_specialize=["n", "k0_lo", "k0_hi", "L", "Q", "bm", "sm", "so", "bi", "si",
                               "qmin", "qmax", "seed_lo", "seed_hi", "off_lo", "off_hi",
                               "sr_bits", "one_group", "small", "has_zp", "bf16"])
def _rows(x_ptr, scale_ptr, zp_ptr, out_ptr, n, k0_lo, k0_hi, L, Q, bm, sm, so, bi, si, qmin,
          qmax, seed_lo, seed_hi, off_lo, off_hi, sr_bits, one_group, small, has_zp, bf16,
          IN_KIND: tl.constexpr, MODE: tl.constexpr, WANT_VALUE: tl.constexpr,
          BLOCK: tl.constexpr):
    """Codes (uint8 two's complement bits) or float32 values of elements ``k0 .. k0 + n - 1``
    of the flat input (``integer._rows``); ``x_ptr`` points at element ``k0``."""
    pid = tl.program_id(0)
    t = pid * BLOCK + tl.arange(0, BLOCK)
    mask = t < n
    full = pid * BLOCK + BLOCK <= n  # unmasked (vectorised) accesses but in the last program
    if full:
        x = tl.load(x_ptr + t)
    else:
        x = tl.load(x_ptr + t, mask=mask)
    if IN_KIND == 1:
        v = x
    elif IN_KIND == 0:
        v = x.to(tl.float64)  # exact
    else:
        v = float_bits32(x, IN_KIND, bf16).to(tl.float32, bitcast=True).to(tl.float64)
    k0 = (k0_hi.to(tl.int64) << 32) | k0_lo.to(tl.uint32).to(tl.int64)
    k = k0 + t.to(tl.int64)
    j = _scale_index(k, one_group, small, L, Q, bm, sm, so, bi, si)
    s32 = tl.load(scale_ptr + j, mask=mask, other=1.0)
    s = s32.to(tl.float64)
    zi = tl.load(zp_ptr + j, mask=mask & (has_zp != 0), other=0)
    z = zi.to(tl.float64)
    zbad = (z < qmin) | (z > qmax)
    # a device scale the host could not check: poisons its group (module docstring)
    bad = (~(s32 > 0.0)) | (s32 == float("inf")) | zbad
    seed = (seed_hi.to(tl.uint32).to(tl.uint64) << 32) | seed_lo.to(tl.uint32).to(tl.uint64)
    off = (off_hi.to(tl.uint32).to(tl.uint64) << 32) | off_lo.to(tl.uint32).to(tl.uint64)
    idx = off + k.to(tl.uint64)
    q = _quantize_one(v, tl.where(bad, 1.0, s), z, qmin.to(tl.float64), qmax.to(tl.float64),
                      MODE, seed, idx, sr_bits)
    if WANT_VALUE:
        val = (q - z).to(tl.float32) * s32  # exact operands, one float32 rounding
        res = tl.where(bad, float("nan"), val)
    else:
        nan = (q != q) | bad
        res = (tl.where(nan, 0, tl.where(nan, 0.0, q).to(tl.int32)) & 0xFF).to(tl.uint8)
    if full:
        tl.store(out_ptr + t, res)
    else:
        tl.store(out_ptr + t, res, mask=mask)


@triton.jit(do_not_specialize=["n", "k0_lo", "k0_hi", "L", "Q", "bm", "sm", "so", "bi", "si",
                               "qmin", "qmax", "one_group", "small", "has_zp"])
def _decode_kernel(codes_ptr, scale_ptr, zp_ptr, out_ptr, n, k0_lo, k0_hi, L, Q, bm, sm, so,
                   bi, si, qmin, qmax, one_group, small, has_zp, SIGNED: tl.constexpr,
                   BLOCK: tl.constexpr):
    """``float32(code - z) * s`` (``integer.decode``); NaN where the scale is not finite and
    positive, or the code or the zero point lies outside the format's ``[qmin, qmax]`` (the
    host checks codes first, ``_arrays.check_codes``; this keeps an unchecked one harmless)."""
    pid = tl.program_id(0)
    t = pid * BLOCK + tl.arange(0, BLOCK)
    mask = t < n
    c = tl.load(codes_ptr + t, mask=mask, other=0)
    if SIGNED:
        ci = c.to(tl.int8, bitcast=True).to(tl.int32)
    else:
        ci = c.to(tl.uint8, bitcast=True).to(tl.int32)
    cbad = (ci < qmin) | (ci > qmax)  # an int4/uint4 code the host did not check
    k0 = (k0_hi.to(tl.int64) << 32) | k0_lo.to(tl.uint32).to(tl.int64)
    k = k0 + t.to(tl.int64)
    j = _scale_index(k, one_group, small, L, Q, bm, sm, so, bi, si)
    s = tl.load(scale_ptr + j, mask=mask, other=1.0)
    zi = tl.load(zp_ptr + j, mask=mask & (has_zp != 0), other=0)
    cv = ci.to(tl.float32) - zi.to(tl.float32)  # exact: small integers
    zbad = (zi < qmin) | (zi > qmax)
    v = cv * s  # one float32 rounding
    bad = (~(s > 0.0)) | (s == float("inf")) | zbad | cbad
    tl.store(out_ptr + t, tl.where(bad, float("nan"), v), mask=mask)


# --------------------------------------------------------------------------------------------
# Host side: scales from data (torch on the device), launches


def group_minmax(flat, lay):
    """Per scale group ``min(min x, 0)`` and ``max(max x, 0)`` over the finite elements of the
    flat float tensor ``flat``, as float64 tensors of ``prod(lay.scale_shape)`` values in the
    scale array's C order (``integer._group_minmax``; min and max are exact in any order)."""
    import torch

    n = flat.numel()
    L, Q, bm, bi = lay.L, lay.Q, lay.bm, lay.bi
    P = n // (L * Q) if n else 0
    ns = math.prod(lay.scale_shape)
    dev = flat.device
    if n == 0:
        return (torch.zeros(ns, dtype=torch.float64, device=dev),
                torch.zeros(ns, dtype=torch.float64, device=dev))
    xf = flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat
    fin = torch.isfinite(xf)
    lo = torch.where(fin, xf, math.inf).view(P, L, Q)
    hi = torch.where(fin, xf, -math.inf).view(P, L, Q)
    nl, nq = -(-L // bm), -(-Q // bi)
    if nl * bm != L or nq * bi != Q:  # a partial last block: pad with the neutral value
        pad = (0, nq * bi - Q, 0, nl * bm - L)
        lo = torch.nn.functional.pad(lo, pad, value=math.inf)
        hi = torch.nn.functional.pad(hi, pad, value=-math.inf)
    lo = lo.reshape(P, nl, bm, nq, bi).amin(dim=(2, 4))
    hi = hi.reshape(P, nl, bm, nq, bi).amax(dim=(2, 4))
    # dimensions whose scale stride is 0 share one scale: reduce them too
    dims = tuple(d for d, st in ((0, lay.so), (1, lay.sm), (2, lay.si)) if st == 0)
    if dims:
        lo = lo.amin(dim=dims)
        hi = hi.amax(dim=dims)
    lo = torch.clamp(lo.reshape(-1).double(), max=0.0)
    hi = torch.clamp(hi.reshape(-1).double(), min=0.0)
    return lo, hi


def _to_f32_scale(s64):
    """``integer._to_f32_scale``: float64 -> float32 (nearest even), clamped to the positive
    float32 range."""
    import torch

    from ..formats.integer import F32_MAX, F32_TINY

    return torch.clamp(s64.float(), min=F32_TINY, max=F32_MAX)


def data_scales(flat, lay, symmetric: bool, uint8: bool, qmin: int, qmax: int, s32=None):
    """Scales (float32) and zero points (int32 or None) from the data, the formulas of
    ``integer._resolve`` in torch float64 on the device; ``s32``: explicit scales (then only
    the asymmetric zero points come from the data)."""
    import torch

    lo, hi = group_minmax(flat, lay)
    if symmetric:
        amax = torch.maximum(-lo, hi)
        s = _to_f32_scale(amax / qmax)  # 127 / 255 (int8 / uint8), 7 / 15 (int4 / uint4)
        return torch.where(amax == 0, torch.ones_like(s), s), None
    if s32 is None:
        s = _to_f32_scale((hi - lo) / (qmax - qmin))
        s32 = torch.where(hi == lo, torch.ones_like(s), s)
    zf = qmin - torch.round(lo / s32.double())  # round half to even, as np.rint
    return s32, torch.clamp(zf, qmin, qmax).to(torch.int32)


def _small(n: int, lay) -> int:
    """1 if every element index and layout value fits in int32 (``_scale_index``)."""
    vals = (n, lay.L, lay.Q, lay.bm, lay.sm, lay.so, lay.bi, lay.si,
            math.prod(lay.scale_shape))
    return int(max(vals) < 2**31 - 1)


def run_rows(flat, scales, zps, lay, out, mode: int, seed: int, sr_bits: int, offset: int,
             qmin: int, qmax: int) -> None:
    """Codes (uint8 ``out``) or values (float32 ``out``) of the flat input on its device."""
    import torch

    from ._launch import LAUNCH_OPTS, block, chunks, device_guard, halves
    from .minifloat import in_kind

    n = flat.numel()
    if n == 0:
        return
    kind, xr, bf16 = in_kind(flat)
    one_group = math.prod(lay.scale_shape) == 1
    B = block(2048)
    slo, shi = halves(seed)
    zp = zps if zps is not None else torch.zeros(1, dtype=torch.int32, device=flat.device)
    with device_guard(flat):
        for s0, s1 in chunks(n):
            klo, khi = halves(s0)
            olo, ohi = halves(int(offset))
            _rows[(triton.cdiv(s1 - s0, B),)](
                xr[s0:s1], scales, zp, out[s0:s1], s1 - s0, klo, khi, lay.L, lay.Q, lay.bm,
                lay.sm, lay.so, lay.bi, lay.si, qmin, qmax, slo, shi, olo, ohi, int(sr_bits),
                int(one_group), _small(n, lay), int(zps is not None), bf16, IN_KIND=kind,
                MODE=int(mode),
                WANT_VALUE=out.dtype == torch.float32, BLOCK=B, num_warps=8, **LAUNCH_OPTS)


def run_decode(codes, scales, zps, lay, out, qmin: int, qmax: int) -> None:
    """``out`` (float32, flat) from flat int8/uint8 codes with the layout's scales; ``qmin``,
    ``qmax``: the format's code range (``integer.RANGES``), which bounds the zero points too."""
    import torch

    from ._launch import LAUNCH_OPTS, block, chunks, device_guard, halves

    n = codes.numel()
    if n == 0:
        return
    one_group = math.prod(lay.scale_shape) == 1
    B = block(4096)
    zp = zps if zps is not None else torch.zeros(1, dtype=torch.int32, device=codes.device)
    with device_guard(codes):
        for s0, s1 in chunks(n):
            klo, khi = halves(s0)
            _decode_kernel[(triton.cdiv(s1 - s0, B),)](
                codes[s0:s1].view(torch.uint8), scales, zp, out[s0:s1], s1 - s0, klo, khi,
                lay.L, lay.Q, lay.bm, lay.sm, lay.so, lay.bi, lay.si, qmin, qmax,
                int(one_group), _small(n, lay), int(zps is not None),
                SIGNED=codes.dtype == torch.int8,
                BLOCK=B, num_warps=8, **LAUNCH_OPTS)
