"""Issue 16: the evaluation text, the perplexity interval, the BAPS Table 4 layout and the claims
table.  Everything here runs without a model (the SmolLM2 paths are in tests/test_models.py)."""

from __future__ import annotations

import hashlib
import importlib.resources
import lzma
import math

import numpy as np
import pytest

from lowprec.studies import claims as C
from lowprec.studies import models as SM
from lowprec.torch import models as TM


def test_eval_text_is_the_documented_file():
    raw = importlib.resources.files("lowprec.data").joinpath(TM.EVAL_TEXT_FILE).read_bytes()
    text = lzma.decompress(raw)
    # the checksum in lowprec/data/PROVENANCE.md
    assert hashlib.sha256(text).hexdigest() == \
        "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0"
    prov = importlib.resources.files("lowprec.data").joinpath("PROVENANCE.md").read_text()
    assert "Brotli" in prov and "public domain" in prov
    t = TM.eval_text()
    assert t.startswith("ALICE'S ADVENTURES IN WONDERLAND")
    assert t.rstrip().endswith("THE END")
    # hard line breaks inside paragraphs are gone, paragraphs stay
    assert "\n\n" in t and not any(line.startswith(" ") for line in t.splitlines())
    assert len(t.split()) > 26_000


def test_bootstrap_interval_is_paired_and_contains_the_ratio():
    rng = np.random.default_rng(0)
    base = [rng.gamma(2.0, 1.0, 100) for _ in range(10)]
    # a uniform shift of the NLL by d multiplies perplexity by exp(d) in every resample
    shifted = [b + 0.01 for b in base]
    r = SM.bootstrap_ratio(shifted, base)
    assert r["ratio"] == pytest.approx(math.exp(0.01))
    assert r["lo"] == pytest.approx(r["ratio"]) and r["hi"] == pytest.approx(r["ratio"])
    assert SM.noise_verdict(r["lo"], r["hi"]) == "worse"
    # noise of both signs: the interval straddles 1
    noisy = [b + rng.normal(0, 0.2, b.size) for b in base]
    r = SM.bootstrap_ratio(noisy, base, resample=25)
    assert r["units"] == 40 and r["lo"] < r["ratio"] < r["hi"]
    assert SM.noise_verdict(r["lo"], r["hi"]) == "within noise"
    # the float32 perplexity interval is an unpaired one: wide
    assert r["ref_lo"] < r["ppl_ref"] < r["ref_hi"]
    with pytest.raises(ValueError, match="same windows"):
        SM.bootstrap_ratio(base[:2], base[:3])
    with pytest.raises(ValueError, match="resample"):
        SM.bootstrap_ratio(base, base, resample=0)


def test_resample_auto_needs_enough_units():
    assert SM.resample_unit(8, 511) == "window"
    assert SM.resample_unit(4, 8191) == 2048  # 16 segments of the four 8k windows
    assert SM.resample_unit(2, 63) == 8
    assert SM.resample_unit(2, 63, "window") == "window"


def _restart_result():
    taus = {}
    for t, (arr, prr, share) in {0: (0.2, 0.96, 0.15), 1: (0.1, 0.74, 0.08),
                                 2: (0.05, 0.54, 0.04)}.items():
        taus[t] = {"arr": arr, "prr": prr, "tile_share": share, "tiles": 100, "all_tiles": 130,
                   "restarts": int(arr * 100), "paper_arr": SM_PAPER_ARR()[t],
                   "paper_prr": None, "per_layer": [arr], "per_head": [[arr]],
                   "per_call": [arr], "per_call_head": [arr]}
    return {"tokens": 2048, "block": 128, "critical": "first+diagonal", "granularity": "tile",
            "layers": 1, "heads": 1, "taus": taus}


def SM_PAPER_ARR():
    from lowprec.studies.baps import PAPER_ARR_NLP

    return PAPER_ARR_NLP


def test_restart_table_prints_paper_columns_and_factor():
    text = SM.format_restart_table(_restart_result())
    assert "10.86" in text and "4.97" in text and "2.50" in text  # paper ARR
    assert "20.00" in text and "10.00" in text and "5.00" in text  # ours
    assert "2.00" in text  # ARR(0) / ARR(1)
    assert "first+diagonal" in text and "128x128" in text


def test_verdict_rules():
    assert C.verdict("value", 0.1086, 0.1086) == "holds"
    assert C.verdict("value", 0.2, 0.1086) == "partly"
    assert C.verdict("value", 1.4, 0.0746) == "no"
    assert C.verdict("db", (22.6, 18.3, 27.0), 25.8) == "holds"  # the paper inside the spread
    assert C.verdict("db", 33.2, 31.0) == "partly"
    assert C.verdict("range", 0.25, (0.1, 0.3)) == "holds"
    assert C.verdict("range", 0.5, (0.1, 0.3)) == "partly"
    assert C.verdict("order", False, None) == "no"
    assert C.verdict("share", 15 / 21, 1.0) == "partly"
    assert C.verdict("value", None, 1.0) == "not run"
    with pytest.raises(ValueError):
        C.verdict("nope", 1.0, 1.0)


