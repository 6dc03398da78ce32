#!/usr/bin/env python
"""Sweep all 2^32 float32 bit patterns through lowprec's float codecs and count mismatches.

Two kinds of comparison, per format, rounding mode and saturation flag:

* ``peer``: lowprec (float32 fast path, codes and fused ``quantize`` values) against the peer
  library for the format's own convention: en-dtypes ``hifloat8`` (HiF8, ``nearest_away``) and
  ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2`` (``nearest_even``), non-saturating; the
  saturating variant is compared with "clamp to +-max, then convert".  Codes whose expected
  value is NaN accept any NaN code (formats.md 2.4); values compare bit for bit, NaN by class.
* ``generic``: the vectorized float32 fast path against the generic kernel
  (``run_kernel(..., generic=True)``) on the same bits, exactly (codes and value bits), for
  every deterministic mode asked for.
* ``fused``: the same comparison for codes only, with both per-element encoders called inside
  one parallel Numba loop that counts mismatches (no arrays; about 10x faster than
  ``generic``, ~2 minutes per format, mode and saturation flag on 2 cores).

Usage::

    python scripts/exhaustive_sweep.py                          # own modes, both checks
    python scripts/exhaustive_sweep.py --formats hif8 --checks peer
    python scripts/exhaustive_sweep.py --modes all --checks generic
    python scripts/exhaustive_sweep.py --start 0x3F000000 --stop 0x40000000   # a slice
    python scripts/exhaustive_sweep.py --formats hif8 --modes all --checks fused

It prints one progress line per chunk of 2^24 patterns and a summary such as
``hif8 nearest_away nonsat codes vs en-dtypes: 0 mismatches over 4294967296 patterns``.
The exit status is 1 if any comparison found a mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import en_dtypes
import ml_dtypes
import numpy as np
from numba import njit, prange

import lowprec as lp
from lowprec.formats.hif8 import HIF8_SPEC
from lowprec.formats.minifloat import SPECS, make_kernel, run_kernel, scalar_code32

FORMATS = ("hif8", "e4m3", "e5m2")
DET_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
OWN_MODE = {"hif8": "nearest_away", "e4m3": "nearest_even", "e5m2": "nearest_even"}
PEER = {"hif8": ("en-dtypes", en_dtypes.hifloat8), "e4m3": ("ml_dtypes", ml_dtypes.float8_e4m3fn),
        "e5m2": ("ml_dtypes", ml_dtypes.float8_e5m2)}
KERNEL_SPECS = {"hif8": HIF8_SPEC, **SPECS}
N_ALL = 1 << 32
MAX_EXAMPLES = 8


@dataclass
class Tally:
    """Mismatch count of one comparison."""

    name: str
    mismatches: int = 0
    patterns: int = 0
    seconds: float = 0.0
    examples: list = field(default_factory=list)

    def add(self, bad: np.ndarray, bits: np.ndarray, got: np.ndarray, exp: np.ndarray, dt: float):
        self.patterns += bits.size
        self.seconds += dt
        nbad = int(np.count_nonzero(bad))
        if nbad:
            self.mismatches += nbad
            for i in np.flatnonzero(bad)[: MAX_EXAMPLES - len(self.examples)]:
                self.examples.append((int(bits[i]), got[i].item(), exp[i].item()))

    def line(self) -> str:
        s = f"{self.name}: {self.mismatches} mismatches over {self.patterns} patterns"
        s += f" ({self.seconds:.1f} s)"
        if self.examples:
            ex = ", ".join(f"{b:#010x}: got {g!r} expected {e!r}" for b, g, e in self.examples)
            s += f"\n    first: {ex}"
        return s


def _nan_code_table(fmt: str) -> np.ndarray:
    return np.isnan(lp.get_format(fmt).values())


def _peer_decode_table(fmt: str) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(PEER[fmt][1]).astype(np.float32)


def peer_codes(x: np.ndarray, fmt: str, sat: bool) -> np.ndarray:
    """Peer conversion of float32 ``x`` (non-saturating; saturating = clamp, then convert)."""
    if sat:
        m = np.float32(lp.get_format(fmt).info.max)
        x = np.clip(x, -m, m)  # NaN stays NaN
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(PEER[fmt][1]).view(np.uint8)


def _run(fmt, bits, mode, sat, want_value, generic):
    out = np.empty(bits.size, np.float32 if want_value else np.uint8)
    run_kernel(KERNEL_SPECS[fmt], bits, out, int(lp.Rounding[mode.upper()]), sat,
               generic=generic)
    return out


_FUSED: dict = {}


def _fused_counter(fmt: str, mode: str, sat: bool):
    """A parallel Numba function ``count(start, stop, nchunks) -> (mismatches, first)``
    comparing the fast path's and the generic kernel's per-element encoders on the float32
    patterns ``start <= bits < stop`` (``first``: the first mismatching pattern of each of the
    ``nchunks`` sub-ranges, or -1)."""
    key = (fmt, mode, sat)
    if key not in _FUSED:
        spec, m = KERNEL_SPECS[fmt], int(lp.Rounding[mode.upper()])
        fast = scalar_code32(spec, m, sat)
        gen = make_kernel(spec, False, m, sat, None)

        @njit(parallel=True, nogil=True)
        def count(start, stop, nchunks):
            bad = np.zeros(nchunks, np.int64)
            first = np.full(nchunks, -1, np.int64)
            step = (stop - start + nchunks - 1) // nchunks
            for c in prange(nchunks):
                lo = start + c * step
                hi = min(stop, lo + step)
                n = 0
                for x in range(lo, hi):
                    u = np.uint32(x)
                    want = gen(u, np.uint64(0), np.int64(0), np.int64(32))[0]
                    if np.uint8(fast(u)) != np.uint8(want):
                        if n == 0:
                            first[c] = x
                        n += 1
                bad[c] = n
            return bad.sum(), first

        _FUSED[key] = count
    return _FUSED[key]


def _fused_chunk(tally: Tally, fmt: str, mode: str, sat: bool, lo: int, hi: int) -> None:
    t0 = time.perf_counter()
    nbad, first = _fused_counter(fmt, mode, sat)(lo, hi, 256)
    tally.patterns += hi - lo
    tally.mismatches += int(nbad)
    ex = first[first >= 0][: MAX_EXAMPLES - len(tally.examples)].astype(np.uint32)
    if ex.size:
        got = _run(fmt, ex, mode, sat, False, False)
        exp = _run(fmt, ex, mode, sat, False, True)
        tally.examples += [(int(b), int(g), int(e)) for b, g, e in zip(ex, got, exp, strict=True)]
    tally.seconds += time.perf_counter() - t0


def _sat_name(sat: bool) -> str:
    return "sat" if sat else "nonsat"


def make_tallies(formats, modes, sats, checks, values):
    """The comparisons to run: ``{key: Tally}``; keys ``(check, fmt, mode, sat, out)``."""
    t = {}
    outs = ("codes", "values") if values else ("codes",)
    for fmt in formats:
        for sat in sats:
            if "peer" in checks and OWN_MODE[fmt] in modes:
                for out in outs:
                    name = (f"{fmt} {OWN_MODE[fmt]} {_sat_name(sat)} {out} vs "
                            f"{PEER[fmt][0]}{' (clamp-then-convert)' if sat else ''}")
                    t["peer", fmt, OWN_MODE[fmt], sat, out] = Tally(name)
            if "generic" in checks:
                for mode in modes:
                    for out in outs:
                        name = f"{fmt} {mode} {_sat_name(sat)} {out} fast path vs generic kernel"
                        t["generic", fmt, mode, sat, out] = Tally(name)
            if "fused" in checks:
                for mode in modes:
                    name = f"{fmt} {mode} {_sat_name(sat)} codes fast path vs generic kernel"
                    t["fused", fmt, mode, sat, "codes"] = Tally(name + " (fused)")
    return t


def sweep_chunk(bits: np.ndarray, tallies: dict) -> None:
    """Run every comparison of ``tallies`` on one chunk of float32 bit patterns."""
    x = bits.view(np.float32)
    cache = {}

    def ours(fmt, mode, sat, out):
        key = (fmt, mode, sat, out)
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = (_run(fmt, bits, mode, sat, out == "values", False),
                          time.perf_counter() - t0)
        return cache[key]

    for (check, fmt, mode, sat, out), tally in tallies.items():
        if check == "fused":
            _fused_chunk(tally, fmt, mode, sat, int(bits[0]), int(bits[-1]) + 1)
            continue
        got, dt = ours(fmt, mode, sat, out)
        t0 = time.perf_counter()
        if check == "peer":
            pc = peer_codes(x, fmt, sat)
            if out == "codes":
                nan = _nan_code_table(fmt)
                bad = (got != pc) & ~(nan[got] & nan[pc])
                exp = pc
            else:
                exp = _peer_decode_table(fmt)[pc]
                bad = (got.view(np.uint32) != exp.view(np.uint32)) & ~(
                    np.isnan(got) & np.isnan(exp))
        else:
            exp = _run(fmt, bits, mode, sat, out == "values", True)
            if out == "codes":
                bad = got != exp
            else:
                bad = got.view(np.uint32) != exp.view(np.uint32)
        tally.add(bad, bits, got, exp, dt + time.perf_counter() - t0)


def sweep(formats=FORMATS, modes=None, sats=(False, True), checks=("peer", "generic"),
          values=True, start=0, stop=N_ALL, chunk_log2=24, progress=True) -> list[Tally]:
    """Sweep float32 patterns ``start <= bits < stop``; returns the tallies.

    ``modes=None`` means the own modes of ``formats`` (their union: the peer check uses each
    format's own mode, the generic check runs all of them on every format).
    """
    if modes is None:
        modes = tuple(sorted({OWN_MODE[f] for f in formats}, key=DET_MODES.index))
    tallies = make_tallies(formats, modes, sats, checks, values)
    if not tallies:
        raise ValueError("nothing to compare: check --formats / --modes / --checks")
    only_fused = all(key[0] == "fused" for key in tallies)
    chunk = 1 << chunk_log2
    t_start = time.perf_counter()
    n_chunks = (stop - start + chunk - 1) // chunk
    for k, lo in enumerate(range(start, stop, chunk)):
        hi = min(stop, lo + chunk)
        if only_fused:  # the fused checks only read the first and last pattern
            bits = np.array([lo, hi - 1], dtype=np.uint32)
        else:
            bits = np.arange(lo, hi, dtype=np.uint64).astype(np.uint32)
        sweep_chunk(bits, tallies)
        if progress:
            el = time.perf_counter() - t_start
            eta = el / (k + 1) * (n_chunks - k - 1)
            nbad = sum(t.mismatches for t in tallies.values())
            print(f"[{k + 1}/{n_chunks}] {lo:#010x}..{hi - 1:#010x}  {el:7.1f} s elapsed, "
                  f"eta {eta:7.1f} s, mismatches so far {nbad}", flush=True)
    return list(tallies.values())


def _parse_int(s: str) -> int:
    return int(s, 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default=",".join(FORMATS),
                   help="comma-separated subset of hif8,e4m3,e5m2 (default: all)")
    p.add_argument("--modes", default="own",
                   help="comma-separated deterministic modes, 'all', or 'own' (the default): "
                        "the own conventions of the selected formats (nearest_away for hif8, "
                        "nearest_even for e4m3/e5m2); the peer check runs each format's own "
                        "mode, the generic check every listed mode on every format")
    p.add_argument("--sat", choices=("both", "nonsat", "sat"), default="both")
    p.add_argument("--checks", default="peer,generic",
                   help="comma-separated subset of peer,generic,fused (default: "
                        "peer,generic)")
    p.add_argument("--no-values", action="store_true", help="compare codes only")
    p.add_argument("--start", type=_parse_int, default=0, help="first bit pattern (default 0)")
    p.add_argument("--stop", type=_parse_int, default=N_ALL,
                   help="one past the last bit pattern (default 2^32)")
    p.add_argument("--chunk-log2", type=int, default=24)
    p.add_argument("--quiet", action="store_true", help="no per-chunk progress lines")
    a = p.parse_args(argv)

    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            p.error(f"format {f!r} is not one of {', '.join(FORMATS)}")
    if a.modes == "own":
        modes = None
    elif a.modes == "all":
        modes = DET_MODES
    else:
        modes = tuple(m.strip() for m in a.modes.split(",") if m.strip())
        for m in modes:
            if m not in DET_MODES:
                p.error(f"mode {m!r} is not one of {', '.join(DET_MODES)}, own, all")
    checks = tuple(c.strip() for c in a.checks.split(",") if c.strip())
    for c in checks:
        if c not in ("peer", "generic", "fused"):
            p.error(f"check {c!r} is not one of peer, generic, fused")
    sats = {"both": (False, True), "nonsat": (False,), "sat": (True,)}[a.sat]
    if not 0 <= a.start < a.stop <= N_ALL:
        p.error("need 0 <= start < stop <= 2^32")

    t0 = time.perf_counter()
    tallies = sweep(formats, modes, sats, checks, not a.no_values, a.start, a.stop,
                    a.chunk_log2, not a.quiet)
    print(f"\nSummary ({time.perf_counter() - t0:.1f} s in all):")
    for t in tallies:
        print(t.line())
    return 1 if any(t.mismatches for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
