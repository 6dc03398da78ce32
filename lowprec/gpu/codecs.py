"""The device side of every codec: validated arguments in, Triton launches on the tensor's own
device, tensors out.  The CUDA implementations of the custom ops (``lowprec.gpu.ops``) call
these; the interpreter tests call them with CPU tensors (``TRITON_INTERPRET=1``).

Each function does what its CPU counterpart does around the Numba kernel (contiguous flat input,
the blocked axis moved last, scale arrays of the granularity's shape), with torch operations that
stay on the device: no host synchronisation, but for one exception.  The decode functions of
sub-byte formats (e2m1, e2m3, e3m2, MXFP4, MXFP6, NVFP4, int4, uint4) check the codes as the
CPU does (``_arrays.check_codes``: one reduction read back, ValueError with the CPU's message);
their kernels also mask every table read and code range by themselves (an invalid code gives
NaN), so memory stays safe when a check cannot run (CUDA graph capture).
"""

from __future__ import annotations

import math

import torch

from ..formats import _arrays as A
from ..formats import integer as _int
from ..formats import mx as _mx
from ..formats.hif8 import HIF8_SPEC
from ..formats.minifloat import SPECS

FLOAT_SPECS = {"hif8": HIF8_SPEC, **SPECS}  # (every float Format also carries its spec)


def float_codec(x: torch.Tensor, out: torch.Tensor, fmt: str, mode: int, saturate: bool,
                seed: int, sr_bits: int, offset: int) -> None:
    """Codes (uint8 ``out``) or values (float32 ``out``) of ``x`` into the contiguous ``out``
    of ``x``'s shape (``api._float_codec`` + ``minifloat.run_kernel``)."""
    from ..formats.core import get_format
    from .minifloat import run_kernel

    run_kernel(get_format(fmt).spec, x.contiguous().reshape(-1), out.view(-1), mode, saturate,
               seed, sr_bits, offset)


def float_decode(codes: torch.Tensor, out: torch.Tensor, fmt: str) -> None:
    """``out = values[codes]`` (float formats) into the contiguous float32 ``out``;
    ValueError for a code outside a sub-byte format's range (one synchronisation)."""
    from ..formats.core import get_format
    from .minifloat import lookup

    f = get_format(fmt)
    A.check_codes(codes, f)
    c = codes.contiguous().reshape(-1)
    lookup(c if c.dtype == torch.uint16 else c.view(torch.uint8), f.values(), out.view(-1))


def _axis_last(x: torch.Tensor, ax: int) -> torch.Tensor:
    xm = x.movedim(ax, -1).contiguous()
    n = xm.shape[-1] if xm.dim() else 1
    return xm.reshape(math.prod(xm.shape[:-1]), n)


def _axis_back(t2: torch.Tensor, moved_shape, ax: int) -> torch.Tensor:
    return t2.reshape(moved_shape).movedim(-1, ax).contiguous()


def _blocked(x: torch.Tensor, ax: int, block_size: int, run, want_value: bool):
    """The block formats' layout (``mx.encode``, ``nvfp4.encode``): ``x`` with the blocked axis
    ``ax`` moved last, seen as a contiguous ``(rows, n)`` tensor, is given to
    ``run(x2, kk)``; its values ``(rows, n)``, or codes ``(rows, n)``, scales ``(rows, nb)``
    and any further results (passed through), come back in ``x``'s layout."""
    moved_shape = tuple(x.movedim(ax, -1).shape)
    res = run(_axis_last(x, ax), _mx.block_len(block_size, moved_shape[-1]))
    if want_value:
        return _axis_back(res, moved_shape, ax)
    codes, scales, *rest = res
    return (_axis_back(codes, moved_shape, ax),
            _axis_back(scales, moved_shape[:-1] + (scales.shape[1],), ax), *rest)


def _unblocked(codes: torch.Tensor, scales: torch.Tensor, ax: int, block_size: int, run):
    """:func:`_blocked` for decoding: ``run(codes2, scales2, kk)`` gives the float32 values
    ``(rows, n)`` of the axis-last codes and scales; they come back in the codes' layout."""
    moved_shape = tuple(codes.movedim(ax, -1).shape)
    out = run(_axis_last(codes, ax), _axis_last(scales, ax),
              _mx.block_len(block_size, moved_shape[-1]))
    return _axis_back(out, moved_shape, ax)


