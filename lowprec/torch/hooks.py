"""Tensor hooks of :func:`lowprec.torch.emulate`: fake-quantized ``nn.Linear`` inputs and weights.

``emulate(..., activations="hif8", weights="e4m3", include=[...], exclude=[...], model=m)``
rounds, inside the context only, the input and the weight of every ``nn.Linear`` of the watched
models whose qualified name (``m.named_modules()``) matches one of the ``include`` fnmatch
patterns (default ``["*"]``) and none of the ``exclude`` patterns, with
:func:`lowprec.quantize` (design.md "PyTorch integration"; formats.md for the formats):

* the input is replaced by a forward pre-hook of the module (a new tensor; the caller's tensor
  is not touched);
* the weight is never written: while the selected module runs, the context's
  ``TorchFunctionMode`` hands ``F.linear`` a quantized *copy* of ``module.weight`` instead of
  the parameter (cached per context and re-quantized when the parameter's version changes), so
  the parameters are bit-identical before, during (seen from outside the module) and after the
  context.  A Linear subclass whose ``forward`` does not call ``F.linear(x, self.weight, ...)``
  gets its input quantized but not its weight.  Biases are not quantized.

Only the unscaled 8-bit float formats (``hif8``, ``e4m3``, ``e5m2``) are accepted for now; the
scaled ones (``mxfp8_*``, ``int8``, ``uint8``) need a scale policy and raise ``ValueError``.
Rounding follows the format's own convention; out-of-range values are clamped to the largest
finite value (``saturate=True``) unless ``quantize_options`` says otherwise.

Statistics (:class:`QuantStats`, one per module): elements, *saturated* elements
(``|x| > format max``, Inf included, NaN not) and *underflowed* elements (``x != 0`` that
quantize to 0), for activations (summed over calls) and weights (counted once per quantization
of the weight).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from ..stats import Stats

QUANT_FORMATS = ("hif8", "e4m3", "e5m2")  # unscaled formats the hooks accept (design.md)
QUANTIZE_DEFAULTS = {"saturate": True}  # clamp out-of-range activations instead of Inf/NaN
_QUANTIZE_KEYS = ("rounding", "saturate", "seed", "sr_bits")


@dataclass
class QuantStats(Stats):
    """Saturation and underflow counts of the fake-quantized ``nn.Linear`` tensors of one module.

    Attributes:
        act_calls: forward calls whose input was quantized.
        act_elements, act_saturated, act_underflow: input elements, of which ``|x| > max``
            (saturated; Inf included) and nonzero ones that became 0 (underflow).
        w_quantizations: times the weight was quantized (1 unless it changed in between).
        w_elements, w_saturated, w_underflow: the same counts for the weight.

    Derived (``to_dict`` includes them): ``act_saturation``, ``act_underflow_rate``,
    ``w_saturation``, ``w_underflow_rate`` (fractions in [0, 1], 0.0 when nothing counted).
    """

    act_calls: int = 0
    act_elements: int = 0
    act_saturated: int = 0
    act_underflow: int = 0
    w_quantizations: int = 0
    w_elements: int = 0
    w_saturated: int = 0
    w_underflow: int = 0

    _derived = ("act_saturation", "act_underflow_rate", "w_saturation", "w_underflow_rate")

    @property
    def act_saturation(self) -> float:
        """Fraction of input elements with ``|x| > max`` of the format."""
        return self.act_saturated / self.act_elements if self.act_elements else 0.0

    @property
    def act_underflow_rate(self) -> float:
        """Fraction of input elements that were nonzero and quantized to 0."""
        return self.act_underflow / self.act_elements if self.act_elements else 0.0

    @property
    def w_saturation(self) -> float:
        """Fraction of weight elements with ``|w| > max`` of the format."""
        return self.w_saturated / self.w_elements if self.w_elements else 0.0

    @property
    def w_underflow_rate(self) -> float:
        """Fraction of weight elements that were nonzero and quantized to 0."""
        return self.w_underflow / self.w_elements if self.w_elements else 0.0


def check_quant_format(fmt, what: str) -> str | None:
    """Validate an ``activations=`` / ``weights=`` format: None or any unscaled float format
    (:data:`QUANT_FORMATS` of the design, the element formats of issue 17 and the formats made
    by :func:`lowprec.float_format`); returns the registry name.

    Raises:
        ValueError: a scaled format (mxfp8, int8, uint8; not supported by the hooks yet) or an
            unknown name, listing the accepted ones.
    """
    if fmt is None:
        return None
    import lowprec

    f = None
    if isinstance(fmt, str):
        try:
            f = lowprec.get_format(fmt)
        except ValueError:
            f = None
    if f is None or f.info.kind != "float":
        scaled = f is not None
        why = " (scaled formats need a scale policy and are not supported yet)" if scaled else ""
        floats = [n for n in lowprec.available_formats()
                  if lowprec.get_format(n).info.kind == "float"]
        raise ValueError(
            f"{what}={fmt!r} is not accepted{why}; allowed: None, {', '.join(floats)} (and "
            "formats made by lowprec.float_format)"
        )
    return f.name


def check_patterns(patterns, what: str, default: tuple) -> tuple:
    """Validate ``include=`` / ``exclude=``: None (``default``), one string or a sequence of
    fnmatch pattern strings; returns a tuple.  TypeError otherwise."""
    if patterns is None:
        return default
    if isinstance(patterns, str):
        return (patterns,)
    try:
        pats = tuple(patterns)
    except TypeError:
        raise TypeError(f"{what} must be a pattern string or a list of them, got "
                        f"{type(patterns).__name__}") from None
    for p in pats:
        if not isinstance(p, str):
            raise TypeError(f"{what} patterns must be strings, got {type(p).__name__}")
    return pats


def check_quantize_options(options) -> dict:
    """Validate ``quantize_options=`` (keywords of :func:`lowprec.quantize`: rounding, saturate,
    seed, sr_bits); returns them merged over :data:`QUANTIZE_DEFAULTS`."""
    if options is None:
        return dict(QUANTIZE_DEFAULTS)
    if not isinstance(options, dict):
        raise TypeError(f"quantize_options must be a dict, got {type(options).__name__}")
    bad = sorted(set(options) - set(_QUANTIZE_KEYS))
    if bad:
        raise ValueError(f"unknown quantize_options {', '.join(bad)}; allowed: "
                         f"{', '.join(_QUANTIZE_KEYS)}")
    return {**QUANTIZE_DEFAULTS, **options}


def selected(name: str, include: tuple, exclude: tuple) -> bool:
    """Whether qualified name ``name`` matches an ``include`` pattern and no ``exclude`` one."""
    return (any(fnmatch.fnmatchcase(name, p) for p in include)
            and not any(fnmatch.fnmatchcase(name, p) for p in exclude))


def fake_quant(t, fmt: str, qopts: dict):
    """Fake-quantize torch tensor ``t`` to ``fmt`` on the CPU.

    Returns ``(tq, elements, saturated, underflow)``: ``tq`` a new tensor with ``t``'s dtype and
    device holding the rounded values (``t`` is not modified), and the counts defined in the
    module docstring.  Values of the 8-bit formats are exact in float16/bfloat16/float32.
    """
    import lowprec

    from ..formats._arrays import to_numpy

    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    arr, _ = to_numpy(x, "tensor")
    arr = np.asarray(arr, dtype=np.float32)
    q = lowprec.quantize(arr, fmt, **qopts)
    fmax = lowprec.get_format(fmt).info.max
    sat = int(np.count_nonzero(np.abs(arr) > fmax))
    under = int(np.count_nonzero((q == 0) & (arr != 0)))
    import torch

    tq = torch.from_numpy(q).to(dtype=t.dtype, device=t.device)
    return tq, int(arr.size), sat, under


__all__ = ["QuantStats", "QUANT_FORMATS", "QUANTIZE_DEFAULTS", "check_quant_format",
           "check_patterns", "check_quantize_options", "selected", "fake_quant"]
