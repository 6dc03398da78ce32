"""Public codec entry points: :func:`encode`, :func:`decode`, :func:`quantize`.

Validation and dispatch only; the arithmetic is in the family modules.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from . import _arrays as A
from .core import Format, QuantizedArray, Rounding, get_format, parse_rounding
from .rounding import HYBRID, SR_BITS_DEFAULT, check_offset, check_seed, check_sr_bits

__all__ = ["encode", "decode", "quantize"]


def _float_spec(name: str):
    """The kernel constants of a float format (every float :class:`Format` carries them)."""
    return get_format(name).spec


def code_dtype(f: Format):
    """NumPy dtype of a float format's codes: uint8, or uint16 for formats wider than 8 bits."""
    return np.uint16 if f.info.bits > 8 else np.uint8


def _no_extra(kwargs: dict, fmt: str, allowed: str) -> None:
    if kwargs:
        raise TypeError(
            f"unexpected argument(s) {', '.join(sorted(kwargs))} for format {fmt!r}; "
            f"allowed: {allowed}"
        )


_FLOAT_ARGS = "rounding, saturate, seed, sr_bits, offset, out"
# keyword arguments of the scaled families, beside the common ones
_SCALED_KW = {
    "mx": ("axis", "block_size", "scale_mode", "nonfinite"),
    "int": ("granularity", "axis", "block_size", "symmetric", "scale", "zero_point", "narrow"),
    "nvfp4": ("axis", "block_size", "recipe", "tensor_scale"),
}


def _family(kind: str):
    """The module of a scaled family (``mx``, ``int``, ``nvfp4``): its NumPy ``encode``,
    ``decode`` and ``quantize``."""
    from . import integer, mx, nvfp4

    return {"mx": mx, "int": integer, "nvfp4": nvfp4}[kind]


def _torch_codec(kind: str):
    """The torch route of a scaled family's ``encode``/``quantize`` (``_torch_route``)."""
    from . import _torch_route as T

    return {"mx": T.mx_codec, "int": T.int_codec, "nvfp4": T.nvfp4_codec}[kind]


def _scaled_kwargs(kwargs: dict, f: Format, out_ok: bool) -> None:
    allowed = _SCALED_KW[f.info.kind]
    bad = {k: v for k, v in kwargs.items() if k not in allowed}
    common = "rounding, saturate, seed, sr_bits, offset" + (", out" if out_ok else "")
    _no_extra(bad, f.name, f"{common}, {', '.join(allowed)}")


def _float_options(f: Format, rounding, saturate, seed, sr_bits, offset, is_f64: bool) -> tuple:
    """Validated ``(mode, saturate, seed, sr_bits, offset)`` of a float-format codec call."""
    r = parse_rounding(rounding if rounding is not None else f.info.default_rounding, f.name)
    if saturate is None:
        saturate = False
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be True or False, got {saturate!r}")
    if r == HYBRID and is_f64:
        raise ValueError(
            "hybrid rounding is defined for float32 sources only (formats.md 1.6); "
            "convert float64 input to float32 first if that is what you mean"
        )
    sr = check_sr_bits(sr_bits) if r == Rounding.STOCHASTIC else SR_BITS_DEFAULT
    seed_v = check_seed(seed, r == Rounding.STOCHASTIC)
    return int(r), bool(saturate), seed_v, sr, check_offset(offset)


def _float_codec(x, f: Format, rounding, saturate, seed, sr_bits, offset, out, want_value):
    if A.is_torch(x):
        from . import _torch_route as T

        return T.float_codec(x, f, rounding, saturate, seed, sr_bits, offset, out, want_value)
    arr, was_torch = A.to_numpy(x)
    arr = A.check_float(arr)
    mode, sat, seed_v, sr, off = _float_options(f, rounding, saturate, seed, sr_bits, offset,
                                                arr.dtype == np.float64)
    from .minifloat import run_kernel

    o = A.make_out(out, arr.shape, np.float32 if want_value else code_dtype(f))
    bits = A.float_bits(arr)
    flat = o.reshape(-1)
    work = A.scratch_if_overlap(flat, bits)  # out= overlapping x: compute through a temporary
    run_kernel(f.spec, bits, work, mode, sat, seed_v, sr, off)
    if work is not flat:
        flat[...] = work
    return A.wrap(o, was_torch) if out is None else out


