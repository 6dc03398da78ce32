"""OCP Microscaling MXFP8: blocks of FP8 E4M3/E5M2 elements sharing one E8M0 scale
(formats.md section 3).

A block of ``k`` (default 32) consecutive elements along ``axis`` shares ``X = 2**(c - 127)``
where ``c`` is the E8M0 scale code (0..254; 0xFF = NaN).  The last block along the axis may be
shorter.  For a block with ``amax = max |v_i|`` (exact, in float64), the shared exponent is::

    floor  (OCP default)  floor(log2(amax)) - emax_elem
    ceil                  ceil(log2(amax)) - emax_elem
    rceil                 ceil(log2(amax / max_elem))   (smallest 2**e with amax / 2**e <= max)
    even                  floor(log2(RNA_m(amax))) - emax_elem, amax first rounded half away
                          to the element's m mantissa bits (so a block max whose significand
                          would round above the element's top binade takes the next scale)

with ``emax_elem`` = 8 (E4M3) or 15 (E5M2), ``max_elem`` = 448 or 57344, clamped to
[-127, 127]; an all-zero block gets -127 (code 0x00, formats.md 3.2 convention).  All of these
are computed exactly from the float bits (never with a floating-point log2, formats.md 3.3).
Rounding in ``rceil`` is exact here; hardware that divides in float32 first may differ when
that quotient rounds onto a power of two.

Elements: ``P_i = round(V_i * 2**-e)`` to E4M3/E5M2 with the chosen rounding mode, always
saturating (OCP MX 6.3: overflow clamps to +-max); the scaling is exact in float64, so there is
no double rounding.  NaN elements keep a NaN code.

Non-finite inputs are implementation-defined in the spec (formats.md 3.3-3.4, open question 8).
``nonfinite="nan"`` (default): a block holding NaN or +-Inf gets scale 0xFF and every element of
it the element NaN code, so the whole block decodes to NaN (microxcaling's behaviour).
``nonfinite="saturate"``: NaN as before, but +-Inf is treated as a huge finite value
(scale from ``amax = Inf`` clamps to 2**127, the Inf element saturates to +-max; gfloat's
behaviour).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import _arrays as A
from ._bits import f64_as_u64
from ._jit import jit
from .core import Format, FormatInfo, QuantizedArray, Rounding, _register, parse_rounding
from .minifloat import FloatSpec, get_format, make_kernel
from .rounding import HYBRID, SR, SR_BITS_DEFAULT, check_offset, check_seed, check_sr_bits

BLOCK_SIZE_DEFAULT = 32  # OCP MX 5.2
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127
SCALE_MODES = ("floor", "rceil", "ceil", "even")
NONFINITE = ("nan", "saturate")

# MXINT8 elements (OCP MX 5.3.3): int8 two's complement with an implicit scale 2**-6.  The
# magnitudes k/64, k = 0..127, are a uniform "float" grid with one binade (E = 0, 6 mantissa
# bits) and its gradual underflow below 1, so the float codec rounds them in every mode; the
# block kernel turns the sign-magnitude code into two's complement.  The range is symmetric,
# [-127/64, 127/64]: -2 (0x80) is never written (as microxcaling; it decodes to -2.0).
MXINT8_ELEM_SPEC = FloatSpec(name="mxint8_elem", e_lo=0, emax=0, fracmax=63, m=6,
                             neg_zero=False, inf_code=-1, nan_code=0, nan_signed=False,
                             max_code=127, max_value=127 / 64, has_nan=False)
MXINT8_VALUES = (np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8)
                 .astype(np.float32) / np.float32(64.0))


def _elem(fmt_name: str, elem: str):
    """``(spec, info, values, emax_elem, mantissa bits, is_int)`` of an MX element format."""
    if elem == "int8":
        info = FormatInfo(
            name="mxint8_elem", bits=8, kind="int", max=127 / 64, min_normal=1.0,
            min_subnormal=1 / 64, has_inf=False, has_nan=False, has_neg_zero=False,
            nan_codes=(), inf_codes=(), nan_code=None, max_code=127,
            default_rounding=Rounding.NEAREST_EVEN)
        return MXINT8_ELEM_SPEC, info, MXINT8_VALUES, 0, 6, True
    f = get_format(elem)
    return f.spec, f.info, f.values(), f.spec.emax, f.spec.m, False


# block format -> element format (OCP MX 5.3, Table 1)
MX_ELEMENTS = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2", "mxfp6_e3m2": "e3m2",
               "mxfp6_e2m3": "e2m3", "mxfp4": "e2m1", "mxint8": "int8"}
_ELEM = {name: _elem(name, el) for name, el in MX_ELEMENTS.items()}


@jit(inline="always")
def _floor_log2(a):
    """Exact ``(floor(log2(a)), f)`` of a finite float64 ``a > 0`` (subnormals included), with
    ``a = (1 + f / 2**52) * 2**floor(log2(a))``: ``f`` is the 52-bit fraction, normalised."""
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1, exact
    return np.int64(e) - 1, np.int64((m * 2.0 - 1.0) * 4503599627370496.0)  # * 2**52: exact


@jit(inline="always")
def _shared_exp(amax, mode, emax_elem, mbits, maxfrac):
    """Unclamped shared exponent of a block (see the module docstring); amax > 0 finite.

    With ``amax = (1 + f) * 2**fl`` (``f`` as a 52-bit integer from :func:`_floor_log2`):

    * floor: ``fl - emax_elem``;
    * ceil: ``fl + (f != 0) - emax_elem``;
    * rceil: the smallest ``e`` with ``amax <= max_elem * 2**e``.  ``max_elem = (1 + F) *
      2**emax_elem`` (F = ``maxfrac`` / 2**52, 0.75 for E4M3 and E5M2), so ``e = fl -
      emax_elem`` when ``f <= F`` and one more otherwise;
    * even: ``amax`` rounded half away to ``mbits`` mantissa bits carries into the next binade
      iff ``f >= (2**(mbits+1) - 1) * 2**(51 - mbits)``; the exponent of the rounded value
      minus ``emax_elem``.

    Closed forms from the bits, so that the GPU kernel (``lowprec.gpu.mx``) computes the same
    integers without a loop; they equal the definitions for every amax, float64 subnormals
    included (a ``floor(amax / 2**(fl - mbits) + 0.5)`` form divided by zero there).
    """
    fl, f = _floor_log2(amax)
    if mode == 0:  # floor
        return fl - emax_elem
    if mode == 2:  # ceil
        return fl + (1 if f != 0 else 0) - emax_elem
    if mode == 1:  # rceil
        return fl + (1 if f > maxfrac else 0) - emax_elem
    carry = ((np.int64(1) << (mbits + 1)) - 1) << (51 - mbits)  # even
    return fl + (1 if f >= carry else 0) - emax_elem


def max_frac52(max_value: float) -> int:
    """The 52-bit fraction of a float64 ``max_value`` (the element's largest finite value)."""
    m, _e = math.frexp(max_value)
    return int((m * 2.0 - 1.0) * 2.0**52)


def _make_block_kernel(fmt_name: str, mode: int):
    spec, _info, _vals, emax_elem, mbits, is_int = _ELEM[fmt_name]
    one = make_kernel(spec, True, mode, True, None)
    NAN_CODE = spec.nan_code
    SIGN = spec.sign
    IS_INT = is_int
    EMAX_ELEM = emax_elem
    MBITS = mbits
    MAXFRAC = max_frac52(spec.max_value)

    @njit(cache=True, nogil=True)
    def kernel(x, k, smode, sat_inf, codes, scales, seed, sr_bits, offset):
        rows, n = x.shape
        nb = scales.shape[1]
        for r in range(rows):
            for b in range(nb):
                lo = b * k
                hi = min(lo + k, n)
                amax = 0.0
                has_nan = False
                has_inf = False
                for i in range(lo, hi):
                    v = x[r, i]
                    if np.isnan(v):
                        has_nan = True
                    elif np.isinf(v):
                        has_inf = True
                    else:
                        amax = max(amax, abs(v))
                if has_nan or (has_inf and not sat_inf):
                    scales[r, b] = E8M0_NAN
                    for i in range(lo, hi):
                        codes[r, i] = NAN_CODE | (SIGN if np.signbit(x[r, i]) else 0)
                    continue
                if has_inf:
                    e = SCALE_EXP_MAX
                elif amax == 0.0:
                    e = SCALE_EXP_MIN
                else:
                    e = _shared_exp(amax, smode, EMAX_ELEM, MBITS, MAXFRAC)
                    e = min(max(e, SCALE_EXP_MIN), SCALE_EXP_MAX)
                scales[r, b] = np.uint8(e + E8M0_BIAS)
                inv = math.ldexp(1.0, -e)
                for i in range(lo, hi):
                    y = x[r, i] * inv  # exact: power-of-two scaling in float64
                    idx = offset + r * n + i  # int64, wraps like the uint64 counter
                    c = one(f64_as_u64(y), seed, idx, sr_bits)[0]
                    if IS_INT:  # sign-magnitude -> two's complement
                        c = ((-(c & 0x7F)) & 0xFF) if c & 0x80 else c
                    codes[r, i] = np.uint8(c)

    return kernel


_BLOCK_KERNELS: dict = {}


def _block_kernel(fmt_name: str, mode: int):
    key = (fmt_name, mode)
    if key not in _BLOCK_KERNELS:
        _BLOCK_KERNELS[key] = _make_block_kernel(fmt_name, mode)
    return _BLOCK_KERNELS[key]


@jit
def _decode_blocks(codes, scales, k, table, out):
    rows, n = codes.shape
    for r in range(rows):
        for i in range(n):
            s = scales[r, i // k]
            if s == E8M0_NAN:
                out[r, i] = np.nan
            else:
                out[r, i] = np.float32(np.float64(table[codes[r, i]]) *
                                       math.ldexp(1.0, np.int64(s) - E8M0_BIAS))


def _check_axis(axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if ndim == 0:
        raise ValueError("MX formats need at least a 1-d input (blocks run along an axis)")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis {axis} is out of range for a {ndim}-d input: use -{ndim}..{ndim - 1}")
    return int(axis) % ndim


def _check_block_size(block_size):
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_size must be a positive integer, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return int(block_size)


def block_len(block_size: int, n: int) -> int:
    """Elements per block as the kernels see it: ``block_size`` capped at the axis length ``n``
    (a block at least as long as the axis is one block over it; issue 12: ``2**63`` overflowed
    the kernels' int64 arithmetic).  Always >= 1, so it also divides an empty axis."""
    return max(1, min(int(block_size), int(n)))


def _parse(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
    return allowed.index(value)


def options(rounding, seed, sr_bits, saturate, axis, block_size, scale_mode, nonfinite, offset,
            ndim: int) -> dict:
    """Validate the MX arguments (everything but the data) for an input of ``ndim`` axes;
    returns the normalised values (``mode`` int, ``axis`` >= 0, ``block_size``, ``smode``
    index into SCALE_MODES, ``sat_inf``, ``seed`` in [0, 2**64), ``sr_bits``, ``offset`` as
    signed int64).  Shared by the NumPy and the torch routes."""
    r = parse_rounding(rounding if rounding is not None else Rounding.NEAREST_EVEN, "e4m3")
    if r == HYBRID:
        raise ValueError("hybrid rounding exists only for hif8")
    if saturate is not None:
        if not isinstance(saturate, (bool, np.bool_)):
            raise TypeError(f"saturate must be True, False or None, got {saturate!r}")
        if not saturate:
            raise ValueError("MX elements always saturate (OCP MX 6.3): saturate=False is not "
                             "available for mxfp8 formats; pass None or True")
    return dict(mode=int(r), axis=_check_axis(axis, ndim), block_size=_check_block_size(block_size),
                smode=_parse("scale_mode", scale_mode, SCALE_MODES),
                sat_inf=_parse("nonfinite", nonfinite, NONFINITE) == 1,
                sr_bits=check_sr_bits(sr_bits) if r == SR else SR_BITS_DEFAULT,
                seed=check_seed(seed, r == SR), offset=check_offset(offset))


def encode(x, f: Format, *, rounding=None, seed=None, sr_bits=SR_BITS_DEFAULT, saturate=None,
           axis: int = -1, block_size: int = BLOCK_SIZE_DEFAULT, scale_mode: str = "floor",
           nonfinite: str = "nan", offset: int = 0) -> QuantizedArray:
    """Encode ``x`` to MXFP8 blocks along ``axis``.

    Args:
        x: float32/float64/float16/bfloat16 numpy array or torch tensor (CPU or CUDA; >= 1-d).
        f: ``mxfp8_e4m3`` or ``mxfp8_e5m2``.
        rounding: element rounding (default ``nearest_even``, OCP); every mode but ``hybrid``.
        seed, sr_bits: stochastic rounding (counter = ``offset`` + flat index in the axis-last
            layout).
        offset: stochastic counter of the first element (int in [0, 2**64)).
        saturate: None or True (MX elements always saturate, OCP MX 6.3); False raises.
        axis: the blocked axis. block_size: elements per block (last block may be partial).
        scale_mode: ``floor`` (OCP), ``rceil``, ``ceil``, ``even`` (module docstring).
        nonfinite: ``nan`` or ``saturate``: what a block holding +-Inf becomes.

    Returns:
        :class:`QuantizedArray` with uint8 element ``codes`` (shape of ``x``) and uint8 E8M0
        ``scales`` (shape of ``x`` with ``axis`` replaced by the number of blocks).

    Example:
        >>> q = lp.encode(np.array([1000.0, 1.0, 0.3], np.float32), "mxfp8_e4m3")
        >>> hex(int(q.scales[0])), q.codes.tolist()
        ('0x80', [126, 48, 34])
    """
    arr, was_torch = A.to_numpy(x)
    arr = A.check_float(arr)
    o = options(rounding, seed, sr_bits, saturate, axis, block_size, scale_mode, nonfinite,
                offset, arr.ndim)
    r, ax, k, smode, sat_inf = o["mode"], o["axis"], o["block_size"], o["smode"], o["sat_inf"]
    sr, seed_v, off = o["sr_bits"], o["seed"], o["offset"]
    moved = np.moveaxis(arr, ax, -1)
    lead = moved.shape[:-1]
    n = moved.shape[-1]
    kk = block_len(k, n)
    nb = -(-n // kk)
    rows = math.prod(lead)
    x2 = np.ascontiguousarray(moved, dtype=np.float64).reshape(rows, n)
    codes = np.empty(x2.shape, dtype=np.uint8)
    scales = np.empty((rows, nb), dtype=np.uint8)
    if x2.size:
        _block_kernel(f.name, int(r))(x2, kk, smode, sat_inf, codes, scales, np.uint64(seed_v),
                                      np.int64(sr), np.int64(off))
    codes = np.ascontiguousarray(np.moveaxis(codes.reshape(lead + (n,)), -1, ax))
    scales = np.ascontiguousarray(np.moveaxis(scales.reshape(lead + (nb,)), -1, ax))
    return QuantizedArray(codes=A.wrap(codes, was_torch), scales=A.wrap(scales, was_torch),
                          format=f.name, axis=ax, block_size=k)


def decode(q: QuantizedArray):
    """Decode an MX :class:`QuantizedArray` to float32 (``2**(scale-127) * element``; scale
    0xFF gives NaN).  Raises ValueError if codes and scales do not match, or if an element code
    of a 4- or 6-bit element format is out of range (``_arrays.check_codes``)."""
    codes, was_torch = A.codes_array(q.codes)
    scales, _ = A.codes_array(q.scales, "scales")
    ax, k, nb = check_quantized(q, codes.shape, codes.dtype, scales.shape, scales.dtype)
    A.check_codes(codes, get_format(q.format))
    c2 = np.ascontiguousarray(np.moveaxis(codes, ax, -1))
    s2 = np.ascontiguousarray(np.moveaxis(scales, ax, -1))
    n = c2.shape[-1]
    rows = math.prod(c2.shape[:-1])
    out = np.empty(c2.shape, dtype=np.float32)
    if out.size:
        _decode_blocks(c2.reshape(rows, n), s2.reshape(rows, nb), k,
                       A.full_table(_ELEM[q.format][2]), out.reshape(rows, n))
    return A.wrap(np.ascontiguousarray(np.moveaxis(out, -1, ax)), was_torch)


def check_quantized(q: QuantizedArray, codes_shape, codes_dtype, scales_shape, scales_dtype):
    """Validate an MX :class:`QuantizedArray`'s metadata (any device: shapes and dtypes only;
    every uint8 scale code is a valid E8M0 value, 0xFF = NaN).  Returns ``(axis, block length
    as the kernels see it, number of blocks)``."""
    if str(codes_dtype).split(".")[-1] != "uint8" or str(scales_dtype).split(".")[-1] != "uint8":
        raise TypeError(f"MX codes and scales must be uint8, got {codes_dtype} and {scales_dtype}")
    if q.granularity is not None or q.zero_points is not None:
        raise ValueError("an MX QuantizedArray has no granularity or zero_points (those are for "
                         "int8/uint8)")
    k = _check_block_size(q.block_size)
    ax = _check_axis(q.axis, len(codes_shape))
    n = codes_shape[ax]
    kk = block_len(k, n)
    nb = -(-n // kk)
    want = tuple(codes_shape[:ax]) + (nb,) + tuple(codes_shape[ax + 1:])
    if tuple(scales_shape) != want:
        raise ValueError(f"scales shape {tuple(scales_shape)} does not match codes "
                         f"{tuple(codes_shape)} with block_size {k} along axis {ax}: "
                         f"expected {want}")
    return ax, kk, nb


def quantize(x, f: Format, *, out=None, **kwargs):
    """MX fake-quantization: ``decode(encode(x, ...))`` as float32 (arguments as
    :func:`encode`; ``out`` is an optional float32 array of ``x.shape``).

    Values beyond float32 range (only reachable from float64 input or ``nonfinite="saturate"``
    with Inf, where the scale clamps to 2**127) become +-Inf in the float32 result."""
    return A.into_out(decode(encode(x, f, **kwargs)), out)


def _info(name: str) -> FormatInfo:
    spec, einfo, _vals, _emax, _m, _int = _ELEM[name]
    el = MX_ELEMENTS[name]
    doc = (f"OCP MX {einfo.name.upper()} elements, E8M0 scale per {BLOCK_SIZE_DEFAULT} "
           "(formats.md 3); values() are unscaled element values")
    if name not in ("mxfp8_e4m3", "mxfp8_e5m2"):
        doc = (f"OCP MX {name.upper()}: {el} elements (one per uint8 code), E8M0 scale per "
               f"{BLOCK_SIZE_DEFAULT} (design.md Formats II); values() are unscaled element "
               "values")
    return FormatInfo(
        name=name, bits=einfo.bits, kind="mx", max=einfo.max, min_normal=einfo.min_normal,
        min_subnormal=einfo.min_subnormal, has_inf=False, has_nan=True,
        has_neg_zero=einfo.has_neg_zero, nan_codes=einfo.nan_codes, inf_codes=(),
        nan_code=einfo.nan_code,
        max_code=einfo.max_code, default_rounding=Rounding.NEAREST_EVEN, scaled=True,
        element=el, block_size=BLOCK_SIZE_DEFAULT, doc=doc,
        extra={"scale_range": (2.0**SCALE_EXP_MIN, 2.0**SCALE_EXP_MAX)},
    )


for _name in _ELEM:
    _register(Format(_info(_name), _ELEM[_name][2]))

__all__ = ["encode", "decode", "quantize", "SCALE_MODES", "BLOCK_SIZE_DEFAULT"]
