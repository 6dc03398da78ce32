"""PyTorch integration (design.md "PyTorch integration"; issue 5).

``from lowprec.torch import emulate``; see :mod:`lowprec.torch.emulate` (the context) and
:mod:`lowprec.torch.hooks` (nn.Linear fake-quantization).  torch is imported on first use of a
name, so ``import lowprec`` (and ``import lowprec.torch``) work without torch installed.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "emulate": "emulate",
    "Emulation": "emulate",
    "EmulationStats": "emulate",
    "ModuleStats": "emulate",
    "CallRecord": "emulate",
    "SHORTHANDS": "emulate",
    "QuantStats": "hooks",
    "QUANT_FORMATS": "hooks",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - torch is installed in CI
        raise ImportError(f"lowprec.torch.{name} needs PyTorch: pip install torch") from e
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