def encode(
    x: Any,
    fmt: str | Format,
    rounding: str | Rounding | None = None,
    saturate: bool | None = None,
    *,
    seed: int | np.random.Generator | None = None,
    sr_bits: int = SR_BITS_DEFAULT,
    offset: int = 0,
    out: Any = None,
    **kwargs: Any,
):
    """Encode floating-point values to 8-bit codes of ``fmt``.

    Args:
        x: numpy array or torch tensor (CPU or CUDA) of float32, float64, float16 or bfloat16,
            any shape and strides. float64 is rounded directly (no intermediate float32).  A
            CUDA tensor is encoded on its own device by Triton kernels, with the same bits as
            the CPU, without host synchronisation (docs/design.md "GPU codecs").
        fmt: a name from :func:`available_formats` (or a :class:`Format`).
        rounding: ``nearest_even``, ``nearest_away``, ``toward_zero``, ``up``, ``down``,
            ``stochastic`` (and ``hybrid`` for hif8, provisional); default: the format's own
            convention (``nearest_away`` for hif8, ``nearest_even`` otherwise).
        saturate: None (default): the format's convention (non-saturating for hif8, e4m3,
            e5m2; saturating elements for MX; integer codes always clamp).
            False: the format's non-saturating conversion (overflow -> NaN for e4m3,
            Inf for e5m2 and hif8; directed modes follow IEEE 754 7.4); True: clamp overflow
            and +-Inf to +-max. MX elements always saturate.
        seed: stochastic rounding only (required then): an int in [0, 2**64) or a numpy
            Generator. Element ``i`` (flat C order; MX: in the axis-last layout) uses random
            bits that depend only on ``(seed, offset + i)``, on either device.
        sr_bits: random bits per element for stochastic rounding, 1..32.
        offset: the stochastic counter of the first element, an int in [0, 2**64): a tensor
            quantized in chunks, each with its start index as ``offset``, equals the tensor
            quantized at once.
        out: optional preallocated C-contiguous uint8 array of ``x.shape`` (float formats): a
            numpy array or a tensor on ``x``'s device; it may overlap ``x``.
        **kwargs: ``packed=True`` (4-bit formats: e2m1, mxfp4, nvfp4, int4, uint4): two codes
            per byte along the last axis, code ``2i`` in the low nibble (torchao's layout; the
            last axis must be even; QuantizedArray codes are packed likewise).  Scaled formats:
            MX ``axis``, ``block_size``, ``scale_mode``, ``nonfinite``; NVFP4 ``axis``,
            ``block_size``, ``recipe``, ``tensor_scale``; INT ``granularity``, ``axis``,
            ``block_size``, ``symmetric``, ``scale``, ``zero_point``, ``narrow``.

    Returns:
        float formats: uint8 codes of ``x.shape`` (a torch tensor for torch input).
        scaled formats: a :class:`QuantizedArray`.

    Raises:
        ValueError / TypeError: unknown format or rounding, non-float input, bad ``sr_bits``,
        stochastic rounding without a seed, bad scaled-format arguments.

    Example:
        >>> import numpy as np, lowprec as lp
        >>> lp.encode(np.array([1.0, 448.0, 500.0], np.float32), "e4m3")
        array([ 56, 126, 127], dtype=uint8)
    """
    if A.is_torch(x):
        from . import _torch_route  # noqa: F401  (first: loads every family, see _torch_route)
    f = get_format(fmt)
    kind = f.info.kind
    packed = kwargs.pop("packed", False)
    if not isinstance(packed, (bool, np.bool_)):
        raise TypeError(f"packed must be True or False, got {packed!r}")
    if packed:
        if out is not None:
            raise TypeError("out= cannot be combined with packed=True")
        A.pack_codes(np.zeros(2, np.uint8), f.info.bits)  # the width check, before any work
        res = encode(x, f, rounding, saturate, seed=seed, sr_bits=sr_bits, offset=offset,
                     **kwargs)
        if isinstance(res, QuantizedArray):
            return replace(res, codes=A.pack_codes(res.codes, f.info.bits), packed=True)
        return A.pack_codes(res, f.info.bits)
    if kind == "float":
        _no_extra(kwargs, f.name, _FLOAT_ARGS)
        return _float_codec(x, f, rounding, saturate, seed, sr_bits, offset, out, False)
    if out is not None:
        raise TypeError(f"out= is not supported when encoding to the scaled format {f.name!r}")
    _scaled_kwargs(kwargs, f, False)
    common = dict(rounding=rounding, seed=seed, sr_bits=sr_bits, saturate=saturate,
                  offset=offset)
    if A.is_torch(x):
        return _torch_codec(kind)(x, f, None, False, common, kwargs)
    return _family(kind).encode(x, f, **common, **kwargs)


