"""Speed ratios behind ``lowprec bench``: our codecs and attention schemes against their peers.

Installed with the package (``benchmarks/`` is not), so ``lowprec bench`` works from any
install.  Two sections, each timed **round-robin** in one process on the same input (one
untimed warm-up call per callable, so Numba compiles or loads its cache; then ``repeat``
rounds; the median is reported), which keeps the ratios steady on a shared machine:

* :func:`bench_formats` - ``lp.encode`` / ``lp.quantize`` for e4m3, e5m2 and hif8 against
  ml_dtypes ``astype`` (and its float32 round trip), torch ``.to(float8_*)`` and en-dtypes
  (``hifloat8``) when installed; each row says whether the peer's values agree with ours.
* :func:`bench_attention` - every attention scheme (:func:`lowprec.studies.main.scheme_runs`)
  against torch SDPA (float32) when torch is installed, else against a float32 numpy
  softmax attention; with the relative error against float64 attention.

``benchmarks/bench_formats.py`` and ``benchmarks/bench_attention.py`` (source checkout only)
are the full reports: larger inputs, memory floors, first-call latency, performance targets.

Numba and torch each keep an OpenMP pool; call :func:`set_omp_wait_policy` *before* torch is
imported (``lowprec bench`` does) so that one pool's idle, spinning workers do not steal the
cores the other is timed on.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

FORMATS = ("e4m3", "e5m2", "hif8")
#: attention shapes (B, H, L, d): ViT-B/16 and a 1k-token decoder
ATTENTION_SHAPES = ((1, 12, 197, 64), (1, 8, 1024, 64))
QUICK_ATTENTION_SHAPES = ((1, 4, 197, 64),)
N_DEFAULT = 1 << 22
N_QUICK = 1 << 20
INPUT_SCALE = 10.0  # standard normal * 10: most values inside the e4m3 range, some clipped


def set_omp_wait_policy(policy: str = "PASSIVE") -> str:
    """Set ``OMP_WAIT_POLICY`` unless the environment already does; returns the value in
    force.  Only effective before torch (or Numba's OpenMP layer) is loaded."""
    return os.environ.setdefault("OMP_WAIT_POLICY", policy)


def time_interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median seconds per call of each callable, timed round-robin.

    Each callable is called once untimed first; then ``repeat`` rounds time every callable
    once, in order.

    Args:
        fns: ``{name: callable}``.
        repeat: timed rounds (>= 1).

    Returns:
        ``{name: median seconds}``.

    Raises:
        ValueError: ``repeat < 1``.

    Example:
        >>> t = time_interleaved({"sum": lambda: sum(range(1000))}, 3)
        >>> t["sum"] > 0
        True
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    for f in fns.values():
        f()
    gc.collect()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def _agree(ours, theirs) -> bool:
    """Value-by-value equality in float32, NaN equal to NaN."""
    a = np.asarray(ours, dtype=np.float32)
    b = np.asarray(theirs, dtype=np.float32)
    return bool(np.array_equal(a, b, equal_nan=True))


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def bench_formats(n: int = N_DEFAULT, repeat: int = 5, formats=FORMATS, *, seed: int = 0,
                  progress: bool = False) -> dict:
    """Encode and fused-quantize throughput of lowprec against the installed peers.

    Args:
        n: float32 elements (``standard_normal * 10``).
        repeat: timed rounds per row.
        formats: among ``e4m3``, ``e5m2``, ``hif8``.
        seed: input seed.
        progress: a tqdm bar over the rows.

    Returns:
        ``{"n", "repeat", "rows": [{"op", "format", "ours_ns", "peer", "peer_ns",
        "speedup", "agree"}]}`` with times in ns per element and ``speedup = peer / ours``
        (above 1: we are faster).  Formats without an installed peer give no row.

    Raises:
        ValueError: unknown format, ``n < 1`` or ``repeat < 1``.
    """
    import ml_dtypes

    from ..formats import api as lp

    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"format {bad[0]!r} is not one of {', '.join(FORMATS)}")
    if n < 1 or repeat < 1:
        raise ValueError(f"n and repeat must be >= 1, got n={n}, repeat={repeat}")
    torch = _torch()
    try:
        import en_dtypes
    except ImportError:
        en_dtypes = None
    x = (np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
         * np.float32(INPUT_SCALE))
    t = torch.from_numpy(x) if torch is not None else None
    ml = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    if en_dtypes is not None:
        ml["hif8"] = en_dtypes.hifloat8
    tdt = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
    groups = []
    for f in formats:
        enc = {}
        quant = {}
        if f in ml:
            lib = "en-dtypes" if f == "hif8" else "ml_dtypes"
            enc[f"{lib} astype"] = (lambda d=ml[f]: x.astype(d), None)
            quant[f"{lib} round trip"] = (lambda d=ml[f]: x.astype(d).astype(np.float32), None)
        if torch is not None and f in tdt:
            d = getattr(torch, tdt[f])
            # torch's e4m3fn cast clamps overflow to +-448: compare with saturate=True
            sat = f == "e4m3"
            enc[f"torch .to({tdt[f]})"] = (lambda d=d: t.to(d), sat)
            quant["torch round trip"] = (lambda d=d: t.to(d).to(torch.float32), sat)
        if enc:
            groups.append(("encode", f, lambda f=f: lp.encode(x, f), enc))
            groups.append(("quantize", f, lambda f=f: lp.quantize(x, f), quant))
    rows = []
    bar = _bar(len(groups), "formats", progress)
    for op, f, ours, peers in groups:
        fns = {"ours": ours} | {k: v[0] for k, v in peers.items()}
        med = time_interleaved(fns, repeat)
        mine = lp.quantize(x, f)
        for name, (fn, sat) in peers.items():
            theirs = fn()
            if hasattr(theirs, "numpy"):
                theirs = theirs.to(torch.float32).numpy()
            ref = lp.quantize(x, f, saturate=True) if sat else mine
            rows.append({"op": op, "format": f, "ours_ns": med["ours"] / n * 1e9,
                         "peer": name, "peer_ns": med[name] / n * 1e9,
                         "speedup": med[name] / med["ours"],
                         "agree": _agree(ref, np.asarray(theirs).astype(np.float32))})
        bar.update()
    bar.close()
    return {"n": n, "repeat": repeat, "rows": rows}


