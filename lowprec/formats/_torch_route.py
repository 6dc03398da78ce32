"""The torch half of :mod:`lowprec.formats.api`: validation of torch arguments and the call of
one ``torch.ops.lowprec`` custom operator (``lowprec.gpu.ops``), for CPU and CUDA tensors alike.

Imported only when a codec receives a torch tensor (so torch is already imported).  Written to
be traceable by TorchDynamo: plain Python on the arguments, torch operations, no NumPy on
tensors, so ``torch.compile(fullgraph=True)`` of a function calling :func:`lowprec.quantize`
compiles to one custom-op node.  Nothing here reads a device tensor's values (no host
synchronisation); checks that would need them are documented in each family module.

The public functions import this module before they first read the format registry: importing
it (through ``lowprec.gpu.ops``) registers every format family, so that a first call traced by
TorchDynamo finds a complete registry (Dynamo runs an import natively, but would not see a
registry that changed after it first read it).
"""

from __future__ import annotations

import numpy as np
import torch

from ..gpu import ops as _ops
from . import integer as _int
from . import mx as _mx
from . import nvfp4 as _nv
from .core import Format, QuantizedArray

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_ALLOWED = "float32, float64, float16, bfloat16"


def _signed(v: int) -> int:
    """A value in [0, 2**64) as the int64 with the same bits (custom ops take int64)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _input(x: torch.Tensor, what: str = "x") -> torch.Tensor:
    if x.dtype not in _FLOATS:
        raise TypeError(f"{what} has dtype {x.dtype}; allowed: {_ALLOWED}")
    return x.detach()  # codecs are not differentiable


def _extent(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (span + 1) * t.element_size()


def overlaps(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """True if an element-wise kernel reading ``src`` and writing ``dst`` could read a value it
    already overwrote (``_arrays.overlaps`` for tensors): same storage, intersecting byte
    ranges, and not the very same elements."""
    if src.untyped_storage().data_ptr() != dst.untyped_storage().data_ptr():
        return False
    a0, b0 = src.data_ptr(), dst.data_ptr()
    if (a0 == b0 and src.element_size() == dst.element_size() and src.shape == dst.shape
            and src.stride() == dst.stride()):
        return False
    return a0 < b0 + _extent(dst) and b0 < a0 + _extent(src)


def _out_tensor(out, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Validate ``out`` for a result of ``like.shape`` and ``dtype`` on ``like``'s device (a
    numpy array is accepted for CPU input: the tensor view of its memory)."""
    if isinstance(out, np.ndarray) and like.device.type == "cpu":
        from . import _arrays as A

        A.make_out(out, tuple(like.shape), np.float32 if dtype == torch.float32 else np.uint8)
        out = torch.from_numpy(out)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor on {like.device}, got {type(out).__name__}")
    if out.device != like.device:
        raise ValueError(f"out must be on the input's device {like.device}, got {out.device}")
    if out.dtype != dtype or tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"out must have dtype {dtype} and shape {tuple(like.shape)}, got "
                         f"{out.dtype} {tuple(out.shape)}")
    if not out.is_contiguous():
        raise ValueError("out must be C-contiguous")
    return out


def _finish(out, result: torch.Tensor):
    """Copy ``result`` into ``out`` (validated) and return ``out`` (the user's object)."""
    if out is None:
        return result
    o = _out_tensor(out, result, result.dtype)
    o.copy_(result)
    return out


# --------------------------------------------------------------------------------------------
# float formats


def _code_dtype(f: Format):
    return torch.uint16 if f.info.bits > 8 else torch.uint8


def float_codec(x, f: Format, rounding, saturate, seed, sr_bits, offset, out, want_value):
    """``api.encode`` / ``api.quantize`` of a float format for a torch tensor."""
    from .api import _float_options

    x = _input(x)
    mode, sat, seed_v, sr, off = _float_options(f, rounding, saturate, seed, sr_bits, offset,
                                                x.dtype == torch.float64)
    args = (f.name, mode, sat, _signed(seed_v), sr, off)
    ops = _ops.route(x)
    if out is None:
        return ops.float_codec(x, *args, want_value)
    o = _out_tensor(out, x, torch.float32 if want_value else _code_dtype(f))
    if not _ops.eager(x) or overlaps(x, o):
        o.copy_(ops.float_codec(x, *args, want_value))  # through a temporary
    else:
        ops.float_codec_out(x, o, *args)
    return out


