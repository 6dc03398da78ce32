"""INT8 / UINT8 affine quantization with per-tensor, per-channel, per-token and per-block scales.

Codes and values (design.md "Formats")::

    x_q = clamp(round(x / s) + z, qmin, qmax)        codes: int8 for "int8", uint8 for "uint8"
    x'  = (x_q - z) * s                              float32 (one rounding of the exact product)

Ranges ``[qmin, qmax]``:

    ============  =================  ==================
    format        symmetric (z = 0)  asymmetric (z int)
    ============  =================  ==================
    int8          [-127, 127]        [-128, 127]
    int8 narrow   [-127, 127]        [-127, 127]
    int8 wide     [-128, 127]        [-128, 127]
    uint8         [0, 255]           [0, 255]
    ============  =================  ==================

``narrow=None`` (default) means narrow for symmetric int8 and wide otherwise; ``narrow=True`` is
an error for uint8.  Symmetric uint8 has ``z = 0``: only non-negative values are representable
and negative inputs clamp to code 0 (use int8, or ``symmetric=False``, for signed data).

Scales (float32, > 0) are computed from the data unless ``scale=`` is given:

* symmetric: ``s = amax / Q`` with ``amax = max |x|`` over the group and ``Q = 127`` for int8
  (narrow or wide: ``-128`` is reached only by clamping) and ``255`` for uint8.
* asymmetric: ``lo = min(min x, 0)``, ``hi = max(max x, 0)`` (so that 0 is exactly
  representable), ``s = (hi - lo) / (qmax - qmin)`` and ``z = clamp(qmin - rint(lo / s), qmin,
  qmax)`` with ``rint`` round-half-even of the float64 quotient by the float32 ``s``.
* only finite values count (NaN and +-Inf are ignored when computing amax/min/max); a group
  with no non-zero finite value gets ``s = 1.0``.
* the scale is computed in float64 and rounded once to float32 (nearest even), then clamped to
  the positive float32 range ``[2**-149, 3.4028235e38]``.

Explicit ``scale=`` (and ``zero_point=``, asymmetric only) may be a scalar or an array
broadcastable to the granularity's scale shape (per-channel also accepts a 1-D array of
``x.shape[axis]`` values).  Scales are rounded to float32; zero, negative, NaN or Inf scales
(before or after that rounding) raise ``ValueError``; zero points must be integers in
``[qmin, qmax]``.  With ``symmetric=False``, ``scale=`` and no ``zero_point=``, the zero points
are computed from the data with the given scales as above.

Granularities (the ``QuantizedArray`` records ``granularity``, ``axis``, ``block_size``):

* ``per_tensor``: one scale; stored with shape ``(1,) * x.ndim``; ``axis = None``.
* ``per_channel``: one scale per index of ``axis`` (default 0); stored keepdims
  (``x.shape[axis]`` on ``axis``, 1 elsewhere).
* ``per_token``: one scale per row, reducing over the last axis only; stored with shape
  ``x.shape[:-1] + (1,)``; ``axis = None`` (the rule is fixed).
* ``per_block``: blocks of ``block_size`` (required) consecutive elements along ``axis``
  (default -1), the last block may be partial; scales have shape ``x.shape`` with ``axis``
  replaced by the number of blocks ``ceil(x.shape[axis] / block_size)``.

Arithmetic.  The quotient ``x / s`` is computed in float64 and rounded to an integer by the shared
:func:`lowprec.formats.rounding.round_to_int` (every mode except ``hybrid``).  For float32,
float16 and bfloat16 inputs the float64 quotient of two 24-bit significands decides every
deterministic mode exactly as the exact quotient would (53 >= 2 * 24 + 2: it is never rounded onto
or across an integer or a half-integer).  Stochastic rounding reads the float64 quotient's
fraction truncated to ``sr_bits`` bits; for float32 inputs this is the exact quotient's truncated
fraction except when the float64 quotient lands exactly on a multiple of ``2**-sr_bits``, where the
probability of rounding up can be ``2**-sr_bits`` too high.  Float64 inputs have one float64
rounding of the quotient before the integer rounding.  Stochastic rounding uses the counter-based
random bits of the element's flat C-order index, so results do not depend on thread count.

Special values.  NaN has no integer code: :func:`encode` raises ``ValueError``; :func:`quantize`
returns NaN there.  +-Inf saturate to ``qmax`` / ``qmin`` in both.  ``saturate`` is accepted for
API symmetry with the float formats, but integer codes always clamp to ``[qmin, qmax]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import prange

from . import _arrays as A
from ._jit import jit
from .core import (
    Format,
    FormatInfo,
    QuantizedArray,
    Rounding,
    _register,
    get_format,
    parse_rounding,
)
from .rounding import SR, SR_BITS_DEFAULT, check_offset, check_seed, check_sr_bits, round_to_int

__all__ = ["encode", "decode", "quantize", "INT8_INFO", "UINT8_INFO", "GRANULARITIES"]

# (wide min, narrow min, max, code dtype) of each integer format; int4 / uint4 codes are stored
# one per byte (int8 / uint8 arrays, values -8..7 / 0..15; ``packed=True`` packs two per byte)
RANGES = {"int8": (-128, -127, 127, np.int8), "uint8": (0, 0, 255, np.uint8),
          "int4": (-8, -7, 7, np.int8), "uint4": (0, 0, 15, np.uint8)}


def is_unsigned(name: str) -> bool:
    """True for the unsigned integer formats (uint8, uint4)."""
    return RANGES[name][0] == 0


INT8_MIN = -128
INT8_MAX = 127
INT8_NARROW_MIN = -127  # symmetric default: the range is symmetric about 0
UINT8_MIN = 0
UINT8_MAX = 255
GRANULARITIES = ("per_tensor", "per_channel", "per_token", "per_block")
_GRAN_NAMES = ", ".join(GRANULARITIES)

F32_TINY = 2.0**-149  # smallest positive float32 (subnormal): lower clamp of computed scales
F32_MAX = float(np.finfo(np.float32).max)  # upper clamp of computed scales
CHUNK = 4096  # elements per parallel work item

PARALLEL_MIN = A.PARALLEL_MIN


# --------------------------------------------------------------------------------------------
# Kernels.  The input is a flat C-order float32/float64 array viewed as (P, L, Q): outer index
# o, middle index m, inner index i (flat index k = (o * L + m) * Q + i).  The scale of element
# (o, m, i) is scale[o * so + (m // bm) * sm + (i // bi) * si], which covers every granularity
# (see _Layout).  Each row (o, m) is cut into segments of one scale (bi consecutive elements);
# a segment is processed by a loop with the scale hoisted, which LLVM vectorizes (a scale
# loaded per element, or a run-time rounding mode, made the loop 4-5x slower).


@jit(inline="always")
def _quantize_one(v, s, z, qmin, qmax, mode, seed, idx, sr_bits):
    """Clamped code (as float64; NaN for NaN input) of one element."""
    y = np.float64(v) / s
    r = round_to_int(y, mode, seed, idx, sr_bits)  # +-Inf come back unchanged
    r = y if y != y else r  # NaN (round_to_int's result is meaningless there)
    q = r + z
    q = qmin if q < qmin else q
    q = qmax if q > qmax else q
    return q


@jit(inline="always")
def _segment(xs, os, s, z, qmin, qmax, mode, seed, k0, sr_bits, want_value):
    """One run of elements sharing scale ``s`` and zero point ``z``; ``xs``/``os`` are slices
    starting at flat index ``k0``.  Returns the number of NaNs met while encoding."""
    nan = 0
    for t in range(xs.shape[0]):
        q = _quantize_one(xs[t], s, z, qmin, qmax, mode, seed, k0 + t, sr_bits)
        if want_value:
            os[t] = np.float32((q - z) * s)  # exact product, one rounding to float32
        else:
            bad = q != q
            nan += bad
            os[t] = np.uint8(0 if bad else np.int64(q) & 0xFF)  # int8: two's complement bits
    return nan


@jit(inline="always")
def _rows(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, mode, seed,
          sr_bits, offset, want_value):
    """Encode (``want_value`` False: codes into uint8 ``out``) or fake-quantize (float32 ``out``)
    the elements ``start .. stop - 1``.  Returns the number of NaNs met while encoding."""
    nan = 0
    k = start
    while k < stop:
        row = k // Q
        r0 = row * Q
        o = row // L
        m = row - o * L
        jrow = o * so + (m // bm) * sm
        rend = min(stop, r0 + Q)
        b = (k - r0) // bi
        send = r0 + (b + 1) * bi
        while k < rend:
            j = jrow + b * si
            k1 = min(rend, send)
            nan += _segment(x[k:k1], out[k:k1], scale[j], zp[j], qmin, qmax, mode, seed,
                            offset + k, sr_bits, want_value)
            k = k1
            b += 1
            send += bi
    return nan


# Splitting off SR lets LLVM drop the random-bit path from the deterministic loops.


@jit
def _encode_chunk(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, mode,
                  seed, sr_bits, offset=0):
    if mode == SR:
        return _rows(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, SR,
                     seed, sr_bits, offset, False)
    return _rows(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, mode,
                 seed, sr_bits, offset, False)


@jit
def _quantize_chunk(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, mode,
                    seed, sr_bits, offset=0):
    if mode == SR:
        return _rows(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, SR,
                     seed, sr_bits, offset, True)
    return _rows(x, scale, zp, out, start, stop, L, Q, bm, sm, so, bi, si, qmin, qmax, mode,
                 seed, sr_bits, offset, True)


@jit
def _encode_serial(x, scale, zp, out, L, Q, bm, sm, so, bi, si, qmin, qmax, mode, seed,
                   sr_bits, offset=0):
    return _encode_chunk(x, scale, zp, out, 0, x.shape[0], L, Q, bm, sm, so, bi, si, qmin, qmax,
                         mode, seed, sr_bits, offset)


@jit
def _quantize_serial(x, scale, zp, out, L, Q, bm, sm, so, bi, si, qmin, qmax, mode, seed,
                     sr_bits, offset=0):
    return _quantize_chunk(x, scale, zp, out, 0, x.shape[0], L, Q, bm, sm, so, bi, si, qmin,
                           qmax, mode, seed, sr_bits, offset)


@jit(parallel=True)
def _encode_parallel(x, scale, zp, out, L, Q, bm, sm, so, bi, si, qmin, qmax, mode, seed,
                     sr_bits, offset=0):
    n = x.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    nans = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        nans[c] = _encode_chunk(x, scale, zp, out, c * CHUNK, min(n, (c + 1) * CHUNK), L, Q,
                                bm, sm, so, bi, si, qmin, qmax, mode, seed, sr_bits, offset)
    return nans.sum()


@jit(parallel=True)
def _quantize_parallel(x, scale, zp, out, L, Q, bm, sm, so, bi, si, qmin, qmax, mode, seed,
                       sr_bits, offset=0):
    n = x.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    for c in prange(nch):
        _quantize_chunk(x, scale, zp, out, c * CHUNK, min(n, (c + 1) * CHUNK), L, Q, bm, sm, so,
                        bi, si, qmin, qmax, mode, seed, sr_bits, offset)
    return 0


@jit
def _minmax(x, lo, hi, L, Q, bm, sm, so, bi, si):
    """``lo[j]``/``hi[j]`` = min/max of the finite elements of scale group ``j``, updated in
    place (start them at +Inf/-Inf).  Same layout and segments as :func:`_rows`."""
    n = x.shape[0]
    k = 0
    while k < n:
        row = k // Q
        o = row // L
        m = row - o * L
        jrow = o * so + (m // bm) * sm
        rend = k + Q
        b = 0
        while k < rend:
            j = jrow + b * si
            k1 = min(rend, k + bi)
            a = lo[j]
            c = hi[j]
            for t in range(k, k1):
                v = np.float64(x[t])
                if math.isfinite(v):
                    a = min(a, v)
                    c = max(c, v)
            lo[j] = a
            hi[j] = c
            k = k1
            b += 1


# --------------------------------------------------------------------------------------------
# Validation and set-up (plain Python, O(number of scales))


class _Layout:
    """How ``x`` (C order) maps onto the scale array: see the kernel comment above."""

    __slots__ = ("L", "Q", "bm", "sm", "so", "bi", "si", "scale_shape", "axis", "block_size",
                 "block_len", "granularity")

    def __init__(self, shape, granularity, axis, block_size):
        if not isinstance(granularity, str) or granularity not in GRANULARITIES:
            raise ValueError(f"granularity {granularity!r} is not one of {_GRAN_NAMES}")
        nd = len(shape)
        self.granularity = granularity
        self.block_size = None
        self.block_len = None  # per_block: block_size capped at the axis length
        if granularity != "per_block" and block_size is not None:
            raise ValueError(
                f"block_size applies to granularity 'per_block' only, not {granularity!r}"
            )
        if granularity in ("per_tensor", "per_token") and axis is not None:
            raise ValueError(
                f"axis applies to granularities 'per_channel' and 'per_block' only, not "
                f"{granularity!r} (per_token always reduces over the last axis)"
            )
        if granularity != "per_tensor" and nd == 0:
            raise ValueError(f"granularity {granularity!r} needs an input with at least 1 axis")
        n = math.prod(shape)
        L, Q, bm, sm, so, bi, si = 1, n, 1, 0, 0, n, 0  # per_tensor: one segment
        self.axis = None
        if granularity == "per_tensor":
            self.scale_shape = (1,) * nd
        elif granularity == "per_token":
            Q = bi = shape[-1]
            so = 1
            self.scale_shape = tuple(shape[:-1]) + (1,)
        else:
            a = _norm_axis((0 if granularity == "per_channel" else -1) if axis is None else axis,
                           nd)
            self.axis = a
            C = shape[a]
            inner = math.prod(shape[a + 1:])
            ss = list(shape) if granularity == "per_block" else [1] * nd
            if granularity == "per_channel":
                ss[a] = C
                if inner > 1:  # rows of `inner` elements share a scale
                    L, Q, sm, bi = C, inner, 1, inner
                else:  # channel = position in the row
                    Q, bi, si = C, 1, 1
            else:
                if (isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))
                        or block_size < 1):
                    raise ValueError(
                        f"block_size must be an integer >= 1 for granularity 'per_block', "
                        f"got {block_size!r}"
                    )
                self.block_size = int(block_size)
                # a block at least as long as the axis is one block over it: cap (issue 12,
                # 2**63 overflowed the kernels' int64 index arithmetic)
                bs = max(1, min(self.block_size, C))
                self.block_len = bs
                nb = -(-C // bs)
                ss[a] = nb
                if inner > 1:  # element (o, m, i) -> scale (o, m // bs, i)
                    L, Q, bm, sm, so, bi, si = C, inner, bs, inner, nb * inner, 1, 1
                else:  # rows of C elements, blocks of bs consecutive elements
                    Q, so, bi, si = C, nb, bs, 1
            self.scale_shape = tuple(ss)
        # empty input: the kernels never run, but keep every divisor >= 1
        self.L, self.Q, self.bm, self.bi = max(L, 1), max(Q, 1), bm, max(bi, 1)
        self.sm, self.so, self.si = sm, so, si

    @property
    def args(self):
        return tuple(np.int64(v) for v in (self.L, self.Q, self.bm, self.sm, self.so, self.bi,
                                           self.si))


def _norm_axis(axis, nd):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -nd <= axis < nd:
        raise ValueError(
            f"axis {axis!r} is not valid for a {nd}-D input; allowed: integers {-nd}..{nd - 1}"
        )
    return int(axis) % nd


def _qrange(f: Format, symmetric: bool, narrow) -> tuple[int, int]:
    if narrow is not None and not isinstance(narrow, (bool, np.bool_)):
        raise TypeError(f"narrow must be True, False or None, got {narrow!r}")
    lo, nlo, hi, _dt = RANGES[f.name]
    if is_unsigned(f.name):
        if narrow:
            raise ValueError(f"narrow=True applies to int8 only (and int4); {f.name} always "
                             f"uses [0, {hi}]")
        return lo, hi
    if narrow is None:
        narrow = symmetric
    return (nlo if narrow else lo), hi


def _user_array(v, what: str) -> np.ndarray:
    if A.is_torch(v):
        v = A.to_numpy(v, what)[0]
    arr = np.asarray(v)
    if arr.dtype == A.BF16 or arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    if arr.dtype.kind not in "iuf":  # bool is not a number here: scale=True is no scale
        raise TypeError(f"{what} must be a real number or array (integer or float), got "
                        f"dtype {arr.dtype}")
    return arr


def _fit_shape(arr: np.ndarray, lay: _Layout, what: str) -> np.ndarray:
    shape = lay.scale_shape
    if (lay.granularity == "per_channel" and arr.ndim == 1 and len(shape) > 1
            and arr.shape[0] == shape[lay.axis]):  # one value per channel
        arr = arr.reshape(shape)
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(
            f"{what} of shape {arr.shape} does not broadcast to the {lay.granularity} scale "
            f"shape {shape}"
        ) from None


def _explicit_scale(scale, lay: _Layout) -> np.ndarray:
    return check_scale_values(_fit_shape(_user_array(scale, "scale"), lay, "scale"), "scale")


def _explicit_zero_point(zero_point, lay: _Layout, qmin: int, qmax: int) -> np.ndarray:
    z = _fit_shape(_user_array(zero_point, "zero_point"), lay, "zero_point")
    zf = z.astype(np.float64)
    if not np.all(np.floor(zf) == zf):
        raise ValueError("zero_point must hold integers")
    if z.size and (zf.min() < qmin or zf.max() > qmax):
        raise ValueError(f"zero_point must lie in [{qmin}, {qmax}]")
    return zf.astype(np.int32)


def _to_f32_scale(s64: np.ndarray) -> np.ndarray:
    """Round float64 scales to float32 (nearest) and clamp to the positive float32 range."""
    with np.errstate(over="ignore", under="ignore"):
        s32 = s64.astype(np.float32)
    return np.clip(s32, np.float32(F32_TINY), np.float32(F32_MAX)).reshape(s64.shape)


def options(f: Format, rounding, seed, sr_bits, saturate, granularity, axis, block_size,
            symmetric, scale, zero_point, narrow, offset, shape) -> dict:
    """Validate the INT arguments that do not depend on the data values, for an input of
    ``shape``; returns ``mode``, ``seed``, ``sr_bits``, ``offset`` (signed int64), ``qmin``,
    ``qmax``, ``lay`` (the :class:`_Layout`) and ``symmetric``.  Shared by the NumPy and the
    torch routes (explicit scale/zero-point values are checked by each)."""
    if f.info.kind != "int":
        raise ValueError(f"{f.name!r} is not an integer format; use int8 or uint8")
    r = parse_rounding(rounding if rounding is not None else f.info.default_rounding, f.name)
    if saturate is not None and not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be True, False or None, got {saturate!r}")
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
    sr = check_sr_bits(sr_bits) if r == Rounding.STOCHASTIC else SR_BITS_DEFAULT
    seed_v = check_seed(seed, r == Rounding.STOCHASTIC)
    off = check_offset(offset)
    qmin, qmax = _qrange(f, bool(symmetric), narrow)
    lay = _Layout(tuple(shape), granularity, axis, block_size)
    if symmetric and zero_point is not None:
        raise ValueError("zero_point applies to symmetric=False only (symmetric means z = 0)")
    if scale is None and zero_point is not None:
        raise ValueError("zero_point= needs scale= as well")
    return dict(mode=int(r), seed=seed_v, sr_bits=sr, offset=off, qmin=qmin, qmax=qmax,
                lay=lay, symmetric=bool(symmetric))


def _resolve(x, f, rounding, seed, sr_bits, saturate, granularity, axis, block_size,
             symmetric, scale, zero_point, narrow, offset=0):
    """Validate everything; return the flat input, the layout, scales and zero points."""
    f = get_format(f)
    arr, was_torch = A.to_numpy(x)
    arr = A.check_float(arr)
    o = options(f, rounding, seed, sr_bits, saturate, granularity, axis, block_size, symmetric,
                scale, zero_point, narrow, offset, arr.shape)
    r, sr, seed_v, off = o["mode"], o["sr_bits"], o["seed"], o["offset"]
    qmin, qmax, lay = o["qmin"], o["qmax"], o["lay"]

    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float32)  # float16 and bfloat16 widen exactly
    flat = np.ascontiguousarray(arr).reshape(-1)

    # scales and zero points are handled flat (C order of the scale shape) until the end
    s32 = _explicit_scale(scale, lay).reshape(-1) if scale is not None else None
    zp = None
    if symmetric:
        if s32 is None:
            lo, hi = _group_minmax(flat, lay)
            amax = np.maximum(-lo, hi)
            s32 = _to_f32_scale(amax / RANGES[f.name][2])
            s32[amax == 0] = 1.0
    else:
        if zero_point is not None:
            zp = _explicit_zero_point(zero_point, lay, qmin, qmax).reshape(-1)
        else:
            lo, hi = _group_minmax(flat, lay)
            if s32 is None:
                s32 = _to_f32_scale((hi - lo) / (qmax - qmin))
                s32[hi == lo] = 1.0
            zf = qmin - np.rint(lo / s32.astype(np.float64))
            zp = np.clip(zf, qmin, qmax).astype(np.int32)
    s32 = np.ascontiguousarray(s32, dtype=np.float32).reshape(lay.scale_shape)
    if zp is not None:
        zp = np.ascontiguousarray(zp, dtype=np.int32).reshape(lay.scale_shape)
    return dict(arr=arr, flat=flat, was_torch=was_torch, lay=lay, scales=s32, zps=zp,
                mode=r, seed=seed_v, sr_bits=sr, offset=off, qmin=qmin, qmax=qmax, fmt=f)


def _group_minmax(flat: np.ndarray, lay: _Layout):
    """Per scale group min(min x, 0) and max(max x, 0) over finite x: flat float64 arrays."""
    ns = math.prod(lay.scale_shape)
    lo = np.full(ns, np.inf)
    hi = np.full(ns, -np.inf)
    _minmax(flat, lo, hi, *lay.args)
    return np.minimum(lo, 0.0), np.maximum(hi, 0.0)


def _run(p, out: np.ndarray, want_value: bool) -> int:
    """Run the encode (uint8 ``out``) or quantize (float32 ``out``) kernel; returns #NaNs."""
    flat = p["flat"]
    s64 = p["scales"].reshape(-1).astype(np.float64)
    zps = p["zps"]
    z64 = np.zeros(s64.shape[0]) if zps is None else zps.reshape(-1).astype(np.float64)
    big = flat.shape[0] >= PARALLEL_MIN
    if want_value:
        kern = _quantize_parallel if big else _quantize_serial
    else:
        kern = _encode_parallel if big else _encode_serial
    return int(kern(flat, s64, z64, out, *p["lay"].args, np.float64(p["qmin"]),
                    np.float64(p["qmax"]), np.int64(p["mode"]), np.uint64(p["seed"]),
                    np.int64(p["sr_bits"]), np.int64(p.get("offset", 0))))


