"""Every notebook in notebooks/ executes top to bottom at small sizes (LOWPREC_NB_QUICK=1), and
matches its source in scripts/make_notebooks.py; every notebook is stored executed at full
size (scripts/run_notebooks.py), with their plots, and their conclusions are computed."""

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


FULL_SIZE = EXPECTED  # every notebook is stored executed at full size


def _conclusion(nb):
    """Index of the "## Conclusion" markdown cell."""
    heads = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "markdown" and "## Conclusion" in c.source]
    assert heads, "no ## Conclusion cell"
    return heads[-1]


def test_notebooks_have_a_conclusion():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert [c for c in nb.cells if c.cell_type == "code"], path.name
        _conclusion(nb)


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_notebooks_stored_executed_with_computed_conclusions(name):
    """Stored with outputs (a plot, no error, every code cell run), and the conclusion's
    numbers come from a code cell: the markdown after "## Conclusion" holds no digit."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "not executed"
    outs = [o for c in code for o in c.outputs]
    assert not [o for o in outs if o.output_type == "error"]
    assert [o for o in outs if "image/png" in o.get("data", {})], "no stored plot"
    i = _conclusion(nb)
    assert not any(ch.isdigit() for c in nb.cells[i:] if c.cell_type == "markdown"
                   for ch in c.source), "typed numbers in the conclusion"
    after = [c for c in nb.cells[i + 1:] if c.cell_type == "code"]
    assert after and any("text/markdown" in o.get("data", {}) for o in after[-1].outputs), \
        "the conclusion is not displayed from the results"


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
