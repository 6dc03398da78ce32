"""Triton twins of the float codecs of :mod:`lowprec.formats.minifloat` (HiF8, E4M3, E5M2).

One kernel, :func:`_codec_kernel`, specialised at compile time on everything the Numba kernels
bake into their closures: the dict of :func:`lowprec.formats.minifloat.codec_constants` (one
``FloatSpec`` drives both devices), the mode, ``saturate``, codes or values, and which of the
per-element functions runs.  Those mirror the Numba ones, name for name:

=====================  ========================================================================
Triton                 Numba (``formats/minifloat.py``)
=====================  ========================================================================
:func:`one`            ``make_kernel.one``: the generic codec, int64 arithmetic on the exact
                       significand; float32 and float64 input, every mode (stochastic, hybrid)
:func:`one_fast32`     ``make_fast32_kernel.one``: float32, deterministic modes, 32-bit lanes
:func:`one_rne`        ``make_fast32_kernel.one_rne``: uniform formats, ties-to-even codes
:func:`one_rna`        ``make_fast32_kernel.one_rna``: HiF8 ties-away codes
:func:`_lookup_kernel` ``_arrays.lookup``: decode through the value table (reads masked
                       to the table: :func:`table_value`)
=====================  ========================================================================

``run_kernel`` picks the path exactly as ``minifloat.run_kernel`` does (float32 input with a
deterministic mode: the fast path; otherwise the generic one), so every (input, option) pair runs
the Triton twin of the Numba function that computes it on the CPU.

Exactness (gpu.md section 2): only integer arithmetic, plus three float operations that are exact
or correctly rounded by IEEE 754 on both devices: ``|x| + C`` in :func:`one_rne` (the FPU's own
ties-to-even, as on the CPU), and ``n * 2**Q_LO`` (an exact product) for values below the lowest
binade.  Kernels are launched with ``enable_fp_fusion=False``.  float16/bfloat16 inputs are
widened to float32 in the kernel (exact); no float is ever narrowed by a cast.  Values are built
from bits: a finite result in a full binade is ``n`` quanta of ``2**(et - m)``, whose float32
bits are ``(et + 127) << 23`` plus ``(n - 2**m) << (23 - m)`` (a carry ``n = 2**(m+1)`` runs into
the exponent) -- the Numba kernel multiplies by a power of two in float64 and narrows, which is
exact, so both give the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..formats.minifloat import _FAST_MODES, Pow2Spec, codec_constants
from ._bits import IN_16, IN_F32, IN_F64, float_bits32
from .hif8 import _code_of_bits32
from .rounding import HYBRID, RNA, SR, round_up, sr_draw, sr_draw32, sr_round_up, sr_round_up32

SIGN = tl.constexpr(0x80)
F32_SIGN = tl.constexpr(0x80000000)

# which per-element function a kernel runs
PATH_GENERIC = 0
PATH_FAST32 = 1
PATH_RNE = 2
PATH_RNA = 3


@triton.jit
def taper_width(ae, M_MAX: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr,
                T2: tl.constexpr):
    """Mantissa bits of the binade ``|E| = ae`` (int32): ``M_MAX - #{t in taper: ae >= t}``
    (``FloatSpec.taper``; the expression the Numba fast path writes inline)."""
    return (M_MAX - (ae >= T0).to(tl.int32) - (ae >= T1).to(tl.int32)
            - (ae >= T2).to(tl.int32))


@triton.jit
def finish_code(code, ovf, big, neg, nan_in, MAX_CODE: tl.constexpr, OVF_CODE: tl.constexpr,
                SAT: tl.constexpr, OVF_MAX_POS: tl.constexpr, OVF_MAX_NEG: tl.constexpr,
                NEG_ZERO: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
                SIGN: tl.constexpr = 0x80):
    """The special cases that end both codecs' code paths (``make_kernel.one`` and
    ``make_fast32_kernel.one`` write them inline): overflow (to +-max or the Inf/NaN code, by
    sign and mode), +-Inf input, the sign bit (none on a zero without -0), NaN input; uint32."""
    ovf_pos = MAX_CODE if OVF_MAX_POS else OVF_CODE
    ovf_neg = MAX_CODE if OVF_MAX_NEG else OVF_CODE
    code = tl.where(ovf, tl.where(neg, ovf_neg, ovf_pos), code)
    code = tl.where(big, MAX_CODE if SAT else OVF_CODE, code)
    sgn = tl.where(neg, SIGN, 0).to(tl.uint32)
    if NEG_ZERO:
        code = code | sgn
    else:
        code = tl.where(code != 0, code | sgn, 0)
    if NAN_SIGNED:
        nan = NAN_CODE | sgn
    else:
        nan = tl.full(sgn.shape, NAN_CODE, tl.uint32)
    return tl.where(nan_in, nan, code).to(tl.uint32)


@triton.jit
def one(u, seed, idx, sr_bits, mtab_ptr, btab_ptr,
        FB: tl.constexpr, BIAS_IN: tl.constexpr, SSH: tl.constexpr, ABS_MASK: tl.constexpr,
        INF_BITS: tl.constexpr, E_LO: tl.constexpr, EMAX: tl.constexpr, FRACMAX: tl.constexpr,
        UNIFORM: tl.constexpr, M_U: tl.constexpr, Q_LO: tl.constexpr, M_MAX: tl.constexpr,
        T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
        NEG_ZERO: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
        MAX_CODE: tl.constexpr, OVF_CODE: tl.constexpr, MODE: tl.constexpr, SAT: tl.constexpr,
        OVF_MAX_POS: tl.constexpr, OVF_MAX_NEG: tl.constexpr, MAXBITS: tl.constexpr,
        INF_BITS32: tl.constexpr, NAN_BITS32: tl.constexpr, LOSCALE_BITS: tl.constexpr,
        WANT_VALUE: tl.constexpr, SIGN: tl.constexpr = 0x80):
    """The generic codec of one lane (``make_kernel.one``): ``u`` holds float32 (uint32) or
    float64 (uint64) bits; returns the uint32 code, or the uint32 bits of the float32 value.

    Lane width: float64 input works in int64 like the Numba kernel; float32 input in int32
    (its significand has 24 bits), with the shift clamp ``sc <= 30`` instead of 62: a larger
    shift leaves ``n = 0`` and ``rem = sig < 2**24 < half`` either way, so every decision is the
    same; its stochastic decision is ``sr_round_up32``, the 32-bit form of ``sr_round_up``.
    """
    neg = (u >> SSH) != 0
    if FB > 31:
        a = (u & ABS_MASK).to(tl.int64)
        SC_MAX: tl.constexpr = 62
    else:
        a = (u & ABS_MASK).to(tl.int32, bitcast=True)
        SC_MAX: tl.constexpr = 30
    ef = a >> FB
    frac = a & ((1 << FB) - 1)
    sig = frac | tl.where(ef != 0, 1 << FB, 0).to(a.dtype)
    e = tl.maximum(ef, 1) - BIAS_IN
    et = tl.maximum(e, E_LO)
    if UNIFORM:
        m = tl.full(e.shape, M_U, a.dtype)
    else:
        # m(E) = M_TAB[min(et, EMAX + 1) - E_LO] computed from the taper instead of gathered:
        # the same width on every binade up to EMAX; above (E = EMAX + 1 or more, inputs that
        # overflow, whose result is replaced whatever m is) the taper gives 0 where M_TAB
        # holds 1.  (Not for speed: on the H100 the gather was 3-4 % faster in the stochastic
        # and hybrid kernels, docs/design.md "GPU codecs"; both give the same bits.)
        m = taper_width(tl.abs(et), M_MAX, T0, T1, T2).to(a.dtype)
    s = FB - m + (et - e)
    sc = tl.minimum(s, SC_MAX)
    one_ = tl.full(sc.shape, 1, a.dtype)
    n = sig >> sc
    rem = sig & ((one_ << sc) - 1)
    sc1 = one_ << (sc - 1)
    if MODE == HYBRID:
        # formats.md 1.6 (provisional): for 4 <= |E| (and E >= E_LO) round up iff F14 >= T14,
        # never when the input is exact; otherwise ties away
        f14 = (rem >> tl.minimum(tl.maximum(s - 14, 0), SC_MAX)) & 0x3FFF
        t14 = frac & 0x3FFF
        up_h = (rem != 0) & (f14 >= t14)
        up_a = round_up(RNA, rem, sc1, False, neg, False)
        up = tl.where(((e >= 4) | (e <= -4)) & (e >= E_LO), up_h, up_a)
    else:
        if MODE == SR:
            if FB > 31:
                sr_up = sr_round_up(rem, s, sr_draw(seed, idx, sr_bits), sr_bits)
            else:  # float32 significands: the 32-bit form of the same decision
                sr_up = sr_round_up32(rem, s, sr_draw32(seed, idx, sr_bits), sr_bits)
        else:
            sr_up = rem != rem
        # ties-to-even looks at the parity of the lower neighbour's code; in a binade without
        # mantissa bits (HiF8 DML) that is the parity of the binade's own code
        if UNIFORM:
            if M_U > 0:
                npar = n
            else:  # no mantissa bits: the code's parity is the exponent's
                npar = tl.where(e < E_LO, n, (et - E_LO) + n)
        else:
            base = tl.load(btab_ptr + (tl.minimum(et, EMAX + 1) - E_LO)).to(a.dtype)
            npar = tl.where((m > 0) | (e < E_LO), n, base)
        up = round_up(MODE, rem, sc1, (npar & 1) == 1, neg, sr_up)
    n = n + tl.where(up, 1, 0).to(a.dtype)
    low = e < E_LO
    carry = n >> (m + 1)
    efin = et + carry
    fr = n & ((one_ << m) - 1)
    ovf = (~low) & ((efin > EMAX) | ((efin == EMAX) & (fr > FRACMAX)))
    big = a >= INF_BITS
    if WANT_VALUE:
        # rounded magnitude from bits: n quanta of 2**(et - m) (full binades), n * 2**Q_LO below
        etc = tl.minimum(et, EMAX + 1)  # keeps the shift in range where ovf/big replace it
        vb = ((etc + 127) << 23) + ((n - (one_ << m)) << (23 - m))
        vlow = (n.to(tl.int32).to(tl.float32)
                * tl.full(n.shape, LOSCALE_BITS, tl.uint32).to(tl.float32, bitcast=True))
        v = tl.where(low, vlow.to(tl.uint32, bitcast=True), vb.to(tl.uint32))
        ovf_pos = MAXBITS if OVF_MAX_POS else INF_BITS32
        ovf_neg = MAXBITS if OVF_MAX_NEG else INF_BITS32
        v = tl.where(ovf, tl.where(neg, ovf_neg, ovf_pos), v)
        v = tl.where(a == INF_BITS, MAXBITS if SAT else INF_BITS32, v)
        v = tl.where(neg, v | F32_SIGN, v)
        v = tl.where(a > INF_BITS, NAN_BITS32, v)
        if not NEG_ZERO:
            v = tl.where((v & 0x7FFFFFFF) == 0, 0, v)
        return v.to(tl.uint32)
    if UNIFORM:
        code = ((et - E_LO) << m) + n
    else:
        bcode = tl.load(btab_ptr + (tl.minimum(efin, EMAX + 1) - E_LO)).to(a.dtype)
        code = tl.where(low, n, bcode + fr)
    return finish_code(code.to(tl.uint32), ovf, big, neg, a > INF_BITS, MAX_CODE, OVF_CODE,
                       SAT, OVF_MAX_POS, OVF_MAX_NEG, NEG_ZERO, NAN_CODE, NAN_SIGNED, SIGN)


@triton.jit
def one_fast32(u, E_LO: tl.constexpr, M_MAX: tl.constexpr, T0: tl.constexpr,
               T1: tl.constexpr, T2: tl.constexpr, UNIFORM: tl.constexpr,
               SH_LO_BASE: tl.constexpr, OFF: tl.constexpr, MAXBITS: tl.constexpr,
               NEG_ZERO: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
               MAX_CODE: tl.constexpr, OVF_CODE: tl.constexpr, MODE: tl.constexpr,
               SAT: tl.constexpr, OVF_MAX_POS: tl.constexpr, OVF_MAX_NEG: tl.constexpr,
               INF_BITS32: tl.constexpr, NAN_BITS32: tl.constexpr,
               LOSCALE_BITS: tl.constexpr, WANT_VALUE: tl.constexpr,
               SIGN: tl.constexpr = 0x80, PAR_FLIP: tl.constexpr = False):
    """The float32 fast path of one lane (``make_fast32_kernel.one``): uint32 bits in, the
    uint32 code or the uint32 bits of the float32 value out; deterministic modes only."""
    a = u & 0x7FFFFFFF
    neg = (u >> 31) != 0
    ef = (a >> 23).to(tl.int32)
    e = tl.maximum(ef, 1) - 127
    low = e < E_LO
    sig = (a & 0x7FFFFF) | tl.where(ef != 0, 0x800000, 0).to(tl.uint32)
    if UNIFORM:
        m = tl.full(e.shape, M_MAX, tl.int32)
    else:
        m = taper_width(tl.abs(e), M_MAX, T0, T1, T2)
    sh_l = tl.maximum(tl.minimum(SH_LO_BASE - e, 31), 1)
    src = tl.where(low, sig, a)
    ush = tl.where(low, sh_l, 23 - m).to(tl.uint32)
    half = tl.full(ush.shape, 1, tl.uint32) << (ush - 1)
    if MODE == RNA:
        # ties away: n + (rem >= half) == (src + half) >> sh (no carry out of 32 bits)
        r = (src + half) >> ush
    else:
        n = src >> ush
        rem = src & ((tl.full(ush.shape, 1, tl.uint32) << ush) - 1)
        if PAR_FLIP:  # no mantissa bits and an odd code offset: the code's parity
            odd = ((n + tl.where(low, 0, 1).to(tl.uint32)) & 1) != 0
        else:
            odd = (n & 1) != 0
        up = round_up(MODE, rem, half, odd, neg, False)
        r = n + tl.where(up, 1, 0).to(tl.uint32)
    vb = r << ush  # not low: the float32 bits of the rounded magnitude (carry included)
    ovf = (vb > MAXBITS) & (~low)
    big = a >= 0x7F800000
    if WANT_VALUE:
        vlow = (r.to(tl.int32).to(tl.float32)
                * tl.full(r.shape, LOSCALE_BITS, tl.uint32).to(tl.float32, bitcast=True))
        v = tl.where(low, vlow.to(tl.uint32, bitcast=True), vb)
        ovf_pos = MAXBITS if OVF_MAX_POS else INF_BITS32
        ovf_neg = MAXBITS if OVF_MAX_NEG else INF_BITS32
        v = tl.where(ovf, tl.where(neg, ovf_neg, ovf_pos), v)
        v = tl.where(big, MAXBITS if SAT else INF_BITS32, v)
        if NEG_ZERO:
            v = v | tl.where(neg, F32_SIGN, 0).to(tl.uint32)
        else:
            v = v | tl.where(neg & (v != 0), F32_SIGN, 0).to(tl.uint32)
        return tl.where(a > 0x7F800000, NAN_BITS32, v).to(tl.uint32)
    if UNIFORM:
        code = tl.where(low, r, r - OFF)
    else:
        code = tl.where(low, r, _code_of_bits32(vb))
    return finish_code(code, ovf, big, neg, a > 0x7F800000, MAX_CODE, OVF_CODE, SAT,
                       OVF_MAX_POS, OVF_MAX_NEG, NEG_ZERO, NAN_CODE, NAN_SIGNED, SIGN)


@triton.jit
def one_rne(u, MAX_CODE: tl.constexpr, OFF: tl.constexpr, RNE_HALF_M1: tl.constexpr,
            RNE_MINNORM: tl.constexpr, RNE_CB: tl.constexpr, RNE_OVF: tl.constexpr,
            RNE_NAN: tl.constexpr, RNE_S0: tl.constexpr, SIGN: tl.constexpr = 0x80,
            SGN_SH: tl.constexpr = 24):
    """Ties-to-even codes of a uniform format (``make_fast32_kernel.one_rne``): integer RNE on
    the float32 bits in the normal range, the FPU's own RNE in ``|x| + C`` below it."""
    a = u & 0x7FFFFFFF
    sgn = (u >> SGN_SH) & SIGN
    lsb = (a >> RNE_S0) & 1
    cn = ((a + RNE_HALF_M1 + lsb) >> RNE_S0) - OFF
    cf = tl.full(a.shape, RNE_CB, tl.uint32).to(tl.float32, bitcast=True)
    cs = (a.to(tl.float32, bitcast=True) + cf).to(tl.uint32, bitcast=True) - RNE_CB
    c = tl.where(a < RNE_MINNORM, cs, cn)
    c = tl.where(c > MAX_CODE, RNE_OVF, c)
    c = tl.where(a > 0x7F800000, RNE_NAN, c)
    return (c | sgn).to(tl.uint32)