def _wrap_like(a: np.ndarray | None, as_torch: bool):
    return None if a is None else A.wrap(a, as_torch)


# --------------------------------------------------------------------------------------------
# Public codec


def encode(x: Any, f: Format, *, rounding: str | Rounding | None = None,
           seed: int | np.random.Generator | None = None, sr_bits: int = SR_BITS_DEFAULT,
           saturate: bool | None = None, granularity: str = "per_tensor", axis: int | None = None,
           block_size: int | None = None, symmetric: bool = True, scale: Any = None,
           zero_point: Any = None, narrow: bool | None = None, offset: int = 0) -> QuantizedArray:
    """Quantize ``x`` to int8/uint8 codes with scales (and zero points): a :class:`QuantizedArray`.

    ``codes = clamp(round(x / s) + z, qmin, qmax)``; see the module docstring for the ranges, how
    scales are computed and the float64-quotient convention.

    Args:
        x: numpy array or torch tensor (CPU or CUDA) of float32, float64, float16 or
            bfloat16, any shape and strides.
        f: the ``int8`` or ``uint8`` :class:`Format` (or its name).
        rounding: any :class:`Rounding` except ``hybrid``; default ``nearest_even``.
        seed: stochastic rounding only (required then): int >= 0 or numpy Generator; element
            ``i`` (flat C order) uses random bits depending only on ``(seed, i)``.
        sr_bits: random bits per element for stochastic rounding, 1..32.
        offset: stochastic counter of the first element (element ``i`` uses ``offset + i``),
            an int in [0, 2**64): chunks quantized with their start as offset equal the whole.
        saturate: True, False or None, accepted for API symmetry; integer codes always clamp
            to ``[qmin, qmax]``.
        granularity: ``per_tensor``, ``per_channel``, ``per_token`` or ``per_block``.
        axis: per_channel: the channel axis (default 0); per_block: the blocked axis
            (default -1); must be None otherwise.
        block_size: per_block only (required): elements per block along ``axis``; the last
            block may be partial.
        symmetric: True: ``z = 0``, ``s = amax / 127`` (int8) or ``amax / 255`` (uint8; negative
            values clamp to 0); False: asymmetric min/max scales with integer zero points.
        scale: explicit scales (scalar or array broadcastable to the scale shape; float32 > 0).
        zero_point: explicit integer zero points in ``[qmin, qmax]`` (asymmetric, with ``scale``).
        narrow: int8 only: True for ``[-127, 127]``, False for ``[-128, 127]``; default: narrow
            when symmetric.

    Returns:
        ``QuantizedArray(codes, scales, format, axis, block_size, zero_points, granularity)``:
        codes int8/uint8 of ``x.shape``; float32 scales (keepdims shape, or the blocks shape
        for per_block); int32 zero points of the same shape, or None when symmetric.  Torch
        input gives torch tensors.

    Raises:
        TypeError: non-float input; non-bool ``saturate``/``symmetric``/``narrow``.
        ValueError: NaN in ``x`` (no integer code); bad rounding (``hybrid``), granularity,
            axis, block_size, scale or zero_point; stochastic rounding without a seed.

    Example:
        >>> import numpy as np, lowprec as lp
        >>> q = lp.encode(np.array([-1.0, 0.5, 2.0], np.float32), "int8")
        >>> q.codes, q.scales
        (array([-64,  32, 127], dtype=int8), array([0.01574803], dtype=float32))
    """
    p = _resolve(x, f, rounding, seed, sr_bits, saturate, granularity, axis, block_size,
                 symmetric, scale, zero_point, narrow, offset)
    fmt = p["fmt"]
    codes = np.empty(p["arr"].shape, dtype=np.uint8)
    nan = _run(p, codes.reshape(-1), False)
    if nan:
        raise ValueError(
            f"NaN has no {fmt.name} code ({nan} NaN value(s) in x); use quantize() to "
            "propagate NaN, or remove NaNs first"
        )
    if not is_unsigned(fmt.name):
        codes = codes.view(np.int8)
    t = p["was_torch"]
    lay = p["lay"]
    return QuantizedArray(codes=A.wrap(codes, t), scales=A.wrap(p["scales"], t), format=fmt.name,
                          axis=lay.axis, block_size=lay.block_size,
                          zero_points=_wrap_like(p["zps"], t), granularity=lay.granularity)


