"""Every notebook in notebooks/ executes top to bottom at small sizes (LOWPREC_NB_QUICK=1), and
matches its source in scripts/make_notebooks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ("01_format_accuracy", "02_error_accumulation", "03_restart_rates",
            "04_integer_schemes")
TIMEOUT_S = 600  # per cell; CI machines are slow and the first run compiles Numba kernels


def test_all_notebooks_present():
    assert [p.stem for p in NOTEBOOKS] == list(EXPECTED)


def test_notebooks_match_generator():
    pytest.importorskip("nbformat")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_notebooks.py"), "--check"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_notebooks_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code, path.name
        assert all(not c.outputs and c.execution_count is None for c in code), path.name
        # each notebook ends with a written conclusion
        assert nb.cells[-1].cell_type == "markdown", path.name
        assert "## Conclusion" in nb.cells[-1].source, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("LOWPREC_NB_QUICK", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel uses its inline backend
    # the kernel is a child process: it must import this checkout's lowprec
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    # every notebook draws at least one figure
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} produced no plot"
