"""Bit-exact 8-bit number formats: HiF8, OCP FP8 E4M3/E5M2, MXFP8, INT8/UINT8.

See :func:`encode`, :func:`decode`, :func:`quantize`, :func:`get_format`.
"""

from .api import decode, encode, quantize
from .core import (
    Format,
    FormatInfo,
    QuantizedArray,
    Rounding,
    available_formats,
    get_format,
)
from .minifloat import float_format

__all__ = [
    "Format",
    "FormatInfo",
    "QuantizedArray",
    "Rounding",
    "available_formats",
    "decode",
    "encode",
    "float_format",
    "get_format",
    "quantize",
]