def quantize(x: Any, f: Format, *, rounding: str | Rounding | None = None,
             seed: int | np.random.Generator | None = None, sr_bits: int = SR_BITS_DEFAULT,
             saturate: bool | None = None, out: np.ndarray | None = None,
             granularity: str = "per_tensor", axis: int | None = None,
             block_size: int | None = None, symmetric: bool = True, scale: Any = None,
             zero_point: Any = None, narrow: bool | None = None, offset: int = 0):
    """Fake-quantize ``x`` through int8/uint8: ``(clamp(round(x / s) + z) - z) * s`` in float32.

    Fused (one pass, no codes materialised) and bit-identical to ``decode(encode(x, ...))`` for
    NaN-free input; NaN input gives NaN, +-Inf give ``(qmax - z) * s`` / ``(qmin - z) * s``.

    Args:
        x, f, rounding, seed, sr_bits, offset, saturate, granularity, axis, block_size,
        symmetric, scale, zero_point, narrow: as :func:`encode`.
        out: optional preallocated C-contiguous float32 array (or CPU tensor) of ``x.shape``.

    Returns:
        float32 values of ``x.shape`` (a torch tensor for torch input), or ``out``.

    Raises:
        as :func:`encode`, except that NaN is allowed; ValueError for a bad ``out``.

    Example:
        >>> lp.quantize(np.array([-1.0, 0.5, 2.0], np.float32), "int8")
        array([-1.007874,  0.503937,  2.      ], dtype=float32)
    """
    p = _resolve(x, f, rounding, seed, sr_bits, saturate, granularity, axis, block_size,
                 symmetric, scale, zero_point, narrow, offset)
    o = A.make_out(out, p["arr"].shape, np.float32)
    flat = o.reshape(-1)
    work = A.scratch_if_overlap(flat, p["flat"])  # out= overlapping x (issue 12)
    _run(p, work, True)
    if work is not flat:
        flat[...] = work
    return A.wrap(o, p["was_torch"]) if out is None else out


