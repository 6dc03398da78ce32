"""PyTorch integration (design.md "PyTorch integration"; issue 5).

``from lowprec.torch import emulate``; see :mod:`lowprec.torch.emulate` (the context; its
report model :mod:`lowprec.torch.report`, the SDPA argument semantics :mod:`lowprec.torch.sdpa`),
:mod:`lowprec.torch.hooks` (nn.Linear fake-quantization), :mod:`lowprec.torch.hf` (transformers
models with eager attention) and :mod:`lowprec.torch.models` (real models loaded offline:
``load_model``, ``available_models``, ``mean_pool``, ``sample_text``).  torch is imported on
first use of a name, so ``import lowprec`` (and ``import lowprec.torch``) work without torch
installed.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "emulate": "emulate",
    "Emulation": "emulate",
    "EmulationStats": "report",
    "ModuleStats": "report",
    "CallRecord": "report",
    "SHORTHANDS": "emulate",
    "QuantStats": "hooks",
    "QUANT_FORMATS": "hooks",
    "load_model": "models",
    "available_models": "models",
    "mean_pool": "models",
    "sample_text": "models",
    "ModelNotInstalledError": "models",
}
_NO_TORCH = {"available_models", "sample_text", "ModelNotInstalledError",  # work without torch
             "EmulationStats", "ModuleStats", "CallRecord"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _NO_TORCH:
        try:
            import torch  # noqa: F401
        except ImportError as e:  # pragma: no cover - torch is installed in CI
            raise ImportError(f"lowprec.torch.{name} needs PyTorch: pip install torch") from e
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
