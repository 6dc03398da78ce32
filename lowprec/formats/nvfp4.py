"""NVFP4: blocks of 16 OCP FP4 E2M1 elements with an E4M3 block scale and a float32 per-tensor
scale (NVIDIA Blackwell; design.md "Formats II").

A value is ``element * (tensor_scale * block_scale)`` with ``block_scale`` an E4M3 code (a
positive E4M3 value) and ``tensor_scale`` one float32 per tensor (1.0 when single-level).  Unlike
MX, the block scale is not a power of two, so scaling the elements rounds: every step below is a
float32 operation, in the order of the recipe named (each is the IEEE-rounded float32 result, as
on the peers' CPU and GPU paths).

``recipe="torchao"`` (default; torchao 0.18 ``nvfp4_quantize`` and ``NVFP4Tensor.to_dtype``),
with ``amax_b`` the block's largest magnitude and ``amax`` the tensor's:

* single level (``tensor_scale=None``): ``s_b = e4m3(clamp(amax_b / 6, 2**-6, 448))``
  (round to nearest even, saturating), elements ``e2m1(clamp(x * (1 / s_b), -6, 6))``;
* two level (``tensor_scale="amax"``, or a float): ``t = amax / (448 * 6)`` (or the float given),
  ``s_b = e4m3(clamp((amax_b / 6) / t, 2**-6, 448))``, elements
  ``e2m1(clamp(x * ((1 / t) / s_b), -6, 6))``;
* decode: ``element * (t * s_b)`` (``s_b`` alone when single level).

``recipe="te"``: our reading of TransformerEngine's NVFP4 recipe (global encode scale
``S = 448 * 6 / amax``, ``t = 1 / S``; ``s_b = e4m3(min((amax_b / 6) * S, 448))``; elements
``e2m1(x * (S / s_b))``; an all-zero block gets ``s_b = 0`` and zero elements).  Not verified bit
for bit against TransformerEngine (which needs a Blackwell GPU); provided so that the two
orders of the float32 operations can be compared.

The element rounding mode is ``rounding=`` (default ``nearest_even``, the peers'; ``stochastic``
is what NVFP4 training recipes use for gradients).  Non-finite inputs: a block holding NaN or
Inf gets the E4M3 NaN scale (0x7F) and decodes to NaN; zero blocks get the smallest scale.

CUDA tensors are encoded on their own device (``lowprec.gpu.nvfp4``, through the custom ops
``torch.ops.lowprec.nvfp4_encode`` / ``nvfp4_quantize`` / ``nvfp4_decode``), bit-identical to
this module: the recipes' float32 steps are written once, below (:func:`recipe_scales`,
:func:`multiplier`, :func:`scaled_elements`, :func:`block_values`), and run on NumPy arrays here
(:class:`NumpyOps`) and on device tensors there (``TorchOps``, every division by a device
tensor); the E4M3 scales and the E2M1 elements are rounded by the Triton twins of the Numba
codecs used here.  With ``tensor_scale="amax"`` a CUDA encode returns the tensor scale as a
0-dim float32 tensor on the device (reading it would synchronise); otherwise it is a float.
"""

from __future__ import annotations

import math

import numpy as np

from . import _arrays as A
from .core import Format, FormatInfo, QuantizedArray, Rounding, _register, get_format

BLOCK_SIZE = 16
E2M1_MAX = np.float32(6.0)
E4M3_MAX = np.float32(448.0)
E4M3_TINY = np.float32(2.0**-6)  # torch.finfo(float8_e4m3fn).tiny, torchao's E4M3_EPS
AMAX_SCALE = E4M3_MAX * E2M1_MAX  # 2688: the largest NVFP4 magnitude (two-level recipes)
E4M3_NAN = 0x7F
RECIPES = ("torchao", "te")


