"""Throughput of lowprec's 8-bit float codecs against peer libraries, measured in one run.

Every number in the printed table is the median, over ``--repeat`` timed calls, of wall time
(``time.perf_counter``) divided by the element count, in nanoseconds per element.  Each callable
is called once untimed first (Numba compiles, peers warm their caches); then each row's
callables (ours, its peers, its memory floor) are timed round-robin, so a slow spell of the
machine hits them alike.  Peers run in the same process on the same input:

* encode (float32 -> uint8 codes): ``lp.encode`` vs ml_dtypes ``x.astype(float8_*)`` and torch
  ``t.to(torch.float8_*)``; hif8 vs en-dtypes ``x.astype(hifloat8)``.
* fused quantize (float32 -> float32 on the format's grid): ``lp.quantize`` vs the round trip
  ``x.astype(f8).astype(np.float32)`` (and torch's ``t.to(f8).to(torch.float32)``).
* memory floor: the cheapest conversion numpy can do with the same bytes in and out
  (``x.astype(np.uint8)``, ``np.copyto(out_u8, x, casting="unsafe")``; float32 copy for quantize).
* decode, other rounding modes, float64 input: for information.
* first-call latency of a fresh interpreter (Numba disk cache populated).

The input is ``standard_normal * 10`` in float32 with about 0.1 % specials (NaN, +-Inf, +-0,
subnormals, underflow, overflow).  The "check" column compares our result with each peer's,
value by value (NaN == NaN), so the ratios are between computations that agree.

Numba (threading layer "omp") and torch each run their own OpenMP pool.  The script sets
``OMP_WAIT_POLICY=PASSIVE`` (unless the environment already sets it; see ``--omp-wait-policy``)
so that one pool's idle, spinning workers do not steal the cores the other is timed on.

The script reports; it asserts nothing.  A "targets" section at the end says PASS or MISS for
each performance goal.  Run ``python benchmarks/bench_formats.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numba
import numpy as np

import lowprec as lp

try:
    import en_dtypes
except ImportError:  # en-dtypes is an optional peer (hif8 reference)
    en_dtypes = None

torch = None  # optional peer; imported by main() after the OpenMP wait policy is set

N_DEFAULT = 1 << 24
REPEAT_DEFAULT = 7
SEED = 0
INPUT_SCALE = 10.0  # standard normal * 10: most values inside the e4m3 range, some clipped
SPECIAL_STRIDE = 1024  # one special value every SPECIAL_STRIDE elements (~0.1 %)
SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0,
     1e-40,  # float32 subnormal
     1e-8, -1e-8,  # underflow every 8-bit format
     1e6, -1e6,  # overflow e4m3 and e5m2
     448.0, 57344.0, 32768.0],  # e4m3 max, e5m2 max, hif8 max
    dtype=np.float32,
)

# Performance goals checked in the "targets" section.
TARGET_ENCODE_VS_ML_DTYPES = 8.0
TARGET_ENCODE_VS_TORCH = 1.5
TARGET_HIF8_VS_EN_DTYPES = 8.0
TARGET_QUANTIZE_VS_ROUND_TRIP = 10.0
TARGET_FLOOR_PERCENT = 30.0
TARGET_FIRST_CALL_S = 0.5

FIRST_CALL_SNIPPET = (
    "import time, numpy as np; import lowprec as lp; x=np.ones(1000,np.float32); "
    "t=time.perf_counter(); lp.encode(x,'e4m3'); print(time.perf_counter()-t)"
)
IMPORT_AND_CALL_SNIPPET = (
    "import time, numpy as np; t=time.perf_counter(); import lowprec as lp; "
    "x=np.ones(1000,np.float32); lp.encode(x,'e4m3'); print(time.perf_counter()-t)"
)

# Numba's "omp" threading layer and torch each load their own libgomp.  By default an idle
# libgomp worker spins for milliseconds after each parallel region, so on a machine with few
# cores the other library's workers lose whole scheduler slices after every switch (up to 2x on
# both sides, measured on 2 cores).  PASSIVE makes idle workers sleep at once: each library is
# then timed as if it ran alone.  libgomp reads the variable when it is loaded.
OMP_POLICY_DEFAULT = "PASSIVE"

ML_F8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
TORCH_F8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


# ------------------------------------------------------------------------------------------
# Timing and comparison


@dataclass
class Timing:
    """Median and samples of one callable, in ns per element."""

    ns: float
    samples: list[float]


def time_interleaved(fns: list[Callable[[], object]], n: int, repeat: int):
    """Time several callables round-robin: one untimed warm-up call each, then ``repeat``
    rounds in which every callable is timed once.

    Interleaving spreads slow spells of a shared machine over all the callables compared, so
    their ratios are steadier than those of back-to-back runs.  Returns the timings and the
    warm-up results (for the agreement check).
    """
    results = [fn() for fn in fns]
    gc.collect()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, samples, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) / n * 1e9)
    return [Timing(statistics.median(s), s) for s in samples], results


def as_f32(a) -> np.ndarray:
    """float32 numpy view of a result (numpy float8 / float32, or a torch tensor)."""
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.to(torch.float32).numpy()
    return np.asarray(a).astype(np.float32, copy=False)


def count_diffs(ours: np.ndarray, theirs: np.ndarray) -> int:
    """Number of elements whose float32 bit patterns differ, counting NaN == NaN."""
    a, b = as_f32(ours), as_f32(theirs)
    differ = a.view(np.uint32) != b.view(np.uint32)
    differ &= ~(np.isnan(a) & np.isnan(b))
    return int(np.count_nonzero(differ))


# ------------------------------------------------------------------------------------------
# Table model


@dataclass
class Peer:
    """A peer computation and its result compared with ours."""

    name: str
    timing: Timing
    diffs: int
    note: str = ""

    def ratio(self, ours: Timing) -> float:
        return self.timing.ns / ours.ns


@dataclass
class Case:
    """One of our measurements, with its memory floor (if any) and peers."""

    key: str
    label: str
    timing: Timing
    floor: tuple[str, Timing] | None = None
    peers: list[Peer] = field(default_factory=list)

    def floor_percent(self) -> float | None:
        return None if self.floor is None else self.floor[1].ns / self.timing.ns * 100

    def peer(self, prefix: str) -> Peer | None:
        return next((p for p in self.peers if p.name.startswith(prefix)), None)


class Bench:
    """Runs the measurements and keeps the results in order for printing."""

    def __init__(self, n: int, repeat: int):
        self.n = n
        self.repeat = repeat
        self.sections: list[tuple[str, list[Case]]] = []
        self.floor_fns: dict[str, tuple[str, Callable[[], object]]] = {}
        self.floor_samples: dict[str, list[float]] = {}
        self.cases: dict[str, Case] = {}

    def section(self, title: str) -> None:
        self.sections.append((title, []))
        print(f"  measuring: {title}", file=sys.stderr, flush=True)

    def add_floor(self, key: str, label: str, fn: Callable[[], object]) -> None:
        """Register a memory-floor callable; it is timed alongside every case that uses it."""
        self.floor_fns[key] = (label, fn)
        self.floor_samples[key] = []

    def floors(self) -> dict[str, Timing]:
        """Each floor over all its samples (pooled over the cases it was timed with)."""
        return {k: Timing(statistics.median(s), s) for k, s in self.floor_samples.items() if s}

    def case(self, key, label, fn, *, floor=None, peers=(), compare=None) -> Case:
        """Measure ``fn``, its memory floor and each peer ``(name, fn[, compare_fn, note])``,
        interleaved.

        ``compare`` turns our result into float32 values for the check (e.g. decode codes);
        a peer's own ``compare_fn`` replaces our result for that peer (different semantics).
        """
        peers = [(spec[0], spec[1], spec[2] if len(spec) > 2 else None,
                  spec[3] if len(spec) > 3 else "") for spec in peers]
        fns = [fn] + [p[1] for p in peers]
        if floor:
            fns.append(self.floor_fns[floor][1])
        with np.errstate(invalid="ignore"):  # NaN/Inf -> uint8 is the point of a floor
            timings, results = time_interleaved(fns, self.n, self.repeat)
        ours = results[0]
        ours_values = compare(ours) if compare else ours
        c = Case(key, label, timings[0])
        if floor:
            c.floor = (floor, timings[-1])
            self.floor_samples[floor] += timings[-1].samples
        k = 1 + len(peers)
        for (name, _, alt, note), pt, theirs in zip(peers, timings[1:k], results[1:k],
                                                    strict=True):
            reference = alt() if alt else ours_values
            c.peers.append(Peer(name, pt, count_diffs(reference, theirs), note))
        del results, ours, ours_values
        self.sections[-1][1].append(c)
        self.cases[key] = c
        return c


# ------------------------------------------------------------------------------------------
# Measurements


def make_input(n: int) -> np.ndarray:
    """standard_normal * INPUT_SCALE float32, with SPECIALS spread every SPECIAL_STRIDE."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal(n, dtype=np.float32)
    x *= np.float32(INPUT_SCALE)
    idx = np.arange(0, n, SPECIAL_STRIDE)
    x[idx] = SPECIALS[np.arange(idx.size) % SPECIALS.size]
    return x


