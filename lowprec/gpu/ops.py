"""The codecs as ``torch.library`` custom operators (namespace ``lowprec``).

Every torch tensor given to :func:`lowprec.encode`, :func:`~lowprec.decode` or
:func:`~lowprec.quantize` goes through one of these ops after validation, so eager calls,
``torch.compile`` (``fullgraph=True`` included) and ``torch.library.opcheck`` all see the same
operator:

* CPU implementation: the Numba path (the tensor's memory viewed as a NumPy array);
* CUDA implementation: the Triton kernels of ``lowprec.gpu`` via :mod:`lowprec.gpu.codecs`, on
  the tensor's own device, without host synchronisation;
* a fake (meta) implementation giving shapes and dtypes, for tracing.

The decode ops of formats whose codes are narrower than their storage (e2m1, e2m3, e3m2, MXFP4,
MXFP6, NVFP4, int4, uint4, user formats of fewer than 8 or 9-15 bits) check the codes in their
implementation, on both devices (``_arrays.check_codes``: ValueError, the same message; on CUDA
one reduction read back).  Inside a compiled graph the implementation runs as in eager mode, so
the compiled call raises the same error; the fake implementation checks nothing.  While a CUDA
graph is being captured the check is skipped and an invalid code decodes to NaN.

Ops (``torch.ops.lowprec.*``): ``float_codec`` (codes or values of hif8/e4m3/e5m2),
``float_decode``, ``mx_encode`` (codes, scales), ``mx_quantize``, ``mx_decode``, ``int_encode``
(codes, scales, zero points; an empty zero-point tensor when symmetric), ``int_quantize``,
``int_decode``, ``nvfp4_encode`` (codes, scales, the 0-dim tensor scale), ``nvfp4_quantize``,
``nvfp4_decode``.  Arguments are the validated, normalised ones (rounding mode as its integer
code, 64-bit seed and offset as signed int64); the public functions do the validation.

``TRITON_ON_CPU`` (tests only): when set, the CPU implementations run the Triton kernels too
(under ``TRITON_INTERPRET=1``), so the interpreter tests exercise the full CUDA code path on CPU
tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..formats import _arrays as A
from ..formats.core import available_formats

# Every format family is imported now, so that tracing (torch.compile) never meets an import.
available_formats()

TRITON_ON_CPU = False

_F32 = torch.float32
_U8 = torch.uint8


def _np(t: Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array (bfloat16 as ml_dtypes.bfloat16)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(A.BF16)
    return t.numpy()


def _u64(v: int) -> int:
    return int(v) & 0xFFFFFFFFFFFFFFFF


def _device_path(*ts: Tensor) -> bool:
    return ts[0].is_cuda or TRITON_ON_CPU


_DIRECT: dict = {}


def _op(name: str, fn, mutates=()):
    """Register ``fn`` as ``torch.ops.lowprec.<name>``; keep ``fn`` for eager calls."""
    _DIRECT[name] = fn
    return torch.library.custom_op(f"lowprec::{name}", mutates_args=mutates)(fn)


def eager(t: Tensor) -> bool:
    """True when a call on ``t`` may run the implementation directly, skipping the dispatcher
    (tens of microseconds per call, and on first use the import of TorchDynamo): a plain
    tensor outside ``torch.compile`` tracing.  Subclasses (fake tensors, parameters) and
    traced calls go through the operator."""
    return type(t) is torch.Tensor and not torch.compiler.is_compiling()


class _Direct:
    """``torch.ops.lowprec``'s operators as plain calls of their implementations."""

    def __getattr__(self, name):
        return _DIRECT[name]


DIRECT = _Direct()


def route(t: Tensor):
    """The namespace to call a codec op on ``t`` through: :data:`DIRECT` in eager mode
    (:func:`eager`), ``torch.ops.lowprec`` otherwise."""
    return DIRECT if eager(t) else torch.ops.lowprec


# --------------------------------------------------------------------------------------------
# float formats


def code_dtype(fmt: str):
    """torch dtype of a float format's codes: uint8, or uint16 above 8 bits (bf16, fp16)."""
    from ..formats.core import get_format

    return torch.uint16 if get_format(fmt).info.bits > 8 else _U8