def test_claims_from_a_report_fill_the_smollm2_rows(tmp_path):
    ppl = {"tokens": 512, "windows": 8, "confidence": 0.95, "schemes": {
        "baps/e2e_hif8": {"ratio": 1.001, "ratio_ci": [0.998, 1.004], "verdict": "within noise"},
        "baps/naive_e2e": {"ratio": 1.2, "ratio_ci": [1.1, 1.3], "verdict": "worse"}}}
    report = {"models": {"smollm2": {"restart_rates": _restart_result(), "perplexity": ppl}},
              "settings": {"models": ["smollm2"], "quick": False}}
    rows = {r["key"]: r for r in C.claims_from_report(report)}
    assert rows["baps:t4:arr1"]["ours"] == "10.00" and rows["baps:t4:arr1"]["verdict"] == \
        "partly"
    assert rows["baps:t4:halving"]["verdict"] == "holds"  # 2.0 against the paper's 2.19
    assert rows["baps:t1:e2e"]["verdict"] == "holds"
    assert rows["baps:t1:naive"]["verdict"] == "holds"
    assert rows["qflash:t4:ivit:A2"]["verdict"] == "not run"  # no synthetic results given
    n = C.verdict_counts(list(rows.values()))
    assert sum(n.values()) == len(C.CLAIMS)
    path = tmp_path / "claims.md"
    C.write_claims(path, report, command="test")
    md = path.read_text()
    assert md.count("\n| BAPS |") == sum(c.paper == "BAPS" for c in C.CLAIMS)
    assert "Generated by" in md and "holds" in md


def test_docs_claims_is_generated_and_complete():
    """docs/claims.md is the generator's output: one row per claim, counts that add up."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "claims.md"
    md = path.read_text()
    assert md.startswith("# Claims of the five papers")
    assert "Generated by `lowprec.studies.claims`" in md
    table = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) - 1 == len(C.CLAIMS)
    counts = dict(part.rsplit(" ", 1) for part in
                  md.split("Counts: ")[1].splitlines()[0].split(", "))
    assert sum(int(v) for v in counts.values()) == len(C.CLAIMS)
    assert sum(f"| {v} |" in line for line in table for v in C.VERDICTS) == len(C.CLAIMS)


def test_claims_table5_and_intattention_options_rows():
    """IntAttention Table 5 rows from the perplexity rows (excess over float32, the ordering
    with and without separated intervals) and the options rows from the layer errors."""
    def row(ratio, lo, hi):
        return {"ratio": ratio, "ratio_ci": [lo, hi], "verdict": "worse"}

    ppl = {"tokens": 512, "windows": 8, "confidence": 0.95, "schemes": {
        "exaq/2": row(1.6, 1.5, 1.7), "exaq/3": row(1.09, 1.07, 1.11),
        "exaq/4": row(1.03, 1.02, 1.04), "index_softmax_only": row(1.01, 1.0, 1.02),
        "quant_only": row(1.005, 0.99, 1.02)}}
    opts = {"layers": 3, "tokens": 512, "rel_l2": {
        "per_tensor": [0.1, 0.1, 0.1], "per_channel": [0.09, 0.1, 0.2],
        "per_block": [0.09, 0.09, 0.2], "deploy": [0.1, 0.1, 0.1],
        "index_softmax_only": [0.05, 0.05, 0.05], "quant_only": [0.1, 0.1, 0.1]}}
    opts["mean_rel_l2"] = {k: sum(v) / 3 for k, v in opts["rel_l2"].items()}
    report = {"models": {"smollm2": {"perplexity": ppl, "intattention_options": opts}}}
    rows = {r["key"]: r for r in C.claims_from_report(report)}
    assert rows["intattention:t5:exaq2"]["ours"].startswith("60.00 [50.00, 70.00]")
    assert rows["intattention:t5:exaq2"]["verdict"] == "partly"  # 60 % against the paper's 40 %
    assert rows["intattention:t5:exaq3"]["verdict"] == "holds"  # 9 % against 8.6 %
    assert rows["intattention:t5:order"]["verdict"] == "holds"
    assert "intervals separate" in rows["intattention:t5:order"]["why"]
    assert "EXAQ 4-bit" in rows["intattention:t5:order"]["why"]
    assert rows["intattention:t5:qkv"]["verdict"] == "no"  # 1.01 > 1.005
    assert rows["intattention:opts:per_block"]["ours"] == "2/3"
    assert rows["intattention:opts:per_block"]["verdict"] == "partly"
    assert rows["intattention:opts:qkv"]["verdict"] == "holds"