def check_quantized(q: QuantizedArray, f: Format, codes_shape, codes_dtype, scales_shape,
                    zps_shape) -> _Layout:
    """Validate an int8/uint8 :class:`QuantizedArray`'s metadata (shapes, dtypes, granularity,
    axis, block size; any device) and return its :class:`_Layout`.

    ``granularity=None`` (a hand-made QuantizedArray) means ``per_block`` when ``block_size``
    is set and otherwise any scale shape that broadcasts to the codes."""
    want = np.dtype(RANGES[f.name][3]).name
    if str(codes_dtype).split(".")[-1] != want:
        raise TypeError(f"{f.name} codes must have dtype {want}, got {codes_dtype}")
    g = q.granularity
    if g is None:
        g = "per_block" if q.block_size is not None else None
    elif not isinstance(g, str) or g not in GRANULARITIES:
        raise ValueError(f"QuantizedArray granularity {g!r} is not one of {_GRAN_NAMES} "
                         "(or None)")
    if g == "per_block" and (q.axis is None or q.block_size is None):
        raise ValueError("per_block QuantizedArray needs a valid axis and block_size")
    if zps_shape is not None and tuple(zps_shape) != tuple(scales_shape):
        raise ValueError(f"zero_points shape {tuple(zps_shape)} differs from scales shape "
                         f"{tuple(scales_shape)}")
    sshape = tuple(scales_shape)
    if g is None:
        lay = _Layout(codes_shape, "per_tensor", None, None)
        target, what = tuple(codes_shape), "codes of shape"
    else:
        lay = _Layout(codes_shape, g, q.axis, q.block_size)
        target, what = lay.scale_shape, f"the {g} scale shape"
    if g == "per_block":
        if sshape != lay.scale_shape:
            raise ValueError(f"per_block scales must have shape {lay.scale_shape}, got {sshape}")
        return lay
    try:
        ok = np.broadcast_shapes(sshape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"scales of shape {sshape} do not broadcast to {what} {target}"
                         + ("" if g is None else f" of codes of shape {tuple(codes_shape)}"))
    if g is None:
        lay.granularity = None
    return lay


