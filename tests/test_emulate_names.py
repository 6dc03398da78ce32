"""Issue 12 item 1: no import order turns a public function into a module.

``from lowprec.torch.emulate import EmulationStats`` used to replace the function
``lowprec.torch.emulate`` (and with it ``lowprec.emulate``) by the submodule of the same name.
The context's module is now ``lowprec.torch.context``; the old path is a deprecated alias.
Each test runs in a fresh interpreter, so the import order is the one written here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c",
                           textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_old_submodule_path_does_not_shadow_the_function():
    r = _run("""
        import warnings
        import lowprec as lp
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            from lowprec.torch.emulate import EmulationStats, Emulation, UNKNOWN_MODULE
        assert any(issubclass(x.category, DeprecationWarning) and "lowprec.torch.context"
                   in str(x.message) for x in w), [str(x.message) for x in w]
        import lowprec.torch
        assert callable(lp.emulate) and callable(lowprec.torch.emulate)
        with lp.emulate("flash") as run:
            pass
        assert isinstance(run, Emulation) and isinstance(run.stats, EmulationStats)
        assert UNKNOWN_MODULE == "<unknown>"
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_new_paths_and_reexports():
    r = _run("""
        import lowprec.torch.context as ctx
        import lowprec as lp
        from lowprec.torch import (emulate, Emulation, EmulationStats, ModuleStats, CallRecord,
                                   SHORTHANDS, UNKNOWN_MODULE, ROOT_MODULE, EMPTY_ROWS)
        assert lp.emulate is emulate is ctx.emulate
        assert ctx.EmulationStats is EmulationStats
        print("ok")
    """)
    assert r.returncode == 0, r.stderr


def test_no_submodule_named_like_a_public_attribute():
    """Every package of lowprec, every submodule imported first: each public name listed in a
    package's lazy table or ``__all__`` stays what it was (the sibling search of item 1)."""
    r = _run("""
        import importlib, pkgutil, types
        import lowprec
        pkgs = ["lowprec", "lowprec.formats", "lowprec.kernels", "lowprec.torch",
                "lowprec.studies", "lowprec.gpu", "lowprec.data"]
        before, clashes = {}, []
        for p in pkgs:
            m = importlib.import_module(p)
            names = set(getattr(m, "_LAZY", {})) | set(getattr(m, "__all__", []))
            subs = {s.name for s in pkgutil.iter_modules(m.__path__)}
            clashes += [f"{p}.{s}" for s in subs & names]
            before[p] = {n: getattr(m, n) for n in names}
        for p in pkgs:
            m = importlib.import_module(p)
            for s in pkgutil.iter_modules(m.__path__):
                try:
                    importlib.import_module(f"{p}.{s.name}")
                except ImportError:  # optional dependencies (triton)
                    pass
        changed = [f"{p}.{n}" for p in pkgs for n, v in before[p].items()
                   if getattr(importlib.import_module(p), n) is not v]
        assert not changed, changed
        assert not clashes, clashes
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
