#!/usr/bin/env python
"""Formats II (issue 17) on a CUDA device: every new element format (its own rounding mode,
saturating or not, toward_zero, up and stochastic) through ``lp.encode`` / ``lp.quantize``
on CUDA tensors (compiled Triton kernels) against the CPU (Numba), codes as integers and
values bit for bit (NaN by class); float32, float64 and bfloat16 input; the new MX formats
and a user format.

Usage: ``python scripts/gpu_formats2_check.py [--n 4194304]``; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import lowprec as lp

FORMATS = ("e2m1", "e2m3", "e3m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e4m3_ieee", "e3m4",
           *(f"binary8p{p}" for p in range(1, 8)), "bfloat16", "float16")


def inputs(n: int, seed: int = 0) -> np.ndarray:
    """Random float32 bit patterns plus every format's grid points and midpoints."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    for f in FORMATS:
        v = lp.get_format(f).values().astype(np.float64)
        v = np.unique(np.abs(v[np.isfinite(v)]))
        parts += [v.astype(np.float32), ((v[1:] + v[:-1]) / 2).astype(np.float32)]
    x = np.concatenate(parts)
    return np.concatenate([x, -x])


CHUNK = 1 << 16  # CPU reference in chunks below PARALLEL_MIN: serial kernels (fewer compiles)


def cpu_ref(fn, arr: np.ndarray, fmt: str, mode: str, sat: bool, kw: dict) -> np.ndarray:
    """``fn(arr, fmt, ...)`` on the CPU in chunks (the stochastic counter continues through
    ``offset``)."""
    outs = [np.asarray(fn(arr[i:i + CHUNK], fmt, mode, sat, offset=i, **kw))
            for i in range(0, arr.size, CHUNK)]
    return np.concatenate(outs)


def mismatches(a: np.ndarray, b: np.ndarray) -> int:
    """Elements that differ (float32: bit for bit, NaN equal to NaN)."""
    if a.dtype == np.float32:
        same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
        return int((~same).sum())
    return int((a != b).sum())


def main(argv=None) -> int:
    """Run every comparison; print one line per format and a total."""
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 22)
    ap.add_argument("--device", default="cuda", help="torch device (cpu: the CPU route)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    x = inputs(a.n)
    xs = {"f32": x, "f64": x.astype(np.float64)[: a.n // 4],
          "bf16": x[: a.n // 4].astype(np.float32)}
    total = 0
    t0 = time.perf_counter()
    for f in FORMATS:
        bad = 0
        own = lp.get_format(f).info.default_rounding.name.lower()
        for kind, arr in xs.items():
            t = torch.from_numpy(arr).to(dev)
            if kind == "bf16":
                t = t.to(torch.bfloat16)
                arr = t.float().cpu().numpy()
            for mode in ((own, "stochastic") if kind == "f64" else (own, "toward_zero", "up",
                                                                   "stochastic")):
                for sat in ((False, True) if mode == own else (False,)):
                    kw = dict(seed=7, sr_bits=13) if mode == "stochastic" else {}
                    c = lp.encode(t, f, mode, sat, **kw).cpu().numpy()
                    bad += mismatches(c, cpu_ref(lp.encode, arr, f, mode, sat, kw))
                    q = lp.quantize(t, f, mode, sat, **kw).cpu().numpy()
                    bad += mismatches(q, cpu_ref(lp.quantize, arr, f, mode, sat, kw))
        print(f"{f}: {bad} mismatches", flush=True)
        total += bad
    xb = x[: (a.n // 256) * 256].reshape(-1, 256)
    xb = xb[np.isfinite(xb).all(axis=1)]
    tb = torch.from_numpy(xb).to(dev)
    for f in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxint8"):
        bad = 0
        for kw in (dict(), dict(rounding="stochastic", seed=3), dict(scale_mode="rceil")):
            q, qt = lp.encode(xb, f, **kw), lp.encode(tb, f, **kw)
            bad += mismatches(q.codes, qt.codes.cpu().numpy())
            bad += mismatches(q.scales, qt.scales.cpu().numpy())
            bad += mismatches(lp.quantize(xb, f, **kw), lp.quantize(tb, f, **kw).cpu().numpy())
        print(f"{f}: {bad} mismatches", flush=True)
        total += bad
    lp.float_format(5, 6, bias=13, inf="top", nan="neg_zero", name="gpu_user")
    t = torch.from_numpy(x).to(dev)
    bad = sum(mismatches(lp.encode(t, "gpu_user", m).cpu().numpy(), lp.encode(x, "gpu_user", m))
              for m in ("nearest_even", "down"))
    print(f"user e5m6: {bad} mismatches", flush=True)
    total += bad
    print(f"total {total} mismatches: {len(FORMATS)} formats (own mode saturating or not, "
          f"toward_zero, up, stochastic; float32, bfloat16 and float64 input; "
          f"{x.size:,} float32 inputs), 4 MX formats, a user format; "
          f"{time.perf_counter() - t0:.0f} s")
    return int(total > 0)


if __name__ == "__main__":
    sys.exit(main())
