"""OCP FP8 E4M3 ("e4m3fn") and E5M2, and the generic float codec every 8-bit float format uses.

Bit layouts (formats.md 2.1)::

    E4M3  S.EEEE.MMM  bias 7   no Inf; NaN = S.1111.111 (0x7F, 0xFF); max 448 (0x7E);
                               min normal 2^-6 (0x08); subnormals M * 2^-9; +-0
    E5M2  S.EEEEE.MM  bias 15  Inf = S.11111.00 (0x7C, 0xFC); NaN = S.11111.{01,10,11};
                               max 57344 (0x7B); min normal 2^-14 (0x04); subnormals M * 2^-16

The generic codec (:func:`make_kernel`) describes a float format by its binades: a binade with
exponent ``E`` holds ``2**m(E)`` values ``(1 + f / 2**m) * 2**E``; below the lowest binade
``E_LO`` the spacing stays ``2**(E_LO - m(E_LO))`` (gradual underflow).  Rounding the input's
exact significand to that spacing is done once, by :func:`lowprec.formats.rounding.round_increment`;
a carry out of the binade lands on the next power of two, which is always representable.
E4M3/E5M2 have one ``m`` and monotonic codes; HiF8 (``hif8.py``) passes a table of ``m(E)`` and
of binade base codes.

Overflow is decided after rounding (formats.md 2.2).  Non-saturating: round-to-nearest and
stochastic overflow go to Inf (E5M2, HiF8) or NaN (E4M3); the directed modes follow IEEE 754
7.4 (toward zero, and toward the opposite infinity, give +-max).  ``saturate=True`` clamps every
overflow and +-Inf to +-max.  NaN input gives the NaN code (sign kept where the format has signed
NaNs).  Float64 input is rounded directly from its 53-bit significand (no double rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numba import njit, prange

from ._arrays import PARALLEL_MIN
from ._bits import f32_as_u32, shl32, shr32, u32_as_f32, u64_as_f64
from ._jit import jit, stable_uuid
from .core import Format, FormatInfo, Rounding, _register, get_format
from .rounding import HYBRID, RDOWN, RNA, RUP, RZ, SR, round_up, sr_draw, sr_round_up

# formats.md 2.1
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
SIGN = 0x80



@jit(inline="always")
def _no_code_fn(e):
    return np.uint32(0)


class FloatSpec:
    """Plain-data description of an 8-bit float format for :func:`make_kernel`.

    Attributes:
        name: the format name (identifies the compiled kernels in Numba's disk cache).
        e_lo: exponent of the lowest binade with full spacing.
        emax: exponent of the highest binade.
        fracmax: largest fraction index allowed in the ``emax`` binade.
        m: mantissa bits of every binade (uniform formats) or -1 (use ``m_tab``).
        m_tab: int64 array, ``m(E)`` for ``E = e_lo .. emax + 1`` (tapered formats).
        base_tab: int64 array, code of ``2**E`` for ``E = e_lo .. emax + 1`` (tapered formats).
        taper: ``m(E) = m_tab.max() - #{t in taper: |E| >= t}`` for ``E >= e_lo`` (the same
            table as ``m_tab``, in the form the vectorized float32 path computes).
        code_fn: tapered formats: a Numba function ``uint32 -> uint32`` giving the positive
            code of a float32 magnitude on the format's grid, ``2**e_lo <= |x| < 2**(emax+1)``,
            from its bits; bits below the binade's ``m(E)`` mantissa bits are ignored (the
            vectorized path computes codes arithmetically instead of gathering from
            ``base_tab``).
        neg_zero: the format has -0 (the sign bit alone).
        bits: code width (up to 16; codes are stored in uint8, or uint16 above 8 bits).
        sign: the sign bit of a code (0x80 for 8-bit formats; 0 for unsigned formats).
        has_nan: False for formats without a NaN code (OCP FP4/FP6): NaN input then writes
            ``nan_code`` (the -0 code, as ml_dtypes does) and overflow always saturates.
        inf_code: positive Inf code, or -1.
        nan_code: positive NaN code.
        nan_signed: NaN codes carry the input sign.
        max_code, max_value: the largest finite value.
    """

    def __init__(self, *, name, e_lo, emax, fracmax, m, m_tab=None, base_tab=None, taper=(),
                 code_fn=None, neg_zero, inf_code, nan_code, nan_signed, max_code, max_value,
                 bits=8, sign=SIGN, has_nan=True):
        self.name = name
        self.bits = bits
        self.sign = sign
        self.has_nan = has_nan
        self.e_lo = e_lo
        self.code_fn = code_fn if code_fn is not None else _no_code_fn
        self.taper = tuple(taper)
        self.emax = emax
        self.fracmax = fracmax
        self.m = m
        n = emax + 2 - e_lo
        self.m_tab = np.asarray(m_tab if m_tab is not None else [m] * n, dtype=np.int64)
        if base_tab is None:
            base_tab = [(e - e_lo + 1) << m for e in range(e_lo, emax + 2)]
        self.base_tab = np.asarray(base_tab, dtype=np.int64)
        self.neg_zero = neg_zero
        self.inf_code = inf_code
        self.nan_code = nan_code
        self.nan_signed = nan_signed
        self.max_code = max_code
        self.max_value = max_value


# (frac bits, exponent bias, sign shift, |x| mask, Inf bits) of float32 and float64 inputs
_IN32 = (23, 127, 31, 0x7FFFFFFF, 0x7F800000)
_IN64 = (52, 1023, 63, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)

_KERNELS: dict = {}


def codec_constants(spec: FloatSpec, in64: bool, mode: int, saturate: bool) -> dict:
    """The scalar constants of one (format, input width, mode, saturate) codec, derived from
    ``spec`` once: the Numba kernels (:func:`make_kernel`, :func:`make_fast32_kernel`) bake them
    into their closures and the Triton kernels (``lowprec.gpu.minifloat``) receive the same dict
    as ``tl.constexpr`` arguments, so one FloatSpec drives both devices.  All values are Python
    ints or bools (float constants are given by their float32 bits)."""
    FB, BIAS_IN, SSH, ABS_MASK, INF_BITS = _IN64 if in64 else _IN32
    e_lo = spec.e_lo
    m_tab = spec.m_tab
    m_max = int(m_tab.max())
    m_lo = int(m_tab[0])
    uniform = spec.m >= 0
    has_inf = spec.inf_code >= 0
    # without Inf and NaN codes (OCP FP4/FP6) overflow can only saturate
    sat = bool(saturate) or not (has_inf or spec.has_nan)
    ovf_code = spec.inf_code if has_inf else (spec.nan_code if spec.has_nan else spec.max_code)
    maxbits = int(np.float32(spec.max_value).view(np.uint32))
    T0, T1, T2 = (list(spec.taper) + [1 << 20] * 3)[:3]
    sign = int(spec.sign)
    off = ((126 + e_lo) << m_max) if uniform else 0
    return dict(
        # input layout (float32 or float64 bits)
        FB=FB, BIAS_IN=BIAS_IN, SSH=SSH, ABS_MASK=ABS_MASK, INF_BITS=INF_BITS,
        # the format's binades
        E_LO=e_lo, EMAX=spec.emax, FRACMAX=spec.fracmax, UNIFORM=uniform,
        M_U=max(spec.m, 0), M_LO=m_lo, Q_LO=e_lo - m_lo, M_MAX=m_max, T0=T0, T1=T1, T2=T2,
        # special codes
        NEG_ZERO=bool(spec.neg_zero), HAS_INF=has_inf, INF_CODE=spec.inf_code,
        NAN_CODE=spec.nan_code, NAN_SIGNED=bool(spec.nan_signed), MAX_CODE=spec.max_code,
        OVF_CODE=ovf_code,
        MODE=int(mode), SAT=sat, SIGN=sign, SGN_SH=32 - spec.bits, HAS_NAN=bool(spec.has_nan),
        # Overflow to +-max instead of Inf/NaN for finite inputs: saturation and the directed
        # modes that round toward zero on that side (IEEE 754 7.4).
        OVF_MAX_POS=sat or mode in (RZ, RDOWN), OVF_MAX_NEG=sat or mode in (RZ, RUP),
        # float32 bits of results: max, the overflow value (Inf, or NaN without Inf), NaN
        MAXBITS=maxbits, INF_BITS32=0x7F800000 if has_inf else 0x7FC00000,
        NAN_BITS32=0x7FC00000 if spec.has_nan else (0x80000000 if spec.neg_zero else 0),
        # float32 fast path: significand shift below the lowest binade is SH_LO_BASE - e;
        # code offset of a uniform format's float32 bits; 2**Q_LO (bits)
        SH_LO_BASE=23 - m_lo + e_lo, OFF=off & 0xFFFFFFFF,
        LOSCALE_BITS=int(np.float32(2.0 ** (e_lo - m_lo)).view(np.uint32)),
        # ties to even without mantissa bits: the code's parity is the exponent's, shifted by OFF
        PAR_FLIP=uniform and m_max == 0 and (off & 1) == 1,
        # ties-to-even encode (uniform formats): half - 1, min normal bits, 2**(E_LO - m + 23)
        RNE_HALF_M1=(1 << (22 - m_max)) - 1, RNE_MINNORM=(127 + e_lo) << 23,
        RNE_CB=(127 + e_lo - m_max + 23) << 23, RNE_OVF=spec.max_code if sat else ovf_code,
        RNE_NAN=spec.nan_code if spec.nan_signed else spec.nan_code | sign, RNE_S0=23 - m_max,
        RNE_OK=uniform and bool(spec.neg_zero) and (m_max > 0 or (off & 1) == 0),
        # ties-away encode (tapered formats whose lowest binade has no mantissa bits, HiF8)
        RNA_OK=(not uniform) and m_lo == 0, RNA_LO=(127 + e_lo - 1) << 23,
        RNA_MINNORM=(127 + e_lo) << 23, RNA_LO_CODE=int(spec.base_tab[0]),
        # smallest |x| + half whose truncation lies above the largest finite value
        RNA_OVF_BITS=maxbits + (1 << (23 - int(m_tab[spec.emax - e_lo]))),
        RNA_OVF=spec.max_code if sat else ovf_code,
    )


def make_kernel(spec: FloatSpec, in64: bool, mode: int, saturate: bool, want_value: bool):
    """Build (once, then cached) the Numba kernel for one (format, input width, mode, saturate,
    output kind) combination.  All of them are constants of the compiled code.

    The kernel signature is ``kernel(bits, out, seed, sr_bits, offset)`` where ``bits`` is the
    uint32/uint64 view of the input, ``out`` is uint8 (codes) or float32 (values), and ``offset``
    is the flat index of ``bits[0]`` (for the stochastic counter).  Returns a pair
    ``(serial, parallel)`` of compiled functions.
    """
    key = (id(spec), in64, mode, saturate, want_value)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    K = codec_constants(spec, in64, mode, saturate)
    FB, BIAS_IN, SSH, ABS_MASK, INF_BITS = K["FB"], K["BIAS_IN"], K["SSH"], K["ABS_MASK"], \
        K["INF_BITS"]
    E_LO, EMAX, FRACMAX = K["E_LO"], K["EMAX"], K["FRACMAX"]
    M_TAB = spec.m_tab
    BASE_TAB = spec.base_tab
    UNIFORM, M_U, Q_LO = K["UNIFORM"], K["M_U"], K["Q_LO"]
    NEG_ZERO, HAS_INF = K["NEG_ZERO"], K["HAS_INF"]
    NAN_CODE, NAN_SIGNED, MAX_CODE = K["NAN_CODE"], K["NAN_SIGNED"], K["MAX_CODE"]
    MAX_VAL = spec.max_value
    MODE, SAT = K["MODE"], K["SAT"]
    OVF_MAX_POS, OVF_MAX_NEG, OVF_CODE = K["OVF_MAX_POS"], K["OVF_MAX_NEG"], K["OVF_CODE"]
    SIGN_C, HAS_NAN = K["SIGN"], K["HAS_NAN"]
    INF_VAL = math.inf if HAS_INF else (math.nan if HAS_NAN else MAX_VAL)
    # a format without NaN writes the -0 code: -0.0, or +0.0 where that code means +0
    NAN_VAL = math.nan if HAS_NAN else (-0.0 if NEG_ZERO else 0.0)
    WANT_VALUE = bool(want_value)
    OUT_T = np.uint16 if spec.bits > 8 else np.uint8
    HYB = mode == HYBRID
    ONE = np.int64(1)
    # 2**k for every quantum exponent k a finite result can have
    Q_MIN = E_LO - int(M_TAB.max())
    POW2 = np.array([2.0**k for k in range(Q_MIN, EMAX + 1)], dtype=np.float64)

    VMASK = (ONE << FB) - 1

    @njit(inline="always", cache=True)
    def one(u, seed, idx, sr_bits):
        # Branch-free main path (so that LLVM vectorizes the loop); special cases are selected
        # at the end.  Returns (code, value).
        neg = (u >> SSH) != 0
        a = np.int64(u & ABS_MASK)
        ef = a >> FB
        frac = a & VMASK
        sig = frac | ((ONE << FB) if ef != 0 else 0)
        e = max(ef, 1) - BIAS_IN
        et = max(e, E_LO)
        if UNIFORM:
            m = M_U
        else:
            m = M_TAB[min(et, EMAX + 1) - E_LO]
        s = FB - m + (et - e)
        sc = min(s, 62)
        n = sig >> sc
        rem = sig & ((ONE << sc) - 1)
        sc1 = np.int64(1) << (sc - 1)
        if HYB:
            # formats.md 1.6 (provisional): for 4 <= |E| (and E >= E_LO) round up iff F14 >= T14,
            # never when the input is exact; otherwise ties away.
            f14 = (rem >> max(s - 14, 0)) & 0x3FFF
            t14 = frac & 0x3FFF
            up_h = (rem != 0) & (f14 >= t14)
            up_a = round_up(RNA, rem, sc1, False, neg, False)
            up = up_h if ((e >= 4 or e <= -4) and e >= E_LO) else up_a
        else:
            if MODE == SR:
                sr_up = sr_round_up(rem, s, sr_draw(seed, idx, sr_bits), sr_bits)
            else:
                sr_up = False
            # ties-to-even looks at the parity of the lower neighbour's code; in a binade without
            # mantissa bits (HiF8 DML) that is the parity of the binade's own code
            if UNIFORM:
                # without mantissa bits the code's parity is the exponent's
                npar = n if (M_U > 0 or e < E_LO) else (et - E_LO) + n
            else:
                npar = n if (m > 0 or e < E_LO) else BASE_TAB[min(et, EMAX + 1) - E_LO]
            up = round_up(MODE, rem, sc1, (npar & 1) == 1, neg, sr_up)
        inc = np.int64(1) if up else np.int64(0)
        n += inc
        low = e < E_LO
        carry = n >> (m + 1)
        efin = et + carry
        fr = n & ((ONE << m) - 1)
        ovf = (not low) and (efin > EMAX or (efin == EMAX and fr > FRACMAX))
        sgn = SIGN_C if neg else 0
        big = a >= INF_BITS
        if WANT_VALUE:
            # rounded magnitude: n quanta of 2**(et - m), built from bits (exact)
            if low:
                v = np.float64(np.int32(n)) * POW2[Q_LO - Q_MIN]
            else:
                v = np.float64(n) * POW2[min(max(et - m, Q_MIN), EMAX) - Q_MIN]
            ovf_pos = MAX_VAL if OVF_MAX_POS else INF_VAL
            ovf_neg = MAX_VAL if OVF_MAX_NEG else INF_VAL
            v = (ovf_neg if neg else ovf_pos) if ovf else v
            v = (MAX_VAL if SAT else INF_VAL) if a == INF_BITS else v
            v = -v if neg else v
            if not NEG_ZERO:
                v = 0.0 if v == 0.0 else v
            v = NAN_VAL if a > INF_BITS else v
            return 0, v
        if UNIFORM:
            code = ((et - E_LO) << m) + n
        else:
            code = BASE_TAB[min(efin, EMAX + 1) - E_LO] + fr
            code = n if low else code
        ovf_pos = MAX_CODE if OVF_MAX_POS else OVF_CODE
        ovf_neg = MAX_CODE if OVF_MAX_NEG else OVF_CODE
        code = (ovf_neg if neg else ovf_pos) if ovf else code
        code = (MAX_CODE if SAT else OVF_CODE) if big else code
        if NEG_ZERO:
            code = code | sgn
        else:
            code = (code | sgn) if code != 0 else 0
        nan = (NAN_CODE | sgn) if NAN_SIGNED else NAN_CODE
        code = nan if a > INF_BITS else code
        return code, 0.0

    stable_uuid(one, f"minifloat.one.{spec.name}.{int(in64)}.{mode}.{int(saturate)}.{want_value}")
    if want_value is None:  # the per-element function itself, for other kernels (MX)
        _KERNELS[key] = one
        return one
    _KERNELS[key] = _element_loops(one, None if want_value else OUT_T)
    return _KERNELS[key]


def _element_loops(one, out_t):
    """``(serial, parallel)`` loops over float bit patterns applying a per-element function
    ``one(bits, seed, idx, sr_bits) -> (code, value)`` (:func:`make_kernel` and the E8M0
    kernel): they write the value as float32 (``out_t`` None) or the code as ``out_t``."""
    if out_t is None:

        @njit(cache=True, nogil=True)
        def serial(bits, out, seed, sr_bits, offset):
            for i in range(bits.shape[0]):
                out[i] = np.float32(one(bits[i], seed, offset + i, sr_bits)[1])

        @njit(cache=True, nogil=True, parallel=True)
        def parallel(bits, out, seed, sr_bits, offset):
            for i in prange(bits.shape[0]):
                out[i] = np.float32(one(bits[i], seed, offset + i, sr_bits)[1])
    else:

        @njit(cache=True, nogil=True)
        def serial(bits, out, seed, sr_bits, offset):
            for i in range(bits.shape[0]):
                out[i] = out_t(one(bits[i], seed, offset + i, sr_bits)[0])

        @njit(cache=True, nogil=True, parallel=True)
        def parallel(bits, out, seed, sr_bits, offset):
            for i in prange(bits.shape[0]):
                out[i] = out_t(one(bits[i], seed, offset + i, sr_bits)[0])

    return serial, parallel


def _fast_loops(one, out_t):
    """``(serial, parallel)`` loops over float32 bit patterns applying a deterministic
    per-element function ``one(bits) -> code or value bits`` (the float32 fast paths:
    :func:`make_fast32_kernel`, :func:`make_pow2_fast32`): ``out_t`` None writes ``one``'s
    result as it is, else converts it to ``out_t``."""
    if out_t is None:

        @njit(cache=True, nogil=True)
        def serial(bits, out):
            for i in range(bits.shape[0]):
                out[i] = one(bits[i])

        @njit(cache=True, nogil=True, parallel=True)
        def parallel(bits, out):
            for i in prange(bits.shape[0]):
                out[i] = one(bits[i])
    else:

        @njit(cache=True, nogil=True)
        def serial(bits, out):
            for i in range(bits.shape[0]):
                out[i] = out_t(one(bits[i]))

        @njit(cache=True, nogil=True, parallel=True)
        def parallel(bits, out):
            for i in prange(bits.shape[0]):
                out[i] = out_t(one(bits[i]))

    return serial, parallel


_FAST_MODES = (0, 1, 2, 3, 4)  # the deterministic modes the float32 fast path implements


def make_fast32_kernel(spec: FloatSpec, mode: int, saturate: bool, want_value: bool):
    """The float32-input twin of :func:`make_kernel` for the deterministic rounding modes,
    written in 32-bit lanes without branches so that LLVM vectorizes it (8 elements per AVX2
    instruction).  Bit-identical to :func:`make_kernel` (tested on every float32 pattern).

    ``out`` is uint8 (codes) or uint32 (the bits of the float32 values).
    """
    key = ("fast32", id(spec), mode, saturate, want_value)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    U = np.uint32
    I = np.int32
    K = codec_constants(spec, False, mode, saturate)
    E_LO, M_MAX, T0, T1, T2 = K["E_LO"], K["M_MAX"], K["T0"], K["T1"], K["T2"]
    UNIFORM = K["UNIFORM"]
    SH_LO_BASE = K["SH_LO_BASE"]  # shift of the significand below the lowest binade: - e
    OFF = K["OFF"]
    MAXBITS = K["MAXBITS"]
    NEG_ZERO, NAN_CODE, NAN_SIGNED = K["NEG_ZERO"], K["NAN_CODE"], K["NAN_SIGNED"]
    MAX_CODE, MODE, SAT = K["MAX_CODE"], K["MODE"], K["SAT"]
    OVF_MAX_POS, OVF_MAX_NEG, OVF_CODE = K["OVF_MAX_POS"], K["OVF_MAX_NEG"], K["OVF_CODE"]
    INF_BITS32, NAN_BITS32 = K["INF_BITS32"], K["NAN_BITS32"]
    LOSCALE = np.uint32(K["LOSCALE_BITS"]).view(np.float32)
    SIGN_C, SGN_SH, PAR_FLIP = K["SIGN"], K["SGN_SH"], K["PAR_FLIP"]
    OUT_T = np.uint16 if spec.bits > 8 else np.uint8

    CODE_FN = spec.code_fn

    @njit(inline="always", cache=True)
    def one(u):
        # every intermediate is cast back to 32 bits: Numba would widen it to 64 otherwise
        a = U(u & U(0x7FFFFFFF))
        neg = U(u >> U(31)) != U(0)
        ef = I(a >> U(23))
        e = I(I(max(ef, I(1))) - I(127))
        low = e < I(E_LO)
        sig = U(U(a & U(0x7FFFFF)) | (U(0x800000) if ef != I(0) else U(0)))
        if UNIFORM:
            m = I(M_MAX)
        else:
            ae = I(abs(e))
            m = I(I(I(I(M_MAX) - I(ae >= I(T0))) - I(ae >= I(T1))) - I(ae >= I(T2)))
        sh_l = I(max(min(I(I(SH_LO_BASE) - e), I(31)), I(1)))
        src = sig if low else a
        sh = sh_l if low else I(I(23) - m)
        ush = U(sh)
        half = shl32(U(1), U(ush - U(1)))
        if MODE == RNA:
            # ties away: n + (rem >= half) == (src + half) >> sh (no carry out of 32 bits)
            r = shr32(U(src + half), ush)
        else:
            n = shr32(src, ush)
            rem = U(src & U(shl32(U(1), ush) - U(1)))
            if PAR_FLIP:
                odd = U(U(n + (U(0) if low else U(1))) & U(1)) != U(0)
            else:
                odd = U(n & U(1)) != U(0)
            up = round_up(MODE, rem, half, odd, neg, False)
            r = U(n + (U(1) if up else U(0)))
        vb = shl32(r, ush)  # not low: the float32 bits of the rounded magnitude (carry included)
        ovf = (vb > U(MAXBITS)) & (not low)
        big = a >= U(0x7F800000)
        sgn = U(SIGN_C) if neg else U(0)
        if WANT_VALUE:
            vlow = f32_as_u32(np.float32(I(r)) * LOSCALE)
            v = vlow if low else vb
            ovf_pos = U(MAXBITS) if OVF_MAX_POS else U(INF_BITS32)
            ovf_neg = U(MAXBITS) if OVF_MAX_NEG else U(INF_BITS32)
            v = (ovf_neg if neg else ovf_pos) if ovf else v
            v = (U(MAXBITS) if SAT else U(INF_BITS32)) if big else v
            if NEG_ZERO:
                v = U(v | (U(0x80000000) if neg else U(0)))
            else:
                v = U(v | (U(0x80000000) if (neg and v != U(0)) else U(0)))
            v = U(NAN_BITS32) if a > U(0x7F800000) else v
            return v
        if UNIFORM:
            code = r if low else U(r - U(OFF))
        else:
            code = r if low else CODE_FN(vb)
        ovf_pos = U(MAX_CODE) if OVF_MAX_POS else U(OVF_CODE)
        ovf_neg = U(MAX_CODE) if OVF_MAX_NEG else U(OVF_CODE)
        code = (ovf_neg if neg else ovf_pos) if ovf else code
        code = (U(MAX_CODE) if SAT else U(OVF_CODE)) if big else code
        if NEG_ZERO:
            code = U(code | sgn)
        else:
            code = U(code | sgn) if code != U(0) else U(0)
        nan = U(U(NAN_CODE) | sgn) if NAN_SIGNED else U(NAN_CODE)
        return nan if a > U(0x7F800000) else code

    # Encoding a uniform format with nearest_even: the cheapest exact form (it runs at the memory
    # floor, ~0.19 ns/element on 2 cores).  Normal range: integer round-to-nearest-even on the
    # float32 bits at bit 23 - m, the carry running into the exponent; below the lowest binade:
    # the hardware's own RNE in ``|x| + C``, C = 2**(E_LO - m + 23), whose ulp is the format's
    # subnormal spacing.  Tested equal to the generic kernel on every float32 pattern.
    RNE_HALF_M1, RNE_MINNORM = K["RNE_HALF_M1"], K["RNE_MINNORM"]
    RNE_CB = K["RNE_CB"]
    RNE_C = np.uint32(RNE_CB).view(np.float32)
    RNE_OVF, RNE_NAN, RNE_S0 = K["RNE_OVF"], K["RNE_NAN"], K["RNE_S0"]

    @njit(inline="always", cache=True)
    def one_rne(u):
        a = U(u & U(0x7FFFFFFF))
        sgn = U(shr32(u, U(SGN_SH)) & U(SIGN_C))
        lsb = U(shr32(a, U(RNE_S0)) & U(1))
        cn = U(shr32(U(U(a + U(RNE_HALF_M1)) + lsb), U(RNE_S0)) - U(OFF))
        cs = U(f32_as_u32(u32_as_f32(a) + RNE_C) - U(RNE_CB))
        c = cs if a < U(RNE_MINNORM) else cn
        c = U(RNE_OVF) if c > U(MAX_CODE) else c
        c = U(RNE_NAN) if a > U(0x7F800000) else c
        return U(c | sgn)

    # Encoding a tapered format whose lowest binade has no mantissa bits (HiF8) with ties away:
    # ``|x| + half(E)`` on the float32 bits rounds in place (a carry runs into the exponent) and
    # the code map reads the sum directly, ignoring the bits below the grid; no shifts back and
    # forth, no separate path for the range below the lowest binade, where the result is
    # 2**E_LO from its half 2**(E_LO - 1) up (the tie goes away) and 0 below.  Compares are on
    # signed lanes (AVX2 has no unsigned compare); ``|x| + half`` only passes 2**31 for NaN.
    # Tested equal to the generic kernel on every float32 pattern.
    RNA_OK, RNA_LO, RNA_MINNORM = K["RNA_OK"], K["RNA_LO"], K["RNA_MINNORM"]
    RNA_LO_CODE, RNA_OVF_BITS, RNA_OVF = K["RNA_LO_CODE"], K["RNA_OVF_BITS"], K["RNA_OVF"]

    @njit(inline="always", cache=True)
    def one_rna(u):
        a = I(u & U(0x7FFFFFFF))
        sgn = U(shr32(u, U(SGN_SH)) & U(SIGN_C))
        e = I(I(shr32(U(a), U(23))) - I(127))
        ae = max(e, I(-e))
        m = I(I(I(I(M_MAX) - I(ae >= I(T0))) - I(ae >= I(T1))) - I(ae >= I(T2)))
        r = U(U(a) + shr32(U(1 << 22), U(m)))  # + half a grid step: ties away
        c = U(CODE_FN(r) | sgn)
        c = U(U(RNA_OVF) | sgn) if I(r) >= I(RNA_OVF_BITS) else c
        zero = sgn if NEG_ZERO else U(0)
        c_lo = U(U(RNA_LO_CODE) | sgn) if a >= I(RNA_LO) else zero
        c = c_lo if a < I(RNA_MINNORM) else c
        nan = U(U(NAN_CODE) | sgn) if NAN_SIGNED else U(NAN_CODE)
        return nan if a > I(0x7F800000) else c

    if K["RNE_OK"] and mode == 0 and not want_value:
        one = one_rne
    if RNA_OK and mode == RNA and not want_value:
        one = one_rna
    WANT_VALUE = want_value
    stable_uuid(one, f"minifloat.fast32.{spec.name}.{mode}.{int(saturate)}.{int(want_value)}")
    _KERNELS[("one32", id(spec), mode, saturate, want_value)] = one
    serial, parallel = _fast_loops(one, None if want_value else OUT_T)

    _KERNELS[key] = (serial, parallel)
    return serial, parallel


def scalar_code32(spec: FloatSpec, mode: int, saturate: bool):
    """The vectorizable scalar encoder of :func:`make_fast32_kernel`: a Numba function
    ``uint32 float32-bits -> uint32 code`` (deterministic modes only), for use inside other
    kernels (the attention kernels encode scores with it)."""
    if int(mode) not in _FAST_MODES:
        raise ValueError(f"scalar_code32 needs a deterministic rounding mode, got {mode}")
    make_fast32_kernel(spec, int(mode), bool(saturate), False)
    return _KERNELS[("one32", id(spec), int(mode), bool(saturate), False)]


def run_kernel(spec: FloatSpec, bits: np.ndarray, out: np.ndarray, mode: int, saturate: bool,
               seed: int = 0, sr_bits: int = 32, offset: int = 0, generic: bool = False) -> None:
    """Run the codec on a 1-D contiguous uint32/uint64 ``bits`` array into ``out`` (uint8 codes
    or float32 values, chosen by ``out.dtype``).

    float32 input with a deterministic mode takes the vectorized fast path unless ``generic``.
    ``seed`` and ``offset`` are 64-bit (signed or unsigned ints); element ``i`` uses the
    stochastic counter ``offset + i`` (mod 2**64).
    """
    want_value = out.dtype == np.float32
    big = bits.shape[0] >= PARALLEL_MIN  # below it the serial kernel is used
    make = make_kernel
    fast = bits.dtype == np.uint32 and int(mode) in _FAST_MODES and not generic
    if isinstance(spec, Pow2Spec):
        make = make_pow2_kernel
        if fast and spec.bias == 127:
            serial, parallel = make_pow2_fast32(spec, int(mode), bool(saturate), want_value)
            (parallel if big else serial)(bits, out.view(np.uint32) if want_value else out)
            return
    elif fast:
        serial, parallel = make_fast32_kernel(spec, int(mode), bool(saturate), want_value)
        o = out.view(np.uint32) if want_value else out
        (parallel if big else serial)(bits, o)
        return
    serial, parallel = make(spec, bits.dtype == np.uint64, int(mode), bool(saturate), want_value)
    off = np.uint64(int(offset) & 0xFFFFFFFFFFFFFFFF).view(np.int64)  # wraps like the counter
    (parallel if big else serial)(bits, out, np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF),
                                  np.int64(sr_bits), off)


# --------------------------------------------------------------------------------------------
# Exponent-only unsigned formats (E8M0): a codec of their own (no zero, no sign, no subnormals)


class Pow2Spec:
    """Plain-data description of an unsigned exponent-only format (E8M0) for
    :func:`make_pow2_kernel`: code ``c`` is ``2**(c - bias)`` for ``c <= max_code``; ``nan_code``
    is NaN; there is no zero, no sign and no Inf.

    Encoding rounds in value space between neighbouring powers of two (the midpoint of
    ``2**E`` and ``2**(E+1)`` is ``1.5 * 2**E``; ties to the even code, as ml_dtypes'
    ``float8_e8m0fnu``).  NaN, zero and negative inputs give NaN (there is no code for them);
    positive values below the smallest power round to it in every mode (no zero to round to);
    overflow and ``+inf`` give NaN, or the largest power with ``saturate=True`` (overflow also
    under ``toward_zero`` / ``down``, as IEEE 754 7.4).
    """

    def __init__(self, *, name, bias, max_code, nan_code, bits=8):
        self.name = name
        self.bias = bias
        self.max_code = max_code
        self.nan_code = nan_code
        self.bits = bits
        self.sign = 0
        self.max_value = 2.0 ** (max_code - bias)


def make_pow2_kernel(spec: Pow2Spec, in64: bool, mode: int, saturate: bool, want_value):
    """The :func:`make_kernel` of a :class:`Pow2Spec` format (same signature and caching;
    ``want_value=None`` returns the per-element function ``(code, value)``)."""
    key = ("pow2", id(spec), in64, mode, saturate, want_value)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    BIAS, MAXC, NANC = spec.bias, spec.max_code, spec.nan_code
    MODE, SAT, IN64 = int(mode), bool(saturate), bool(in64)
    OVF_MAX = SAT or MODE in (RZ, RDOWN)
    HALF = np.int64(1) << 51

    @njit(inline="always", cache=True)
    def one(u, seed, idx, sr_bits):
        if IN64:
            x = u64_as_f64(u)
        else:
            x = np.float64(u32_as_f32(np.uint32(u)))
        if not x > 0.0:  # NaN, zeros, negatives: no code
            return NANC, math.nan
        if x == math.inf:
            c = MAXC if SAT else NANC
        else:
            mm, ee = math.frexp(x)  # exact: x = mm * 2**ee, 0.5 <= mm < 1
            fl = np.int64(ee) - 1
            rem = np.int64((mm * 2.0 - 1.0) * 4503599627370496.0)  # 52-bit fraction
            if MODE == SR:
                sr_up = sr_round_up(rem, np.int64(52), sr_draw(seed, idx, sr_bits), sr_bits)
            else:
                sr_up = False
            up = round_up(MODE, rem, HALF, ((fl + BIAS) & 1) == 1, False, sr_up)
            c = fl + BIAS + (1 if up else 0)
            c = max(c, np.int64(0))
            if c > MAXC:
                c = MAXC if OVF_MAX else NANC
        if c == NANC:
            return NANC, math.nan
        return c, math.ldexp(1.0, np.int64(c) - BIAS)

    stable_uuid(one, f"minifloat.pow2.{spec.name}.{int(in64)}.{mode}.{int(saturate)}.{want_value}")
    if want_value is None:
        _KERNELS[key] = one
        return one
    _KERNELS[key] = _element_loops(one, None if want_value else np.uint8)
    return _KERNELS[key]


def make_pow2_fast32(spec: Pow2Spec, mode: int, saturate: bool, want_value: bool):
    """The float32-input twin of :func:`make_pow2_kernel` for the deterministic modes and
    bias 127 (E8M0, whose code is float32's biased exponent): 32-bit lanes without branches
    (vectorized), bit-identical to the generic kernel (tested on every float32 pattern).
    ``out`` is uint8 (codes) or uint32 (float32 value bits)."""
    key = ("pow2fast", id(spec), mode, saturate, want_value)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    U = np.uint32
    MODE, SAT = int(mode), bool(saturate)
    MAXC, NANC = U(spec.max_code), U(spec.nan_code)
    OVF = MAXC if (SAT or MODE in (RZ, RDOWN)) else NANC

    @njit(inline="always", cache=True)
    def one(u):
        a = U(u & U(0x7FFFFFFF))
        ef = shr32(a, U(23))
        frac = U(a & U(0x7FFFFF))
        sub = ef == U(0)
        # normal: between 2**(ef-127) (code ef) and twice it, the fraction decides; float32
        # subnormals in [2**-127, 2**-126): between codes 0 and 1, by frac - 2**22 of 2**22
        rem = U(frac - U(0x400000)) if sub else frac
        half = U(0x200000) if sub else U(0x400000)
        up = round_up(MODE, rem, half, U(ef & U(1)) != U(0), False, False)
        up = up & ((not sub) | (frac >= U(0x400000)))
        c = U(ef + (U(1) if up else U(0)))
        c = OVF if c > MAXC else c
        c = (MAXC if SAT else NANC) if a == U(0x7F800000) else c
        c = NANC if (a > U(0x7F800000) or a == U(0) or (u >> U(31)) != U(0)) else c
        if want_value:
            v = U(0x400000) if c == U(0) else shl32(c, U(23))
            return U(0x7FC00000) if c == NANC else v
        return c

    stable_uuid(one, f"minifloat.pow2fast.{spec.name}.{mode}.{int(saturate)}.{int(want_value)}")
    serial, parallel = _fast_loops(one, None if want_value else np.uint8)

    _KERNELS[key] = (serial, parallel)
    return serial, parallel


# --------------------------------------------------------------------------------------------
# Float format descriptors: one literal per format, everything else derived from it

INF_KINDS = ("ieee", "top", "none")
NAN_KINDS = ("ieee", "top", "neg_zero", "none")


@dataclass(frozen=True)
class FloatDesc:
    """The one literal that describes a binary float format; :func:`derive` computes its
    :class:`FloatSpec` (kernel constants), :class:`FormatInfo` and value table.

    Attributes:
        name: registry name.
        exp_bits, man_bits: widths of the exponent and (stored) mantissa fields.
        bias: exponent bias: a normal code with exponent field ``E`` and fraction ``f`` is
            ``(1 + f / 2**man_bits) * 2**(E - bias)``; field 0 is subnormal
            ``f * 2**(1 - bias - man_bits)`` (zero when ``f == 0``).
        inf: ``"ieee"`` (exponent all ones, fraction 0), ``"top"`` (the largest magnitude code,
            P3109) or ``"none"``.
        nan: ``"ieee"`` (exponent all ones, fraction != 0; every such code), ``"top"`` (only the
            largest magnitude code: OCP E4M3 "fn", E8M0), ``"neg_zero"`` (the -0 code: "fnuz",
            P3109) or ``"none"`` (OCP FP4/FP6: NaN input writes the -0 code, as ml_dtypes).
        negative_zero: the -0 code decodes to -0.0 (False: the encoder writes +0 for -0 and the
            code decodes to +0.0; forced False when ``nan == "neg_zero"``).
        signed: False only for exponent-only formats without subnormals (E8M0).
        subnormals: False only for exponent-only unsigned formats (E8M0).
        default_rounding: the format's own convention.
        doc: one line for ``FormatInfo.doc``.
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    inf: str = "ieee"
    nan: str = "ieee"
    negative_zero: bool = True
    signed: bool = True
    subnormals: bool = True
    default_rounding: Rounding = Rounding.NEAREST_EVEN
    doc: str = ""

    @property
    def bits(self) -> int:
        """Width of one code: sign + exponent + mantissa bits."""
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def kernel_key(self) -> str:
        """The parameters as a string (names the compiled kernels in Numba's disk cache)."""
        return (f"e{self.exp_bits}m{self.man_bits}b{self.bias}.{self.inf}.{self.nan}."
                f"{int(self.negative_zero)}{int(self.signed)}{int(self.subnormals)}")


def _check_int(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    if not lo <= int(v) <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return int(v)


def check_desc(d: FloatDesc) -> None:
    """Raise ValueError/TypeError (with the reason) if ``d`` describes no codec-able format."""
    if not isinstance(d.name, str) or not d.name.strip():
        raise TypeError(f"name must be a non-empty string, got {d.name!r}")
    e = _check_int("exp_bits", d.exp_bits, 1, 8)
    m = _check_int("man_bits", d.man_bits, 0, 15)
    _check_int("bias", d.bias, -(1 << 16), 1 << 16)
    for flag in ("negative_zero", "signed", "subnormals"):
        if not isinstance(getattr(d, flag), (bool, np.bool_)):
            raise TypeError(f"{flag} must be True or False, got {getattr(d, flag)!r}")
    if d.inf not in INF_KINDS:
        raise ValueError(f"inf {d.inf!r} is not one of {', '.join(INF_KINDS)}")
    if d.nan not in NAN_KINDS:
        raise ValueError(f"nan {d.nan!r} is not one of {', '.join(NAN_KINDS)}")
    if d.bits > 16:
        raise ValueError(f"a format of {d.bits} bits (sign + {e} + {m}) is wider than the 16 "
                         "bits lowprec stores per code")
    if d.inf == "top" and d.nan == "top":
        raise ValueError("inf='top' and nan='top' both claim the largest code; use nan='ieee' "
                         "or nan='neg_zero' beside inf='top'")
    if d.inf == "ieee" and d.nan != "ieee":
        raise ValueError("inf='ieee' (exponent all ones) needs nan='ieee' for the other codes "
                         "of that exponent")
    if d.nan == "ieee" and m == 0:
        raise ValueError("nan='ieee' needs at least one mantissa bit (NaN = exponent all ones, "
                         "fraction != 0)")
    if d.nan == "neg_zero" and not d.signed:
        raise ValueError("nan='neg_zero' needs a signed format")
    if d.nan == "neg_zero" and d.negative_zero:
        raise ValueError("nan='neg_zero' uses the -0 code for NaN: pass negative_zero=False")
    if not d.signed or not d.subnormals:
        if d.signed or d.subnormals or m != 0 or d.inf != "none" or d.nan not in ("top", "none"):
            raise ValueError(
                "unsigned formats and formats without subnormals are supported as exponent-only "
                "scale formats like e8m0: signed=False, subnormals=False, man_bits=0, "
                "inf='none', nan='top'")
        if d.nan != "top":
            raise ValueError("an unsigned exponent-only format needs nan='top' (code for NaN, "
                             "zero and negative inputs)")
        if -d.bias < -149 or (1 << e) - 2 - d.bias > 127:
            raise ValueError("the powers of two of an exponent-only format must lie within "
                             "float32's range [2**-149, 2**127]")
        return
    top = (1 << (e + m)) - 1
    max_code = top - (1 << m) if d.inf == "ieee" else top - (d.inf == "top" or d.nan == "top")
    if max_code < 1:
        raise ValueError("the description leaves no positive finite value")
    if 1 - d.bias < -126:
        raise ValueError(f"the smallest normal 2**{1 - d.bias} is below float32's 2**-126 "
                         "(bias at most 127)")
    emax = (max_code >> m) - d.bias
    if emax > 127:
        raise ValueError(f"the largest finite value (exponent {emax}) exceeds float32's range")


def _magnitude(d: FloatDesc, c: int) -> float:
    """Value of the positive magnitude code ``c`` (NaN/Inf included)."""
    e, m = d.exp_bits, d.man_bits
    top = (1 << (e + m)) - 1
    if not d.signed:  # exponent-only
        return math.nan if c == top else 2.0 ** (c - d.bias)
    ef, f = c >> m, c & ((1 << m) - 1)
    if d.inf == "ieee" and ef == (1 << e) - 1:
        return math.inf if f == 0 else math.nan
    if c == top and d.inf == "top":
        return math.inf
    if c == top and d.nan == "top":
        return math.nan
    if ef == 0:
        return f * 2.0 ** (1 - d.bias - m)
    return (1 + f / (1 << m)) * 2.0 ** (ef - d.bias)


def derive(d: FloatDesc):
    """``(spec, info, values)`` of a float format from its descriptor (validated first)."""
    check_desc(d)
    e, m, nb = d.exp_bits, d.man_bits, d.bits
    sign = (1 << (e + m)) if d.signed else 0
    ncodes = 1 << nb
    vals = np.empty(ncodes, dtype=np.float64)
    for c in range(ncodes):
        v = _magnitude(d, c & (sign - 1) if sign else c)
        vals[c] = -v if (c & sign) and sign else v
    if d.signed:
        if d.nan == "neg_zero":
            vals[sign] = math.nan
        elif not d.negative_zero:
            vals[sign] = 0.0
    pos = vals[:sign] if sign else vals
    finite = [c for c in range(len(pos)) if np.isfinite(pos[c])]
    max_code = max(finite)
    inf_pos = [c for c in range(len(pos)) if np.isinf(pos[c])]
    nan_codes = tuple(int(c) for c in np.flatnonzero(np.isnan(vals)))
    inf_codes = (inf_pos[0], inf_pos[0] | sign) if inf_pos else ()
    has_nan = d.nan != "none"
    if d.nan == "ieee":
        nan_code = (((1 << e) - 1) << m) | (1 << (m - 1))
    elif d.nan == "top":
        nan_code = (1 << (e + m)) - 1
    else:
        nan_code = sign  # neg_zero, and the stand-in of formats without NaN
    max_value = float(pos[max_code])
    neg_zero = d.signed and d.negative_zero and d.nan != "neg_zero"
    min_normal = 2.0 ** (1 - d.bias) if d.signed else 2.0 ** -d.bias
    min_sub = min(float(v) for v in pos if np.isfinite(v) and v > 0)
    if d.signed:
        spec = FloatSpec(name=d.kernel_key, e_lo=1 - d.bias, emax=(max_code >> m) - d.bias,
                         fracmax=max_code & ((1 << m) - 1), m=m, neg_zero=neg_zero,
                         inf_code=inf_pos[0] if inf_pos else -1, nan_code=nan_code,
                         nan_signed=d.nan in ("ieee", "top"), max_code=max_code,
                         max_value=max_value, bits=nb, sign=sign, has_nan=has_nan)
    else:
        spec = Pow2Spec(name=d.kernel_key, bias=d.bias, max_code=max_code, nan_code=nan_code,
                        bits=nb)
    info = FormatInfo(
        name=d.name, bits=nb, kind="float", max=max_value, min_normal=min_normal,
        min_subnormal=min_sub, has_inf=bool(inf_pos), has_nan=has_nan, has_neg_zero=neg_zero,
        nan_codes=nan_codes, inf_codes=inf_codes, nan_code=nan_code if has_nan else None,
        max_code=max_code, default_rounding=d.default_rounding,
        doc=d.doc or f"user format: {d.kernel_key}", extra={"desc": d},
    )
    return spec, info, vals.astype(np.float32)


def _p3109(p: int) -> FloatDesc:
    return FloatDesc(f"binary8p{p}", 8 - p, p - 1, 1 << (7 - p), inf="top", nan="neg_zero",
                     negative_zero=False,
                     doc=f"IEEE P3109 binary8p{p}: {8 - p} exponent bits, precision {p}, bias "
                         f"{1 << (7 - p)}; Inf 0x7F/0xFF, NaN 0x80, no -0 (gfloat p3109(8, {p}))")


# Every built-in binary float format, one literal each (formats.md 2, design.md "Formats II").
FLOAT_DESCS = (
    FloatDesc("e4m3", 4, 3, 7, inf="none", nan="top",
              doc="OCP FP8 E4M3 (e4m3fn): S.EEEE.MMM, bias 7, no Inf, NaN 0x7F/0xFF "
                  "(formats.md 2)"),
    FloatDesc("e5m2", 5, 2, 15,
              doc="OCP FP8 E5M2: S.EEEEE.MM, bias 15, Inf 0x7C/0xFC, NaN 0x7D-0x7F "
                  "(formats.md 2)"),
    FloatDesc("e2m1", 2, 1, 1, inf="none", nan="none",
              doc="OCP FP4 E2M1: bias 1, max 6, no Inf/NaN (NaN input -> -0 code 0x8)"),
    FloatDesc("e2m3", 2, 3, 1, inf="none", nan="none",
              doc="OCP FP6 E2M3: bias 1, max 7.5, no Inf/NaN (NaN input -> -0 code 0x20)"),
    FloatDesc("e3m2", 3, 2, 3, inf="none", nan="none",
              doc="OCP FP6 E3M2: bias 3, max 28, no Inf/NaN (NaN input -> -0 code 0x20)"),
    # e8m0 rounds ties up by default (nearest_away), as ml_dtypes float8_e8m0fnu and torch
    FloatDesc("e8m0", 8, 0, 127, inf="none", nan="top", negative_zero=False, signed=False,
              subnormals=False, default_rounding=Rounding.NEAREST_AWAY,
              doc="OCP MX scale E8M0: unsigned powers of two 2^-127..2^127, NaN 0xFF, no zero; "
                  "default rounding nearest_away (ties up, as ml_dtypes and torch)"),
    FloatDesc("e4m3fnuz", 4, 3, 8, inf="none", nan="neg_zero", negative_zero=False,
              doc="E4M3 FNUZ (AMD MI300): bias 8, max 240, NaN 0x80, no Inf, no -0"),
    FloatDesc("e5m2fnuz", 5, 2, 16, inf="none", nan="neg_zero", negative_zero=False,
              doc="E5M2 FNUZ (AMD MI300): bias 16, max 57344, NaN 0x80, no Inf, no -0"),
    FloatDesc("e4m3_ieee", 4, 3, 7,
              doc="IEEE-style E4M3 with Inf (ml_dtypes float8_e4m3): bias 7, max 240"),
    FloatDesc("e3m4", 3, 4, 3,
              doc="IEEE-style E3M4 (ml_dtypes float8_e3m4): bias 3, max 15.5, Inf, NaN"),
    *(_p3109(p) for p in range(1, 8)),
    FloatDesc("bfloat16", 8, 7, 127, doc="bfloat16: IEEE-style, bias 127 (a rounding target)"),
    FloatDesc("float16", 5, 10, 15, doc="IEEE binary16 (a rounding target)"),
)


SPECS: dict = {}  # name -> FloatSpec / Pow2Spec of every format registered here


def register_desc(d: FloatDesc) -> Format:
    """Derive and register the format of descriptor ``d``; returns its :class:`Format`."""
    spec, info, vals = derive(d)
    f = Format(info, vals, spec)
    SPECS[d.name] = spec
    _register(f)
    return f


for _d in FLOAT_DESCS:
    register_desc(_d)

E4M3_SPEC, E5M2_SPEC = SPECS["e4m3"], SPECS["e5m2"]
E4M3_INFO = get_format("e4m3").info
E5M2_INFO = get_format("e5m2").info
E4M3_VALUES = get_format("e4m3").values()
E5M2_VALUES = get_format("e5m2").values()


# --------------------------------------------------------------------------------------------
# User-described formats

_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789_")


def float_format(exp_bits: int, man_bits: int, *, bias: int | None = None, inf: str = "ieee",
                 nan: str = "ieee", negative_zero: bool | None = None, signed: bool = True,
                 subnormals: bool = True, name: str | None = None,
                 default_rounding: str | Rounding = "nearest_even") -> Format:
    """Describe a binary float format and register it: every codec (:func:`lowprec.encode`,
    ``decode``, ``quantize``, every rounding mode and ``saturate``, CPU and CUDA), the model
    hooks (``lowprec.emulate(activations=..., weights=...)``) and ``lowprec formats`` accept
    its name, and it compiles to the same Numba kernels as the built-in formats (once per
    description; the compiled code is cached on disk under a key made of the parameters).

    Args:
        exp_bits: exponent field width, 1..8.
        man_bits: stored mantissa width, 0..15 (sign + exponent + mantissa <= 16 bits; codes
            are uint8 up to 8 bits, uint16 above).
        bias: exponent bias (default IEEE ``2**(exp_bits-1) - 1``).  The smallest normal
            ``2**(1-bias)`` must be >= 2**-126 and the largest finite value < 2**128, so that
            every value is a float32.
        inf: ``"ieee"`` (exponent all ones, fraction 0), ``"top"`` (the largest magnitude code,
            as P3109) or ``"none"``.
        nan: ``"ieee"`` (exponent all ones, fraction != 0), ``"top"`` (only the largest
            magnitude code, as OCP E4M3 "fn"), ``"neg_zero"`` (the -0 code, as "fnuz" and
            P3109) or ``"none"`` (no NaN: NaN input writes the -0 code, overflow saturates).
        negative_zero: whether the -0 code means -0.0 (default: True unless ``nan ==
            "neg_zero"``).
        signed, subnormals: False (both) only for exponent-only scale formats like E8M0
            (``man_bits=0``, ``inf="none"``, ``nan="top"``).
        name: registry name (lower case letters, digits, ``_``); default
            ``"e{exp_bits}m{man_bits}_b{bias}_inf{inf}_nan{nan}"``.
        default_rounding: the rounding used when a call passes none.

    Returns:
        The registered :class:`Format` (calling again with the same description and name
        returns the same format).

    Raises:
        ValueError / TypeError: an impossible description (the message says why), or a name
        already used by another format.

    Example:
        >>> f = lp.float_format(4, 3, bias=7, inf="none", nan="top", name="my_e4m3")
        >>> f.info.max
        448.0
        >>> int(lp.encode(np.float32(500.0), "my_e4m3", saturate=True))
        126
    """
    from .core import _ALIASES, _REGISTRY, _USER, parse_rounding

    e = _check_int("exp_bits", exp_bits, 1, 8)
    m = _check_int("man_bits", man_bits, 0, 15)
    b = (1 << (e - 1)) - 1 if bias is None else _check_int("bias", bias, -(1 << 16), 1 << 16)
    if negative_zero is None:
        negative_zero = nan != "neg_zero" and bool(signed)
    if name is None:
        name = f"e{e}m{m}_b{b}_inf{inf}_nan{nan}" + ("" if negative_zero or nan == "neg_zero"
                                                      else "_nonegzero")
    if not isinstance(name, str) or not name or not set(name) <= _NAME_OK:
        raise ValueError(f"name must be lower case letters, digits and '_', got {name!r}")
    d = FloatDesc(name, e, m, b, inf=inf, nan=nan, negative_zero=negative_zero, signed=signed,
                  subnormals=subnormals, default_rounding=parse_rounding(default_rounding),
                  doc="")
    check_desc(d)
    if d.default_rounding == Rounding.HYBRID:
        raise ValueError("hybrid rounding exists only for hif8")
    old = _REGISTRY.get(name)
    if old is None and name in _ALIASES:
        raise ValueError(f"name {name!r} is an alias of the built-in format {_ALIASES[name]!r}")
    if old is not None:
        od = old.info.extra.get("desc")
        if name in _USER and od is not None and replace(od, doc="") == d:
            return old
        raise ValueError(f"format name {name!r} is taken ({old.info.doc}); pass another name=")
    d = FloatDesc(name, e, m, b, inf=inf, nan=nan, negative_zero=negative_zero, signed=signed,
                  subnormals=subnormals, default_rounding=d.default_rounding,
                  doc=f"user format (lowprec.float_format): {d.kernel_key}")
    spec, info, vals = derive(d)
    spec.name = "user." + spec.name  # own compiled kernels, cached on disk by the parameters
    f = Format(info, vals, spec)
    SPECS[name] = spec
    _register(f)
    _USER.append(name)
    return f