def _check(axis, block_size, recipe, tensor_scale, ndim):
    from .mx import _check_axis, _check_block_size

    ax = _check_axis(axis, ndim)
    k = _check_block_size(block_size)
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r} is not one of {', '.join(RECIPES)}")
    if tensor_scale is not None and not (isinstance(tensor_scale, str) and tensor_scale == "amax"):
        if isinstance(tensor_scale, bool) or not isinstance(tensor_scale,
                                                            (int, float, np.floating)):
            raise TypeError(f"tensor_scale must be None, 'amax' or a positive float, got "
                            f"{tensor_scale!r}")
        if not (math.isfinite(tensor_scale) and tensor_scale > 0):
            raise ValueError(f"tensor_scale must be a positive finite float, got {tensor_scale}")
        tensor_scale = float(tensor_scale)  # (rounded to float32 by the recipe)
    if recipe == "te" and tensor_scale is None:
        tensor_scale = "amax"  # the TE recipe is two-level by construction
    return ax, k, tensor_scale


def options(rounding, seed, sr_bits, saturate, offset, axis, block_size, recipe, tensor_scale,
            ndim: int) -> dict:
    """Validate the NVFP4 arguments (everything but the data) for an input of ``ndim`` axes;
    shared by the NumPy and the torch routes (no NumPy: TorchDynamo traces it).  Returns
    ``axis`` (>= 0), ``block_size``, ``recipe``, ``ts`` (None, ``"amax"`` or a float), and the
    element rounding's ``mode`` (int), ``seed`` in [0, 2**64), ``sr_bits``, ``offset`` (signed
    int64)."""
    from .api import _float_options

    if saturate is not None and saturate is not True:
        raise ValueError("NVFP4 elements always saturate: pass saturate=None or True")
    ax, k, ts = _check(axis, block_size, recipe, tensor_scale, ndim)
    mode, _sat, seed_v, sr, off = _float_options(_E2M1, rounding, None, seed, sr_bits, offset,
                                                 False)
    return dict(axis=ax, block_size=k, recipe=recipe, ts=ts, mode=mode, seed=seed_v,
                sr_bits=sr, offset=off)


# --------------------------------------------------------------------------------------------
# The recipes' float32 steps, written once for both devices: ``xp`` is :class:`NumpyOps` on the
# CPU and ``lowprec.gpu.nvfp4.TorchOps`` on a device (the same operations on tensors).


class NumpyOps:
    """The float32 operations of the recipes on NumPy arrays (each one IEEE-rounded)."""

    const = staticmethod(np.float32)
    div = staticmethod(np.divide)
    mul = staticmethod(np.multiply)
    clip = staticmethod(np.clip)
    minimum = staticmethod(np.minimum)
    where = staticmethod(np.where)
    isfinite = staticmethod(np.isfinite)

    @staticmethod
    def repeat(a, k: int):
        return np.repeat(a, k, axis=-1)


def recipe_scales(amax_b, amax_t, ts, recipe: str, xp):
    """``(t, s)``: the float32 tensor scale and the block scales before their E4M3 rounding,
    from the blocks' amax ``amax_b`` (NaN for a block holding NaN) and the tensor's finite amax
    ``amax_t`` (module docstring; ``ts`` as :func:`options` returns it)."""
    one = xp.const(1.0)
    six = xp.const(E2M1_MAX)
    if ts is None:
        return one, xp.clip(xp.div(amax_b, six), E4M3_TINY, E4M3_MAX)
    if recipe == "torchao":
        t = xp.div(amax_t, xp.const(AMAX_SCALE)) if ts == "amax" else xp.const(ts)
        t = xp.where(t > 0, t, one)
        return t, xp.clip(xp.div(xp.div(amax_b, six), t), E4M3_TINY, E4M3_MAX)
    enc = xp.div(xp.const(AMAX_SCALE), amax_t) if ts == "amax" else xp.div(one, xp.const(ts))
    enc = xp.where(xp.isfinite(enc) & (enc > 0), enc, one)
    return xp.div(one, enc), xp.minimum(xp.mul(xp.div(amax_b, six), enc), xp.const(E4M3_MAX))