def float_decode(codes, f: Format, out):
    """``api.decode`` of plain float-format codes held in a torch tensor."""
    if codes.dtype != _code_dtype(f):
        raise TypeError(f"{f.name} codes must have dtype {_code_dtype(f)}, got {codes.dtype}")
    ops = _ops.route(codes)
    if out is None:
        return ops.float_decode(codes, f.name)
    o = _out_tensor(out, codes, torch.float32)
    if not _ops.eager(codes) or overlaps(codes, o):
        o.copy_(ops.float_decode(codes, f.name))
    else:
        ops.float_decode_out(codes, o, f.name)
    return out


# --------------------------------------------------------------------------------------------
# scaled formats


def mx_codec(x, f: Format, out, want_value: bool, common: dict, kwargs: dict):
    """``api.encode`` (a QuantizedArray of tensors) / ``api.quantize`` of an MX format."""
    x = _input(x)
    o = _mx.options(common["rounding"], common["seed"], common["sr_bits"], common["saturate"],
                    kwargs.get("axis", -1), kwargs.get("block_size", _mx.BLOCK_SIZE_DEFAULT),
                    kwargs.get("scale_mode", "floor"), kwargs.get("nonfinite", "nan"),
                    common["offset"], x.dim())
    n = x.shape[o["axis"]]
    args = (f.name, o["axis"], _mx.block_len(o["block_size"], n), o["smode"], o["sat_inf"],
            o["mode"], _signed(o["seed"]), o["sr_bits"], o["offset"])
    if want_value:
        return _finish(out, _ops.route(x).mx_quantize(x, *args))
    codes, scales = _ops.route(x).mx_encode(x, *args)
    return QuantizedArray(codes=codes, scales=scales, format=f.name, axis=o["axis"],
                          block_size=o["block_size"])


def nvfp4_codec(x, f: Format, out, want_value: bool, common: dict, kwargs: dict):
    """``api.encode`` (a QuantizedArray of tensors) / ``api.quantize`` of NVFP4.  The
    QuantizedArray's ``tensor_scale`` is a float, except for a CUDA tensor encoded with
    ``tensor_scale="amax"`` (either recipe): there it is a 0-dim float32 tensor on the device
    (the tensor's amax is not read on the host)."""
    x = _input(x)
    o = _nv.options(common["rounding"], common["seed"], common["sr_bits"], common["saturate"],
                    common["offset"], kwargs.get("axis", -1),
                    kwargs.get("block_size", _nv.BLOCK_SIZE), kwargs.get("recipe", "torchao"),
                    kwargs.get("tensor_scale"), x.dim())
    ts = o["ts"]
    kind = "none" if ts is None else "amax" if ts == "amax" else "value"
    args = (o["axis"], o["block_size"], o["recipe"], kind, 0.0 if kind != "value" else ts,
            o["mode"], _signed(o["seed"]), o["sr_bits"], o["offset"])
    if want_value:
        return _finish(out, _ops.route(x).nvfp4_quantize(x, *args))
    codes, scales, t = _ops.route(x).nvfp4_encode(x, *args)
    if ts != "amax":
        t = _nv.host_tensor_scale(ts, o["recipe"])
    elif x.device.type == "cpu":
        t = float(t)
    return QuantizedArray(codes=codes, scales=scales, format=f.name, axis=o["axis"],
                          block_size=o["block_size"], tensor_scale=t)


def _int_values(v, what: str, lay, device, check, integral: bool):
    """Explicit scales / zero points as a tensor of the scale shape on ``device``: host values
    are checked (``check``) first; a tensor already on a CUDA device is only shape-checked."""
    if isinstance(v, torch.Tensor) and v.device == device and device.type != "cpu":
        if v.dtype not in _FLOATS + (torch.int8, torch.uint8, torch.int16, torch.int32,
                                     torch.int64):
            raise TypeError(f"{what} must be a real number or array (integer or float), got "
                            f"dtype {v.dtype}")
        if integral and v.dtype.is_floating_point:
            raise TypeError(f"a CUDA {what} must have an integer dtype (its values are not "
                            "read on the host)")
        shape = lay.scale_shape
        if (lay.granularity == "per_channel" and v.dim() == 1 and len(shape) > 1
                and v.shape[0] == shape[lay.axis]):
            v = v.reshape(shape)
        try:
            return v.expand(shape).contiguous()
        except RuntimeError:
            raise ValueError(f"{what} of shape {tuple(v.shape)} does not broadcast to the "
                             f"{lay.granularity} scale shape {shape}") from None
    if isinstance(v, torch.Tensor) and v.device.type != "cpu" and v.device != device:
        raise ValueError(f"{what} is on {v.device}, the input on {device}")
    arr = check(v)
    return _h2d(torch.from_numpy(np.ascontiguousarray(arr)), device)