def run_benchmarks(bench: Bench, x: np.ndarray) -> None:
    n = x.size
    codes_out = np.empty(n, np.uint8)
    values_out = np.empty(n, np.float32)
    t = torch.from_numpy(x) if torch is not None else None

    bench.add_floor("astype_u8", "x.astype(np.uint8)", lambda: x.astype(np.uint8))
    bench.add_floor("copyto_u8", 'np.copyto(u8, x, casting="unsafe")',
                    lambda: np.copyto(codes_out, x, casting="unsafe"))
    bench.add_floor("copy_f32", "x.copy()  (float32 floor for quantize)", lambda: x.copy())
    bench.add_floor("copyto_f32", "np.copyto(f32, x)  (float32, out=)",
                    lambda: np.copyto(values_out, x))

    bench.section("encode float32 -> codes")
    for fmt in ("e4m3", "e5m2"):
        f8 = ML_F8[fmt]
        peers = [(f"ml_dtypes astype {f8.__name__}", lambda f8=f8: x.astype(f8))]
        if torch is not None:
            tf8 = getattr(torch, TORCH_F8[fmt])
            torch_peer = (f"torch .to({TORCH_F8[fmt]})", lambda tf8=tf8: t.to(tf8))
            if fmt == "e4m3":  # torch's e4m3fn cast clamps overflow and Inf to +-448
                torch_peer += (lambda fmt=fmt: lp.decode(lp.encode(x, fmt, saturate=True), fmt),
                               "checked against saturate=True (torch clamps)")
            peers.append(torch_peer)
        bench.case(f"encode_{fmt}", f"{fmt} nearest_even",
                   lambda fmt=fmt: lp.encode(x, fmt), floor="astype_u8", peers=peers,
                   compare=lambda c, fmt=fmt: lp.decode(c, fmt))
        bench.case(f"encode_{fmt}_out", f"{fmt} nearest_even out=",
                   lambda fmt=fmt: lp.encode(x, fmt, out=codes_out), floor="copyto_u8")
    peers = []
    if en_dtypes is not None:
        peers.append(("en-dtypes astype hifloat8", lambda: x.astype(en_dtypes.hifloat8)))
    bench.case("encode_hif8", "hif8 nearest_away", lambda: lp.encode(x, "hif8"),
               floor="astype_u8", peers=peers, compare=lambda c: lp.decode(c, "hif8"))
    bench.case("encode_hif8_out", "hif8 nearest_away out=",
               lambda: lp.encode(x, "hif8", out=codes_out), floor="copyto_u8")

    bench.section("fused quantize float32 -> float32")
    for fmt in ("e4m3", "e5m2"):
        f8 = ML_F8[fmt]
        peers = [(f"ml_dtypes round trip {f8.__name__}",
                  lambda f8=f8: x.astype(f8).astype(np.float32))]
        if torch is not None:
            tf8 = getattr(torch, TORCH_F8[fmt])
            torch_peer = (f"torch round trip {TORCH_F8[fmt]}",
                          lambda tf8=tf8: t.to(tf8).to(torch.float32))
            if fmt == "e4m3":
                torch_peer += (lambda fmt=fmt: lp.quantize(x, fmt, saturate=True),
                               "checked against saturate=True (torch clamps)")
            peers.append(torch_peer)
        bench.case(f"quantize_{fmt}", f"{fmt} nearest_even",
                   lambda fmt=fmt: lp.quantize(x, fmt), floor="copy_f32", peers=peers)
        bench.case(f"quantize_{fmt}_out", f"{fmt} nearest_even out=",
                   lambda fmt=fmt: lp.quantize(x, fmt, out=values_out), floor="copyto_f32")
    peers = []
    if en_dtypes is not None:
        peers.append(("en-dtypes round trip hifloat8",
                      lambda: x.astype(en_dtypes.hifloat8).astype(np.float32)))
    bench.case("quantize_hif8", "hif8 nearest_away", lambda: lp.quantize(x, "hif8"),
               floor="copy_f32", peers=peers)
    bench.case("quantize_hif8_out", "hif8 nearest_away out=",
               lambda: lp.quantize(x, "hif8", out=values_out), floor="copyto_f32")

    bench.section("for information: other rounding modes, float64 input, decode")
    for mode in ("toward_zero", "up"):
        bench.case(f"encode_e4m3_{mode}", f"e4m3 {mode}",
                   lambda mode=mode: lp.encode(x, "e4m3", mode), floor="astype_u8")
    bench.case("encode_e4m3_stochastic", "e4m3 stochastic seed=0",
               lambda: lp.encode(x, "e4m3", "stochastic", seed=0), floor="astype_u8")
    x64 = x.astype(np.float64)
    bench.case("encode_e4m3_f64", "e4m3 nearest_even, float64 in",
               lambda x64=x64: lp.encode(x64, "e4m3"),
               peers=[("ml_dtypes astype (float64 in)",
                       lambda x64=x64: x64.astype(ml_dtypes.float8_e4m3fn))],
               compare=lambda c: lp.decode(c, "e4m3"))
    codes = lp.encode(x, "e4m3")
    bench.case("decode_e4m3", "decode e4m3", lambda: lp.decode(codes, "e4m3"),
               peers=[("ml_dtypes view+astype f32",
                       lambda: codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32))])
    bench.case("decode_e4m3_out", "decode e4m3 out=",
               lambda: lp.decode(codes, "e4m3", out=values_out))


