#!/usr/bin/env python
"""All 2^32 float32 bit patterns through the element formats of issue 17 ("Formats II").

Comparisons (codes as integers; an expected NaN accepts any NaN code):

* ``ml_dtypes``: lowprec ``encode`` (float32 fast path, the format's own ``nearest_even``,
  non-saturating) against ``x.astype(ml_dtypes.<type>)`` for every format ml_dtypes has.
  Inputs where the peers' conventions are known to differ are counted apart (``nan_inputs``:
  FP4/FP6 have no NaN, ml_dtypes writes -0 for +NaN and +0 for -NaN, lowprec -0 for both;
  ``e8m0_sub``: float32 subnormals in (2**-127, 1.5 * 2**-127], which ml_dtypes rounds up to
  2**-126 although 2**-127 is nearer (or, at 1.5 * 2**-127, the tie's even code); every such
  lowprec code is checked to be a nearest).
* ``user``: a format made by :func:`lowprec.float_format` with a built-in's description
  against the built-in (codes, every deterministic mode asked for).
* ``int``: ``int4`` / ``uint4`` at scale 1 against ``clip(rint(x))`` (float64) held in
  ml_dtypes' ``int4`` / ``uint4`` (NaN inputs skipped: they have no code, and ``encode``
  raises for them).
* ``gfloat``: P3109 formats against gfloat ``round_ndarray`` + ``encode_ndarray`` (slow:
  ~100 ns per element; use ``--start/--stop`` for slices).

Usage::

    python scripts/exhaustive_formats2.py --check ml_dtypes --formats e2m1,e3m4
    python scripts/exhaustive_formats2.py --check user --formats e4m3,e5m2 --modes all
    python scripts/exhaustive_formats2.py --check gfloat --formats binary8p3 --stop 0x01000000
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import ml_dtypes
import numpy as np

import lowprec as lp

ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn,
      "e3m2": ml_dtypes.float6_e3m2fn, "e8m0": ml_dtypes.float8_e8m0fnu,
      "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
      "e4m3_ieee": ml_dtypes.float8_e4m3, "e3m4": ml_dtypes.float8_e3m4,
      "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DET_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
CHUNK = 1 << 24


def chunks(start: int, stop: int):
    """Float32 arrays of consecutive bit patterns covering ``[start, stop)``."""
    for lo in range(start, stop, CHUNK):
        hi = min(lo + CHUNK, stop)
        yield np.arange(lo, hi, dtype=np.uint64).astype(np.uint32).view(np.float32)


def e8m0_nearest_ok(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """True where ``codes`` (e8m0) is a nearest power of two to positive ``x`` (exact in
    float64: the candidates are 2**floor(log2 x) and twice it)."""
    v = np.ldexp(1.0, codes.astype(np.int64) - 127)
    xd = x.astype(np.float64)
    lo = np.ldexp(1.0, np.floor(np.log2(xd)).astype(np.int64))
    best = np.minimum(np.abs(xd - lo), np.abs(xd - 2 * lo))
    return np.abs(xd - v) == best


def run_ml(fmt: str, start: int, stop: int) -> dict:
    """Mismatch counts of ``fmt`` against ml_dtypes over ``[start, stop)``."""
    t = ML[fmt]
    f = lp.get_format(fmt)
    wide = f.info.bits > 8
    tally = {"mismatch": 0, "nan_inputs": 0, "e8m0_sub": 0, "e8m0_sub_not_nearest": 0}
    for x in chunks(start, stop):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = x.astype(t).view(np.uint16 if wide else np.uint8)
        g = lp.encode(x, fmt)
        bad = g != w
        if bad.any():
            wn = np.isnan(f.values()[w[bad]])
            gn = np.isnan(f.values()[g[bad]])
            keep = ~(wn & gn)
            idx = np.flatnonzero(bad)[keep]
            xn = np.isnan(x[idx])
            tally["nan_inputs"] += int(xn.sum())
            idx = idx[~xn]
            if fmt == "e8m0":
                sub = (x[idx] > 0) & (x[idx] <= np.float32(1.5 * 2.0**-127))
                tally["e8m0_sub"] += int(sub.sum())
                tally["e8m0_sub_not_nearest"] += int((~e8m0_nearest_ok(x[idx][sub],
                                                                      g[idx][sub])).sum())
                idx = idx[~sub]
            tally["mismatch"] += int(idx.size)
            if idx.size and tally["mismatch"] == idx.size:
                print(f"  first mismatches: {x[idx[:4]].view(np.uint32)} got {g[idx[:4]]} "
                      f"want {w[idx[:4]]}", flush=True)
    return tally


def run_user(fmt: str, modes, start: int, stop: int) -> dict:
    """Mismatch counts of a user format with ``fmt``'s description against ``fmt``."""
    d = lp.get_format(fmt).info.extra["desc"]
    lp.float_format(d.exp_bits, d.man_bits, bias=d.bias, inf=d.inf, nan=d.nan,
                    negative_zero=d.negative_zero, signed=d.signed, subnormals=d.subnormals,
                    name=f"user_{fmt}")
    tally = {}
    for mode in modes:
        for sat in (False, True):
            n = 0
            for x in chunks(start, stop):
                n += int((lp.encode(x, f"user_{fmt}", mode, sat)
                          != lp.encode(x, fmt, mode, sat)).sum())
            tally[f"{mode}-{'sat' if sat else 'nonsat'}"] = n
    return tally