def decode(codes: Any, fmt: str | Format | None = None, *, out: Any = None,
           packed: bool = False):
    """Decode codes to float32 values.

    Args:
        codes: uint8 codes of a float format (numpy, or a torch tensor on any device: decoded
            there), together with ``fmt``; or a :class:`QuantizedArray` from :func:`encode`
            (then ``fmt`` may be omitted).
        fmt: the format of plain codes.
        out: optional preallocated float32 array (plain codes only; numpy or a tensor on the
            codes' device; it may overlap ``codes``).
        packed: plain codes packed two per byte by ``encode(..., packed=True)`` (a packed
            QuantizedArray says so itself).

    Returns:
        float32 values of ``codes.shape``, exactly the values of the codes (NaN codes -> NaN).

    Raises:
        ValueError: unknown format; a scaled format given plain codes without scales;
            a QuantizedArray whose scales, zero points or metadata are invalid (on CUDA the
            scale values are not checked, which would synchronise: an invalid scale decodes
            to NaN); a code outside the range of a format whose codes are narrower than their
            storage (e2m1, e2m3, e3m2, mxfp4, mxfp6_*, nvfp4: ``0 .. 2**bits - 1``; int4
            ``-8 .. 7``, uint4 ``0 .. 15``), with the same message on every device, naming
            the first such code and its flat index; ``packed=True`` for a format wider than
            4 bits.
        TypeError: codes that are not uint8 (int8 for int4/int8, uint16 above 8 bits).

    Synchronisation: decoding CUDA codes of those sub-byte formats checks them with one
    reduction read back to the host (one synchronisation per call); 8- and 16-bit formats,
    ``encode`` and ``quantize`` never synchronise.  Under ``torch.compile`` the check runs
    inside the custom operator, so the compiled call raises the same error; while a CUDA graph
    is captured it is skipped and an invalid code decodes to NaN (docs/design.md, "Sub-byte
    codes").

    Example:
        >>> lp.decode(np.array([0x38, 0x7F], np.uint8), "e4m3")
        array([ 1., nan], dtype=float32)
    """
    if not isinstance(packed, (bool, np.bool_)):
        raise TypeError(f"packed must be True or False, got {packed!r}")
    if isinstance(codes, QuantizedArray) and codes.packed:
        A.check_packable(get_format(codes.format).info.bits)
        codes = replace(codes, codes=A.unpack_codes(codes.codes, codes.format == "int4"),
                        packed=False)
    elif packed:
        if isinstance(codes, QuantizedArray):
            raise ValueError("this QuantizedArray is not packed (its packed field is False)")
        if fmt is not None:
            A.check_packable(get_format(fmt).info.bits)
        codes = A.unpack_codes(codes)
    if A.is_torch(codes.codes if isinstance(codes, QuantizedArray) else codes):
        from . import _torch_route  # noqa: F401  (first: loads every family, see _torch_route)
    if isinstance(codes, QuantizedArray):
        f = get_format(codes.format)
        if fmt is not None and get_format(fmt) != f:
            raise ValueError(f"QuantizedArray holds {f.name!r} codes, not {get_format(fmt).name!r}")
        if A.is_torch(codes.codes):
            from . import _torch_route as T

            return T.decode_quantized(codes, f)
        return _family(f.info.kind).decode(codes)
    if fmt is None:
        raise ValueError("decode needs fmt= for plain codes (or pass a QuantizedArray)")
    f = get_format(fmt)
    if f.info.kind != "float":
        raise ValueError(
            f"{f.name!r} codes need their scales: pass the QuantizedArray returned by encode"
        )
    if A.is_torch(codes):
        from . import _torch_route as T

        return T.float_decode(codes, f, out)
    arr, was_torch = A.codes_array(codes)
    if arr.dtype != code_dtype(f):
        raise TypeError(f"{f.name} codes must have dtype {np.dtype(code_dtype(f))}, got "
                        f"{arr.dtype}")
    A.check_codes(arr, f)
    o = A.make_out(out, arr.shape, np.float32)
    work = A.scratch_if_overlap(o, arr)
    A.lookup(arr, f.values(), work)
    if work is not o:
        o[...] = work
    return A.wrap(o, was_torch) if out is None else out


def quantize(
    x: Any,
    fmt: str | Format,
    rounding: str | Rounding | None = None,
    saturate: bool | None = None,
    *,
    seed: int | np.random.Generator | None = None,
    sr_bits: int = SR_BITS_DEFAULT,
    offset: int = 0,
    out: Any = None,
    **kwargs: Any,
):
    """Fake-quantize: round ``x`` to values of ``fmt`` and return them as float32, in one pass.

    Equal to ``decode(encode(x, fmt, ...))`` for every input (tested), but fused: the float
    formats never materialise codes.  Arguments as :func:`encode`; ``out`` (float32, C-contiguous,
    ``x.shape``, numpy or a tensor on ``x``'s device) is accepted for every format.  CUDA
    tensors are quantized on their device (Triton), bit-identical to the CPU, and under
    ``torch.compile`` the call is one custom operator (``torch.ops.lowprec.*``).

    Returns:
        float32 values of ``x.shape`` (a tensor on ``x``'s device for torch input), or ``out``.

    Raises:
        as :func:`encode`.

    Example:
        >>> lp.quantize(np.array([0.1, 100.0], np.float32), "hif8")
        array([ 0.09375, 96.     ], dtype=float32)
    """
    if A.is_torch(x):
        from . import _torch_route  # noqa: F401  (first: loads every family, see _torch_route)
    f = get_format(fmt)
    kind = f.info.kind
    if kind == "float":
        _no_extra(kwargs, f.name, _FLOAT_ARGS)
        return _float_codec(x, f, rounding, saturate, seed, sr_bits, offset, out, True)
    _scaled_kwargs(kwargs, f, True)
    common = dict(rounding=rounding, seed=seed, sr_bits=sr_bits, saturate=saturate,
                  offset=offset)
    if A.is_torch(x):
        return _torch_codec(kind)(x, f, out, True, common, kwargs)
    return _family(kind).quantize(x, f, out=out, **common, **kwargs)