def check_scale_values(s: np.ndarray, what: str = "QuantizedArray scales") -> np.ndarray:
    """Scales (explicit ``scale=`` or a QuantizedArray's) as float32, or ValueError unless every
    value is finite and > 0, before and after the rounding to float32."""
    s = np.asarray(s, dtype=np.float64)
    if not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"{what} must be finite and > 0 everywhere (got zero, negative, NaN "
                         "or Inf)")
    with np.errstate(over="ignore", under="ignore"):
        s32 = s.astype(np.float32)
    if not np.all(np.isfinite(s32) & (s32 > 0)):
        raise ValueError(f"{what} must be a positive finite float32 (it under- or overflows "
                         "float32)")
    return s32


def check_zero_point_values(z: np.ndarray, f: Format) -> np.ndarray:
    """Zero points of a QuantizedArray as int32, or ValueError unless integers in the format's
    code range ([-128, 127] int8, [0, 255] uint8)."""
    zf = z.astype(np.float64)
    lo, _nlo, hi, _dt = RANGES[f.name]
    if not np.all(np.floor(zf) == zf) or (zf.size and (zf.min() < lo or zf.max() > hi)):
        raise ValueError(f"QuantizedArray zero_points must be integers in [{lo}, {hi}]")
    return zf.astype(np.int32)


