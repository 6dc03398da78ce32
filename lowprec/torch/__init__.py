"""PyTorch integration (design.md "PyTorch integration"; issue 5).

``from lowprec.torch import emulate`` (also ``lowprec.emulate``); see
:mod:`lowprec.torch.context` (the context; its report model :mod:`lowprec.torch.report`, the
SDPA argument semantics :mod:`lowprec.torch.sdpa`, ``nn.MultiheadAttention``'s function
:mod:`lowprec.torch.mha`, module naming :mod:`lowprec.torch.naming`, the custom ops used under
``torch.compile`` :mod:`lowprec.torch.ops`), :mod:`lowprec.torch.hooks`
(nn.Linear fake-quantization), :mod:`lowprec.torch.hf` (transformers models with eager
attention) and :mod:`lowprec.torch.models` (real models loaded offline: ``load_model``,
``available_models``, ``mean_pool``, ``sample_text``).  torch is imported on first use of a
name, so ``import lowprec`` (and ``import lowprec.torch``) work without torch installed.

No submodule shares a name with a function of this package (docs/design.md, "One name, one
object"): the context's module was ``lowprec.torch.emulate`` until issue 12, and importing it
replaced the function ``lowprec.torch.emulate`` (and so ``lowprec.emulate``) by the module.
The old path still imports, with a ``DeprecationWarning``, as an alias of
:mod:`lowprec.torch.context`; the package's attributes that are functions can no longer be
replaced by a module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

_LAZY = {
    "emulate": "context",
    "Emulation": "context",
    "SHORTHANDS": "context",
    "UNKNOWN_MODULE": "context",
    "ROOT_MODULE": "context",
    "EMPTY_ROWS": "context",
    "EmulationStats": "report",
    "ModuleStats": "report",
    "CallRecord": "report",
    "QuantStats": "hooks",
    "QUANT_FORMATS": "hooks",
    "load_model": "models",
    "available_models": "models",
    "mean_pool": "models",
    "sample_text": "models",
    "eval_text": "models",
    "ModelNotInstalledError": "models",
}
_NO_TORCH = {"available_models", "sample_text", "eval_text",  # these work without torch
             "ModelNotInstalledError", "EmulationStats", "ModuleStats", "CallRecord"}
#: old submodule path -> its new one (imported with a DeprecationWarning, see the docstring)
RENAMED = {f"{__name__}.emulate": f"{__name__}.context"}

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


class _Package(types.ModuleType):
    """This package's module type: the import system sets ``package.child = module`` after
    importing a submodule; a name of :data:`_LAZY` (a function or class) is never replaced
    that way, so no import order can turn ``lowprec.torch.emulate`` into a module again."""

    def __setattr__(self, name, value):
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


class _RenamedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of :data:`RENAMED` as an alias of its new module, with a
    ``DeprecationWarning`` naming the new import."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in RENAMED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = RENAMED[spec.name]
        warnings.warn(f"{spec.name} was renamed {new} (issue 12); import its names from "
                      f"{__name__} instead, e.g. `from {__name__} import emulate, "
                      "EmulationStats`", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        return None  # the new module is already executed


sys.modules[__name__].__class__ = _Package
if not any(isinstance(f, _RenamedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _RenamedFinder())
