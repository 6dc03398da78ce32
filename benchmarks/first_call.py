"""First-call latency of lowprec in fresh interpreters, with and without SciPy importable.

Every number is the median over ``--runs`` fresh ``python`` processes (Numba's disk cache is
populated by one untimed process first).  Each process reports:

* ``import lowprec``: the package import alone (numpy is imported before the clock starts);
* ``first encode``: the first ``lp.encode(np.ones(1000, np.float32), fmt)`` after it; this pays
  for importing ``lowprec.formats`` and Numba and for loading the cached kernel;
* ``second encode``: the same call again (the steady state, for scale).

A second kind of process times the phases of that first call one after the other:
``import numba``, ``import lowprec.formats`` (the codec modules, kernels not yet built),
Numba's target-context initialisation (``cpu_target.target_context.refresh()``, which Numba runs
before it loads the first cached function; it imports Numba's NumPy/linear-algebra support, and
``numba.np.arraymath`` probes for BLAS by importing ``scipy.linalg.cython_blas``), and the encode
call itself (kernel build, cache index lookup, loading the machine code).

"no scipy" processes hide SciPy with an import blocker (``sys.meta_path``) installed before
anything else is imported, to show what the same machine gives where SciPy is not installed.
The two settings are run round-robin, so a slow spell of a shared machine hits both alike.

Usage::

    python benchmarks/first_call.py                 # 7 runs per setting, e4m3
    python benchmarks/first_call.py --runs 11 --fmt hif8

It reports; it asserts nothing and exits 0 (unless a child process fails).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

BLOCK_SCIPY = """
import sys
class _NoScipy:
    def find_spec(self, name, path=None, target=None):
        if name == "scipy" or name.startswith("scipy."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by first_call.py)")
        return None
sys.meta_path.insert(0, _NoScipy())
"""

CALL = """
import json, sys, time
import numpy as np
x = np.ones(1000, np.float32)
t0 = time.perf_counter()
import lowprec as lp
t1 = time.perf_counter()
lp.encode(x, FMT)
t2 = time.perf_counter()
lp.encode(x, FMT)
t3 = time.perf_counter()
print(json.dumps({"import lowprec": t1 - t0, "first encode": t2 - t1, "second encode": t3 - t2,
                  "scipy imported": "scipy.linalg" in sys.modules}))
"""

PHASES = """
import json, sys, time
import numpy as np
x = np.ones(1000, np.float32)
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
import lowprec as lp
import lowprec.formats.api
t2 = time.perf_counter()
from numba.core.registry import cpu_target
cpu_target.target_context.refresh()
t3 = time.perf_counter()
lp.encode(x, FMT)
t4 = time.perf_counter()
print(json.dumps({"import numba": t1 - t0, "import lowprec.formats": t2 - t1,
                  "numba target refresh": t3 - t2, "encode call": t4 - t3,
                  "sum": t4 - t0}))
"""


def run_child(body: str, fmt: str, block_scipy: bool) -> dict:
    """Run one fresh interpreter; return the JSON dict it prints."""
    src = (BLOCK_SCIPY if block_scipy else "") + body.replace("FMT", repr(fmt))
    res = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        raise RuntimeError(f"child failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def scipy_installed() -> bool:
    """True if SciPy can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("scipy") is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="First-call latency of lowprec in fresh "
                                             "interpreters (median of several runs).")
    ap.add_argument("--runs", type=int, default=7, help="processes per setting (default 7)")
    ap.add_argument("--fmt", default="e4m3", help="format encoded (default e4m3)")
    ap.add_argument("--json", metavar="PATH", help="also write the samples to this file")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")

    settings = [("scipy", False), ("no scipy", True)] if scipy_installed() else \
        [("no scipy (not installed)", False)]
    run_child(CALL, args.fmt, False)  # populate Numba's disk cache (untimed)
    samples: dict = {(name, kind): [] for name, _ in settings for kind in ("call", "phases")}
    for _ in range(args.runs):
        for name, block in settings:
            samples[name, "call"].append(run_child(CALL, args.fmt, block))
            samples[name, "phases"].append(run_child(PHASES, args.fmt, block))

    print(f"first-call latency, lp.encode(np.ones(1000, np.float32), {args.fmt!r}), warm Numba "
          f"disk cache; median of {args.runs} fresh processes per setting (s)")
    for kind in ("call", "phases"):
        keys = [k for k in samples[settings[0][0], kind][0] if k != "scipy imported"]
        print(f"\n{'':<24}" + "".join(f"{name:>26}" for name, _ in settings))
        for k in keys:
            row = f"{k:<24}"
            for name, _ in settings:
                vals = [s[k] for s in samples[name, kind]]
                row += f"{statistics.median(vals):>12.3f} [{min(vals):.3f}-{max(vals):.3f}]"
            print(row)
        if kind == "call":
            row = f"{'scipy.linalg imported':<24}"
            for name, _ in settings:
                row += f"{str(samples[name, kind][0]['scipy imported']):>26}"
            print(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({f"{n}|{k}": v for (n, k), v in samples.items()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