@triton.jit
def one_rna(u, M_MAX: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
            NEG_ZERO: tl.constexpr, NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr,
            RNA_LO: tl.constexpr, RNA_MINNORM: tl.constexpr, RNA_LO_CODE: tl.constexpr,
            RNA_OVF_BITS: tl.constexpr, RNA_OVF: tl.constexpr, SIGN: tl.constexpr = 0x80,
            SGN_SH: tl.constexpr = 24):
    """Ties-away codes of HiF8 (``make_fast32_kernel.one_rna``): ``|x| + half(E)`` on the
    float32 bits, the code read from the sum."""
    a = (u & 0x7FFFFFFF).to(tl.int32, bitcast=True)
    sgn = (u >> SGN_SH) & SIGN
    e = (a >> 23) - 127
    m = taper_width(tl.maximum(e, -e), M_MAX, T0, T1, T2)
    r = a.to(tl.uint32, bitcast=True) + ((1 << 22) >> m.to(tl.uint32))  # + half: ties away
    c = _code_of_bits32(r) | sgn
    c = tl.where(r.to(tl.int32, bitcast=True) >= RNA_OVF_BITS, RNA_OVF | sgn, c)
    if NEG_ZERO:
        zero = sgn
    else:
        zero = tl.zeros(sgn.shape, tl.uint32)
    c_lo = tl.where(a >= RNA_LO, RNA_LO_CODE | sgn, zero)
    c = tl.where(a < RNA_MINNORM, c_lo, c)
    if NAN_SIGNED:
        nan = NAN_CODE | sgn
    else:
        nan = tl.full(sgn.shape, NAN_CODE, tl.uint32)
    return tl.where(a > 0x7F800000, nan, c).to(tl.uint32)