def first_call_latency() -> dict:
    """Run the two snippets in fresh interpreters, twice each; seconds (None on failure)."""
    result: dict = {}
    for key, code in (("first_call", FIRST_CALL_SNIPPET),
                      ("import_and_first_call", IMPORT_AND_CALL_SNIPPET)):
        runs = []
        for _ in range(2):
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=False)
            try:
                runs.append(float(p.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                runs.append(None)
                result[f"{key}_error"] = (p.stderr or p.stdout).strip()[-500:]
        result[key] = runs
    return result


# ------------------------------------------------------------------------------------------
# Reporting


def _fmt_ns(t: Timing | None) -> str:
    return "" if t is None else f"{t.ns:.3f}"


def print_table(bench: Bench) -> list[dict]:
    """Print the results; return them as rows for the JSON file."""
    rows = []
    head = (f"{'case':<32} {'ns/el':>8} {'%floor':>7}   {'peer':<34} {'peer ns/el':>10} "
            f"{'speedup':>8}  check")
    print("\nmemory floor (numpy, single thread; median over every case it was timed with)")
    for key, t in bench.floors().items():
        print(f"  {bench.floor_fns[key][0]:<44} {t.ns:8.3f} ns/el")
    for title, cases in bench.sections:
        if not cases:
            continue
        print(f"\n{title}\n{head}\n{'-' * len(head)}")
        for c in cases:
            pct = c.floor_percent()
            pct_s = "" if pct is None else f"{pct:6.1f}%"
            left = f"{c.label:<32} {_fmt_ns(c.timing):>8} {pct_s:>7}"
            row = {"key": c.key, "section": title, "case": c.label, "ns_per_element": c.timing.ns,
                   "samples_ns": c.timing.samples,
                   "floor": c.floor[0] if c.floor else None, "floor_percent": pct, "peers": []}
            if not c.peers:
                print(left)
            for i, p in enumerate(c.peers):
                check = "exact" if p.diffs == 0 else f"{p.diffs} diffs"
                if p.note:
                    check += f" ({p.note})"
                prefix = left if i == 0 else " " * len(left)
                print(f"{prefix}   {p.name:<34} {_fmt_ns(p.timing):>10} "
                      f"{p.ratio(c.timing):7.1f}x  {check}")
                row["peers"].append({"name": p.name, "ns_per_element": p.timing.ns,
                                     "samples_ns": p.timing.samples,
                                     "speedup": p.ratio(c.timing), "diffs": p.diffs,
                                     "note": p.note})
            rows.append(row)
    return rows


# Formats II (issue 17): the new element formats against the peer that has them
ML_II = {"e2m1": "float4_e2m1fn", "e2m3": "float6_e2m3fn", "e3m2": "float6_e3m2fn",
         "e8m0": "float8_e8m0fnu", "e4m3fnuz": "float8_e4m3fnuz", "e5m2fnuz": "float8_e5m2fnuz",
         "e4m3_ieee": "float8_e4m3", "e3m4": "float8_e3m4", "bfloat16": "bfloat16"}
P3109_II = tuple(f"binary8p{p}" for p in range(1, 8))
TARGET_II_VS_ML_DTYPES = 8.0
TARGET_II_VS_GFLOAT = 30.0
TARGET_USER_VS_BUILTIN = 1.5
GFLOAT_N = 1 << 18  # gfloat runs ~100 ns per element: its rows use the first 2^18 elements


def run_formats2(bench: Bench, x: np.ndarray, bench_g: Bench) -> None:
    """The Formats II rows: encode vs ml_dtypes (9 formats), vs gfloat (P3109, on
    ``bench_g``'s shorter input), a user format vs the built-in it equals, and block formats
    for information."""
    bench.section("Formats II: encode float32 -> codes vs ml_dtypes")
    for fmt, tname in ML_II.items():
        t = getattr(ml_dtypes, tname)
        own = lp.get_format(fmt).info.default_rounding.name.lower()
        bench.case(f"encode2_{fmt}", f"{fmt} {own}",
                   lambda fmt=fmt: lp.encode(x, fmt), floor="astype_u8",
                   peers=[(f"ml_dtypes astype {tname}", lambda t=t: x.astype(t),
                           (lambda fmt=fmt, t=t: _nan_free(lp.decode(lp.encode(x, fmt), fmt),
                                                           x, fmt)),
                           "NaN inputs and e8m0 subnormal ties excluded (docs: Formats II)")],
                   compare=None)
    lp.float_format(4, 3, bias=7, inf="none", nan="top", name="bench_user_e4m3")
    bench.section("Formats II: a user format vs the built-in it equals")
    bench.case("encode2_user_e4m3", "float_format(4, 3, bias=7, inf=none, nan=top)",
               lambda: lp.encode(x, "bench_user_e4m3"), floor="astype_u8",
               peers=[("built-in e4m3", lambda: lp.encode(x, "e4m3"))],
               compare=None)
    bench.case("quantize2_user_e4m3", "quantize, same user format",
               lambda: lp.quantize(x, "bench_user_e4m3"), floor="copy_f32",
               peers=[("built-in e4m3 quantize", lambda: lp.quantize(x, "e4m3"))])
    bench.section("Formats II: block formats (for information)")
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxint8", "nvfp4"):
        bench.case(f"quantize2_{fmt}", f"quantize {fmt}", lambda fmt=fmt: lp.quantize(x, fmt),
                   floor="copy_f32")
    xg = np.ascontiguousarray(x[:bench_g.n])
    try:
        import gfloat
        from gfloat.formats import format_info_p3109
    except ImportError:  # gfloat is an optional peer
        return
    bench_g.section(f"Formats II: P3109 encode vs gfloat (first {bench_g.n:,} elements)")
    for fmt in P3109_II:
        fi = format_info_p3109(8, int(fmt.removeprefix("binary8p")))
        bench_g.case(f"encode2_{fmt}", f"{fmt} nearest_even", lambda fmt=fmt: lp.encode(xg, fmt),
                     peers=[("gfloat round_ndarray+encode_ndarray",
                             lambda fi=fi: gfloat.encode_ndarray(
                                 fi, gfloat.round_ndarray(fi, xg.astype(np.float64))))],
                     compare=None)


def _nan_free(v: np.ndarray, x: np.ndarray, fmt: str):
    """Our decoded values where the peers agree by convention; the peer's elsewhere (so
    the check column counts real disagreements only)."""
    t = getattr(ml_dtypes, ML_II[fmt])
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = x.astype(t)
    skip = np.isnan(x)
    if fmt == "e8m0":
        skip |= (x > 0) & (x <= np.float32(1.5 * 2.0**-127))
    return np.where(skip, theirs.astype(np.float32), v)


def _line(ok: bool | None, text: str) -> dict:
    status = "n/a " if ok is None else ("PASS" if ok else "MISS")
    print(f"  {status}  {text}")
    return {"status": status.strip(), "text": text}


def print_targets(bench: Bench, latency: dict) -> list[dict]:
    out = []
    print("\ntargets")
    cs = bench.cases
    for fmt in ("e4m3", "e5m2"):
        for prefix, goal, what in (("ml_dtypes", TARGET_ENCODE_VS_ML_DTYPES, "ml_dtypes"),
                                   ("torch", TARGET_ENCODE_VS_TORCH, "torch")):
            p = cs[f"encode_{fmt}"].peer(prefix)
            if p is None:
                out.append(_line(None, f"encode {fmt} >= {goal}x {what}: peer not installed"))
                continue
            r = p.ratio(cs[f"encode_{fmt}"].timing)
            out.append(_line(r >= goal, f"encode {fmt} >= {goal}x {what}: {r:.1f}x"))
    p = cs["encode_hif8"].peer("en-dtypes")
    if p is None:
        out.append(_line(None, "hif8 encode vs en-dtypes: en-dtypes not installed"))
    else:
        r = p.ratio(cs["encode_hif8"].timing)
        out.append(_line(r >= TARGET_HIF8_VS_EN_DTYPES,
                         f"encode hif8 >= {TARGET_HIF8_VS_EN_DTYPES}x en-dtypes: {r:.1f}x"))
    for fmt, prefix in (("e4m3", "ml_dtypes"), ("e5m2", "ml_dtypes"), ("hif8", "en-dtypes")):
        p = cs[f"quantize_{fmt}"].peer(prefix)
        goal = TARGET_QUANTIZE_VS_ROUND_TRIP
        if p is None:
            out.append(_line(None, f"quantize {fmt} vs {prefix} round trip: not installed"))
            continue
        r = p.ratio(cs[f"quantize_{fmt}"].timing)
        out.append(_line(r >= goal, f"quantize {fmt} >= {goal}x {prefix} round trip: {r:.1f}x"))
    for fmt in ("e4m3", "e5m2", "hif8"):
        a = cs[f"encode_{fmt}"].floor_percent()
        b = cs[f"encode_{fmt}_out"].floor_percent()
        ok = min(a, b) >= TARGET_FLOOR_PERCENT
        out.append(_line(ok, f"encode {fmt} >= {TARGET_FLOOR_PERCENT:.0f}% of memory floor: "
                             f"{a:.0f}% of astype (allocating), {b:.0f}% of copyto (out=)"))
    for fmt in ML_II:
        c = cs.get(f"encode2_{fmt}")
        p = c.peer("ml_dtypes") if c else None
        if p is not None:
            r = p.ratio(c.timing)
            out.append(_line(r >= TARGET_II_VS_ML_DTYPES,
                             f"encode {fmt} >= {TARGET_II_VS_ML_DTYPES:.0f}x ml_dtypes: {r:.1f}x"))
    for fmt in P3109_II:
        c = cs.get(f"encode2_{fmt}")
        p = c.peer("gfloat") if c else None
        if p is not None:
            r = p.ratio(c.timing)
            out.append(_line(r >= TARGET_II_VS_GFLOAT,
                             f"encode {fmt} >= {TARGET_II_VS_GFLOAT:.0f}x gfloat: {r:.0f}x"))
    for key in ("encode2_user_e4m3", "quantize2_user_e4m3"):
        c = cs.get(key)
        if c is not None:
            r = c.timing.ns / c.peers[0].timing.ns
            out.append(_line(r <= TARGET_USER_VS_BUILTIN,
                             f"{key}: user format / built-in time <= {TARGET_USER_VS_BUILTIN}: "
                             f"{r:.2f}"))
    second = latency["first_call"][1]
    if second is None:
        out.append(_line(None, "first call: subprocess failed"))
    else:
        out.append(_line(second < TARGET_FIRST_CALL_S,
                         f"first call < {TARGET_FIRST_CALL_S} s (warm disk cache): "
                         f"{second:.3f} s"))
    return out


def set_omp_wait_policy(choice: str | None) -> str:
    """Set OMP_WAIT_POLICY before any OpenMP runtime loads; return a line describing it."""
    if choice is None:
        if "OMP_WAIT_POLICY" in os.environ:
            return f"{os.environ['OMP_WAIT_POLICY']} (from the environment)"
        choice = OMP_POLICY_DEFAULT
    if choice == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
        return "unset (libgomp default: idle workers spin, then sleep)"
    os.environ["OMP_WAIT_POLICY"] = choice
    return f"{choice} (set by this script; --omp-wait-policy to change)"


def import_torch() -> None:
    """Import torch (an optional peer) into the module globals, after the policy is set."""
    global torch
    try:
        import torch as _torch
    except ImportError:
        return
    torch = _torch


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "numpy": np.__version__, "numba": numba.__version__, "ml_dtypes": ml_dtypes.__version__,
        "lowprec": lp.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "en_dtypes": getattr(en_dtypes, "__version__", "installed") if en_dtypes else None,
        "numba_threads": numba.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Benchmark lowprec encode/quantize/decode against ml_dtypes, torch, "
                    "en-dtypes and numpy's memory floor (median ns per element).")
    ap.add_argument("--n", type=int, default=N_DEFAULT,
                    help=f"number of float32 input elements (default 2^24 = {N_DEFAULT})")
    ap.add_argument("--repeat", type=int, default=REPEAT_DEFAULT,
                    help=f"timed calls per measurement; the median is reported "
                         f"(default {REPEAT_DEFAULT})")
    ap.add_argument("--json", metavar="PATH", help="also write all results to this JSON file")
    ap.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE", "unset"], default=None,
                    help="OMP_WAIT_POLICY for numba's and torch's OpenMP runtimes (default: "
                         f"keep the environment's value, else {OMP_POLICY_DEFAULT}; 'unset' "
                         "leaves libgomp's own spin-then-sleep default)")
    ap.add_argument("--skip-formats2", action="store_true",
                    help="skip the Formats II rows (issue 17: new formats vs ml_dtypes / gfloat)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeat < 1:
        ap.error("--n and --repeat must be >= 1")
    policy_note = set_omp_wait_policy(args.omp_wait_policy)
    import_torch()

    info = machine_info()
    print(f"lowprec {info['lowprec']} codec benchmark: n = {args.n:,} float32 elements "
          f"({args.n * 4 / 2**20:.0f} MiB), median of {args.repeat} calls, ns per element")
    print(f"cpu: {info['cpu']} ({info['cpu_count']} logical cores), python {info['python']}")
    print(f"numpy {info['numpy']}, numba {info['numba']}, ml_dtypes {info['ml_dtypes']}, "
          f"torch {info['torch']}, en-dtypes {info['en_dtypes']}")
    print(f"threads: numba {info['numba_threads']}, torch {info['torch_threads']} "
          "(numpy, ml_dtypes and en-dtypes casts are single-threaded)")
    print(f"OMP_WAIT_POLICY: {policy_note}")
    print("speedup = peer ns / our ns;  %floor = floor ns / our ns * 100;  "
          "check = our values vs the peer's")

    x = make_input(args.n)
    bench = Bench(args.n, args.repeat)
    run_benchmarks(bench, x)
    if not args.skip_formats2:
        bench_g = Bench(min(args.n, GFLOAT_N), args.repeat)
        run_formats2(bench, x, bench_g)
        bench.sections += bench_g.sections
        bench.cases.update(bench_g.cases)
    del x
    info["numba_threading_layer"] = numba.threading_layer()
    latency = first_call_latency()

    rows = print_table(bench)
    print(f"\nnumba threading layer: {info['numba_threading_layer']}")
    print("\nfirst-call latency (fresh interpreter, run twice; the first run may compile and "
          "fill Numba's disk cache)")
    labels = {"first_call": "lp.encode(np.ones(1000), 'e4m3'), first call",
              "import_and_first_call": "import lowprec + that first call"}
    for key, label in labels.items():
        runs = ", ".join("failed" if r is None else f"{r:.3f} s" for r in latency[key])
        print(f"  {label:<48} {runs}")
        if f"{key}_error" in latency:
            print(f"    error: {latency[key + '_error']}")

    targets = print_targets(bench, latency)
    if args.json:
        doc = {"n": args.n, "repeat": args.repeat, "machine": info,
               "floors_ns_per_element": {k: t.ns for k, t in bench.floors().items()},
               "rows": rows, "latency_s": latency, "targets": targets}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
