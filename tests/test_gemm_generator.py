"""The unrolled tile products of ``lowprec/kernels/_gemm.py`` are exactly what
``scripts/gen_gemm.py`` generates (edit the generator, not the module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen_gemm.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_gemm", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gemm_module_is_generated():
    gen = _generator()
    assert gen.TARGET.read_text() == gen.generate()
    assert gen.main(["--check"]) == 0


def test_generated_constants_match_the_module():
    from lowprec.kernels import _gemm

    gen = _generator()
    assert (_gemm.ROWS, _gemm.RED) == (gen.ROWS, gen.RED)
