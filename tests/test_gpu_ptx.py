"""Every Triton kernel variant of ``lowprec.gpu`` compiled ahead of time for sm_90 (no GPU
needed), its PTX free of the instructions gpu.md section 4 forbids: approximate division,
exp2/log2/sqrt, ``.ftz``, ``satfinite``, narrowing float conversions, ``fma``.

Runs ``scripts/gpu_ptx_check.py --ptx-only`` in a subprocess without ``TRITON_INTERPRET`` (the
test session runs the kernels in the interpreter, whose kernels cannot be compiled), on every
core.  The default run compiles every 8th variant of each kernel (each kernel covered, about
60 variants); all of them (about 450, 2-4 minutes on 2 cores) run under the ``slow`` marker:
``pytest -m slow tests/test_gpu_ptx.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def _report(tmp_path, *extra) -> tuple[dict, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "ptx.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_ptx_check.py"),
                          "--ptx-only", "--json", str(out), *extra], env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.exists(), res.stdout + res.stderr
    rep = json.loads(out.read_text())
    assert rep["failures"] == [], json.dumps(rep["failures"][:3], indent=1)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return rep, res


def test_sampled_kernel_variants_compile_to_clean_ptx(tmp_path):
    """Every 8th variant of each kernel: every kernel compiles, its PTX clean."""
    rep, _ = _report(tmp_path, "--every", "8")
    assert sorted(rep["per_kernel"]) == rep["all_kernels"]
    assert rep["all_variants"] == 408 + 40 + 4
    assert rep["variants"] < rep["all_variants"] // 4


@pytest.mark.slow
def test_every_kernel_variant_compiles_to_clean_ptx(tmp_path):
    rep, res = _report(tmp_path)
    # the launchers' whole variant space: 224 float codec, 144 MX, 36 INT, 4 decode kernels;
    # Formats II (issue 17): 24 codec variants of new formats, 8 E8M0, 4 new MX elements, the 4
    # other E2M1 modes of NVFP4's elements; the two decode kernels with their table reads
    # masked to 16 and 64 entries (4- and 6-bit codes)
    assert rep["variants"] == 408 + 40 + 4, rep["per_kernel"]