def format_bench_formats(res: dict) -> str:
    """The table of :func:`bench_formats`."""
    head = (f"{'op':<9}{'format':<7}{'ours ns/el':>11}  {'peer':<26}{'peer ns/el':>11}"
            f"{'speedup':>9}  agree")
    lines = [f"codecs: {res['n']:,} float32 elements, median of {res['repeat']} "
             "(speedup = peer time / our time)", head, "-" * len(head)]
    for r in res["rows"]:
        lines.append(f"{r['op']:<9}{r['format']:<7}{r['ours_ns']:>11.3f}  {r['peer']:<26}"
                     f"{r['peer_ns']:>11.3f}{r['speedup']:>8.1f}x  "
                     f"{'yes' if r['agree'] else 'NO'}")
    if not res["rows"]:
        lines.append("(no peer installed: pip install ml_dtypes torch en-dtypes)")
    return "\n".join(lines)


def _numpy_attention(q, k, v):
    """float32 softmax attention in numpy (the peer when torch is missing)."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(1.0 / math.sqrt(q.shape[-1]))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v)


def bench_attention(shapes=ATTENTION_SHAPES, repeat: int = 3, runs: dict | None = None, *,
                    seed: int = 0, progress: bool = False) -> dict:
    """Seconds per call of every attention scheme run, against a float32 peer, per shape.

    Args:
        shapes: ``(B, H, L, d)`` shapes; inputs standard normal float32, non-causal.
        repeat: timed rounds.
        runs: :func:`lowprec.studies.main.scheme_runs` (default: all).
        seed: input seed.
        progress: a tqdm bar over the shapes.

    Returns:
        ``{"peer": name, "shapes": {str(shape): {label: {"seconds", "ratio", "rel_error"}}}}``
        with ``ratio = seconds / peer seconds`` (below 1: faster than the peer).
    """
    from ..kernels import attention
    from .main import scheme_runs

    runs = scheme_runs() if runs is None else runs
    torch = _torch()
    peer = "torch SDPA float32" if torch is not None else "numpy float32 softmax attention"
    out = {"peer": peer, "repeat": repeat, "shapes": {}}
    bar = _bar(len(shapes), "attention", progress)
    for shape in shapes:
        rng = np.random.default_rng(seed)
        q, k, v = (rng.standard_normal(tuple(shape), dtype=np.float32) for _ in range(3))
        ref = np.asarray(attention(q.astype(np.float64), k.astype(np.float64),
                                   v.astype(np.float64), "reference"))
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            fns = {peer: lambda tq=tq, tk=tk, tv=tv:
                   torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)}
        else:
            fns = {peer: lambda q=q, k=k, v=v: _numpy_attention(q, k, v)}
        for label, (scheme, opts) in runs.items():
            fns[label] = lambda s=scheme, o=opts, q=q, k=k, v=v: attention(q, k, v, s, **o)
        med = time_interleaved(fns, repeat)
        row = {}
        for label, sec in med.items():
            o = fns[label]()
            o = o.numpy() if hasattr(o, "numpy") else np.asarray(o)
            err = float(np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref))
            row[label] = {"seconds": sec, "ratio": sec / med[peer], "rel_error": err}
        out["shapes"][str(tuple(shape))] = row
        bar.update()
    bar.close()
    return out


def format_bench_attention(res: dict) -> str:
    """The table of :func:`bench_attention`."""
    lines = [f"attention: median s/call of {res['repeat']}, ratio = our time / {res['peer']} "
             "time, rel. error vs float64"]
    for shape, rows in res["shapes"].items():
        lines += ["", f"{shape} non-causal", f"  {'scheme':<24}{'s/call':>10}{'ratio':>9}"
                  f"{'rel.err':>11}"]
        for label, r in rows.items():
            lines.append(f"  {label:<24}{r['seconds']:>10.4f}{r['ratio']:>8.2f}x"
                         f"{r['rel_error']:>11.2e}")
    return "\n".join(lines)


def _bar(total: int, desc: str, enabled: bool):
    from .main import _bar as bar

    return bar(total, desc, enabled)


def machine_line() -> str:
    """One line: CPU count, Python, numpy, numba (threads) and torch versions."""
    import numba

    torch = sys.modules.get("torch")
    tv = f"torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else \
        "torch not loaded"
    return (f"{os.cpu_count()} cores, python {sys.version.split()[0]}, numpy {np.__version__}, "
            f"numba {numba.__version__} ({numba.get_num_threads()} threads), {tv}, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")


__all__ = ["bench_formats", "format_bench_formats", "bench_attention", "format_bench_attention",
           "time_interleaved", "set_omp_wait_policy", "machine_line", "FORMATS",
           "ATTENTION_SHAPES", "QUICK_ATTENTION_SHAPES", "N_DEFAULT", "N_QUICK"]