def _float_codec(x: Tensor, fmt: str, rounding: int, saturate: bool, seed: int, sr_bits: int,
                offset: int, want_value: bool) -> Tensor:
    """Codes (uint8; uint16 for 16-bit formats) or values (float32) of ``x`` in the float
    format ``fmt``."""
    out = torch.empty(x.shape, dtype=_F32 if want_value else code_dtype(fmt), device=x.device)
    _float_codec_out(x, out, fmt, rounding, saturate, seed, sr_bits, offset)
    return out


float_codec = _op("float_codec", _float_codec)


@float_codec.register_fake
def _(x, fmt, rounding, saturate, seed, sr_bits, offset, want_value):
    return torch.empty_like(x, dtype=_F32 if want_value else code_dtype(fmt),
                            memory_format=torch.contiguous_format)


def _float_codec_out(x: Tensor, out: Tensor, fmt: str, rounding: int, saturate: bool, seed: int,
                    sr_bits: int, offset: int) -> None:
    """:func:`float_codec` into ``out`` (contiguous, ``x.shape``; uint8 codes or float32
    values, chosen by its dtype; it must not overlap ``x``)."""
    if _device_path(x):
        from . import codecs

        codecs.float_codec(x, out, fmt, rounding, saturate, seed, sr_bits, offset)
        return
    from ..formats.api import _float_spec
    from ..formats.minifloat import run_kernel

    run_kernel(_float_spec(fmt), A.float_bits(_np(x.contiguous())), _np(out).reshape(-1),
               rounding, saturate, _u64(seed), sr_bits, offset)


float_codec_out = _op("float_codec_out", _float_codec_out, ("out",))


@float_codec_out.register_fake
def _(x, out, fmt, rounding, saturate, seed, sr_bits, offset):
    return None


def _float_decode(codes: Tensor, fmt: str) -> Tensor:
    """float32 values of uint8 ``codes`` of the float format ``fmt``."""
    out = torch.empty(codes.shape, dtype=_F32, device=codes.device)
    _float_decode_out(codes, out, fmt)
    return out


float_decode = _op("float_decode", _float_decode)


@float_decode.register_fake
def _(codes, fmt):
    return torch.empty_like(codes, dtype=_F32, memory_format=torch.contiguous_format)


def _float_decode_out(codes: Tensor, out: Tensor, fmt: str) -> None:
    """:func:`float_decode` into ``out`` (contiguous float32, not overlapping ``codes``);
    ValueError for a code outside a sub-byte format's range (``_arrays.check_codes``)."""
    if _device_path(codes):
        from . import codecs

        codecs.float_decode(codes, out, fmt)
        return
    from ..formats.core import get_format

    f = get_format(fmt)
    c = _np(codes.contiguous())
    A.check_codes(c, f)
    A.lookup(c, f.values(), _np(out))


float_decode_out = _op("float_decode_out", _float_decode_out, ("out",))


@float_decode_out.register_fake
def _(codes, out, fmt):
    return None


# --------------------------------------------------------------------------------------------
# MX


def _mx_np_kwargs(axis, block_size, smode, sat_inf, rounding, seed, sr_bits, offset):
    from ..formats.core import Rounding
    from ..formats.mx import NONFINITE, SCALE_MODES

    return dict(axis=axis, block_size=block_size, scale_mode=SCALE_MODES[smode],
                nonfinite=NONFINITE[int(sat_inf)], rounding=Rounding(rounding), seed=_u64(seed),
                sr_bits=sr_bits, offset=_u64(offset))


def _mx_encode(x: Tensor, fmt: str, axis: int, block_size: int, smode: int, sat_inf: bool,
              rounding: int, seed: int, sr_bits: int, offset: int) -> tuple[Tensor, Tensor]:
    """MX element codes and E8M0 scale codes of ``x`` blocked along ``axis``."""
    if _device_path(x):
        from . import codecs

        return codecs.mx_codec(x, fmt, axis, block_size, smode, sat_inf, rounding, seed, sr_bits,
                               offset, False)
    from ..formats import mx
    from ..formats.core import get_format

    q = mx.encode(_np(x), get_format(fmt), **_mx_np_kwargs(axis, block_size, smode, sat_inf,
                                                          rounding, seed, sr_bits, offset))
    return torch.from_numpy(q.codes), torch.from_numpy(q.scales)


