#!/usr/bin/env python
"""On a CUDA machine: the GPU codecs against the Numba path, exhaustively where possible.

Sections (each prints one line per comparison and adds it to the JSON report):

* ``all32``: all 2**32 float32 bit patterns for hif8, e4m3, e5m2 x the five deterministic modes
  (+ hybrid for hif8) x saturate, codes and fused values;
* ``stochastic``: 2**28 float32 patterns spread over all exponents x three seeds x two
  ``sr_bits`` per format (saturate alternating), codes and values, each chunk with its start
  as ``offset`` (so the chunked GPU calls must equal the counter of one whole call);
* ``inputs``: every float16 and bfloat16 pattern and 2**22 float64 values (53-bit, every
  exponent of the format, plus random bit patterns) per format x mode x saturate;
* ``mx``: MXFP8 on a 4096 x 4096 tensor (random and edge rows, Inf/NaN) for both element
  formats x scale modes x rounding modes x non-finite policies, axis -1, plus axis 0, partial
  and long blocks, float64/bfloat16 inputs;
* ``int``: INT8/UINT8 on a 2**24-element tensor for every granularity x symmetric x mode.

Codes are compared as integers and values bit for bit with NaN by class, on the GPU (the CPU
reference is copied up through pinned memory).  The CPU side runs the Numba path's serial
kernels in threads over slices (they release the GIL): the same code as the parallel kernels,
with a fraction of their compile time.  Before the sweep, ``--warm`` worker processes compile
every Triton variant the sweep uses into Triton's disk cache, in parallel.

Usage::

    python scripts/gpu_exhaustive.py                 # everything (a few minutes, 16 cores)
    python scripts/gpu_exhaustive.py --sections all32 --formats e4m3
    python scripts/gpu_exhaustive.py --quick         # 2**28 patterns in all32 (a smoke run)

Writes ``gpu_exhaustive.json`` to ``$OUT`` when that variable is set (or to ``--json``).
Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

FORMATS = ("hif8", "e4m3", "e5m2")
DET = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
CHUNK = 1 << 26
THREADS = os.cpu_count() or 4


def _modes(fmt):
    return DET + (("hybrid",) if fmt == "hif8" else ())


def _spec(fmt):
    from lowprec.formats.hif8 import HIF8_SPEC
    from lowprec.formats.minifloat import SPECS

    return {"hif8": HIF8_SPEC, **SPECS}[fmt]


class Report:
    """Mismatch counts of every comparison, printed and collected for the JSON."""

    def __init__(self):
        self.rows = []
        self.t0 = time.perf_counter()

    def add(self, section, name, mismatches, n, seconds, first=None):
        r = dict(section=section, name=name, mismatches=int(mismatches), elements=int(n),
                 seconds=round(seconds, 2))
        if first:
            r["first"] = first
        self.rows.append(r)
        print(f"[{section}] {name}: {mismatches} mismatches / {n} ({seconds:.1f} s)",
              flush=True)

    def summary(self):
        bad = sum(r["mismatches"] for r in self.rows)
        return dict(comparisons=len(self.rows), mismatches=bad,
                    elements=sum(r["elements"] for r in self.rows),
                    seconds=round(time.perf_counter() - self.t0, 1), rows=self.rows)


# --------------------------------------------------------------------------------------------
# CPU reference: the Numba kernels on slices, in threads


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(THREADS)
    return _POOL


def _slices(n):
    step = -(-n // THREADS)
    step = (step + 63) // 64 * 64
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def cpu_float(fmt, bits, out, mode, sat, seed=0, sr_bits=32, offset=0):
    """``minifloat.run_kernel`` on ``bits`` into ``out`` with the serial kernels in threads."""
    from lowprec.formats.minifloat import _FAST_MODES, make_fast32_kernel, make_kernel

    spec = _spec(fmt)
    want_value = out.dtype == np.float32
    if bits.dtype == np.uint32 and mode in _FAST_MODES:
        kern = make_fast32_kernel(spec, mode, sat, want_value)[0]
        o = out.view(np.uint32) if want_value else out

        def job(a, b):
            kern(bits[a:b], o[a:b])
    else:
        kern = make_kernel(spec, bits.dtype == np.uint64, mode, sat, want_value)[0]

        def job(a, b):
            off = np.uint64((offset + a) % 2**64).view(np.int64)
            kern(bits[a:b], out[a:b], np.uint64(seed % 2**64), np.int64(sr_bits), off)

    list(_pool().map(lambda ab: job(*ab), _slices(bits.size)))


_FILL = None


def _fill_arange(buf, start):
    """``buf[i] = start + i`` (uint32 bit patterns), in threads."""
    global _FILL
    if _FILL is None:
        from numba import njit

        @njit(nogil=True, cache=True)
        def fill(b, s):
            for i in range(b.shape[0]):
                b[i] = np.uint32(s + i)

        _FILL = fill
    list(_pool().map(lambda ab: _FILL(buf[ab[0]:ab[1]], np.int64(start + ab[0])),
                     _slices(buf.size)))


# --------------------------------------------------------------------------------------------
# GPU comparison helpers


def _count_codes(got, pinned):
    """Mismatches of GPU codes against the CPU codes held in the pinned buffer."""
    import torch

    w = pinned.to(got.device, non_blocking=True)
    return torch.count_nonzero(got != w)


def _count_values(got, pinned):
    """Mismatches of GPU values against the CPU values (their int32 bits, pinned), NaN by
    class."""
    import torch

    w = pinned.to(got.device, non_blocking=True)
    g = got.view(torch.int32)
    gn = torch.isnan(got)
    wn = torch.isnan(w.view(torch.float32))
    return torch.count_nonzero(~((g == w) | (gn & wn)))


def _pinned(n, dev):
    """Pinned host buffers the CPU reference writes into directly (codes, value bits)."""
    import torch

    p8 = torch.empty(n, dtype=torch.uint8)
    p32 = torch.empty(n, dtype=torch.int32)
    if dev != "cpu":
        p8, p32 = p8.pin_memory(), p32.pin_memory()
    return p8, p32, p8.numpy(), p32.numpy().view(np.float32)


def _sync(dev):
    import torch

    if dev != "cpu":
        torch.cuda.synchronize()


def _np_of(t):
    """The NumPy array of a CPU tensor (bfloat16 as ml_dtypes): the CPU reference must take
    the NumPy route, never the torch one (which --device cpu sends to the interpreter)."""
    import torch

    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _first_bad_codes(bits, got, want):
    g = got.cpu().numpy()
    i = np.flatnonzero(g != want)[:4]
    return [[hex(int(bits[j])), int(g[j]), int(want[j])] for j in i]


# --------------------------------------------------------------------------------------------
# sections


def sweep_all32(rep, formats, log2, dev, modes=None):
    import torch

    import lowprec as lp

    total = 1 << log2
    n = min(CHUNK, total)
    bits = np.empty(n, np.uint32)
    pin8, pin32, codes, vals = _pinned(n, dev)
    for fmt in formats:
        for mode in _modes(fmt):
            if modes and mode not in modes:
                continue
            m = int(lp.Rounding[mode.upper()])
            for sat in (False, True):
                t0 = time.perf_counter()
                bc = torch.zeros((), dtype=torch.int64, device=dev)
                bv = torch.zeros((), dtype=torch.int64, device=dev)
                first = None
                for start in range(0, total, n):
                    xg = (torch.arange(start, start + n, dtype=torch.int64, device=dev)
                          .to(torch.int32).view(torch.float32))
                    gc = lp.encode(xg, fmt, mode, sat)
                    gv = lp.quantize(xg, fmt, mode, sat)
                    _fill_arange(bits, start)  # the CPU runs while the GPU works
                    cpu_float(fmt, bits, codes, m, sat)
                    cpu_float(fmt, bits, vals, m, sat)
                    bc += _count_codes(gc, pin8)
                    bv += _count_values(gv, pin32)
                    _sync(dev)  # before the pinned buffers are reused
                    if first is None and int(bc) + int(bv):
                        first = _first_bad_codes(bits, gc, codes)
                nc, nv = int(bc), int(bv)
                dt = time.perf_counter() - t0
                tag = f"{fmt} {mode} {'sat' if sat else 'nonsat'}"
                rep.add("all32", tag + " codes", nc, total, dt / 2, first)
                rep.add("all32", tag + " values", nv, total, dt / 2)


def sweep_stochastic(rep, formats, log2, dev):
    import torch

    import lowprec as lp

    total = 1 << log2
    n = min(CHUNK, total)
    # 16 * i + (i mod 16): every exponent and sign, varied low bits; made once, on both sides
    i = np.arange(total, dtype=np.uint64)
    bits_all = ((i << np.uint64(4)) | (i & np.uint64(15))).astype(np.uint32)
    del i
    xg_all = torch.from_numpy(bits_all.view(np.int32)).to(dev).view(torch.float32)
    pin8, pin32, codes, vals = _pinned(n, dev)
    sr = int(lp.Rounding.STOCHASTIC)
    for fmt in formats:
        for si, seed in enumerate((0, 12345, 0xDEADBEEFCAFEF00D)):
            for k in (8, 32):
                sat = (si + k) % 2 == 1
                t0 = time.perf_counter()
                bc = torch.zeros((), dtype=torch.int64, device=dev)
                bv = torch.zeros((), dtype=torch.int64, device=dev)
                for start in range(0, total, n):
                    bits = bits_all[start:start + n]
                    xg = xg_all[start:start + n]
                    kw = dict(seed=seed, sr_bits=k, offset=start)
                    gc = lp.encode(xg, fmt, "stochastic", sat, **kw)
                    gv = lp.quantize(xg, fmt, "stochastic", sat, **kw)
                    cpu_float(fmt, bits, codes, sr, sat, seed, k, start)
                    cpu_float(fmt, bits, vals, sr, sat, seed, k, start)
                    bc += _count_codes(gc, pin8)
                    bv += _count_values(gv, pin32)
                    _sync(dev)  # before the pinned buffers are reused
                dt = time.perf_counter() - t0
                tag = f"{fmt} seed={seed:#x} sr_bits={k} {'sat' if sat else 'nonsat'}"
                rep.add("stochastic", tag + " codes", int(bc), total, dt / 2)
                rep.add("stochastic", tag + " values", int(bv), total, dt / 2)


def sweep_inputs(rep, formats, quick, dev):
    """float16 and bfloat16: every pattern, every mode and saturation; float64: edges and
    random 53-bit values, every mode non-saturating and the format's own mode saturating (the
    CPU reference of each float64 combination is one more Numba compilation)."""
    import gpu_cases as C
    import torch

    import lowprec as lp
    from lowprec.formats import _arrays as A

    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    nlog = 10 if dev == "cpu" else (16 if quick else 20)
    if dev == "cpu":
        h = h[::64]
    own = {"hif8": "nearest_away", "e4m3": "nearest_even", "e5m2": "nearest_even"}
    for fmt in formats:
        f64 = np.concatenate([C.edge_bits64(fmt).view(np.float64),
                              C.random_float64(1 << nlog, 7, fmt)])
        b64 = A.float_bits(f64)
        f64g = torch.from_numpy(f64).to(dev)
        for mode in C.modes(fmt):
            m = int(lp.Rounding[mode.upper()])
            for sat in (False, True):
                t0 = time.perf_counter()
                bad = total = 0
                kw = dict(seed=99, offset=5) if mode == "stochastic" else {}
                for name in ("float16", "bfloat16"):
                    xt = torch.from_numpy(h.view(np.int16)).view(getattr(torch, name))
                    xc = _np_of(xt)
                    gc = lp.encode(xt.to(dev), fmt, mode, sat, **kw).cpu().numpy()
                    gv = lp.quantize(xt.to(dev), fmt, mode, sat, **kw).cpu().numpy()
                    bad += C.count_code_mismatches(gc, lp.encode(xc, fmt, mode, sat, **kw))
                    bad += C.count_value_mismatches(gv, lp.quantize(xc, fmt, mode, sat, **kw))
                    total += 2 * h.size
                if mode != "hybrid" and (not sat or mode == own[fmt]):
                    wc = np.empty(f64.size, np.uint8)
                    wv = np.empty(f64.size, np.float32)
                    cpu_float(fmt, b64, wc, m, sat, 99, 32, 5)
                    cpu_float(fmt, b64, wv, m, sat, 99, 32, 5)
                    gc = lp.encode(f64g, fmt, mode, sat, **kw).cpu().numpy()
                    gv = lp.quantize(f64g, fmt, mode, sat, **kw).cpu().numpy()
                    bad += C.count_code_mismatches(gc, wc) + C.count_value_mismatches(gv, wv)
                    total += 2 * f64.size
                rep.add("inputs", f"{fmt} {mode} {'sat' if sat else 'nonsat'} f16+bf16"
                        + ("+f64" if total > 4 * h.size else ""), bad, total,
                        time.perf_counter() - t0)


def _mx_cpu(x, fmt, kw, want_value):
    """MX reference on row slices in threads (the serial Numba block kernel releases the
    GIL); the counter offset of each slice is its first flat index (axis -1 only)."""
    import lowprec as lp

    rows, n = x.shape
    sl = _slices(rows)
    fn = lp.quantize if want_value else lp.encode

    def job(ab):
        a, b = ab
        k = dict(kw, offset=(kw.get("offset", 0) + a * n) % 2**64)
        return fn(x[a:b], fmt, **k)

    parts = list(_pool().map(job, sl))
    if want_value:
        return np.concatenate(parts)
    return (np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts]))


def sweep_mx(rep, quick, dev):
    import gpu_cases as C
    import torch

    import lowprec as lp
    from lowprec.formats.mx import SCALE_MODES

    rows, n = (32, 256) if dev == "cpu" else ((512, 1024) if quick else (2048, 4096))
    x = C.mx_blocks(rows, n, 21)
    xg = torch.from_numpy(x).to(dev)
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
        for smode in SCALE_MODES:
            for mode in DET + ("stochastic",):
                for nonfinite in ("nan", "saturate"):
                    t0 = time.perf_counter()
                    kw = dict(scale_mode=smode, rounding=mode, nonfinite=nonfinite, seed=3,
                              sr_bits=16)
                    wc, ws = _mx_cpu(x, fmt, kw, False)
                    wv = _mx_cpu(x, fmt, kw, True)
                    q = lp.encode(xg, fmt, **kw)
                    gv = lp.quantize(xg, fmt, **kw)
                    bad = (C.count_code_mismatches(q.codes.cpu().numpy(), wc)
                           + C.count_code_mismatches(q.scales.cpu().numpy(), ws)
                           + C.count_value_mismatches(gv.cpu().numpy(), wv)
                           + C.count_value_mismatches(lp.decode(q).cpu().numpy(), wv))
                    rep.add("mx", f"{fmt} {smode} {mode} {nonfinite}", bad, 3 * x.size,
                            time.perf_counter() - t0)
    # other layouts and input kinds, CPU reference in one call
    small = x[:256, :1000] if dev != "cpu" else x[:16, :200]
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
        for axis, k, dtype in ((0, 32, "float32"), (-1, 7, "float32"), (-1, 3000, "float32"),
                               (-1, 32, "float64"), (-1, 32, "bfloat16"), (1, 16, "float16")):
            t0 = time.perf_counter()
            xt = torch.from_numpy(np.clip(small, -6e4, 6e4) if dtype == "float16" else small)
            xt = xt.to(getattr(torch, dtype))
            kw = dict(axis=axis, block_size=k, rounding="stochastic", seed=8)
            want = lp.quantize(_np_of(xt), fmt, **kw)
            got = lp.quantize(xt.to(dev), fmt, **kw).cpu().numpy()
            wq = lp.encode(_np_of(xt), fmt, **kw)
            gq = lp.encode(xt.to(dev), fmt, **kw)
            bad = (C.count_value_mismatches(got, want)
                   + C.count_code_mismatches(gq.codes.cpu().numpy(), wq.codes)
                   + C.count_code_mismatches(gq.scales.cpu().numpy(), wq.scales))
            rep.add("mx", f"{fmt} axis={axis} k={k} {dtype}", bad, 2 * small.size,
                    time.perf_counter() - t0)


def sweep_int(rep, quick, dev):
    import gpu_cases as C
    import torch

    import lowprec as lp

    shape = (4, 8, 64) if dev == "cpu" else ((16, 64, 1024) if quick else (64, 64, 1024))
    x = C.int_inputs(shape, 31)
    xg = torch.from_numpy(x).to(dev)
    grans = [("per_tensor", {}), ("per_channel", {"axis": 1}), ("per_channel", {"axis": 2}),
             ("per_token", {}), ("per_block", {"axis": -1, "block_size": 96}),
             ("per_block", {"axis": 0, "block_size": 7})]
    for fmt in ("int8", "uint8"):
        for gi, (g, gkw) in enumerate(grans):
            for sym in (True, False):
                modes = (DET + ("stochastic",)) if gi == 0 else ("nearest_even", "down",
                                                                  "stochastic")
                for mode in modes:
                    t0 = time.perf_counter()
                    kw = dict(granularity=g, symmetric=sym, rounding=mode, seed=4,
                              sr_bits=32, **gkw)
                    want = lp.quantize(x, fmt, **kw)
                    got = lp.quantize(xg, fmt, **kw).cpu().numpy()
                    wq = lp.encode(x, fmt, **kw)
                    gq = lp.encode(xg, fmt, **kw)
                    bad = (C.count_value_mismatches(got, want)
                           + C.count_code_mismatches(gq.codes.cpu().numpy(), wq.codes)
                           + C.count_value_mismatches(gq.scales.cpu().numpy(), wq.scales)
                           + C.count_value_mismatches(lp.decode(gq).cpu().numpy(),
                                                      lp.decode(wq)))
                    if not sym:
                        bad += C.count_code_mismatches(gq.zero_points.cpu().numpy(),
                                                       wq.zero_points)
                    rep.add("int", f"{fmt} {g}{gkw} sym={sym} {mode}", bad, 2 * x.size,
                            time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# warm-up: compile the Triton variants in parallel processes (Triton's disk cache)


def warm_calls(sections, formats):
    """Small calls that launch every kernel variant the sweep uses (same specialisations)."""
    import gpu_cases as C

    calls = []
    for fmt in formats:
        for mode in C.modes(fmt):
            for sat in (False, True):
                for dt in ("float32", "float64", "float16"):
                    if dt == "float64" and mode == "hybrid":
                        continue
                    kw = dict(seed=1) if mode == "stochastic" else {}
                    calls.append(("float", fmt, dt, dict(rounding=mode, saturate=sat, **kw)))
    if "mx" in sections:
        for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
            for mode in DET + ("stochastic",):
                for dt in ("float32", "float64", "bfloat16"):
                    for k in (32, 3000):
                        calls.append(("mx", fmt, dt, dict(rounding=mode, seed=1,
                                                          block_size=k)))
    if "int" in sections:
        for mode in DET + ("stochastic",):
            calls.append(("int", "int8", "float32", dict(rounding=mode, seed=1)))
    return calls


def _warm_worker(args):
    calls, dev = args
    import torch

    import lowprec as lp

    for kind, fmt, dt, kw in calls:
        x = torch.randn(4096 * 3, device=dev).to(getattr(torch, dt))
        if kind == "float":
            lp.encode(x, fmt, **kw)
            lp.quantize(x, fmt, **kw)
            lp.decode(lp.encode(x, fmt, **kw), fmt)
        else:
            lp.decode(lp.encode(x.reshape(3, 4096), fmt, **kw))
            lp.quantize(x.reshape(3, 4096), fmt, **kw)
    torch.cuda.synchronize()
    return len(calls)


def warm(sections, formats, jobs, dev):
    import multiprocessing as mp

    calls = warm_calls(sections, formats)
    t0 = time.perf_counter()
    parts = [(calls[i::jobs], dev) for i in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        n = sum(pool.map(_warm_worker, parts))
    print(f"[warm] {n} calls compiled in {jobs} processes: {time.perf_counter() - t0:.1f} s",
          flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="all32,stochastic,inputs,mx,int")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--modes", default=None, help="all32: only these modes (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--all32-log2", type=int, default=None,
                    help="patterns of the all32 section: 2**N from 0 (default 32; 28 quick)")
    ap.add_argument("--sr-log2", type=int, default=None,
                    help="patterns per stochastic run: 2**N (default 28; 24 quick)")
    ap.add_argument("--device", default="cuda",
                    help="cuda (default); cpu runs the kernels in Triton's interpreter "
                         "(set TRITON_INTERPRET=1; a check of this script, tiny sizes)")
    ap.add_argument("--warm", type=int, default=min(16, THREADS),
                    help="processes that compile the Triton variants first (0: none)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    dev = a.device
    if dev != "cpu" and not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    if dev == "cpu":
        import gpu_cases  # noqa: F401

        from lowprec.gpu import ops

        ops.TRITON_ON_CPU = True  # CPU tensors take the device path (interpreter)
    sections = a.sections.split(",")
    formats = tuple(a.formats.split(","))
    log32 = a.all32_log2 if a.all32_log2 is not None else (28 if a.quick else 32)
    logsr = a.sr_log2 if a.sr_log2 is not None else (24 if a.quick else 28)
    rep = Report()
    if a.warm and dev != "cpu":
        warm(sections, formats, a.warm, dev)
    modes = a.modes.split(",") if a.modes else None
    runs = {"all32": lambda: sweep_all32(rep, formats, log32, dev, modes),
            "stochastic": lambda: sweep_stochastic(rep, formats, logsr, dev),
            "inputs": lambda: sweep_inputs(rep, formats, a.quick, dev),
            "mx": lambda: sweep_mx(rep, a.quick, dev),
            "int": lambda: sweep_int(rep, a.quick, dev)}
    import triton

    path = a.json or (os.path.join(os.environ["OUT"], "gpu_exhaustive.json")
                      if os.environ.get("OUT") else None)

    def save():
        summ_ = dict(rep.summary(), device=torch.cuda.get_device_name() if dev != "cpu"
                     else "cpu", torch=torch.__version__, triton=triton.__version__,
                     quick=a.quick, all32_log2=log32, sr_log2=logsr, sections=sections)
        if path:
            with open(path, "w") as fh:
                json.dump(summ_, fh, indent=1)

    for s in sections:
        runs[s]()
        save()  # after each section: a run cut short still reports what it finished
    summ = rep.summary()
    print(f"TOTAL: {summ['mismatches']} mismatches in {summ['comparisons']} comparisons, "
          f"{summ['elements']} elements, {summ['seconds']} s")
    return 1 if summ["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
