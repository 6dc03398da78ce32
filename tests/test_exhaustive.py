"""All 2^32 float32 bit patterns (opt-in: ``pytest -m exhaustive``; minutes per test).

* HiF8 ``nearest_away`` == en-dtypes, E4M3 / E5M2 ``nearest_even`` == ml_dtypes, non-saturating;
  saturating == clamp-then-convert; codes (NaN by class) and fused ``quantize`` values.
* The vectorized float32 fast path == the generic kernel, codes and value bits, for every
  deterministic mode and saturation (the slower family).

The sweep itself lives in ``scripts/exhaustive_sweep.py`` (same code, with progress output).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "exhaustive_sweep.py"
_spec = importlib.util.spec_from_file_location("exhaustive_sweep", _SCRIPT)
sweep_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("exhaustive_sweep", sweep_mod)  # dataclasses need the module registered
_spec.loader.exec_module(sweep_mod)

pytestmark = pytest.mark.exhaustive

FORMATS = sweep_mod.FORMATS
DET_MODES = sweep_mod.DET_MODES


def _check(tallies):
    for t in tallies:
        assert t.patterns == sweep_mod.N_ALL, t.line()
    bad = [t.line() for t in tallies if t.mismatches]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_all_float32_vs_peer(fmt, sat):
    _check(sweep_mod.sweep([fmt], None, (sat,), ("peer",), values=True, progress=False))


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("mode", DET_MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_all_float32_fast_path_vs_generic(fmt, mode, sat):
    _check(sweep_mod.sweep([fmt], (mode,), (sat,), ("generic",), values=True, progress=False))
