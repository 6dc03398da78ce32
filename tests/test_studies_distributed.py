"""``lowprec study`` spread over processes (issue 18 item 2, :mod:`lowprec.studies.distributed`).

The split and the merge are checked in one process with stand-in groups; one test launches the
documented entry point (``torchrun --nproc-per-node 2 -m lowprec.studies.distributed``, gloo)
on a small study and compares rank 0's report with the one-process report: equal in every
field but the times and the ``machine`` description.
"""

import json
import os
import subprocess
import sys

import pytest

from lowprec.cli import main
from lowprec.studies import distributed as D
from lowprec.studies import main as study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(study.__file__))))
#: report fields that are wall times (they differ between any two runs)
TIMES = ("seconds", "emulation_seconds", "float32_seconds")


def _timeless(obj):
    """``obj`` without its times and the ``machine`` description (where and how it ran)."""
    if isinstance(obj, dict):
        return {k: _timeless(v) for k, v in obj.items() if k not in TIMES + ("machine",)}
    if isinstance(obj, list):
        return [_timeless(v) for v in obj]
    return obj


def test_share_is_round_robin_and_covers_every_unit_once():
    for n in (0, 1, 5, 12):
        for size in (1, 2, 3, 8):
            got = sorted(i for r in range(size) for i in D.share(n, r, size))
            assert got == list(range(n))
    assert list(D.share(7, 1, 3)) == [1, 4]
    with pytest.raises(ValueError, match="rank 2 of 2"):
        D.share(4, 2, 2)


class _Rank(D.Group):
    """A stand-in for rank ``rank`` of a group: ``gather`` hands the object to ``box`` and,
    on rank 0, returns the other ranks' objects from it."""

    def __init__(self, rank, size, box):
        super().__init__(rank, size)
        object.__setattr__(self, "box", box)

    def gather(self, obj):
        self.box[self.rank] = obj
        return [self.box[r] for r in range(self.size)] if self.main else None


def test_run_units_splits_and_merges_in_plan_order():
    ran = []

    def unit(i):
        return D.Unit(("u", i), lambda: ran.append(i) or {"i": i, "sq": i * i})

    units = [unit(i) for i in range(7)]
    box: dict = {}
    for rank in (2, 1):  # the other ranks first: rank 0 gathers what they left in the box
        assert D.run_units(units, _Rank(rank, 3, box)) is None
    assert ran == [2, 5, 1, 4]
    seconds: dict = {}
    got = D.run_units(units, _Rank(0, 3, box), seconds=seconds)
    assert ran[4:] == [0, 3, 6]
    assert list(got) == [("u", i) for i in range(7)]  # plan order, not rank order
    assert got == {("u", i): {"i": i, "sq": i * i} for i in range(7)}
    assert list(seconds) == list(got) and min(seconds.values()) >= 0
    assert D.run_units(units) == got  # one process: the same dict
    with pytest.raises(ValueError, match="same key"):
        D.run_units(units + units[:1])


def test_plan_assembles_from_results_only():
    plan = D.Plan([D.Unit(("a",), lambda: 2), D.Unit(("b",), lambda: 3)],
                  lambda res: res[("a",)] * res[("b",)])
    assert plan.run() == 6


def test_distributed_needs_torchrun(monkeypatch, capsys, tmp_path):
    for var in D.ENV:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node N -m "
                                         "lowprec.studies.distributed"):
        D.init()
    assert main(["study", "--distributed", "--quick", "--model", "synthetic", "--schemes",
                 "flash", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "runs under torchrun" in capsys.readouterr().err


def test_torchrun_two_processes_equal_one_process(tmp_path):
    """The documented entry point, 2 processes over gloo: rank 0's report.json and
    summary.txt equal the one-process run's (times and machine aside)."""
    pytest.importorskip("torch.distributed.run")
    args = ["--quick", "--model", "synthetic", "--schemes", "flash,baps/e2e_hif8,intattention",
            "--no-plots", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    dist_out = tmp_path / "two"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "lowprec.studies.distributed", *args,
                          "--out", str(dist_out)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("lowprec study:") == 1  # rank 0 alone prints
    assert "over 2 processes" in res.stdout
    one_out = tmp_path / "one"
    assert main(["study", *args, "--out", str(one_out)]) == 0
    two = json.loads((dist_out / "report.json").read_text())
    one = json.loads((one_out / "report.json").read_text())
    assert two["machine"]["processes"] == 2 and one["machine"]["processes"] == 1
    assert set(two["synthetic"]["rows"]) == {"flash", "baps/e2e_hif8", "intattention"}
    assert "restart" in two
    one["files"] = [os.path.basename(f) for f in one["files"]]
    two["files"] = [os.path.basename(f) for f in two["files"]]
    assert _timeless(two) == _timeless(one)
    assert (dist_out / "summary.txt").read_text() == (one_out / "summary.txt").read_text()
