#!/usr/bin/env python
"""Formats II (issue 17) on a CUDA device: every new element format (e2m1 ... e3m4,
binary8p1-p7, bfloat16, float16: its own rounding mode, saturating or not, toward_zero, up and
stochastic) through ``lp.encode`` / ``lp.quantize`` on CUDA tensors (compiled Triton kernels)
against the CPU (Numba), codes as integers and values bit for bit (NaN by class); float32,
float64 and bfloat16 input; the new MX formats (mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxint8); NVFP4
(both recipes, one and two levels, every element rounding mode, packed codes, float64 and
bfloat16 input); a user format.

Usage: ``python scripts/gpu_formats2_check.py [--n 4194304]``; exit status 1 on any mismatch.
Without a GPU, ``python scripts/gpu_formats2_check.py --interpret --n 4096`` runs the same
device code on CPU tensors in Triton's interpreter (a smoke test: slow, keep ``--n`` tiny).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import lowprec as lp  # noqa: E402  (does not import Triton: --interpret may still set it up)

FORMATS = ("e2m1", "e2m3", "e3m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e4m3_ieee", "e3m4",
           *(f"binary8p{p}" for p in range(1, 8)), "bfloat16", "float16")
MX_FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxint8")
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
NVFP4_LEVELS = (("torchao", None), ("torchao", "amax"), ("torchao", 0.37), ("te", "amax"),
                ("te", 0.37))
SR = dict(seed=7, sr_bits=13)


def inputs(n: int, seed: int = 0) -> np.ndarray:
    """``n`` random float32 bit patterns plus every format's grid points and midpoints (every
    ``k``-th one where a format has more than ``n``: the 16-bit formats at a tiny ``n``)."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    for f in FORMATS:
        v = lp.get_format(f).values().astype(np.float64)
        v = np.unique(np.abs(v[np.isfinite(v)]))
        v = v[:: -(-v.size // n)]
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


def mismatches(a, b) -> int:
    """Elements that differ (float32: bit for bit, NaN equal to NaN); torch tensors are
    brought to the host."""
    a, b = (np.asarray(v.cpu().numpy() if hasattr(v, "cpu") else v) for v in (a, b))
    if a.dtype == np.float32:
        same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
        return int((~same).sum())
    return int((a != b).sum())


def check_elements(x: np.ndarray, dev, n: int, formats=FORMATS) -> int:
    """Every element format of ``formats``: codes and values, own mode (saturating or not),
    toward_zero, up, stochastic; float32, float64 and bfloat16 input."""
    import torch

    xs = {"f32": x, "f64": x.astype(np.float64)[: n // 4], "bf16": x[: n // 4]}
    total = 0
    for f in formats:
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
                    kw = SR if mode == "stochastic" else {}
                    c = lp.encode(t, f, mode, sat, **kw)
                    bad += mismatches(c, cpu_ref(lp.encode, arr, f, mode, sat, kw))
                    q = lp.quantize(t, f, mode, sat, **kw)
                    bad += mismatches(q, cpu_ref(lp.quantize, arr, f, mode, sat, kw))
        print(f"{f}: {bad} mismatches", flush=True)
        total += bad
    return total


def check_mx(x: np.ndarray, dev) -> int:
    """The new MX formats on rows of 256 finite values: codes, scales, values."""
    import torch

    xb = x[: (x.size // 256) * 256].reshape(-1, 256)
    xb = xb[np.isfinite(xb).all(axis=1)]
    tb = torch.from_numpy(xb).to(dev)
    total = 0
    for f in MX_FORMATS:
        bad = 0
        for kw in (dict(), dict(rounding="stochastic", seed=3), dict(scale_mode="rceil")):
            q, qt = lp.encode(xb, f, **kw), lp.encode(tb, f, **kw)
            bad += mismatches(q.codes, qt.codes) + mismatches(q.scales, qt.scales)
            bad += mismatches(lp.quantize(xb, f, **kw), lp.quantize(tb, f, **kw))
        print(f"{f}: {bad} mismatches", flush=True)
        total += bad
    return total


def check_nvfp4(x: np.ndarray, dev, n: int) -> int:
    """NVFP4: both recipes, one and two levels, every element rounding mode, on rows of random
    bit patterns, random rows of many magnitudes with zero and non-finite blocks
    (``gpu_cases.nvfp4_rows``) and blocks on the recipes' rounding boundaries
    (``gpu_cases.nvfp4_ties``); codes, scales, tensor scale, values, packed codes
    (``gpu_cases.nvfp4_mismatches``); float64 and bfloat16 input."""
    import gpu_cases as C
    import torch

    sets = [x[: (x.size // 128) * 128].reshape(-1, 128),
            C.nvfp4_rows(max(8, n // C.NVFP4_N), 1), C.nvfp4_ties()]
    total = 0
    for recipe, ts in NVFP4_LEVELS:
        bad = 0
        for arr in sets:
            t = torch.from_numpy(arr).to(dev)
            for mode in MODES:
                kw = dict(recipe=recipe, tensor_scale=ts, rounding=mode,
                          **(dict(SR, offset=2**63 + 5) if mode == "stochastic" else {}))
                bad += C.nvfp4_mismatches(arr, t, kw)
        print(f"nvfp4 {recipe} tensor_scale={ts}: {bad} mismatches", flush=True)
        total += bad
    arr = sets[1]
    bad = 0
    for dtype in (torch.float64, torch.bfloat16):
        t = torch.from_numpy(arr).to(dtype)
        xc = t.double().numpy() if dtype == torch.float64 else t.float().numpy()  # exact
        for kw in (dict(tensor_scale="amax"), dict(recipe="te", axis=0, block_size=7)):
            bad += C.nvfp4_mismatches(xc, t.to(dev), kw)
    print(f"nvfp4 float64 / bfloat16 input, axis 0: {bad} mismatches", flush=True)
    return total + bad


def check_user(x: np.ndarray, dev) -> int:
    """A user format (``lp.float_format``), codes and values in three modes."""
    import torch

    lp.float_format(5, 6, bias=13, inf="top", nan="neg_zero", name="gpu_user")
    t = torch.from_numpy(x).to(dev)
    bad = 0
    for m in ("nearest_even", "down", "stochastic"):
        kw = SR if m == "stochastic" else {}
        bad += mismatches(lp.encode(t, "gpu_user", m, **kw), lp.encode(x, "gpu_user", m, **kw))
        bad += mismatches(lp.quantize(t, "gpu_user", m, **kw),
                          lp.quantize(x, "gpu_user", m, **kw))
    print(f"user e5m6: {bad} mismatches", flush=True)
    return bad


def main(argv=None) -> int:
    """Run every comparison; print one line per format and a total."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 22)
    ap.add_argument("--device", default="cuda", help="torch device (cpu: the CPU route)")
    ap.add_argument("--interpret", action="store_true",
                    help="run the device code on CPU tensors in Triton's interpreter (sets "
                         "TRITON_INTERPRET=1; no GPU needed; use a tiny --n)")
    ap.add_argument("--parts", default="elements,MX,NVFP4,user format",
                    help="comma-separated parts to run (default: all)")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="comma-separated element formats of the elements part (default: all)")
    a = ap.parse_args(argv)
    formats = tuple(a.formats.split(","))
    unknown = set(formats) - set(FORMATS)
    if unknown:
        ap.error(f"unknown element formats {sorted(unknown)}; choose from {FORMATS}")
    if a.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before lowprec.gpu's kernels are decorated
        a.device = "cpu"
    import torch

    if a.interpret:
        import warnings

        from lowprec.gpu import ops

        ops.TRITON_ON_CPU = True
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's NumPy
    dev = torch.device(a.device)
    x = inputs(a.n)
    t0 = time.perf_counter()
    total = 0
    for name, check in (("elements", lambda: check_elements(x, dev, a.n, formats)),
                        ("MX", lambda: check_mx(x, dev)),
                        ("NVFP4", lambda: check_nvfp4(x[: a.n], dev, a.n)),
                        ("user format", lambda: check_user(x, dev))):
        if name not in a.parts.split(","):
            continue
        t1 = time.perf_counter()
        total += check()
        print(f"-- {name}: {time.perf_counter() - t1:.0f} s", flush=True)
    print(f"total {total} mismatches: {len(formats)} formats (own mode saturating or not, "
          f"toward_zero, up, stochastic; float32, bfloat16 and float64 input; "
          f"{x.size:,} float32 inputs), {len(MX_FORMATS)} MX formats, NVFP4 "
          f"({len(NVFP4_LEVELS)} recipe/level pairs x {len(MODES)} modes), a user format; "
          f"{'interpreter, ' if a.interpret else ''}{time.perf_counter() - t0:.0f} s")
    return int(total > 0)


if __name__ == "__main__":
    sys.exit(main())