def mx_codec(x: torch.Tensor, fmt: str, ax: int, block_size: int, smode: int, sat_inf: bool,
             mode: int, seed: int, sr_bits: int, offset: int, want_value: bool):
    """MX codes and scales (``want_value`` False) or float32 values of ``x`` along ``ax``
    (``mx.encode`` / ``mx.quantize``)."""
    from .mx import quantize_blocks

    def run(x2, kk):
        rows, n = x2.shape
        args = (x2, fmt, kk, smode, sat_inf, mode, seed, sr_bits, offset)
        if want_value:
            out = torch.empty((rows, n), dtype=torch.float32, device=x.device)
            quantize_blocks(*args, out=out)
            return out
        codes = torch.empty((rows, n), dtype=torch.uint8, device=x.device)
        scales = torch.empty((rows, -(-n // kk)), dtype=torch.uint8, device=x.device)
        quantize_blocks(*args, codes=codes, scales=scales)
        return codes, scales

    return _blocked(x, ax, block_size, run, want_value)


def mx_decode(codes: torch.Tensor, scales: torch.Tensor, fmt: str, ax: int,
              block_size: int) -> torch.Tensor:
    """float32 values of MX codes and scales along ``ax`` (``mx.decode``); ValueError for an
    element code outside a 4- or 6-bit element format's range (one synchronisation)."""
    from ..formats.core import get_format
    from .mx import decode_blocks

    A.check_codes(codes, get_format(fmt))

    def run(c2, s2, kk):
        out = torch.empty(c2.shape, dtype=torch.float32, device=codes.device)
        decode_blocks(c2, s2, fmt, kk, out)
        return out

    return _unblocked(codes, scales, ax, block_size, run)


def nvfp4_codec(x: torch.Tensor, ax: int, block_size: int, recipe: str, ts, mode: int,
                seed: int, sr_bits: int, offset: int, want_value: bool):
    """NVFP4 codes, scales and the 0-dim float32 tensor scale (``want_value`` False) or float32
    values of ``x`` along ``ax`` (``nvfp4.encode`` / ``nvfp4.quantize``; ``ts`` as
    ``nvfp4.options`` returns it)."""
    from .nvfp4 import encode_rows

    return _blocked(x, ax, block_size, lambda x2, kk: encode_rows(
        x2, kk, recipe, ts, mode, seed, sr_bits, offset, want_value), want_value)


def nvfp4_decode(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor, ax: int,
                 block_size: int) -> torch.Tensor:
    """float32 values of NVFP4 codes and E4M3 scales along ``ax`` with the 0-dim float32
    ``tensor_scale`` on their device (``nvfp4.decode``); ValueError for an element code above
    15 (one synchronisation)."""
    from ..formats.core import get_format
    from .nvfp4 import decode_rows

    A.check_codes(codes, get_format("nvfp4"))

    return _unblocked(codes, scales, ax, block_size,
                      lambda c2, s2, kk: decode_rows(c2, s2, tensor_scale, kk))


def int_layout(shape, fmt: str, granularity: str, axis, block_size, symmetric: bool, narrow):
    """``(layout, qmin, qmax)`` of an integer codec (``integer._resolve``'s checks)."""
    f = _int.get_format(fmt)
    qmin, qmax = _int._qrange(f, bool(symmetric), narrow)
    return _int._Layout(tuple(shape), granularity, axis, block_size), qmin, qmax


def int_scales(flat: torch.Tensor, lay, fmt: str, symmetric: bool, qmin: int, qmax: int,
               scale: torch.Tensor | None, zero_point: torch.Tensor | None):
    """Flat float32 scales and int32 zero points (or None) on ``flat``'s device: explicit ones
    (already broadcast to the scale shape) or from the data."""
    s32 = None if scale is None else scale.reshape(-1).to(torch.float32).contiguous()
    if symmetric:
        if s32 is None:
            s32, _ = _gpu_int().data_scales(flat, lay, True, fmt in ("uint8", "uint4"), qmin, qmax)
        return s32, None
    if zero_point is not None:
        return s32, zero_point.reshape(-1).to(torch.int32).contiguous()
    return _gpu_int().data_scales(flat, lay, False, fmt in ("uint8", "uint4"), qmin, qmax, s32)


def _gpu_int():
    from . import integer

    return integer


def int_codec(x: torch.Tensor, fmt: str, granularity: str, axis, block_size, symmetric: bool,
              narrow, scale, zero_point, mode: int, seed: int, sr_bits: int, offset: int,
              want_value: bool):
    """INT codes + scales + zero points (``want_value`` False) or float32 values of ``x``
    (``integer.encode`` / ``integer.quantize``).  ``scale``/``zero_point``: None or tensors on
    ``x``'s device already broadcast to the granularity's scale shape."""
    lay, qmin, qmax = int_layout(x.shape, fmt, granularity, axis, block_size, symmetric,
                                 narrow)
    flat = x.contiguous().reshape(-1)
    s32, zp = int_scales(flat, lay, fmt, symmetric, qmin, qmax, scale, zero_point)
    gi = _gpu_int()
    if want_value:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        gi.run_rows(flat, s32, zp, lay, out.view(-1), mode, seed, sr_bits, offset, qmin, qmax)
        return out
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    gi.run_rows(flat, s32, zp, lay, codes.view(-1), mode, seed, sr_bits, offset, qmin, qmax)
    if fmt in ("int8", "int4"):
        codes = codes.view(torch.int8)
    scales = s32.reshape(lay.scale_shape)
    zps = zp.reshape(lay.scale_shape) if zp is not None else None
    return codes, scales, zps


def int_decode(codes: torch.Tensor, scales: torch.Tensor, zps, lay, fmt: str) -> torch.Tensor:
    """float32 ``(codes - z) * s`` with ``lay`` from ``integer.check_quantized``; ``scales`` /
    ``zps`` broadcastable to its scale shape (or, for a granularity-less QuantizedArray, to the
    codes).  ValueError for int4/uint4 codes outside -8..7 / 0..15 (one synchronisation)."""
    A.check_codes(codes, _int.get_format(fmt))
    shape = tuple(codes.shape)
    if lay.granularity is None:  # scales broadcast to the codes: one scale per element
        lay = _int._Layout(shape, "per_tensor", None, None)
        lay.Q, lay.bi, lay.si = max(1, math.prod(shape)), 1, 1
        lay.scale_shape = shape
    s = scales.to(torch.float32).expand(lay.scale_shape).contiguous().reshape(-1)
    z = None if zps is None else zps.to(torch.int32).expand(lay.scale_shape).contiguous()
    qmin, _nlo, qmax, _dt = _int.RANGES[fmt]  # the codes' range, and the zero points' (CPU)
    out = torch.empty(shape, dtype=torch.float32, device=codes.device)
    _gpu_int().run_decode(codes.contiguous().reshape(-1), s, None if z is None else
                          z.reshape(-1), lay, out.view(-1), qmin, qmax)
    return out
