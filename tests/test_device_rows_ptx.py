"""The Triton kernel of the row-wise schemes' device paths (``lowprec.gpu.rowsum``) compiled
ahead of time for sm_90 (no GPU needed, specs/gpu.md section 4): its PTX holds the sequential
IEEE adds (``add.f32`` / ``add.f64``, round to nearest) and none of the forbidden instructions
(``scripts/gpu_ptx_check.FORBIDDEN``: approximate or flushing arithmetic, FMA, saturating
narrow conversions).  Runs in a subprocess without ``TRITON_INTERPRET``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.rowsum import _seq_rowsum_kernel
rep = {}
for ty in ("fp32", "fp64"):
    sig = {"X": "*" + ty, "OUT": "*" + ty, "N": "i32", "L": "i32"}
    ptx = _compile(_seq_rowsum_kernel, sig, {"BLOCK_R": 128}, 4)
    bad = [ln.strip() for ln in ptx.splitlines() if FORBIDDEN.search(ln)]
    adds = len(re.findall(r"\\badd\\.(?:rn\\.)?" + ty.replace("fp", "f") + r"\\b", ptx))
    rep[ty] = {"bad": bad[:5], "adds": adds}
print(json.dumps(rep))
"""


def test_seq_rowsum_compiles_to_clean_ptx():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    for ty in ("fp32", "fp64"):
        assert rep[ty]["bad"] == [], rep
        assert rep[ty]["adds"] >= 1, rep