def _h2d(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host values (already checked) onto ``device`` without a host synchronisation."""
    if device.type == "cpu":
        return t
    from ..gpu._launch import host_to_device

    return host_to_device(t, device)


def int_codec(x, f: Format, out, want_value: bool, common: dict, kwargs: dict):
    """``api.encode`` (a QuantizedArray of tensors) / ``api.quantize`` of int8/uint8."""
    x = _input(x)
    gran = kwargs.get("granularity", "per_tensor")
    axis, block_size = kwargs.get("axis"), kwargs.get("block_size")
    symmetric, narrow = kwargs.get("symmetric", True), kwargs.get("narrow")
    scale, zero_point = kwargs.get("scale"), kwargs.get("zero_point")
    o = _int.options(f, common["rounding"], common["seed"], common["sr_bits"],
                     common["saturate"], gran, axis, block_size, symmetric, scale, zero_point,
                     narrow, common["offset"], tuple(x.shape))
    lay, qmin, qmax = o["lay"], o["qmin"], o["qmax"]
    st = None if scale is None else _int_values(
        scale, "scale", lay, x.device, lambda v: _int._explicit_scale(v, lay), False)
    zt = None if zero_point is None else _int_values(
        zero_point, "zero_point", lay, x.device,
        lambda v: _int._explicit_zero_point(v, lay, qmin, qmax), True)
    args = (f.name, gran, lay.axis, lay.block_len, bool(symmetric), narrow, st, zt, o["mode"],
            _signed(o["seed"]), o["sr_bits"], o["offset"])
    if want_value:
        return _finish(out, _ops.route(x).int_quantize(x, *args))
    codes, scales, zps = _ops.route(x).int_encode(x, *args)
    return QuantizedArray(codes=codes, scales=scales, format=f.name, axis=lay.axis,
                          block_size=lay.block_size, zero_points=None if symmetric else zps,
                          granularity=lay.granularity)


def decode_quantized(q: QuantizedArray, f: Format):
    """``api.decode`` of a QuantizedArray whose codes are a torch tensor."""
    codes = q.codes
    dev = codes.device

    def on_device(v, what, check):
        if isinstance(v, torch.Tensor) and v.device == dev:
            return v
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise ValueError(f"QuantizedArray {what} are on {v.device}, the codes on {dev}")
        arr = check(np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v))
        return _h2d(torch.from_numpy(np.ascontiguousarray(arr)), dev)

    if f.info.kind == "mx":
        scales = on_device(q.scales, "scales", lambda a: a)
        ax, kk, _nb = _mx.check_quantized(q, tuple(codes.shape), codes.dtype,
                                          tuple(scales.shape), scales.dtype)
        return _ops.route(codes).mx_decode(codes, scales, f.name, ax, kk)
    if f.info.kind == "nvfp4":
        scales = on_device(q.scales, "scales", lambda a: a)
        ax, kk, _nb = _mx.check_quantized(q, tuple(codes.shape), codes.dtype,
                                          tuple(scales.shape), scales.dtype)
        t = q.tensor_scale
        if t is None:
            raise ValueError("an NVFP4 QuantizedArray needs its tensor_scale")
        if isinstance(t, torch.Tensor) and t.device.type != "cpu" and t.device != dev:
            raise ValueError(f"QuantizedArray tensor_scale is on {t.device}, the codes on {dev}")
        if not (isinstance(t, torch.Tensor) and t.device == dev):  # a host value
            t = torch.full((), float(np.float32(float(t))), dtype=torch.float32, device=dev)
        return _ops.route(codes).nvfp4_decode(codes, scales, t.to(torch.float32).reshape(()),
                                              ax, kk)
    scales = on_device(q.scales, "scales", _int.check_scale_values)
    zps = None if q.zero_points is None else on_device(
        q.zero_points, "zero_points", lambda a: _int.check_zero_point_values(a, f))
    lay = _int.check_quantized(q, f, tuple(codes.shape), codes.dtype, tuple(scales.shape),
                               None if zps is None else tuple(zps.shape))
    return _ops.route(codes).int_decode(codes, scales, zps, f.name, q.granularity, lay.axis,
                                        lay.block_len if lay.granularity == "per_block"
                                        else None)