def decode(q: QuantizedArray):
    """Dequantize an int8/uint8 :class:`QuantizedArray`: ``(codes - z) * s`` in float32.

    Args:
        q: as returned by :func:`encode` (numpy or torch fields).

    Returns:
        float32 values of ``q.codes.shape`` (a torch tensor if ``q.codes`` is one).  Each value
        is the float32 rounding of the exact product ``(code - z) * s``.

    Raises:
        TypeError: codes of the wrong dtype (int8 for int8, uint8 for uint8).
        ValueError: not an integer format; an unknown granularity; scales/zero points whose
            shape does not fit the codes and granularity; scales that are not finite and > 0;
            zero points that are not integers in the format's range; int4/uint4 codes outside
            -8..7 / 0..15 (``_arrays.check_codes``).

    Example:
        >>> lp.decode(lp.encode(np.array([-1.0, 0.5, 2.0], np.float32), "int8"))
        array([-1.007874,  0.503937,  2.      ], dtype=float32)
    """
    f = get_format(q.format)
    if f.info.kind != "int":
        raise ValueError(f"{f.name!r} is not an integer format; use int8 or uint8")
    codes, was_torch = A.codes_array(q.codes)
    s = _user_array(q.scales, "scales")
    z = None if q.zero_points is None else _user_array(q.zero_points, "zero_points")
    lay = check_quantized(q, f, codes.shape, codes.dtype, s.shape,
                          None if z is None else z.shape)
    s = check_scale_values(s)
    if z is not None:
        z = check_zero_point_values(z, f)
    A.check_codes(codes, f)
    if lay.granularity == "per_block":
        a, bs, L = lay.axis, lay.block_len, codes.shape[lay.axis]
        s = np.take(np.repeat(s, bs, axis=a), np.arange(L), axis=a)
        if z is not None:
            z = np.take(np.repeat(z, bs, axis=a), np.arange(L), axis=a)
    v = codes.astype(np.float32)
    if z is not None:
        v = v - z.astype(np.float32)  # exact: small integers
    with np.errstate(over="ignore"):  # like quantize: overflow gives +-Inf silently
        out = np.ascontiguousarray(v * s, dtype=np.float32)  # one float32 rounding
    return A.wrap(out, was_torch)


