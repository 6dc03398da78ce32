"""``docs/gpu-study-runs.md`` is what ``scripts/record_gpu_runs.py`` makes of the stored GPU
results (issue 15 item 4): regenerated here, equal to the committed file, and its summary
tables hold the numbers of the JSON they come from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "runs" / "gpu"


@pytest.fixture(scope="module")
def rec():
    spec = importlib.util.spec_from_file_location("record_gpu_runs",
                                                  ROOT / "scripts" / "record_gpu_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def doc(rec):
    return rec.document()


def test_committed_document_is_current(doc):
    assert (ROOT / "docs" / "gpu-study-runs.md").read_text() == doc


def test_restart_summary_rows_come_from_the_runs(doc):
    """Each restart run's ARR / PRR at tau 1 appears in its summary row, in percent."""
    rows = [ln for ln in doc.splitlines() if ln.strip().split(" ")[0].isdigit()]
    for name in ("lc.json", "lcx.json"):
        for L, r in json.loads((RUNS / name).read_text())["restart"].items():
            arr, prr = (f"{100 * r['taus']['1'][k]:.2f}" for k in ("arr", "prr"))
            assert any(ln.split()[0] == L and arr in ln.split() and prr in ln.split()
                       for ln in rows), (name, L, arr, prr)


def test_perplexity_summary_cells_come_from_the_runs(doc):
    summary = doc.split("## Perplexity ratio to float32")[1].split("```")[1]
    for name in ("lc32.json", "l32b.json", "more3.json"):
        for _L, p in json.loads((RUNS / name).read_text())["perplexity"].items():
            for label, r in p["schemes"].items():
                line = next(ln for ln in summary.splitlines() if ln.startswith(label + " "))
                assert f"{r['ratio']:.4f}" in line, (name, label)


def test_agreement_table_counts(doc):
    rows = json.loads((RUNS / "agree.json").read_text())
    table = doc.split("## Device against CPU")[1].split("```")[1]
    for s in {r["scheme"] for r in rows}:
        mine = [r for r in rows if r["scheme"] == s]
        line = next(ln for ln in table.splitlines() if ln.startswith(s + " "))
        assert line.split()[1:] == [str(len(mine)), f"{sum(r['outputs'] for r in mine):,}",
                                   str(sum(r["mismatch"] for r in mine)),
                                   str(sum(1 for r in mine if r["stats_diff"]))]
