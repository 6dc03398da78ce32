#!/usr/bin/env python
"""Compile every Triton kernel variant of ``lowprec.gpu`` ahead of time for sm_90 and scan the
PTX for the instructions gpu.md section 4 forbids (no GPU needed).

A variant is one combination of a kernel's ``tl.constexpr`` arguments that the launchers can
produce: float codec x format x rounding mode x saturate x codes/values x input dtype; MX block
kernel x element format x input dtype x mode x codes/values x tile shape; INT kernel x input
dtype x mode x codes/values; the decode kernels.  Each is compiled with the launch options the
launchers use (``enable_fp_fusion=False``, their ``num_warps``, 16-byte aligned pointers as the
JIT specialises them), through PTX to a cubin (so that what the interpreter accepts but the
compiler rejects fails here too).

Forbidden in the PTX: approximate division (``div.full``, ``div.approx``), approximate
transcendental and root instructions (``ex2.approx``, ``lg2.approx``, ``sqrt.approx``,
``rsqrt``), any ``.ftz`` (flushed subnormals), ``satfinite`` conversions, any narrowing float
conversion (``cvt`` to f16/bf16/e4m3/e5m2), and any ``fma`` (no kernel multiplies and adds in
one rounding on the CPU).

Usage::

    python scripts/gpu_ptx_check.py                  # every variant, a summary line
    python scripts/gpu_ptx_check.py --json out.json  # and a JSON report
    python scripts/gpu_ptx_check.py --jobs 4 --limit 20
    python scripts/gpu_ptx_check.py --ptx-only       # stop at PTX (skip ptxas; the tests)

Must run without ``TRITON_INTERPRET`` (the tests call it in a subprocess).  Exit status 1 if a
variant fails to compile or holds a forbidden instruction.  Works with Triton 3.6 and 3.7.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FORBIDDEN = re.compile(
    r"div\.full|div\.approx|ex2\.approx|lg2\.approx|sqrt\.approx|rsqrt|\.ftz|satfinite|"
    r"\bfma\.|cvt\.[a-z.]*\.(f16|bf16|e4m3|e5m2|f16x2|bf16x2)\.f(32|64)"
)
TARGET = ("cuda", 90, 32)
_IN_TYPES = {0: "*fp32", 1: "*fp64", 2: "*i16"}


def variants() -> list[tuple[str, dict]]:
    """(kernel name, description) of every variant; the description is JSON-able."""
    from lowprec.formats.core import Rounding

    out = []
    modes = [int(r) for r in Rounding if r != Rounding.HYBRID]
    for fmt in ("hif8", "e4m3", "e5m2"):
        for mode in modes + ([int(Rounding.HYBRID)] if fmt == "hif8" else []):
            for kind in (0, 1, 2):
                if mode == int(Rounding.HYBRID) and kind == 1:
                    continue  # hybrid rounding of float64 input raises
                for sat in (False, True):
                    for want in (False, True):
                        out.append(("codec", dict(fmt=fmt, mode=mode, kind=kind, sat=sat,
                                                  want=want)))
    out.append(("lookup", {}))
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
        for kind in (0, 1, 2):
            for mode in modes:
                for want in (False, True):
                    for kk in (32, 4096):  # the two tile shapes
                        out.append(("mx", dict(fmt=fmt, kind=kind, mode=mode, want=want,
                                               kk=kk)))
    out.append(("mx_decode", {}))
    for kind in (0, 1, 2):
        for mode in modes:
            for want in (False, True):
                out.append(("int", dict(kind=kind, mode=mode, want=want)))
    for signed in (False, True):
        out.append(("int_decode", dict(signed=signed)))
    # Formats II (issue 17): one format of each kind of specials, uint16 codes (bfloat16), the
    # E8M0 kernel and the new MX elements
    for fmt in ("e2m1", "binary8p1", "bfloat16"):
        for mode in (0, 5):
            for kind in (0, 1):
                for want in (False, True):
                    out.append(("codec", dict(fmt=fmt, mode=mode, kind=kind, sat=False,
                                              want=want)))
    for kind in (0, 1):
        for mode in (1, 5):
            for want in (False, True):
                out.append(("pow2", dict(kind=kind, mode=mode, want=want)))
    for fmt in ("mxfp4", "mxint8"):
        for mode in (0,):
            for want in (False, True):
                out.append(("mx", dict(fmt=fmt, kind=0, mode=mode, want=want, kk=32)))
    # NVFP4 on a device (gpu/nvfp4.py) launches no kernel of its own: E4M3 scale codes (above),
    # the lookup kernel, and E2M1 codes of float32 in every mode -- the other four here
    for mode in (1, 2, 3, 4):
        out.append(("codec", dict(fmt="e2m1", mode=mode, kind=0, sat=False, want=False)))
    # decode of 4- and 6-bit codes: table reads masked to the table's 16 or 64 entries
    for nt in (16, 64):
        out.append(("lookup", dict(nt=nt)))
        out.append(("mx_decode", dict(nt=nt)))
    return out


def _compile(fn, sig: dict, constexprs: dict, num_warps: int, num_stages: int | None = None) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(sig)
    for k in constexprs:
        sig[k] = "constexpr"
    # pointers 16-byte aligned, as the JIT specialises them for torch's allocations (the
    # accesses are then vectorised); every integer argument is declared do_not_specialize
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, t in sig.items() if t.startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget(*TARGET),
                       options={"enable_fp_fusion": False, "num_warps": num_warps,
                                **({"num_stages": num_stages} if num_stages else {})})
    return k.asm["ptx"]


def compile_variant(item: tuple[str, dict]) -> dict:
    """Compile one variant; returns its description with ``ok``, ``bad`` (forbidden lines),
    ``error`` and ``seconds``."""
    name, d = item
    t0 = time.perf_counter()
    res = dict(kernel=name, **d)
    try:
        ptx = _build(name, d)
        bad = [ln.strip() for ln in ptx.splitlines() if FORBIDDEN.search(ln)]
        res.update(ok=not bad, bad=bad[:5], lines=len(ptx.splitlines()))
    except Exception as e:  # a compile error is a failure of the check, reported
        res.update(ok=False, error=f"{type(e).__name__}: {str(e)[-400:]}")
    res["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def _build(name: str, d: dict) -> str:
    from lowprec.formats.hif8 import HIF8_SPEC
    from lowprec.formats.minifloat import SPECS
    from lowprec.gpu import integer, minifloat, mx

    i32 = "i32"
    if name == "codec":
        spec = {"hif8": HIF8_SPEC, **SPECS}[d["fmt"]]
        C = minifloat.kernel_constexprs(spec, d["kind"] == 1, d["mode"], d["sat"], d["want"])
        C.update(IN_KIND=d["kind"], BLOCK=minifloat.gpu_block(C["PATH"]))
        codes = "*u16" if C["OUT16"] else "*u8"
        sig = dict(x_ptr=_IN_TYPES[d["kind"]], out_ptr="*fp32" if d["want"] else codes,
                   mtab_ptr="*i32", btab_ptr="*i32", n=i32, seed_lo=i32, seed_hi=i32,
                   off_lo=i32, off_hi=i32, sr_bits=i32, bf16=i32)
        return _compile(minifloat._codec_kernel, sig, C, minifloat._NUM_WARPS)
    if name == "pow2":
        e8 = SPECS["e8m0"]
        C = dict(IN_KIND=d["kind"], BIAS=e8.bias, MAXC=e8.max_code, NANC=e8.nan_code,
                 MODE=d["mode"], SAT=False, OVF_MAX=False, WANT_VALUE=d["want"],
                 BLOCK=minifloat._GPU_BLOCK_GENERIC)
        sig = dict(x_ptr=_IN_TYPES[d["kind"]], out_ptr="*fp32" if d["want"] else "*u8", n=i32,
                   seed_lo=i32, seed_hi=i32, off_lo=i32, off_hi=i32, sr_bits=i32, bf16=i32)
        return _compile(minifloat._pow2_kernel, sig, C, minifloat._NUM_WARPS)
    if name == "lookup":
        sig = dict(codes_ptr="*u8", table_ptr="*fp32", out_ptr="*fp32", n=i32)
        return _compile(minifloat._lookup_kernel, sig,
                        dict(BLOCK=minifloat._GPU_BLOCK, NT=d.get("nt", 0)), 4)
    if name == "mx":
        C = mx.block_constexprs(d["fmt"], d["kind"] == 1, d["mode"], d["want"], d["kk"])
        C["IN_KIND"] = d["kind"]
        sig = dict(x_ptr=_IN_TYPES[d["kind"]], codes_ptr="*u8", scales_ptr="*u8",
                   out_ptr="*fp32", mtab_ptr="*i32", btab_ptr="*i32", vtab_ptr="*fp32",
                   rows=i32, n=i32, nb=i32, kk=i32, seed_lo=i32, seed_hi=i32, off_lo=i32,
                   off_hi=i32, sr_bits=i32, smode=i32, sat_inf=i32, bf16=i32)
        return _compile(mx._block_kernel, sig, C, 4)
    if name == "mx_decode":
        sig = dict(codes_ptr="*u8", scales_ptr="*u8", vtab_ptr="*fp32", out_ptr="*fp32",
                   total=i32, n=i32, nb=i32, kk=i32)
        return _compile(mx._decode_blocks, sig, dict(BLOCK=4096, NT=d.get("nt", 0)), 8)
    lay = dict(n=i32, k0_lo=i32, k0_hi=i32, L=i32, Q=i32, bm=i32, sm=i32, so=i32, bi=i32,
               si=i32, qmin=i32, qmax=i32)
    if name == "int":
        sig = dict(x_ptr=_IN_TYPES[d["kind"]], scale_ptr="*fp32", zp_ptr="*i32",
                   out_ptr="*fp32" if d["want"] else "*u8", **lay, seed_lo=i32, seed_hi=i32,
                   off_lo=i32, off_hi=i32, sr_bits=i32, one_group=i32, small=i32, has_zp=i32,
                   bf16=i32)
        C = dict(IN_KIND=d["kind"], MODE=d["mode"], WANT_VALUE=d["want"], BLOCK=2048)
        return _compile(integer._rows, sig, C, 8)
    sig = dict(codes_ptr="*u8", scale_ptr="*fp32", zp_ptr="*i32", out_ptr="*fp32", **lay,
               one_group=i32, small=i32, has_zp=i32)
    return _compile(integer._decode_kernel, sig, dict(SIGNED=d["signed"], BLOCK=4096), 8)


def _ptx_only() -> None:
    """Stop each compilation at PTX: the cubin stage (ptxas, about a quarter of the time) returns
    nothing.  Used with a throw-away Triton cache, so no empty cubin is ever cached for real."""
    from triton.backends.nvidia.compiler import CUDABackend

    CUDABackend.make_cubin = lambda self, src, metadata, opt, capability: b""


def sample(items: list, every: int) -> list:
    """Every ``every``-th variant of each kernel, its first included (each kernel stays
    covered)."""
    seen: dict = {}
    out = []
    for it in items:
        i = seen[it[0]] = seen.get(it[0], -1) + 1
        if i % every == 0:
            out.append(it)
    return out


def run(jobs: int | None = None, limit: int | None = None, ptx_only: bool = False,
        every: int = 1) -> dict:
    """Compile every variant (``jobs`` processes; with ``every`` > 1 only :func:`sample`'s);
    returns the JSON-able report."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    import tempfile

    import triton

    everything = variants()[:limit]
    items = sample(everything, every) if every > 1 else everything
    t0 = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    tmp = None
    if ptx_only:
        tmp = tempfile.TemporaryDirectory(prefix="lowprec-ptx-")
        os.environ["TRITON_CACHE_DIR"] = tmp.name
        _ptx_only()
    try:
        if jobs > 1:
            with ProcessPoolExecutor(jobs, initializer=_ptx_only if ptx_only else None) as ex:
                results = list(ex.map(compile_variant, items, chunksize=4))
        else:
            results = [compile_variant(it) for it in items]
    finally:
        if tmp is not None:
            tmp.cleanup()
    bad = [r for r in results if not r["ok"]]
    by_kernel: dict = {}
    for r in results:
        by_kernel[r["kernel"]] = by_kernel.get(r["kernel"], 0) + 1
    return dict(triton=triton.__version__, target=list(TARGET), ptx_only=ptx_only,
                variants=len(results), all_variants=len(everything),
                all_kernels=sorted({it[0] for it in everything}), per_kernel=by_kernel,
                failures=bad, seconds=round(time.perf_counter() - t0, 1),
                compile_seconds=round(sum(r["seconds"] for r in results), 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N variants")
    ap.add_argument("--json", default=None, help="write the report to this file")
    ap.add_argument("--ptx-only", action="store_true", help="stop at PTX (skip ptxas)")
    ap.add_argument("--every", type=int, default=1,
                    help="compile every N-th variant of each kernel (its first included)")
    a = ap.parse_args(argv)
    if a.every < 1:
        ap.error("--every must be >= 1")
    rep = run(a.jobs, a.limit, a.ptx_only, a.every)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rep, fh, indent=1)
    print(f"triton {rep['triton']} sm_{TARGET[1]}: {rep['variants']} variants "
          f"{rep['per_kernel']}, {len(rep['failures'])} failing, {rep['seconds']} s")
    for r in rep["failures"][:10]:
        print("  FAIL", {k: v for k, v in r.items() if k not in ("seconds",)})
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