# --------------------------------------------------------------------------------------------
# Registration

INT8_VALUES = np.arange(256, dtype=np.uint16).astype(np.uint8).view(np.int8).astype(np.float32)
UINT8_VALUES = np.arange(256, dtype=np.float32)

INT8_INFO = FormatInfo(
    name="int8", bits=8, kind="int", max=float(INT8_MAX), min_normal=0.0, min_subnormal=1.0,
    has_inf=False, has_nan=False, has_neg_zero=False, nan_codes=(), inf_codes=(), nan_code=None,
    max_code=INT8_MAX, default_rounding=Rounding.NEAREST_EVEN, scaled=True,
    qmin=INT8_NARROW_MIN, qmax=INT8_MAX,
    doc="INT8 affine quantization: two's complement codes, symmetric [-127, 127] by default "
        "([-128, 127] wide / asymmetric), float32 scales, int32 zero points",
)
UINT8_INFO = FormatInfo(
    name="uint8", bits=8, kind="int", max=float(UINT8_MAX), min_normal=0.0, min_subnormal=1.0,
    has_inf=False, has_nan=False, has_neg_zero=False, nan_codes=(), inf_codes=(), nan_code=None,
    max_code=UINT8_MAX, default_rounding=Rounding.NEAREST_EVEN, scaled=True,
    qmin=UINT8_MIN, qmax=UINT8_MAX,
    doc="UINT8 affine quantization: codes [0, 255], float32 scales, int32 zero points "
        "(symmetric: z = 0, negatives clamp to 0)",
)