def _mx_scale_shape(shape, axis, block_size):
    from ..formats.mx import block_len

    n = shape[axis]
    nb = -(-n // block_len(block_size, n))
    return tuple(shape[:axis]) + (nb,) + tuple(shape[axis + 1:])


mx_encode = _op("mx_encode", _mx_encode)


@mx_encode.register_fake
def _(x, fmt, axis, block_size, smode, sat_inf, rounding, seed, sr_bits, offset):
    return (torch.empty_like(x, dtype=_U8, memory_format=torch.contiguous_format),
            x.new_empty(_mx_scale_shape(tuple(x.shape), axis, block_size), dtype=_U8))


def _mx_quantize(x: Tensor, fmt: str, axis: int, block_size: int, smode: int, sat_inf: bool,
                rounding: int, seed: int, sr_bits: int, offset: int) -> Tensor:
    """MX fake-quantization of ``x`` (float32)."""
    if _device_path(x):
        from . import codecs

        return codecs.mx_codec(x, fmt, axis, block_size, smode, sat_inf, rounding, seed, sr_bits,
                               offset, True)
    from ..formats import mx
    from ..formats.core import get_format

    y = mx.quantize(_np(x), get_format(fmt), **_mx_np_kwargs(axis, block_size, smode, sat_inf,
                                                            rounding, seed, sr_bits, offset))
    return torch.from_numpy(y)


mx_quantize = _op("mx_quantize", _mx_quantize)


@mx_quantize.register_fake
def _(x, fmt, axis, block_size, smode, sat_inf, rounding, seed, sr_bits, offset):
    return torch.empty_like(x, dtype=_F32, memory_format=torch.contiguous_format)


def _mx_decode(codes: Tensor, scales: Tensor, fmt: str, axis: int, block_size: int) -> Tensor:
    """float32 values of MX ``codes`` with their E8M0 ``scales`` along ``axis``."""
    if _device_path(codes):
        from . import codecs

        return codecs.mx_decode(codes, scales, fmt, axis, block_size)
    from ..formats import mx
    from ..formats.core import QuantizedArray

    q = QuantizedArray(codes=_np(codes), scales=_np(scales), format=fmt, axis=axis,
                       block_size=block_size)
    return torch.from_numpy(np.ascontiguousarray(mx.decode(q)))


mx_decode = _op("mx_decode", _mx_decode)


@mx_decode.register_fake
def _(codes, scales, fmt, axis, block_size):
    return torch.empty_like(codes, dtype=_F32, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------------------------
# NVFP4 (``ts``: "none", "amax" or "value", the kinds of ``tensor_scale``; ``ts_value``: the
# tensor scale of "value")


def _nvfp4_ts(ts: str, ts_value: float):
    """``tensor_scale`` as ``nvfp4.options`` returns it, from the ops' two arguments."""
    return {"none": None, "amax": "amax", "value": float(ts_value)}[ts]


def _nvfp4_np(x: Tensor, axis, block_size, recipe, ts, ts_value, rounding, seed, sr_bits,
              offset):
    from ..formats import nvfp4
    from ..formats.core import Rounding, get_format

    return nvfp4.encode(_np(x), get_format("nvfp4"), axis=axis, block_size=block_size,
                        recipe=recipe, tensor_scale=_nvfp4_ts(ts, ts_value),
                        rounding=Rounding(rounding), seed=_u64(seed), sr_bits=sr_bits,
                        offset=_u64(offset))


def _nvfp4_encode(x: Tensor, axis: int, block_size: int, recipe: str, ts: str, ts_value: float,
                 rounding: int, seed: int, sr_bits: int,
                 offset: int) -> tuple[Tensor, Tensor, Tensor]:
    """NVFP4 E2M1 codes, E4M3 scale codes and the float32 tensor scale (0-dim) of ``x``
    blocked along ``axis``."""
    if _device_path(x):
        from . import codecs

        return codecs.nvfp4_codec(x, axis, block_size, recipe, _nvfp4_ts(ts, ts_value),
                                  rounding, seed, sr_bits, offset, False)
    q = _nvfp4_np(x, axis, block_size, recipe, ts, ts_value, rounding, seed, sr_bits, offset)
    return (torch.from_numpy(q.codes), torch.from_numpy(q.scales),
            torch.tensor(q.tensor_scale, dtype=_F32))


nvfp4_encode = _op("nvfp4_encode", _nvfp4_encode)


@nvfp4_encode.register_fake
def _(x, axis, block_size, recipe, ts, ts_value, rounding, seed, sr_bits, offset):
    return (torch.empty_like(x, dtype=_U8, memory_format=torch.contiguous_format),
            x.new_empty(_mx_scale_shape(tuple(x.shape), axis, block_size), dtype=_U8),
            x.new_empty((), dtype=_F32))


def _nvfp4_quantize(x: Tensor, axis: int, block_size: int, recipe: str, ts: str,
                   ts_value: float, rounding: int, seed: int, sr_bits: int,
                   offset: int) -> Tensor:
    """NVFP4 fake-quantization of ``x`` (float32)."""
    if _device_path(x):
        from . import codecs

        return codecs.nvfp4_codec(x, axis, block_size, recipe, _nvfp4_ts(ts, ts_value),
                                  rounding, seed, sr_bits, offset, True)
    from ..formats import nvfp4

    q = _nvfp4_np(x, axis, block_size, recipe, ts, ts_value, rounding, seed, sr_bits, offset)
    return torch.from_numpy(np.ascontiguousarray(nvfp4.decode(q)))


nvfp4_quantize = _op("nvfp4_quantize", _nvfp4_quantize)


@nvfp4_quantize.register_fake
def _(x, axis, block_size, recipe, ts, ts_value, rounding, seed, sr_bits, offset):
    return torch.empty_like(x, dtype=_F32, memory_format=torch.contiguous_format)


def _nvfp4_decode(codes: Tensor, scales: Tensor, tensor_scale: Tensor, axis: int,
                 block_size: int) -> Tensor:
    """float32 values of NVFP4 ``codes`` with their E4M3 ``scales`` along ``axis`` and the
    0-dim float32 ``tensor_scale`` (on the codes' device)."""
    if _device_path(codes):
        from . import codecs

        return codecs.nvfp4_decode(codes, scales, tensor_scale, axis, block_size)
    from ..formats import nvfp4
    from ..formats.core import QuantizedArray

    q = QuantizedArray(codes=_np(codes), scales=_np(scales), format="nvfp4", axis=axis,
                       block_size=block_size, tensor_scale=float(tensor_scale))
    return torch.from_numpy(np.ascontiguousarray(nvfp4.decode(q)))


nvfp4_decode = _op("nvfp4_decode", _nvfp4_decode)


@nvfp4_decode.register_fake
def _(codes, scales, tensor_scale, axis, block_size):
    return torch.empty_like(codes, dtype=_F32, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------------------------
# INT8 / UINT8


def _int_np_kwargs(granularity, axis, block_size, symmetric, narrow, scale, zero_point, rounding,
                   seed, sr_bits, offset):
    from ..formats.core import Rounding

    return dict(granularity=granularity, axis=axis, block_size=block_size,
                symmetric=symmetric, narrow=narrow,
                scale=None if scale is None else _np(scale),
                zero_point=None if zero_point is None else _np(zero_point),
                rounding=Rounding(rounding), seed=_u64(seed), sr_bits=sr_bits, offset=_u64(offset))


def _int_encode(x: Tensor, fmt: str, granularity: str, axis: int | None, block_size: int | None,
               symmetric: bool, narrow: bool | None, scale: Tensor | None,
               zero_point: Tensor | None, rounding: int, seed: int, sr_bits: int,
               offset: int) -> tuple[Tensor, Tensor, Tensor]:
    """int8/uint8 codes, float32 scales and int32 zero points (empty when symmetric) of ``x``;
    ``scale``/``zero_point``: explicit values broadcast to the scale shape, on ``x``'s
    device."""
    if _device_path(x):
        from . import codecs

        codes, s, z = codecs.int_codec(x, fmt, granularity, axis, block_size, symmetric, narrow,
                                       scale, zero_point, rounding, seed, sr_bits, offset, False)
        return codes, s, (z if z is not None else torch.empty(0, dtype=torch.int32,
                                                               device=x.device))
    from ..formats import integer
    from ..formats.core import get_format

    q = integer.encode(_np(x), get_format(fmt), **_int_np_kwargs(
        granularity, axis, block_size, symmetric, narrow, scale, zero_point, rounding, seed,
        sr_bits, offset))
    z = q.zero_points if q.zero_points is not None else np.empty(0, np.int32)
    return torch.from_numpy(q.codes), torch.from_numpy(q.scales), torch.from_numpy(z)


def _int_scale_shape(x, fmt, granularity, axis, block_size, symmetric, narrow):
    from . import codecs

    return codecs.int_layout(tuple(x.shape), fmt, granularity, axis, block_size, symmetric,
                             narrow)[0].scale_shape


int_encode = _op("int_encode", _int_encode)


@int_encode.register_fake
def _(x, fmt, granularity, axis, block_size, symmetric, narrow, scale, zero_point, rounding, seed,
      sr_bits, offset):
    ss = _int_scale_shape(x, fmt, granularity, axis, block_size, symmetric, narrow)
    cd = torch.int8 if fmt in ("int8", "int4") else _U8
    return (torch.empty_like(x, dtype=cd, memory_format=torch.contiguous_format),
            x.new_empty(ss, dtype=_F32),
            x.new_empty(ss if not symmetric else (0,), dtype=torch.int32))


def _int_quantize(x: Tensor, fmt: str, granularity: str, axis: int | None,
                 block_size: int | None, symmetric: bool, narrow: bool | None,
                 scale: Tensor | None, zero_point: Tensor | None, rounding: int, seed: int,
                 sr_bits: int, offset: int) -> Tensor:
    """int8/uint8 fake-quantization of ``x`` (float32)."""
    if _device_path(x):
        from . import codecs

        return codecs.int_codec(x, fmt, granularity, axis, block_size, symmetric, narrow, scale,
                                zero_point, rounding, seed, sr_bits, offset, True)
    from ..formats import integer
    from ..formats.core import get_format

    y = integer.quantize(_np(x), get_format(fmt), **_int_np_kwargs(
        granularity, axis, block_size, symmetric, narrow, scale, zero_point, rounding, seed,
        sr_bits, offset))
    return torch.from_numpy(y)


int_quantize = _op("int_quantize", _int_quantize)


@int_quantize.register_fake
def _(x, fmt, granularity, axis, block_size, symmetric, narrow, scale, zero_point, rounding, seed,
      sr_bits, offset):
    return torch.empty_like(x, dtype=_F32, memory_format=torch.contiguous_format)


def _int_decode(codes: Tensor, scales: Tensor, zero_points: Tensor | None, fmt: str,
               granularity: str | None, axis: int | None, block_size: int | None) -> Tensor:
    """float32 ``(codes - z) * s`` of an int8/uint8 QuantizedArray (metadata validated)."""
    from ..formats import integer
    from ..formats.core import QuantizedArray, get_format

    f = get_format(fmt)
    q = QuantizedArray(codes=codes, scales=scales, zero_points=zero_points, format=fmt,
                       granularity=granularity, axis=axis, block_size=block_size)
    if _device_path(codes):
        from . import codecs

        lay = integer.check_quantized(q, f, tuple(codes.shape), codes.dtype,
                                      tuple(scales.shape), None if zero_points is None else
                                      tuple(zero_points.shape))
        return codecs.int_decode(codes, scales, zero_points, lay, fmt)
    qn = QuantizedArray(codes=_np(codes), scales=_np(scales),
                        zero_points=None if zero_points is None else _np(zero_points),
                        format=fmt, granularity=granularity, axis=axis, block_size=block_size)
    return torch.from_numpy(np.ascontiguousarray(integer.decode(qn)))


int_decode = _op("int_decode", _int_decode)


@int_decode.register_fake
def _(codes, scales, zero_points, fmt, granularity, axis, block_size):
    return torch.empty_like(codes, dtype=_F32, memory_format=torch.contiguous_format)
