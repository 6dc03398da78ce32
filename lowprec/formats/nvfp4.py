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
    if recipe == "te" and tensor_scale is None:
        tensor_scale = "amax"  # the TE recipe is two-level by construction
    return ax, k, tensor_scale


def encode(x, f: Format, *, rounding=None, seed=None, sr_bits=32, saturate=None, offset=0,
           axis: int = -1, block_size: int = BLOCK_SIZE, recipe: str = "torchao",
           tensor_scale=None) -> QuantizedArray:
    """Encode ``x`` to NVFP4 (module docstring): E2M1 element codes, E4M3 block-scale codes and
    the float32 tensor scale.

    Args:
        x: float32/float64/float16/bfloat16 numpy array or CPU torch tensor, >= 1-d.  float64
            is converted to float32 first (the recipes are float32 arithmetic).
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
    from .mx import block_len

    arr, was_torch = A.to_numpy(x)
    arr = A.check_float(arr)
    if saturate is not None and saturate is not True:
        raise ValueError("NVFP4 elements always saturate: pass saturate=None or True")
    ax, k, ts = _check(axis, block_size, recipe, tensor_scale, arr.ndim)
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
        if ts is None:
            t = np.float32(1.0)
            s = np.clip(amax_b / E2M1_MAX, E4M3_TINY, E4M3_MAX)
        elif recipe == "torchao":
            t = amax_t / np.float32(E4M3_MAX * E2M1_MAX) if ts == "amax" else np.float32(ts)
            t = t if t > 0 else np.float32(1.0)
            s = np.clip((amax_b / E2M1_MAX) / t, E4M3_TINY, E4M3_MAX)
        else:
            enc = np.float32(E4M3_MAX * E2M1_MAX) / amax_t if ts == "amax" else \
                np.float32(1.0) / np.float32(ts)
            enc = enc if (np.isfinite(enc) and enc > 0) else np.float32(1.0)
            t = np.float32(1.0) / enc
            s = np.minimum((amax_b / E2M1_MAX) * enc, E4M3_MAX)
        scodes = _e4m3(s)
        sval = get_format("e4m3").values()[scodes]
        if recipe == "torchao":
            mult = (np.float32(1.0) / t) / sval if ts is not None else np.float32(1.0) / sval
        else:
            mult = np.where(sval > 0, (np.float32(1.0) / t) / sval, np.float32(0.0))
        y = np.clip(xb * mult[..., None].astype(np.float32), -E2M1_MAX, E2M1_MAX)
    y = np.where(np.isfinite(xb), y, xb).astype(np.float32)
    from .api import encode as _enc

    codes = np.asarray(_enc(y.reshape(lead + (nb * kk,))[..., :n], "e2m1", rounding,
                            seed=seed, sr_bits=sr_bits, offset=offset))
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
    block_scale)`` in float32 (torchao's order); a NaN block scale gives NaN."""
    from .mx import check_quantized

    codes, was_torch = A.codes_array(q.codes)
    scales, _ = A.codes_array(q.scales, "scales")
    ax, kk, _nb = check_quantized(q, codes.shape, codes.dtype, scales.shape, scales.dtype)
    if q.tensor_scale is None:
        raise ValueError("an NVFP4 QuantizedArray needs its tensor_scale")
    c2 = np.moveaxis(codes, ax, -1)
    s2 = np.moveaxis(scales, ax, -1)
    ev = get_format("e2m1").values()[c2]
    sv = np.float32(q.tensor_scale) * get_format("e4m3").values()[s2]
    full = np.repeat(sv, kk, axis=-1)[..., :c2.shape[-1]]
    out = (ev * full).astype(np.float32)
    return A.wrap(np.ascontiguousarray(np.moveaxis(out, -1, ax)), was_torch)


def quantize(x, f: Format, *, out=None, **kwargs):
    """NVFP4 fake-quantization: ``decode(encode(x, ...))`` (arguments as :func:`encode`)."""
    return A.into_out(decode(encode(x, f, **kwargs)), out)


_E2M1 = get_format("e2m1")
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