@triton.jit(do_not_specialize=["n", "seed_lo", "seed_hi", "off_lo", "off_hi", "sr_bits", "bf16"])
def _codec_kernel(x_ptr, out_ptr, mtab_ptr, btab_ptr, n, seed_lo, seed_hi, off_lo, off_hi,
                  sr_bits, bf16, PATH: tl.constexpr, IN_KIND: tl.constexpr,
                  FB: tl.constexpr, BIAS_IN: tl.constexpr, SSH: tl.constexpr,
                  ABS_MASK: tl.constexpr, INF_BITS: tl.constexpr, E_LO: tl.constexpr,
                  EMAX: tl.constexpr, FRACMAX: tl.constexpr, UNIFORM: tl.constexpr,
                  M_U: tl.constexpr, M_LO: tl.constexpr, Q_LO: tl.constexpr,
                  M_MAX: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                  NEG_ZERO: tl.constexpr, HAS_INF: tl.constexpr, INF_CODE: tl.constexpr,
                  NAN_CODE: tl.constexpr, NAN_SIGNED: tl.constexpr, MAX_CODE: tl.constexpr,
                  OVF_CODE: tl.constexpr, MODE: tl.constexpr, SAT: tl.constexpr,
                  OVF_MAX_POS: tl.constexpr, OVF_MAX_NEG: tl.constexpr, MAXBITS: tl.constexpr,
                  INF_BITS32: tl.constexpr, NAN_BITS32: tl.constexpr,
                  SH_LO_BASE: tl.constexpr, OFF: tl.constexpr, LOSCALE_BITS: tl.constexpr,
                  RNE_HALF_M1: tl.constexpr, RNE_MINNORM: tl.constexpr, RNE_CB: tl.constexpr,
                  RNE_OVF: tl.constexpr, RNE_NAN: tl.constexpr, RNE_S0: tl.constexpr,
                  RNA_OK: tl.constexpr, RNA_LO: tl.constexpr, RNA_MINNORM: tl.constexpr,
                  RNA_LO_CODE: tl.constexpr, RNA_OVF_BITS: tl.constexpr, RNA_OVF: tl.constexpr,
                  WANT_VALUE: tl.constexpr, BLOCK: tl.constexpr, SIGN: tl.constexpr = 0x80,
                  SGN_SH: tl.constexpr = 24, HAS_NAN: tl.constexpr = True,
                  PAR_FLIP: tl.constexpr = False, RNE_OK: tl.constexpr = True,
                  OUT16: tl.constexpr = False):
    """``out[i] = codec(x[i])`` for ``i < n`` (the ``serial``/``parallel`` loops of the Numba
    kernels): codes (uint8) or float32 values.  ``x`` is float32, float16, bfloat16 (widened,
    exact) or float64; the stochastic counter of element ``i`` is ``offset + i`` with
    ``offset = off_hi * 2**32 + off_lo`` (uint64), the seed likewise."""
    # IN_KIND: 0 float32, 1 float64, 2 float16 or (bf16 != 0) bfloat16 bits (``_bits``)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    # every program but the last reads and writes without a mask: vectorised accesses
    full = pid * BLOCK + BLOCK <= n
    if full:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)
    if IN_KIND == 1:
        u = x.to(tl.uint64, bitcast=True)
    else:
        u = float_bits32(x, IN_KIND, bf16)  # float16/bfloat16 (int16 bits) widen exactly
    if PATH == 0:
        seed = ((seed_hi.to(tl.uint32).to(tl.uint64) << 32)
                | seed_lo.to(tl.uint32).to(tl.uint64))
        off = (off_hi.to(tl.uint32).to(tl.uint64) << 32) | off_lo.to(tl.uint32).to(tl.uint64)
        idx = off + offs.to(tl.uint64)
        r = one(u, seed, idx, sr_bits, mtab_ptr, btab_ptr, FB, BIAS_IN, SSH, ABS_MASK,
                INF_BITS, E_LO, EMAX, FRACMAX, UNIFORM, M_U, Q_LO, M_MAX, T0, T1, T2,
                NEG_ZERO, NAN_CODE,
                NAN_SIGNED, MAX_CODE, OVF_CODE, MODE, SAT, OVF_MAX_POS, OVF_MAX_NEG, MAXBITS,
                INF_BITS32, NAN_BITS32, LOSCALE_BITS, WANT_VALUE, SIGN)
    elif PATH == 1:
        r = one_fast32(u, E_LO, M_MAX, T0, T1, T2, UNIFORM, SH_LO_BASE, OFF, MAXBITS,
                       NEG_ZERO, NAN_CODE, NAN_SIGNED, MAX_CODE, OVF_CODE, MODE, SAT,
                       OVF_MAX_POS, OVF_MAX_NEG, INF_BITS32, NAN_BITS32, LOSCALE_BITS,
                       WANT_VALUE, SIGN, PAR_FLIP)
    elif PATH == 2:
        r = one_rne(u, MAX_CODE, OFF, RNE_HALF_M1, RNE_MINNORM, RNE_CB, RNE_OVF, RNE_NAN,
                    RNE_S0, SIGN, SGN_SH)
    else:
        r = one_rna(u, M_MAX, T0, T1, T2, NEG_ZERO, NAN_CODE, NAN_SIGNED, RNA_LO,
                    RNA_MINNORM, RNA_LO_CODE, RNA_OVF_BITS, RNA_OVF, SIGN, SGN_SH)
    if WANT_VALUE:
        res = r.to(tl.float32, bitcast=True)
    elif OUT16:
        res = r.to(tl.uint16)
    else:
        res = r.to(tl.uint8)
    if full:
        tl.store(out_ptr + offs, res)
    else:
        tl.store(out_ptr + offs, res, mask=offs < n)