def run_gfloat(fmt: str, modes, start: int, stop: int) -> dict:
    """Mismatch counts of a P3109 format against gfloat (every mode, both saturations)."""
    import gfloat
    from gfloat.formats import format_info_p3109

    p = int(fmt.removeprefix("binary8p"))
    fi = format_info_p3109(8, p)
    rm = {"nearest_even": gfloat.RoundMode.TiesToEven, "nearest_away": gfloat.RoundMode.TiesToAway,
          "toward_zero": gfloat.RoundMode.TowardZero, "up": gfloat.RoundMode.TowardPositive,
          "down": gfloat.RoundMode.TowardNegative}
    tally = {}
    for mode in modes:
        for sat in (False, True):
            n = 0
            for x in chunks(start, stop):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    w = gfloat.encode_ndarray(fi, gfloat.round_ndarray(fi, x.astype(np.float64),
                                                                       rm[mode], sat))
                n += int((lp.encode(x, fmt, mode, sat) != w).sum())
            tally[f"{mode}-{'sat' if sat else 'nonsat'}"] = n
    return tally


def run_int(fmt: str, start: int, stop: int) -> dict:
    """Mismatch count of ``int4`` / ``uint4`` (scale 1) against ``clip(rint(x))`` in ml_dtypes."""
    t, lo, hi = {"int4": (ml_dtypes.int4, -7, 7), "uint4": (ml_dtypes.uint4, 0, 15)}[fmt]
    n = bad = 0
    for x in chunks(start, stop):
        x = x[~np.isnan(x)]
        got = lp.encode(x, fmt, scale=1.0).codes.astype(np.int64)
        want = np.clip(np.rint(x.astype(np.float64)), lo, hi).astype(t).astype(np.int64)
        bad += int((got != want).sum())
        n += x.size
    return {"patterns": n, "mismatch": bad}


def main(argv=None) -> int:
    """Command line entry point; exit status 1 on any unexplained mismatch."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", choices=("ml_dtypes", "user", "gfloat", "int"),
                    default="ml_dtypes")
    ap.add_argument("--formats", default=",".join(ML))
    ap.add_argument("--modes", default="nearest_even")
    ap.add_argument("--start", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--stop", type=lambda s: int(s, 0), default=1 << 32)
    a = ap.parse_args(argv)
    modes = DET_MODES if a.modes == "all" else tuple(a.modes.split(","))
    status = 0
    for fmt in a.formats.split(","):
        t0 = time.perf_counter()
        if a.check == "ml_dtypes":
            tally = run_ml(fmt, a.start, a.stop)
            status |= tally["mismatch"] > 0 or tally["e8m0_sub_not_nearest"] > 0
        elif a.check == "int":
            tally = run_int(fmt, a.start, a.stop)
            status |= tally["mismatch"] > 0
        elif a.check == "user":
            tally = run_user(fmt, modes, a.start, a.stop)
            status |= any(tally.values())
        else:
            tally = run_gfloat(fmt, modes, a.start, a.stop)
            status |= any(tally.values())
        print(f"{fmt} {a.check} over {a.stop - a.start} patterns: {tally} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return int(bool(status))


if __name__ == "__main__":
    sys.exit(main())
