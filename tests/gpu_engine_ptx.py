"""Ahead-of-time compilation of the GPU attention engine's kernels and a scan of their PTX.

No GPU needed (specs/gpu.md section 4): every kernel variant is compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` and its PTX is scanned for
instructions that break bit-exactness (specs/gpu.md section 2):

* approximate or flushing arithmetic: ``div.full``, ``*.approx``, ``.ftz`` (the one allowed
  occurrence is libdevice's double ``exp2`` range test, ``abs.ftz.f32`` on the high word of the
  double followed by ``setp.lt.f32 .., 0f408FF000``: a flushed subnormal pattern is below the
  bound either way), ``cvt`` with ``sat``, float rounding ``cvt.rni/rpi/rmi`` to float,
  tensor-core ``mma``/``wgmma`` (their accumulation order is not the sequential one);
* ``fma.rn.f32`` anywhere but in the fused product loops (``tl.fma``, run only on tiles whose
  products the guard proves exact): the count must equal their multiply-adds (per thread
  share of ``BM*BN`` times ``UK + 1`` for q k^T, of ``BM*DV`` times ``UNROLL + 1`` for P v)
  and be 0 when the exact products are switched off.

Also catches what the interpreter accepts and the compiler rejects.  Must run WITHOUT
``TRITON_INTERPRET`` (the kernels have to be JIT functions): the test runs it in a subprocess.

Usage: ``python tests/gpu_engine_ptx.py [--full] [--json]`` (exit status 1 on a finding).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

_FMA_PTR = {"QT": "*fp32", "KT": "*fp32", "VF": "*fp32", "QG": "*fp32", "G": "*fp32",
            "MASK": "*fp32", "MMAP": "*i32", "VIS": "*i8", "TAB": "*i32", "PTAB": "*fp32",
            "VTAB": "*fp32", "CLIST": "*i32", "IN_LIST": "*i32", "SCR": "*fp32", "OUT": "*fp32",
            "FLAGS": "*i8", "RR": "*i32"}
_FORBIDDEN = re.compile(r"\b(div\.full\S*|\S+\.approx\S*|cvt\S*sat\S*|cvt\.r[npm]i\.f\S*"
                        r"|w?mma\.\S*)")
_LIBDEVICE_EXP2_TEST = "0f408FF000"  # libdevice exp2's |hi word| range bound


def variants(full: bool = False) -> list[dict]:
    """Kernel variants to compile: every value of every switch at least once (``full``: also
    the large tiles the GPU uses by default, which take seconds each)."""
    from lowprec.kernels import online as o

    base = dict(BM=32, BN=32, DV_PAD=32, UK=4, UNROLL=4, FLOW=o.FA2, EXP=o.EXP_FLOAT,
                PRE_HIF8=False, CRIT=o.CRIT_NONE, MAX_ROUND=o.ROUND_RINT, GRAN=o.GRAN_TILE,
                ACC=o.ACC_F32, HAS_MASK=False, TRY_EXACT_QK=True, TRY_EXACT_PV=False,
                O_MEM=False, QK_STAGES=0, PV_STAGES=0)
    table = dict(EXP=o.EXP_TABLE, TRY_EXACT_PV=True)
    e2e = dict(table, FLOW=o.E2E, CRIT=o.CRIT_FIRST)
    out = [
        ("flash", {}),
        ("flash mask", dict(HAS_MASK=True)),
        ("exp2_table", table),
        ("exp2_table mask acc16", dict(table, HAS_MASK=True, ACC=o.ACC_F16)),
        ("naive_e2e", dict(table, PRE_HIF8=True)),
        ("e2e first", e2e),
        ("e2e first O in memory", dict(e2e, O_MEM=True)),
        ("e2e first+last mask ceil", dict(e2e, CRIT=o.CRIT_FIRST_LAST, HAS_MASK=True,
                                          MAX_ROUND=o.ROUND_CEIL)),
        ("e2e first+diag row bf16acc", dict(e2e, CRIT=o.CRIT_FIRST_DIAG, GRAN=o.GRAN_ROW,
                                            ACC=o.ACC_BF16)),
        ("e2e list", dict(e2e, CRIT=o.CRIT_LIST)),
        ("e2e no exact products", dict(e2e, TRY_EXACT_QK=False, TRY_EXACT_PV=False)),
        ("flash no exact products", dict(TRY_EXACT_QK=False)),
        ("e2e pipelined, unroll 8", dict(e2e, QK_STAGES=2, PV_STAGES=2, UK=8, UNROLL=8)),
        ("flash dv 16", dict(DV_PAD=16)),
    ]
    res = [dict(name=n, const=dict(base, **c), num_warps=4) for n, c in out]
    if full:
        big = dict(BM=128, BN=128, DV_PAD=128)  # the default launches
        res += [dict(name="flash 128", const=dict(base, **big, UK=8, UNROLL=8), num_warps=8),
                dict(name="e2e 128", const=dict(base, **e2e, **big, UK=8, UNROLL=8,
                                                QK_STAGES=3, PV_STAGES=3), num_warps=16),
                dict(name="flash 64 rows", const=dict(base, **dict(big, BM=64)), num_warps=8)]
    return res


def compile_ptx(fn, const: dict, ptrs: dict, num_warps: int, target=(90, 32)) -> str:
    """PTX of the JIT kernel ``fn`` with constexprs ``const`` (all other ints i32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {a: ("constexpr" if a in const else ptrs.get(a, "i32")) for a in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=const)
    k = triton.compile(src, target=GPUTarget("cuda", *target),
                       options={"enable_fp_fusion": False, "num_warps": num_warps})
    return k.asm["ptx"]


def expected_fma(const: dict, num_warps: int) -> set:
    """Allowed ``fma.rn.f32`` counts: those of the fused product loops, run only on tiles
    whose products the guard proves exact (``UK`` or ``UNROLL`` steps per iteration and a
    one-step remainder loop; the dot layout anchors multiply constant zeros, which LLVM
    folds away)."""
    per = 32 * num_warps
    qk = (const["UK"] + 1) * const["BM"] * const["BN"] // per if const["TRY_EXACT_QK"] else 0
    pv = ((const["UNROLL"] + 1) * const["BM"] * const["DV_PAD"] // per
          if const["TRY_EXACT_PV"] else 0)
    return {qk + pv}


def scan(ptx: str) -> list[str]:
    """Findings (forbidden instructions with their line) in ``ptx``; the libdevice exp2 range
    test is the one tolerated ``.ftz``."""
    lines = ptx.splitlines()
    bad = []
    for n, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("//"):
            continue
        if _FORBIDDEN.search(s):
            bad.append(f"{n + 1}: {s}")
        elif ".ftz" in s:
            nxt = next((x.strip() for x in lines[n + 1:] if x.strip()), "")
            ok = s.startswith("abs.ftz.f32") and nxt.startswith("setp.lt.f32") and \
                _LIBDEVICE_EXP2_TEST in nxt
            if not ok:
                bad.append(f"{n + 1}: {s}")
    return bad


def kernel_ptx_checks(full: bool = False) -> list[dict]:
    """Compile and scan every variant of the engine and of its pre-pass kernels."""
    import triton

    from lowprec.gpu import engine as ge

    if not isinstance(ge._engine, triton.runtime.jit.JITFunction):
        raise RuntimeError("the kernels are not JIT functions: unset TRITON_INTERPRET")
    results = []
    for var in variants(full):
        t0 = time.time()
        ptx = compile_ptx(ge._engine, var["const"], _FMA_PTR, var["num_warps"])
        fma = len(re.findall(r"^\s*fma\.rn\.f32\b", ptx, re.M))
        findings = scan(ptx)
        want = expected_fma(var["const"], var["num_warps"])
        if fma not in want:
            findings.append(f"fma.rn.f32 count {fma}, expected one of {sorted(want)}")
        results.append(dict(kernel="_engine", variant=var["name"], seconds=time.time() - t0,
                            fma=fma, findings=findings))
    pre = [
        (ge._visible_tiles, dict(CAUSAL=True, BM=32, BN=32), {"MASK": "*fp32", "VIS": "*i8"}),
        (ge._prep_q, dict(BQ=32, BM=16, D_PAD=32, ROUND=True, LOW=ge._LOW_QK.value),
         {"Q": "*fp32", "QT": "*fp32", "QG": "*fp32"}),
        (ge._prep_kv, dict(BN=32, D_PAD=32, DV_PAD=32, ROUND=False, LOW_K=ge._LOW_QK.value,
                           LOW_V=ge._LOW_V.value), {"K": "*fp16", "V": "*bf16", "KT": "*fp32",
                                                    "VF": "*fp32", "G": "*fp32"}),
        (ge._round_bf16_kernel, dict(BLOCK=1024), {"X": "*fp32", "Y": "*i16"}),
    ]
    for fn, const, ptrs in pre:
        t0 = time.time()
        ptx = compile_ptx(fn, const, ptrs, 4)
        findings = scan(ptx)
        if re.search(r"^\s*fma\.rn\.f32\b", ptx, re.M):
            findings.append("fma.rn.f32 in a kernel without dots")
        results.append(dict(kernel=fn.fn.__name__, variant="", seconds=time.time() - t0,
                            fma=0, findings=findings))
    return results


def main(argv=None) -> int:
    """Command line: compile, scan, print a table (or JSON); exit status 1 on any finding."""
    argv = sys.argv[1:] if argv is None else argv
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    res = kernel_ptx_checks(full="--full" in argv)
    n_bad = sum(len(r["findings"]) for r in res)
    if "--json" in argv:
        print(json.dumps(dict(triton=triton.__version__, results=res, findings=n_bad)))
    else:
        print(f"triton {triton.__version__}, target cuda sm_90")
        for r in res:
            status = "ok" if not r["findings"] else "; ".join(r["findings"][:5])
            print(f"{r['kernel']:20s} {r['variant']:36s} {r['seconds']:6.1f} s  "
                  f"fma.rn.f32={r['fma']:<6d} {status}")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