@triton.jit(do_not_specialize=["n", "seed_lo", "seed_hi", "off_lo", "off_hi", "sr_bits", "bf16"])
def _pow2_kernel(x_ptr, out_ptr, n, seed_lo, seed_hi, off_lo, off_hi, sr_bits, bf16,
                 IN_KIND: tl.constexpr, BIAS: tl.constexpr, MAXC: tl.constexpr,
                 NANC: tl.constexpr, MODE: tl.constexpr, SAT: tl.constexpr,
                 OVF_MAX: tl.constexpr, WANT_VALUE: tl.constexpr, BLOCK: tl.constexpr):
    """E8M0-like formats (``minifloat.make_pow2_kernel``, line for line): the input is
    widened to float64 (exact; float32 subnormals become normal), whose exponent and 52-bit
    fraction give ``floor(log2 x)`` and the rounding decision between neighbouring powers."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    if IN_KIND == 1:
        u = x.to(tl.uint64, bitcast=True)
    else:
        u = float_bits32(x, IN_KIND, bf16).to(tl.float32, bitcast=True).to(tl.float64)
        u = u.to(tl.uint64, bitcast=True)
    neg = (u >> 63) != 0
    a = u & 0x7FFFFFFFFFFFFFFF
    ef = (a >> 52).to(tl.int64)
    fl = ef - 1023
    rem = (a & 0xFFFFFFFFFFFFF).to(tl.int64)
    half = tl.full(rem.shape, 1 << 51, tl.int64)
    if MODE == SR:
        seed = ((seed_hi.to(tl.uint32).to(tl.uint64) << 32)
                | seed_lo.to(tl.uint32).to(tl.uint64))
        off = (off_hi.to(tl.uint32).to(tl.uint64) << 32) | off_lo.to(tl.uint32).to(tl.uint64)
        idx = off + offs.to(tl.uint64)
        sr_up = sr_round_up(rem, tl.full(rem.shape, 52, tl.int64), sr_draw(seed, idx, sr_bits),
                            sr_bits)
    else:
        sr_up = rem != rem
    up = round_up(MODE, rem, half, ((fl + BIAS) & 1) == 1, rem != rem, sr_up)
    c = tl.maximum(fl + BIAS + tl.where(up, 1, 0).to(tl.int64), 0)
    c = tl.where(c > MAXC, MAXC if OVF_MAX else NANC, c)
    c = tl.where(a == 0x7FF0000000000000, MAXC if SAT else NANC, c)
    c = tl.where(neg | (a == 0) | (a > 0x7FF0000000000000), NANC, c)
    if WANT_VALUE:
        vb = tl.where(c >= 127 - BIAS + 1, (c + (127 - BIAS)) << 23,
                      (1 << 22) >> tl.maximum(BIAS - 127 - c - 1, 0).to(tl.int64))
        vb = tl.where(c == NANC, 0x7FC00000, vb).to(tl.uint32)
        tl.store(out_ptr + offs, vb.to(tl.float32, bitcast=True), mask=mask)
    else:
        tl.store(out_ptr + offs, c.to(tl.uint8), mask=mask)


def run_pow2(spec, x, out, mode: int, saturate: bool, seed: int = 0, sr_bits: int = 32,
             offset: int = 0) -> None:
    """:func:`run_kernel` for a ``Pow2Spec`` format (E8M0)."""
    import torch

    from ._launch import LAUNCH_OPTS, block, chunks, device_guard, halves

    kind, x, bf16 = in_kind(x)
    n = x.numel()
    if n == 0:
        return
    if spec.bias != 127:
        raise ValueError("the GPU codec of exponent-only formats needs bias 127 (e8m0)")
    slo, shi = halves(seed)
    B = block(_GPU_BLOCK_GENERIC)
    mode = int(mode)
    with device_guard(x):
        for s0, s1 in chunks(n):
            olo, ohi = halves(int(offset) + s0)
            m = s1 - s0
            _pow2_kernel[(triton.cdiv(m, B),)](
                x[s0:s1], out[s0:s1], m, slo, shi, olo, ohi, int(sr_bits), bf16,
                IN_KIND=kind, BIAS=spec.bias, MAXC=spec.max_code, NANC=spec.nan_code,
                MODE=mode, SAT=bool(saturate), OVF_MAX=bool(saturate) or mode in (2, 4),
                WANT_VALUE=out.dtype == torch.float32, BLOCK=B, num_warps=_NUM_WARPS,
                **LAUNCH_OPTS)


@triton.jit
def table_value(table_ptr, c, NT: tl.constexpr):
    """``table[c]`` for int32 codes ``c >= 0``; ``NT`` > 0: the table has only ``NT`` entries
    (a sub-byte format's 16 or 64 values), a code beyond reads nothing and gives NaN (the
    CPU's ``_arrays.full_table``), so no code read from memory can index past the table."""
    if NT > 0:
        v = tl.load(table_ptr + c, mask=c < NT, other=float("nan"))
    else:
        v = tl.load(table_ptr + c)
    return v


def table_len(values, codes) -> int:
    """The ``NT`` constexpr of :func:`table_value` for a value table and the codes' tensor:
    the table's length if it is shorter than the codes' range, else 0 (nothing to mask)."""
    nt = int(values.shape[0])
    return nt if nt < 1 << (8 * codes.element_size()) else 0


@triton.jit(do_not_specialize=["n"])
def _lookup_kernel(codes_ptr, table_ptr, out_ptr, n, BLOCK: tl.constexpr, NT: tl.constexpr = 0):
    """``out[i] = table[codes[i]]`` (``_arrays.lookup``): decode through the value table
    (``NT``: :func:`table_value`)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    full = pid * BLOCK + BLOCK <= n
    if full:
        c = tl.load(codes_ptr + offs).to(tl.int32)
        tl.store(out_ptr + offs, table_value(table_ptr, c, NT))
    else:
        mask = offs < n
        c = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.int32)
        tl.store(out_ptr + offs, table_value(table_ptr, c, NT), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers (host side; torch is imported by then: the caller holds a tensor)

_GPU_BLOCK = 4096  # elements per program on the GPU (16 per thread at 8 warps)
_GPU_BLOCK_GENERIC = 2048  # the generic codec (stochastic, hybrid, float64): 8 per thread
_NUM_WARPS = 8


def gpu_block(path: int) -> int:
    """Elements per program of :func:`_codec_kernel` on the GPU for a path.  Measured on the
    H100 at 2**28 float32 (8 warps; ``triton.testing.do_bench``): the memory-bound fast paths
    reach the copy's bandwidth at 4096; the generic codec, which computes a SplitMix64 hash per
    stochastic element, ran 1.27 ms (hif8) / 1.11 ms (e4m3) at 4096 and 1.14 / 1.05 ms at 2048
    (1024 with 4 warps: 1.16 / 1.05; 8192: 1.82 / 1.57)."""
    return _GPU_BLOCK_GENERIC if path == PATH_GENERIC else _GPU_BLOCK


def kernel_path(in64: bool, mode: int, want_value: bool, K: dict, generic: bool = False) -> int:
    """Which per-element function runs (``minifloat.run_kernel``'s choice, and inside
    ``make_fast32_kernel`` the choice of ``one_rne``/``one_rna``)."""
    if in64 or int(mode) not in _FAST_MODES or generic:
        return PATH_GENERIC
    if K["RNE_OK"] and int(mode) == 0 and not want_value:
        return PATH_RNE
    if K["RNA_OK"] and int(mode) == 1 and not want_value:
        return PATH_RNA
    return PATH_FAST32


def kernel_constexprs(spec, in64: bool, mode: int, saturate: bool, want_value: bool,
                      generic: bool = False) -> dict:
    """Every ``tl.constexpr`` of :func:`_codec_kernel` for one codec (from the same
    :func:`codec_constants` dict the Numba kernels use), ``BLOCK`` excepted."""
    K = codec_constants(spec, in64, int(mode), bool(saturate))
    return dict(K, PATH=kernel_path(in64, mode, want_value, K, generic),
                WANT_VALUE=bool(want_value), OUT16=spec.bits > 8)


def in_kind(x):
    """(IN_KIND constexpr, the tensor the kernel reads, the bf16 flag) for a float tensor
    ``x``: 16-bit floats are read as their int16 bits (a view)."""
    import torch

    if x.dtype == torch.float64:
        return IN_F64, x, 0
    if x.dtype in (torch.float16, torch.bfloat16):
        return IN_16, x.view(torch.int16), int(x.dtype == torch.bfloat16)
    return IN_F32, x, 0


def run_kernel(spec, x, out, mode: int, saturate: bool, seed: int = 0, sr_bits: int = 32,
               offset: int = 0, generic: bool = False) -> None:
    """Run the codec on a 1-D contiguous tensor ``x`` (float32, float16, bfloat16 or float64)
    into ``out`` (uint8 codes or float32 values, chosen by ``out.dtype``) on ``x``'s device.

    ``seed`` and ``offset`` are 64-bit (signed or unsigned ints): element ``i`` uses counter
    ``offset + i``.  No host synchronisation.
    """
    import torch

    from ._launch import LAUNCH_OPTS, block, chunks, device_guard, halves, table

    want_value = out.dtype == torch.float32
    in64 = x.dtype == torch.float64
    if isinstance(spec, Pow2Spec):
        run_pow2(spec, x, out, mode, saturate, seed, sr_bits, offset)
        return
    C = kernel_constexprs(spec, in64, mode, saturate, want_value, generic)
    C["IN_KIND"], x, bf16 = in_kind(x)
    n = x.numel()
    if n == 0:
        return
    mtab = table(spec.m_tab, x.device, torch.int32)
    btab = table(spec.base_tab, x.device, torch.int32)
    slo, shi = halves(seed)
    B = block(gpu_block(C["PATH"]))
    with device_guard(x):
        for s0, s1 in chunks(n):
            olo, ohi = halves(int(offset) + s0)
            m = s1 - s0
            _codec_kernel[(triton.cdiv(m, B),)](
                x[s0:s1], out[s0:s1], mtab, btab, m, slo, shi, olo, ohi, int(sr_bits), bf16,
                BLOCK=B, num_warps=_NUM_WARPS, **C, **LAUNCH_OPTS)


def lookup(codes, values, out) -> None:
    """``out[i] = values[codes[i]]`` on the codes' device (1-D contiguous uint8 or uint16
    ``codes``, float32 ``out``; ``values`` = the format's float32 values, one per code).  A
    code past the end of a sub-byte format's table gives NaN (read nothing); callers check
    user-supplied codes first (``_arrays.check_codes``)."""
    import torch

    from ._launch import block, chunks, device_guard, table

    n = codes.numel()
    if n == 0:
        return
    tab = table(values, codes.device, torch.float32)
    B = block(_GPU_BLOCK)
    with device_guard(codes):
        for s0, s1 in chunks(n):
            _lookup_kernel[(triton.cdiv(s1 - s0, B),)](codes[s0:s1], tab, out[s0:s1], s1 - s0,
                                                      BLOCK=B, NT=table_len(values, codes),
                                                      num_warps=4)
