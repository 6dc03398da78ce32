"""Time of lowprec's emulated attention schemes against torch SDPA (float32, CPU), in one run.

Two sections:

* **flash-scale** (issue "Emulated attention I"): ``flash`` and ``baps`` (``e2e_hif8`` and
  ``default``) at ``(1, 8, 4096, 128)``, causal and not, against
  ``torch.nn.functional.scaled_dot_product_attention`` on the same float32 inputs.
* **schemes** (issue "Emulated attention II"): every registered attention scheme at
  ``(1, 12, 197, 64)`` (ViT-B/16 shaped) and ``(1, 8, 2048, 64)``, non-causal, against SDPA;
  ``hccs`` also with given parameters (by default it calibrates on every call).

Each callable is called once untimed (Numba compiles or loads its cache; SDPA warms up), then the
callables of a row group are timed **round-robin** ``--repeat`` rounds with
``time.perf_counter``; the table gives the median seconds per call and the ratio to SDPA's
median from the same rounds.  A relative error column compares each scheme's output with float64
attention (``lp.attention(..., "reference")``) so that the times are of computations that work.

Numba and torch each keep an OpenMP pool; ``OMP_WAIT_POLICY=PASSIVE`` is set (unless already
set) so one pool's spinning workers do not steal the cores the other is timed on.  Both use the
same thread count (``--threads``, default: all cores).

The script reports and asserts nothing; the last section prints PASS/MISS for the target
(``e2e_hif8`` within 3x of SDPA).  ``python benchmarks/bench_attention.py --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np

TARGET_E2E = 3.0  # issue 3: e2e_hif8 within 3x of SDPA at (1, 8, 4096, 128)
BIG_SHAPE = (1, 8, 4096, 128)
SCHEME_SHAPES = ((1, 12, 197, 64), (1, 8, 2048, 64))
# scheme -> options used in the benchmark (every registered scheme runs with its defaults
# unless listed here)
SCHEME_OPTIONS = {"baps": {"config": "e2e_hif8"}}
HCCS_GIVEN = "hccs (given params)"
TARGET_SCHEMES = 5.0  # issue 13: every scheme within 5x of SDPA at (1, 8, 2048, 64)


def _inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    B, H, L, d = shape
    return tuple(rng.standard_normal((B, H, L, d), dtype=np.float32) for _ in range(3))


def _rel(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ok = np.isfinite(ref)
    return float(np.linalg.norm((out - ref)[ok]) / np.linalg.norm(ref[ok]))


def _time_group(fns: dict, repeat: int) -> dict:
    """Median seconds per callable, timed round-robin after one untimed call each."""
    from lowprec.studies.bench import time_interleaved

    return time_interleaved(fns, repeat)


def _row(name, sec, sdpa, err=None):
    e = f"{err:>10.2e}" if err is not None else f"{'':>10}"
    return f"  {name:<34} {sec:>9.4f} {sec / sdpa:>8.2f}x {e}"


def bench_big(torch, lp, repeat: int, shape=BIG_SHAPE, json_out=None) -> dict:
    q, k, v = _inputs(shape)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    res = {}
    for causal in (False, True):
        ref = np.asarray(lp.attention(q.astype(np.float64), k.astype(np.float64),
                                      v.astype(np.float64), "reference", causal=causal))
        cases = {
            "flash": lambda c=causal: lp.attention(q, k, v, "flash", causal=c),
            "baps e2e_hif8": lambda c=causal: lp.attention(q, k, v, "baps", config="e2e_hif8",
                                                           causal=c),
            "baps default": lambda c=causal: lp.attention(q, k, v, "baps", config="default",
                                                          causal=c),
        }
        fns = {"torch SDPA float32": lambda c=causal: torch.nn.functional.
               scaled_dot_product_attention(tq, tk, tv, is_causal=c)}
        fns.update(cases)
        med = _time_group(fns, repeat)
        sdpa = med["torch SDPA float32"]
        print(f"\n{shape} causal={causal}   (median s/call, ratio to SDPA, rel. error vs float64)")
        for name, sec in med.items():
            err = _rel(fns[name]().numpy() if name.startswith("torch") else cases[name](), ref)
            print(_row(name, sec, sdpa, err))
            res[f"{name} causal={causal}"] = {"seconds": sec, "ratio": sec / sdpa,
                                              "rel_error": err}
    return res


def _bench_shape(torch, lp, shape, names, repeat: int) -> dict:
    q, k, v = _inputs(shape, seed=1)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    ref = np.asarray(lp.attention(q.astype(np.float64), k.astype(np.float64),
                                  v.astype(np.float64), "reference"))
    fns = {"torch SDPA float32": lambda: torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv)}
    for n in names:
        opts = SCHEME_OPTIONS.get(n, {})
        fns[n] = lambda n=n, o=opts: lp.attention(q, k, v, n, **o)
    if "hccs" in names:  # hccs calibrates per call: also time it with given parameters
        _, st = lp.attention(q, k, v, "hccs", return_stats=True)
        params = st.params[0]
        fns[HCCS_GIVEN] = lambda: lp.attention(q, k, v, "hccs", params=params)
    med = _time_group(fns, repeat)
    sdpa = med["torch SDPA float32"]
    print(f"\n{shape} non-causal   (median s/call, ratio to SDPA, rel. error vs float64)")
    res = {}
    for name, sec in med.items():
        out = fns[name]()
        out = out.numpy() if hasattr(out, "numpy") else out
        err = _rel(out, ref)
        print(_row(name, sec, sdpa, err))
        res[f"{name} {shape}"] = {"seconds": sec, "ratio": sec / sdpa, "rel_error": err}
    return res


def bench_schemes(torch, lp, repeat: int, shapes=SCHEME_SHAPES) -> dict:
    res = {}
    names = list(lp.schemes())
    for shape in shapes:
        res.update(_bench_shape(torch, lp, shape, names, repeat))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds (median reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both torch and Numba")
    ap.add_argument("--section", choices=("all", "big", "schemes"), default="all")
    ap.add_argument("--big-shape", type=int, nargs=4, default=BIG_SHAPE,
                    metavar=("B", "H", "L", "D"), help="shape of the flash-scale section")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numba
    import torch

    import lowprec as lp

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(f"lowprec attention benchmark: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, threads={args.threads}, torch {torch.__version__}, "
          f"numba {numba.__version__}, python {sys.version.split()[0]}")
    res = {}
    if args.section in ("all", "big"):
        res["big"] = bench_big(torch, lp, args.repeat, tuple(args.big_shape))
    if args.section in ("all", "schemes"):
        res["schemes"] = bench_schemes(torch, lp, args.repeat)
    if "schemes" in res:
        shape = SCHEME_SHAPES[-1]
        print(f"\ntargets: every scheme within {TARGET_SCHEMES}x of SDPA at {shape}")
        for key, r in res["schemes"].items():
            if key.endswith(str(shape)) and not key.startswith("torch"):
                print(f"  {key:<48} {r['ratio']:6.2f}x "
                      f"{'PASS' if r['ratio'] <= TARGET_SCHEMES else 'MISS'}")
    if "big" in res:
        print("\ntargets")
        for causal in (False, True):
            r = res["big"][f"baps e2e_hif8 causal={causal}"]["ratio"]
            print(f"  e2e_hif8 within {TARGET_E2E}x of SDPA, causal={causal}: {r:.2f}x "
                  f"{'PASS' if r <= TARGET_E2E else 'MISS'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