def multiplier(t, sval, ts, recipe: str, xp):
    """The float32 factor of each block's elements, from the E4M3 block scale values ``sval``
    (torchao: ``(1 / t) / s``, ``1 / s`` single level; TE: ``S / s``, 0 for ``s = 0``)."""
    one = xp.const(1.0)
    if recipe == "torchao":
        return xp.div(xp.div(one, t), sval) if ts is not None else xp.div(one, sval)
    return xp.where(sval > 0, xp.div(xp.div(one, t), sval), xp.const(0.0))


def scaled_elements(xb, mult, xp):
    """``clamp(x * mult, -6, 6)`` of blocks ``xb`` (``[..., blocks, k]``); NaN and +-Inf
    elements stay themselves (the E2M1 codec maps them)."""
    y = xp.clip(xp.mul(xb, mult[..., None]), -E2M1_MAX, E2M1_MAX)
    return xp.where(xp.isfinite(xb), y, xb)


def block_values(ev, sval, t, kk: int, xp):
    """Decoded float32 values: ``element * (t * block_scale)`` (torchao's order) for element
    values ``ev`` (``[..., n]``) and block scale values ``sval`` (``[..., blocks]``)."""
    sv = xp.mul(t, sval)
    return xp.mul(ev, xp.repeat(sv, kk)[..., :ev.shape[-1]])


def host_tensor_scale(ts, recipe: str) -> float:
    """The tensor scale ``t`` of a call whose ``ts`` does not depend on the data (None or a
    float), as :func:`recipe_scales` computes it."""
    z = np.zeros(0, np.float32)
    with np.errstate(all="ignore"):
        return float(recipe_scales(z, np.float32(0.0), ts, recipe, NumpyOps)[0])


# --------------------------------------------------------------------------------------------


