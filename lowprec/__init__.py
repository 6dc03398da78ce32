"""lowprec: bit-exact emulation of low-precision number formats and attention pipelines.

Quick tour::

    import numpy as np, lowprec as lp
    lp.available_formats()           # ['hif8', 'e4m3', 'e5m2', 'mxfp8_e4m3', ...]
    codes = lp.encode(x, "e4m3")     # uint8 codes
    y = lp.decode(codes, "e4m3")     # float32 values
    y = lp.quantize(x, "hif8")       # fused fake-quantization
    out = lp.attention(q, k, v, scheme="baps", config="e2e_hif8", causal=True)
    lp.schemes()                     # {name: description}

Nothing heavy is imported until first use (Numba kernels compile lazily and cache to disk;
the first compilation in a process logs one INFO line on the ``"lowprec"`` logger, and
``lowprec compile`` / :func:`lowprec.compile.compile_kernels` compiles everything ahead of time).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "available_formats": "lowprec.formats.core",
    "get_format": "lowprec.formats.core",
    "float_format": "lowprec.formats.minifloat",
    "Format": "lowprec.formats.core",
    "FormatInfo": "lowprec.formats.core",
    "QuantizedArray": "lowprec.formats.core",
    "Rounding": "lowprec.formats.core",
    "encode": "lowprec.formats.api",
    "decode": "lowprec.formats.api",
    "quantize": "lowprec.formats.api",
    "attention": "lowprec.kernels",
    "compile_kernels": "lowprec.compile",
    "emulate": "lowprec.torch",
    "schemes": "lowprec.kernels",
    "softmax": "lowprec.kernels",
}
_SUBMODULES = ("formats", "kernels", "stats", "studies", "compile")
_NUMBA = ("lowprec.formats", "lowprec.kernels")  # names whose first use may compile kernels

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        value = importlib.import_module(f"lowprec.{name}")
        globals()[name] = value
        return value
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'lowprec' has no attribute {name!r}")

    value = getattr(importlib.import_module(mod), name)
    if mod.startswith(_NUMBA):
        from .compile import watch_compilation

        watch_compilation()
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
