"""Triton twins of :mod:`lowprec.formats.mx`: MXFP8 blocks on the GPU.

=========================  ==================================================================
Triton                     Numba (``formats/mx.py``)
=========================  ==================================================================
:func:`_floor_log2`        ``_floor_log2``: exponent and fraction of a block's amax, from bits
:func:`_shared_exp`        ``_shared_exp``: the four scale modes, the same closed forms
:func:`_block_kernel`      ``_make_block_kernel.kernel``: amax, scale, elements of each block
:func:`_decode_blocks`     ``_decode_blocks``: ``2**(scale - 127) * element``, 0xFF -> NaN
                           (element table reads masked: ``minifloat.table_value``)
=========================  ==================================================================

Layout as on the CPU: the blocked axis is moved last, the array seen as ``(rows, n)``, blocks of
``k`` consecutive elements per row (the last one partial); the stochastic counter of element
``(r, i)`` is ``offset + r * n + i`` (flat index in that axis-last layout).

Elements.  The CPU scales in float64 (``y = x * 2**-e``, exact) and runs the generic float64
codec.  For float32 (and widened float16/bfloat16) input the GPU builds the float32 bits of the
same ``y`` with integer operations (``y`` keeps the 24-bit significand of ``x``: exact whenever
``|y| >= 2**-126``) and runs the float32 twin the float codec uses for that mode (the fast path
for the deterministic modes, the generic codec in 32-bit lanes for stochastic rounding).  Below
``2**-126`` every element rounding depends only on the sign and on ``y != 0`` (the element's
smallest step is 2**-9 or 2**-16 and the stochastic fraction has at most 32 bits), so such ``y``
are replaced by ``+-2**-126``, which rounds the same way in every mode.  float64 input keeps the
CPU's float64 product and the generic float64 codec.  Both choices are checked against the Numba
path in the tests and on every block of the GPU sweep.

The amax of a block is a max over the integer bits of the finite ``|x|`` (exact, any order).
For a subnormal amax every scale mode clamps to -127 (``floor(log2 amax) - emax_elem + 1 <
-127``), so :func:`_floor_log2` does not normalise subnormals.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..formats.minifloat import codec_constants
from ..formats.mx import (
    _ELEM,
    E8M0_BIAS,
    E8M0_NAN,
    SCALE_EXP_MAX,
    SCALE_EXP_MIN,
    max_frac52,
)
from ._bits import IN_F64, float_bits32
from .minifloat import kernel_path, one, one_fast32, one_rne, table_len, table_value

_E8M0_BIAS = tl.constexpr(E8M0_BIAS)
_E8M0_NAN = tl.constexpr(E8M0_NAN)
_EXP_MIN = tl.constexpr(SCALE_EXP_MIN)
_EXP_MAX = tl.constexpr(SCALE_EXP_MAX)


@triton.jit
def _floor_log2(abits, FB: tl.constexpr, BIAS: tl.constexpr):
    """``(floor(log2 a), f)`` of a finite positive float from its bits (uint32 float32 or
    uint64 float64): ``a = (1 + f / 2**FB) * 2**fl``, subnormal ``a`` included (normalised:
    ``p`` the fraction's leading bit, ``fl = p + 1 - BIAS - FB``, ``f`` the bits below it
    moved up to ``FB`` bits), as ``mx._floor_log2`` computes from float64 (a float32
    subnormal amax can give a scale above the clamp, e.g. MXINT8's ``emax_elem = 0``).  The
    leading bit comes from the exact conversion of the fraction to a float (below 2**24 /
    2**53)."""
    fl = (abits >> FB).to(tl.int32) - BIAS
    f = abits & ((1 << FB) - 1)
    if FB == 23:
        p = (f.to(tl.float32).to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 127
    else:
        p = (f.to(tl.float64).to(tl.uint64, bitcast=True) >> 52).to(tl.int32) - 1023
    p = tl.minimum(tl.maximum(p, 0), FB - 1)  # (f == 0: amax 0, replaced by the caller)
    pu = p.to(f.dtype)
    lead = (f >> pu) << pu  # 2**p (the bits above p are zero)
    fs = (f - lead) << (FB - p).to(f.dtype)
    sub = fl == -BIAS
    return tl.where(sub, p + 1 - BIAS - FB, fl), tl.where(sub, fs, f)


@triton.jit
def _shared_exp(fl, f, smode, EMAX_ELEM: tl.constexpr, MAXFRAC: tl.constexpr,
                CARRY: tl.constexpr):
    """Unclamped shared exponent (``mx._shared_exp``; ``MAXFRAC``, ``CARRY`` in the input's
    fraction width).  ``smode`` is a run-time index into SCALE_MODES (one compiled kernel for
    the four; the choice costs a few selects per block)."""
    up = tl.where(smode == 2, f != 0, tl.where(smode == 1, f > MAXFRAC, f >= CARRY))
    up = up & (smode != 0)  # floor: never
    return fl + up.to(tl.int32) - EMAX_ELEM


@triton.jit
def _pow2_f32(e):
    """The float32 ``2**e`` for int32 ``e`` in [-127, 127] (2**-127 is subnormal)."""
    bits = tl.where(e >= -126, (e + 127) << 23, 0x00400000)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_bits32(u, e):
    """float32 bits of ``x * 2**-e`` for float32 bits ``u`` (module docstring): exact when
    ``|y| >= 2**-126``, ``+-2**-126`` for smaller non-zero ``y``; +-Inf stays +-Inf."""
    a = u & 0x7FFFFFFF
    ef = (a >> 23).to(tl.int32)
    ye = ef - e
    shifted = (a.to(tl.int32, bitcast=True) - (e << 23)).to(tl.uint32, bitcast=True)
    prod = (a.to(tl.float32, bitcast=True) * _pow2_f32(-e)).to(tl.uint32, bitcast=True)
    y = tl.where(ef >= 1, tl.where(ye >= 1, shifted, 0), prod)
    y = tl.where((y < 0x00800000) & (a != 0), 0x00800000, y)  # tiny: the representative
    y = tl.where(a == 0x7F800000, a, y)
    return y | (u & 0x80000000)


@triton.jit
def _encode_tile(x, e, bad, seed, idx, sr_bits, bf16, mtab_ptr, btab_ptr, vtab_ptr,
                 IN_KIND: tl.constexpr,
                 PATH: tl.constexpr, FB: tl.constexpr, BIAS_IN: tl.constexpr, SSH: tl.constexpr,
                 ABS_MASK: tl.constexpr, INF_BITS: tl.constexpr, E_LO: tl.constexpr,
                 EMAX: tl.constexpr, FRACMAX: tl.constexpr, UNIFORM: tl.constexpr,
                 M_U: tl.constexpr, Q_LO: tl.constexpr, M_MAX: tl.constexpr, T0: tl.constexpr,
                 T1: tl.constexpr, T2: tl.constexpr, NEG_ZERO: tl.constexpr,
                 NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr, MAX_CODE: tl.constexpr,
                 OVF_CODE: tl.constexpr, MODE: tl.constexpr, OVF_MAX_POS: tl.constexpr,
                 OVF_MAX_NEG: tl.constexpr, MAXBITS: tl.constexpr, INF_BITS32: tl.constexpr,
                 NAN_BITS32: tl.constexpr, SH_LO_BASE: tl.constexpr, OFF: tl.constexpr,
                 LOSCALE_BITS: tl.constexpr, RNE_HALF_M1: tl.constexpr,
                 RNE_MINNORM: tl.constexpr, RNE_CB: tl.constexpr, RNE_OVF: tl.constexpr,
                 RNE_NAN: tl.constexpr, RNE_S0: tl.constexpr, WANT_VALUE: tl.constexpr,
                 SIGN: tl.constexpr = 0x80, SGN_SH: tl.constexpr = 24,
                 PAR_FLIP: tl.constexpr = False, IS_INT: tl.constexpr = False):
    """Element codes (or values) of a tile of blocks with shared exponents ``e`` ([BR, 1]) and
    NaN flags ``bad``: the inner loop of ``_make_block_kernel.kernel`` (saturating)."""
    if IN_KIND == 1:
        u = x.to(tl.uint64, bitcast=True)
        sgn = (u >> 63).to(tl.uint32)
        inv = ((1023 - e).to(tl.int64) << 52).to(tl.float64, bitcast=True)
        y = (x * inv).to(tl.uint64, bitcast=True)  # exact: a power-of-two scaling
    else:
        u = float_bits32(x, IN_KIND, bf16)
        sgn = u >> 31
        y = _scaled_bits32(u, e)
    if PATH == 0:
        code = one(y, seed, idx, sr_bits, mtab_ptr, btab_ptr, FB, BIAS_IN, SSH, ABS_MASK,
                   INF_BITS, E_LO, EMAX, FRACMAX, UNIFORM, M_U, Q_LO, M_MAX, T0, T1, T2,
                   NEG_ZERO, NAN_CODE,
                   NAN_SIGNED, MAX_CODE, OVF_CODE, MODE, True, OVF_MAX_POS, OVF_MAX_NEG,
                   MAXBITS, INF_BITS32, NAN_BITS32, LOSCALE_BITS, False, SIGN)
    elif PATH == 1:
        code = one_fast32(y, E_LO, M_MAX, T0, T1, T2, UNIFORM, SH_LO_BASE, OFF, MAXBITS,
                          NEG_ZERO, NAN_CODE, NAN_SIGNED, MAX_CODE, OVF_CODE, MODE, True,
                          OVF_MAX_POS, OVF_MAX_NEG, INF_BITS32, NAN_BITS32, LOSCALE_BITS, False,
                          SIGN, PAR_FLIP)
    else:
        code = one_rne(y, MAX_CODE, OFF, RNE_HALF_M1, RNE_MINNORM, RNE_CB, RNE_OVF, RNE_NAN,
                       RNE_S0, SIGN, SGN_SH)
    if IS_INT:  # MXINT8: sign-magnitude -> two's complement
        code = tl.where((code & 0x80) != 0, (0 - (code & 0x7F)) & 0xFF, code)
    code = tl.where(bad, NAN_CODE | (sgn * SIGN), code)
    if WANT_VALUE:
        v = tl.load(vtab_ptr + code.to(tl.int32)) * _pow2_f32(e)
        r = tl.where(bad, float("nan"), v)
    else:
        r = code
    return r


@triton.jit(do_not_specialize=["rows", "n", "nb", "kk", "seed_lo", "seed_hi", "off_lo",
                               "off_hi", "sr_bits", "smode", "sat_inf", "bf16"])
def _block_kernel(x_ptr, codes_ptr, scales_ptr, out_ptr, mtab_ptr, btab_ptr, vtab_ptr, rows, n,
                  nb, kk, seed_lo, seed_hi, off_lo, off_hi, sr_bits, smode, sat_inf, bf16,
                  IN_KIND: tl.constexpr, EMAX_ELEM: tl.constexpr,
                  MAXFRAC: tl.constexpr, CARRY: tl.constexpr, PATH: tl.constexpr,
                  FB: tl.constexpr, BIAS_IN: tl.constexpr, SSH: tl.constexpr,
                  ABS_MASK: tl.constexpr, INF_BITS: tl.constexpr, E_LO: tl.constexpr,
                  EMAX: tl.constexpr, FRACMAX: tl.constexpr, UNIFORM: tl.constexpr,
                  M_U: tl.constexpr, Q_LO: tl.constexpr, M_MAX: tl.constexpr, T0: tl.constexpr,
                  T1: tl.constexpr, T2: tl.constexpr, NEG_ZERO: tl.constexpr,
                  NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr, MAX_CODE: tl.constexpr,
                  OVF_CODE: tl.constexpr, MODE: tl.constexpr, OVF_MAX_POS: tl.constexpr,
                  OVF_MAX_NEG: tl.constexpr, MAXBITS: tl.constexpr, INF_BITS32: tl.constexpr,
                  NAN_BITS32: tl.constexpr, SH_LO_BASE: tl.constexpr, OFF: tl.constexpr,
                  LOSCALE_BITS: tl.constexpr, RNE_HALF_M1: tl.constexpr,
                  RNE_MINNORM: tl.constexpr, RNE_CB: tl.constexpr, RNE_OVF: tl.constexpr,
                  RNE_NAN: tl.constexpr, RNE_S0: tl.constexpr, WANT_VALUE: tl.constexpr,
                  BR: tl.constexpr, KP: tl.constexpr, ONE_CHUNK: tl.constexpr,
                  SIGN: tl.constexpr = 0x80, SGN_SH: tl.constexpr = 24,
                  PAR_FLIP: tl.constexpr = False, IS_INT: tl.constexpr = False):
    """``BR`` blocks per program, ``KP`` (a power of two >= ``kk`` when ``ONE_CHUNK``, else a
    chunk of one long block) elements at a time: amax, the scale, then the elements."""
    pid = tl.program_id(0)
    b = pid * BR + tl.arange(0, BR)  # block ids
    row = b // nb
    j = b - row * nb
    bvalid = b < rows * nb
    t = tl.arange(0, KP)
    base = (row * n + j * kk)[:, None]  # flat index of each block's first element
    blen = tl.minimum(kk, n - j * kk)[:, None]
    seed = (seed_hi.to(tl.uint32).to(tl.uint64) << 32) | seed_lo.to(tl.uint32).to(tl.uint64)
    off = (off_hi.to(tl.uint32).to(tl.uint64) << 32) | off_lo.to(tl.uint32).to(tl.uint64)
    if IN_KIND == 1:
        INF_IN: tl.constexpr = 0x7FF0000000000000
        FB_IN: tl.constexpr = 52
        BIAS_A: tl.constexpr = 1023
    else:
        INF_IN: tl.constexpr = 0x7F800000
        FB_IN: tl.constexpr = 23
        BIAS_A: tl.constexpr = 127
    # amax over the finite |x| (integer max of the bits), NaN / Inf flags
    # "flat": every block of this program is whole and the blocks are contiguous in memory
    # (kk == KP, rows of whole blocks), so the tile is one contiguous, aligned range and the
    # accesses are unmasked and vectorised (the OCP k = 32 case)
    flat = (kk == KP) & (n % KP == 0) & (pid * BR + BR <= rows * nb)
    pos_flat = b[:, None] * KP + t[None, :]
    if ONE_CHUNK:
        if flat:
            valid = tl.full([BR, KP], 1, tl.int1)
            x = tl.load(x_ptr + pos_flat)
        else:
            valid = bvalid[:, None] & (t[None, :] < blen)
            x = tl.load(x_ptr + base + t[None, :], mask=valid)
        if IN_KIND == 1:
            a = x.to(tl.uint64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
        else:
            a = float_bits32(x, IN_KIND, bf16) & 0x7FFFFFFF
        amax = tl.max(tl.where(valid & (a < INF_IN), a, 0), axis=1)
        has_nan = tl.max(tl.where(valid & (a > INF_IN), 1, 0), axis=1)
        has_inf = tl.max(tl.where(valid & (a == INF_IN), 1, 0), axis=1)
    else:
        if IN_KIND == 1:
            amax = tl.zeros([BR], tl.uint64)
        else:
            amax = tl.zeros([BR], tl.uint32)
        has_nan = tl.zeros([BR], tl.int32)
        has_inf = tl.zeros([BR], tl.int32)
        for c0 in range(0, kk, KP):
            valid = bvalid[:, None] & (c0 + t[None, :] < blen)
            x = tl.load(x_ptr + base + c0 + t[None, :], mask=valid)
            if IN_KIND == 1:
                a = x.to(tl.uint64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
            else:
                a = float_bits32(x, IN_KIND, bf16) & 0x7FFFFFFF
            amax = tl.maximum(amax, tl.max(tl.where(valid & (a < INF_IN), a, 0), axis=1))
            has_nan = tl.maximum(has_nan, tl.max(tl.where(valid & (a > INF_IN), 1, 0), axis=1))
            has_inf = tl.maximum(has_inf, tl.max(tl.where(valid & (a == INF_IN), 1, 0), axis=1))
    fl, f = _floor_log2(amax, FB_IN, BIAS_A)
    e = _shared_exp(fl, f, smode, EMAX_ELEM, MAXFRAC, CARRY)
    e = tl.minimum(tl.maximum(e, _EXP_MIN), _EXP_MAX)
    e = tl.where(amax == 0, _EXP_MIN, e)
    # nonfinite="saturate" (sat_inf != 0): Inf is a huge finite value, scale 2**127
    e = tl.where((has_inf != 0) & (sat_inf != 0), _EXP_MAX, e)
    bad = (has_nan != 0) | ((has_inf != 0) & (sat_inf == 0))
    if not WANT_VALUE:
        sc = tl.where(bad, _E8M0_NAN, e + _E8M0_BIAS)
        tl.store(scales_ptr + b, sc.to(tl.uint8), mask=bvalid)
    e2 = e[:, None]
    bad2 = bad[:, None]
    for c0 in range(0, kk if not ONE_CHUNK else 1, KP):
        valid = bvalid[:, None] & (c0 + t[None, :] < blen)
        pos = base + c0 + t[None, :]
        if not ONE_CHUNK:
            x = tl.load(x_ptr + pos, mask=valid)
        idx = off + pos.to(tl.uint64)
        r = _encode_tile(x, e2, bad2, seed, idx, sr_bits, bf16, mtab_ptr, btab_ptr, vtab_ptr,
                         IN_KIND,
                         PATH, FB, BIAS_IN, SSH, ABS_MASK, INF_BITS, E_LO, EMAX, FRACMAX,
                         UNIFORM, M_U, Q_LO, M_MAX, T0, T1, T2, NEG_ZERO, NAN_CODE, NAN_SIGNED,
                         MAX_CODE, OVF_CODE, MODE, OVF_MAX_POS, OVF_MAX_NEG, MAXBITS,
                         INF_BITS32, NAN_BITS32, SH_LO_BASE, OFF, LOSCALE_BITS, RNE_HALF_M1,
                         RNE_MINNORM, RNE_CB, RNE_OVF, RNE_NAN, RNE_S0, WANT_VALUE, SIGN, SGN_SH,
                         PAR_FLIP, IS_INT)
        if WANT_VALUE:
            dst = out_ptr
        else:
            dst = codes_ptr
            r = r.to(tl.uint8)
        if ONE_CHUNK:
            if flat:
                tl.store(dst + pos_flat, r)
            else:
                tl.store(dst + pos, r, mask=valid)
        else:
            tl.store(dst + pos, r, mask=valid)


@triton.jit(do_not_specialize=["total", "n", "nb", "kk"])
def _decode_blocks(codes_ptr, scales_ptr, vtab_ptr, out_ptr, total, n, nb, kk,
                   BLOCK: tl.constexpr, NT: tl.constexpr = 0):
    """``out = 2**(scale - 127) * element`` (float32, exact or +-Inf), NaN where the scale
    code is 0xFF (``mx._decode_blocks``); ``NT``: the element table's length for 4- and 6-bit
    elements, a code beyond it gives NaN (``minifloat.table_value``)."""
    pid = tl.program_id(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    mask = i < total
    row = i // n
    col = i - row * n
    s = tl.load(scales_ptr + row * nb + col // kk, mask=mask, other=0).to(tl.int32)
    c = tl.load(codes_ptr + i, mask=mask, other=0).to(tl.int32)
    v = table_value(vtab_ptr, c, NT) * _pow2_f32(s - _E8M0_BIAS)
    tl.store(out_ptr + i, tl.where(s == _E8M0_NAN, float("nan"), v), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers


_TILE = 4096  # elements per program for short blocks
# Two tile shapes (so that the set of compiled kernels stays small): blocks up to 32 elements
# (the OCP default and shorter) 128 per program, loaded once; longer blocks one per program,
# 1024 elements at a time (an amax pass, then an element pass).
_SHAPES = ((32, 128, True), (1024, 1, False))  # (KP, BR, ONE_CHUNK)


def tile_shape(kk: int) -> tuple[int, int, bool]:
    """``(KP, BR, ONE_CHUNK)`` of the block kernel for blocks of ``kk`` elements."""
    return _SHAPES[0] if kk <= 32 else _SHAPES[1]


def block_constexprs(fmt_name: str, in64: bool, mode: int, want_value: bool, kk: int) -> dict:
    """Every ``tl.constexpr`` of :func:`_block_kernel` but ``IN_KIND`` (element constants from
    the Numba path's :func:`codec_constants`)."""
    spec, _info, _vals, emax_elem, mbits, is_int = _ELEM[fmt_name]
    K = codec_constants(spec, in64, int(mode), True)
    path = kernel_path(in64, int(mode), False, K)
    fb = 52 if in64 else 23
    C = {k: K[k] for k in (
        "FB", "BIAS_IN", "SSH", "ABS_MASK", "INF_BITS", "E_LO", "EMAX", "FRACMAX", "UNIFORM",
        "M_U", "Q_LO", "M_MAX", "T0", "T1", "T2", "NEG_ZERO", "NAN_CODE", "NAN_SIGNED",
        "MAX_CODE", "OVF_CODE", "MODE", "OVF_MAX_POS", "OVF_MAX_NEG", "MAXBITS", "INF_BITS32",
        "NAN_BITS32", "SH_LO_BASE", "OFF", "LOSCALE_BITS", "RNE_HALF_M1", "RNE_MINNORM",
        "RNE_CB", "RNE_OVF", "RNE_NAN", "RNE_S0", "SIGN", "SGN_SH", "PAR_FLIP")}
    C["IS_INT"] = bool(is_int)
    carry52 = ((1 << (mbits + 1)) - 1) << (51 - mbits)
    kp, br, one_chunk = tile_shape(kk)
    C.update(EMAX_ELEM=emax_elem, MAXFRAC=max_frac52(spec.max_value) >> (52 - fb),
             CARRY=carry52 >> (52 - fb), PATH=path, WANT_VALUE=bool(want_value),
             ONE_CHUNK=one_chunk, KP=kp, BR=br)
    return C


def quantize_blocks(x2, fmt_name: str, kk: int, smode: int, sat_inf: bool, mode: int,
                    seed: int, sr_bits: int, offset: int, codes=None, scales=None, out=None):
    """Run the block kernel on a contiguous ``(rows, n)`` tensor ``x2``: codes (uint8,
    ``(rows, n)``) and scales (uint8, ``(rows, nb)``), or float32 values into ``out``."""
    import torch

    from ._launch import LAUNCH_OPTS, device_guard, halves, interpreting, table
    from .minifloat import in_kind

    rows, n = x2.shape
    if rows * n == 0:
        return
    want_value = out is not None
    spec, _info, vals, _emax, _m, _int = _ELEM[fmt_name]
    kind, xr, bf16 = in_kind(x2)
    C = block_constexprs(fmt_name, kind == IN_F64, mode, want_value, kk)
    C["IN_KIND"] = kind
    if interpreting():  # fewer, larger programs (each costs milliseconds there)
        C["BR"] = max(C["BR"], (1 << 16) // C["KP"])
    nb = -(-n // kk)
    mtab = table(spec.m_tab, x2.device, torch.int32)
    btab = table(spec.base_tab, x2.device, torch.int32)
    vtab = table(vals, x2.device, torch.float32)
    dummy8 = torch.empty(1, dtype=torch.uint8, device=x2.device)
    dummyf = torch.empty(1, dtype=torch.float32, device=x2.device)
    slo, shi = halves(seed)
    # rows per launch: keep every flat index of a launch in int32
    rstep = max(1, (1 << 30) // max(n, 1))
    with device_guard(x2):
        for r0 in range(0, rows, rstep):
            r1 = min(rows, r0 + rstep)
            olo, ohi = halves(int(offset) + r0 * n)
            grid = (triton.cdiv((r1 - r0) * nb, C["BR"]),)
            _block_kernel[grid](
                xr[r0:r1], dummy8 if want_value else codes[r0:r1],
                dummy8 if want_value else scales[r0:r1], out[r0:r1] if want_value else dummyf,
                mtab, btab, vtab, r1 - r0, n, nb, kk, slo, shi, olo, ohi, int(sr_bits),
                int(smode), int(sat_inf), bf16, num_warps=4, **C, **LAUNCH_OPTS)


def decode_blocks(codes2, scales2, fmt_name: str, kk: int, out) -> None:
    """``out`` (float32, ``(rows, n)``) from contiguous codes ``(rows, n)`` and scales
    ``(rows, nb)`` on their device."""
    import torch

    from ._launch import block, device_guard, table

    rows, n = codes2.shape
    total = rows * n
    if total == 0:
        return
    vals = _ELEM[fmt_name][2]
    vtab = table(vals, codes2.device, torch.float32)
    nt = table_len(vals, codes2)
    nb = scales2.shape[1]
    B = block(4096)
    rstep = max(1, (1 << 30) // max(n, 1))
    with device_guard(codes2):
        for r0 in range(0, rows, rstep):
            r1 = min(rows, r0 + rstep)
            t = (r1 - r0) * n
            _decode_blocks[(triton.cdiv(t, B),)](codes2[r0:r1], scales2[r0:r1], vtab,
                                                 out[r0:r1], t, n, nb, kk, BLOCK=B, NT=nt,
                                                 num_warps=8)