def encode(x, f: Format, *, rounding=None, seed=None, sr_bits=32, saturate=None, offset=0,
           axis: int = -1, block_size: int = BLOCK_SIZE, recipe: str = "torchao",
           tensor_scale=None) -> QuantizedArray:
    """Encode ``x`` to NVFP4 (module docstring): E2M1 element codes, E4M3 block-scale codes and
    the float32 tensor scale.

    Args:
        x: float32/float64/float16/bfloat16 numpy array or torch tensor (a CUDA tensor is
            encoded on its device by ``lp.encode``), >= 1-d.  float64 is converted to float32
            first (the recipes are float32 arithmetic).
        f: the ``nvfp4`` format.
        rounding, seed, sr_bits, offset: element rounding, as :func:`lowprec.encode`.
        saturate: None or True (elements are clamped to +-6 by the recipe).
        axis: the blocked axis.  block_size: elements per block (16, NVFP4's; others allowed
            for studies; the last block may be partial).
        recipe: ``"torchao"`` or ``"te"``.
        tensor_scale: None (single level), ``"amax"`` (two level, from the tensor's amax) or a
            positive float (a calibrated per-tensor scale ``t``).

    Returns:
        :class:`QuantizedArray` with uint8 ``codes`` (E2M1), uint8 ``scales`` (E4M3 codes), and
        ``tensor_scale`` (float32; 1.0 when single level).
    """
    from .minifloat import run_kernel
    from .mx import block_len

    arr, was_torch = A.to_numpy(x)
    arr = A.check_float(arr)
    o = options(rounding, seed, sr_bits, saturate, offset, axis, block_size, recipe,
                tensor_scale, arr.ndim)
    ax, k, ts = o["axis"], o["block_size"], o["ts"]
    x2 = np.moveaxis(np.asarray(arr, dtype=np.float32), ax, -1)
    lead, n = x2.shape[:-1], x2.shape[-1]
    kk = block_len(k, n)
    nb = -(-n // kk)
    pad = nb * kk - n
    xb = np.pad(x2, [(0, 0)] * len(lead) + [(0, pad)]).reshape(lead + (nb, kk))
    with np.errstate(all="ignore"):
        finite = np.isfinite(xb).all(axis=-1)
        amax_b = np.max(np.abs(xb), axis=-1, initial=np.float32(0)).astype(np.float32)
        amax_t = np.float32(np.max(np.abs(x2[np.isfinite(x2)]), initial=np.float32(0)))
        t, s = recipe_scales(amax_b, amax_t, ts, recipe, NumpyOps)
        scodes = _e4m3(s)
        sval = _E4M3.values()[scodes]
        y = scaled_elements(xb, multiplier(t, sval, ts, recipe, NumpyOps), NumpyOps)
    y = np.ascontiguousarray(y.astype(np.float32).reshape(lead + (nb * kk,))[..., :n])
    codes = np.empty(y.shape, np.uint8)
    run_kernel(_E2M1.spec, y.reshape(-1).view(np.uint32), codes.reshape(-1), o["mode"], False,
               o["seed"], o["sr_bits"], o["offset"])
    scodes = np.where(finite, scodes, E4M3_NAN).astype(np.uint8)
    codes = np.ascontiguousarray(np.moveaxis(codes, -1, ax))
    scodes = np.ascontiguousarray(np.moveaxis(scodes, -1, ax))
    return QuantizedArray(codes=A.wrap(codes, was_torch), scales=A.wrap(scodes, was_torch),
                          format=f.name, axis=ax, block_size=k, tensor_scale=float(t))


def _e4m3(s: np.ndarray) -> np.ndarray:
    from .api import encode as _enc

    return np.asarray(_enc(np.asarray(s, np.float32), "e4m3", "nearest_even", True))


def decode(q: QuantizedArray):
    """Decode an NVFP4 :class:`QuantizedArray` to float32: ``element * (tensor_scale *
    block_scale)`` in float32 (torchao's order); a NaN block scale gives NaN.  Raises
    ValueError for an element code above 15 (``_arrays.check_codes``)."""
    from .mx import check_quantized

    codes, was_torch = A.codes_array(q.codes)
    scales, _ = A.codes_array(q.scales, "scales")
    ax, kk, _nb = check_quantized(q, codes.shape, codes.dtype, scales.shape, scales.dtype)
    if q.tensor_scale is None:
        raise ValueError("an NVFP4 QuantizedArray needs its tensor_scale")
    A.check_codes(codes, get_format(q.format))
    ev = _E2M1.values()[np.moveaxis(codes, ax, -1)]
    sval = _E4M3.values()[np.moveaxis(scales, ax, -1)]
    out = block_values(ev, sval, np.float32(q.tensor_scale), kk, NumpyOps).astype(np.float32)
    return A.wrap(np.ascontiguousarray(np.moveaxis(out, -1, ax)), was_torch)


def quantize(x, f: Format, *, out=None, **kwargs):
    """NVFP4 fake-quantization: ``decode(encode(x, ...))`` (arguments as :func:`encode`)."""
    return A.into_out(decode(encode(x, f, **kwargs)), out)


_E2M1 = get_format("e2m1")
_E4M3 = get_format("e4m3")
NVFP4_INFO = FormatInfo(
    name="nvfp4", bits=4, kind="nvfp4", max=6.0 * 448.0, min_normal=1.0, min_subnormal=0.5,
    has_inf=False, has_nan=True, has_neg_zero=True, nan_codes=(), inf_codes=(), nan_code=None,
    max_code=_E2M1.info.max_code, default_rounding=Rounding.NEAREST_EVEN, scaled=True,
    element="e2m1", block_size=BLOCK_SIZE,
    doc="NVFP4: E2M1 elements, E4M3 scale per 16, float32 tensor scale (design.md Formats II); "
        "values() are unscaled element values",
)
_register(Format(NVFP4_INFO, _E2M1.values()))

__all__ = ["encode", "decode", "quantize", "RECIPES", "BLOCK_SIZE"]