_register(Format(INT8_INFO, INT8_VALUES))
_register(Format(UINT8_INFO, UINT8_VALUES))

# INT4 / UINT4 (issue 17): the same affine codec with 4-bit code ranges; values() lists the 16
# codes in the nibble order ml_dtypes.int4 / uint4 use (int4: two's complement nibbles)
INT4_VALUES = (np.arange(16) ^ 8).astype(np.float32) - 8
UINT4_VALUES = np.arange(16, dtype=np.float32)
_register(Format(FormatInfo(
    name="int4", bits=4, kind="int", max=7.0, min_normal=0.0, min_subnormal=1.0,
    has_inf=False, has_nan=False, has_neg_zero=False, nan_codes=(), inf_codes=(), nan_code=None,
    max_code=7, default_rounding=Rounding.NEAREST_EVEN, scaled=True, qmin=-7, qmax=7,
    doc="INT4 affine quantization: codes -8..7 (int8 arrays, or packed two per byte), "
        "symmetric [-7, 7] by default, float32 scales, int32 zero points",
), INT4_VALUES))
_register(Format(FormatInfo(
    name="uint4", bits=4, kind="int", max=15.0, min_normal=0.0, min_subnormal=1.0,
    has_inf=False, has_nan=False, has_neg_zero=False, nan_codes=(), inf_codes=(), nan_code=None,
    max_code=15, default_rounding=Rounding.NEAREST_EVEN, scaled=True, qmin=0, qmax=15,
    doc="UINT4 affine quantization: codes 0..15 (uint8 arrays, or packed two per byte), "
        "float32 scales, int32 zero points",
), UINT4_VALUES))
