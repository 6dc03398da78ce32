"""Issue 12 items 17 and 19: what ``lp.emulate``'s report shows.

* item 17: ``summary()`` shows each scheme's key counters and the hazards that occurred; the
  first hazard of a context is a ``UserWarning`` naming the counter, the module and its meaning;
* item 19: a restart rate that does not apply (no restart test) is ``-`` / null, never 0.0, in
  ``summary()``, ``to_dict()``, the JSON report and the ``lowprec study`` tables.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import lowprec as lp  # noqa: E402
from lowprec.kernels import stats_classes  # noqa: E402
from lowprec.torch.report import counter_meaning  # noqa: E402


class Sdpa(nn.Module):
    def forward(self, q, k, v, **kw):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _qkv(amp=1.0, L=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, L, 8, generator=g) for _ in range(3))
    return q * amp, k * amp, v


def _table_row(table: str, name: str) -> dict:
    """``{column: cell}`` of the summary row of ``name`` (columns cut at the dashed rule)."""
    import re

    lines = table.splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[2])]
    row = next(ln for ln in lines if ln.startswith(name + " "))
    return {lines[1][a:b].strip(): row[a:b].strip() for a, b in spans}


@pytest.mark.parametrize("scheme", ["flash", "intattention", "qflash", "hccs", "ivit",
                                    "intflash"])
def test_summary_shows_key_counters(scheme):
    m = Sdpa()
    with torch.no_grad(), lp.emulate(scheme) as run:
        m(*_qkv(L=40))
    st = run.stats.total().scheme_stats
    table = run.stats.summary()
    row = _table_row(table, "<root>")
    for k in type(st)._key:
        assert row[k.removeprefix("total_")] == (format(v, ".4f") if isinstance(
            v := st.key_counts()[k], float) else str(v))
    assert "hazards: none (nonfinite_rows" in table
    assert ("ARR" in row) == (scheme == "flash")


def test_hazard_warns_once_and_summary_names_it():
    m = Sdpa()
    with pytest.warns(UserWarning) as rec:
        with torch.no_grad(), lp.emulate("flash") as run:
            m(*_qkv(1e19))                    # float32 scores overflow: NaN rows
            m(*_qkv(1e19, seed=1))
            m(*_qkv())
    msgs = [str(w.message) for w in rec if "hazard" in str(w.message)]
    assert len(msgs) == 1
    assert "nonfinite_rows" in msgs[0] and "<root>" in msgs[0] and "NaN or +-Inf" in msgs[0]
    assert rec[0].filename == __file__     # points at the user's line
    n = run.stats.total().scheme_stats.hazards["nonfinite_rows"]
    assert n > 0
    table = run.stats.summary()
    assert _table_row(table, "TOTAL")["nonfinite_rows"] == str(n)
    assert f"! hazard nonfinite_rows = {n} in 1 module(s) (<root>)" in table
    assert run.stats.to_dict()["<root>"]["hazards"]["nonfinite_rows"] == n


def test_no_hazard_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad(), lp.emulate("qflash"):
            Sdpa()(*_qkv())


def test_every_hazard_has_a_meaning():
    for cls in stats_classes().values():
        for k in ("nonfinite_rows",) + tuple(cls._hazards):
            text = counter_meaning(cls, k)
            assert "see its documentation" not in text, (cls.__name__, k)
            assert len(text) > 10


@pytest.mark.parametrize("scheme, opts", [("flash", {}), ("baps", {"config": "exp2_hif8"}),
                                          ("baps", {"config": "e2e_hif8"})])
def test_restart_rate_none_is_dash_and_null(scheme, opts, tmp_path):
    """One key tile (8 keys): no non-critical tile, so no restart rate even for e2e_hif8."""
    with torch.no_grad(), lp.emulate(scheme, **opts) as run:
        Sdpa()(*_qkv())
    assert run.stats.restart_rate is None and run.stats.peak_restart_rate is None
    row = _table_row(run.stats.summary(), "<root>")
    assert row["ARR"] == "-" and row["PRR"] == "-"
    d = run.stats.to_dict()["<root>"]
    assert d["restart_rate"] is None and d["scheme.restart_rate"] is None
    doc = json.loads(run.stats.to_json(tmp_path / "r.json"))
    assert doc["totals"]["restart_rate"] is None
    assert doc["modules"]["<root>"]["peak_restart_rate"] is None
    assert doc["calls"][0]["stats"]["restart_rate"] is None


def test_restart_rate_present_with_a_restart_test():
    with torch.no_grad(), lp.emulate("hif8", block_k=16) as run:
        Sdpa()(*_qkv(L=64))
    assert run.stats.restart_rate is not None
    assert _table_row(run.stats.summary(), "<root>")["ARR"] == format(run.stats.restart_rate,
                                                                       ".4f")


def test_study_tables_print_dash_for_no_restart_test():
    from lowprec.studies import baps as sb
    from lowprec.studies import main as study

    res = study.compare_schemes(study.synthetic_workloads(quick=True),
                                study.scheme_runs(["flash", "baps/exp2_hif8"]))
    assert res["rows"]["baps/exp2_hif8"]["decoder"]["restart_rate"] is None
    table = study.format_accuracy(res)
    for label in ("flash", "baps/exp2_hif8"):
        line = next(ln for ln in table.splitlines() if ln.startswith(label + " "))
        assert line.split()[-1] == "-"
    assert json.loads(json.dumps(study.to_jsonable(res)))["rows"]["baps/exp2_hif8"][
        "decoder"]["restart_rate"] is None
    fake = {"L": 8, "heads": 1, "seeds": (0,), "block_k": 8, "taus": [1], "arr": [None],
            "prr": [None], "per_head": {1: np.array([])}}
    assert "   -        -" in sb.format_restart_vs_tau(fake)
