"""Execute the notebooks at full size and store them with their outputs and plots.

    python scripts/run_notebooks.py                 # 01-04 (tens of minutes on 2 cores)
    python scripts/run_notebooks.py 03_restart_rates

Each notebook named is first rebuilt from ``scripts/make_notebooks.py`` (so the stored cells
are the generator's; the others are left as they are), then run top to bottom with nbclient in
a kernel that imports this checkout's lowprec, at full size (``LOWPREC_NB_QUICK`` unset), and
written back with outputs, so that the repository page shows their tables, plots and
conclusions without running them.  CI still runs them at small sizes
(``tests/test_notebooks.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
FULL_SIZE = ("01_format_accuracy", "02_error_accumulation", "03_restart_rates",
             "04_integer_schemes")
TIMEOUT_S = 3600  # per cell


def _generator():
    """``scripts/make_notebooks.py`` as a module (its ``NOTEBOOKS`` and ``build``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  ROOT / "scripts" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_notebook(name: str, *, timeout: int = TIMEOUT_S) -> float:
    """Execute ``notebooks/<name>.ipynb`` at full size and write it back with its outputs.

    Args:
        name: the notebook's stem, e.g. ``"03_restart_rates"``.
        timeout: seconds per cell.

    Returns:
        The wall time in seconds.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell failed (the notebook is not written).
    """
    import nbclient
    import nbformat

    path = NB_DIR / f"{name}.ipynb"
    nb = _generator().build(_generator().NOTEBOOKS[name])
    env_py = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "")
                                            .split(os.pathsep) if p])
    os.environ["PYTHONPATH"] = env_py  # the kernel is a child process
    os.environ.pop("LOWPREC_NB_QUICK", None)
    os.environ.pop("MPLBACKEND", None)
    t0 = time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    nbformat.write(nb, path)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    """Run the chosen notebooks at full size, each rebuilt from its generator first."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(FULL_SIZE),
                    help=f"notebook stems (default: {' '.join(FULL_SIZE)})")
    args = ap.parse_args(argv)
    bad = [n for n in args.names if n not in FULL_SIZE]
    if bad:
        ap.error(f"not a full-size notebook: {', '.join(bad)} (choose from "
                 f"{', '.join(FULL_SIZE)})")
    for name in args.names:
        print(f"running {name} ...", flush=True)
        print(f"  {name}: {run_notebook(name):.0f} s, stored with outputs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
