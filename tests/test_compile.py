"""Issue 12 item 20: the first compilation is announced once, and ``compile_kernels``
(``lowprec compile``) fills Numba's disk cache ahead of time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from lowprec.compile import NOTICE, compile_kernels, compile_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = NOTICE.split(" (")[0]  # "compiling Numba kernels"


def _run(code: str, cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def test_notice_once_on_a_cold_cache_and_never_on_a_warm_one(tmp_path):
    code = """
        import logging, numpy as np
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        import lowprec as lp
        lp.quantize(np.ones(8, np.float32), "e4m3")
        lp.quantize(np.ones(8, np.float64), "e5m2")
        from lowprec.compile import compiled_count
        print(compiled_count())
    """
    cold = _run(code, str(tmp_path))
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr.count(MARK) == 1, cold.stderr
    assert "lowprec: " + MARK in cold.stderr and "lowprec compile" in cold.stderr
    assert int(cold.stdout) >= 2
    warm = _run(code, str(tmp_path))
    assert warm.returncode == 0, warm.stderr
    assert MARK not in warm.stderr and int(warm.stdout) == 0


def test_cli_shows_the_notice(tmp_path):
    """The command shows the logger's INFO lines (no logging set up by the application)."""
    r = _run("""
        from lowprec.cli import _show_notices
        _show_notices()
        import numpy as np, lowprec as lp
        lp.quantize(np.ones(4, np.float32), "hif8")
    """, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("lowprec: " + MARK) == 1, r.stderr
    r = _run("""
        from lowprec.cli import main
        raise SystemExit(main(["compile", "--schemes", "index_softmax", "--formats", "e5m2",
                               "--no-progress"]))
    """, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split("compiled ")[1].split()[0]) > 0  # a cold cache: it compiled
    assert MARK not in r.stderr  # the command says it itself: no notice line besides


def test_compile_kernels_items_and_errors():
    res = compile_kernels(["flash"], ["e4m3"])
    assert set(res["items"]) == {"attention flash", "format e4m3"}
    assert all("seconds" in v for v in res["items"].values())
    assert res["compiled"] >= 0 and res["seconds"] > 0
    with pytest.raises(ValueError, match="'nope'"):
        compile_tasks(["nope"], [])
    with pytest.raises(ValueError, match="nope"):
        compile_tasks([], ["nope"])
    labels = [t[0] for t in compile_tasks(["hccs", "baps"], [])]
    assert "softmax hccs" in labels and "attention hccs" in labels
    assert sum(x.startswith("attention baps/") for x in labels) >= 2
    every = [t[0] for t in compile_tasks()]
    assert "format int8" in every and "attention intflash/half" in every
