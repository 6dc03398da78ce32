"""The Triton kernels of the row-wise schemes' device paths (``lowprec.gpu.rowsum``,
``lowprec.gpu.index_attention``, ``lowprec.gpu.qflash_kernel``, ``lowprec.gpu.intflash_kernel``,
``lowprec.gpu.exp2f``, ``lowprec.gpu.int8codes``, ``lowprec.gpu.rowstats``,
``lowprec.gpu.quant_only_kernel``, ``lowprec.gpu.ivit_kernel`` (``ivit``, ``ibert``),
``lowprec.gpu.callstats``) compiled ahead of time for sm_90 (no GPU needed, specs/gpu.md
section 4): its PTX holds the sequential IEEE adds (``add.f32`` / ``add.f64``, round to
nearest) and none of the forbidden instructions (``scripts/gpu_ptx_check.FORBIDDEN``:
approximate or flushing arithmetic, FMA, saturating narrow conversions).  Runs in a
subprocess without ``TRITON_INTERPRET``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.rowsum import _seq_rowsum_kernel
rep = {}
for ty in ("fp32", "fp64"):
    sig = {"X": "*" + ty, "OUT": "*" + ty, "N": "i32", "L": "i32"}
    ptx = _compile(_seq_rowsum_kernel, sig, {"BLOCK_R": 128}, 4)
    bad = [ln.strip() for ln in ptx.splitlines() if FORBIDDEN.search(ln)]
    adds = len(re.findall(r"\\badd\\.(?:rn\\.)?" + ty.replace("fp", "f") + r"\\b", ptx))
    rep[ty] = {"bad": bad[:5], "adds": adds}
print(json.dumps(rep))
"""


def _ptx_report(script: str):
    """Run a compile script in a subprocess without ``TRITON_INTERPRET``; its last stdout line
    (JSON)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_seq_rowsum_compiles_to_clean_ptx():
    rep = _ptx_report(_SCRIPT)
    for ty in ("fp32", "fp64"):
        assert rep[ty]["bad"] == [], rep
        assert rep[ty]["adds"] >= 1, rep


_IA_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.index_attention import _intattention_kernel
sig = {"Q8": "*i8", "K8": "*i8", "V8": "*i8", "CINT": "*i32", "LUT": "*i32", "SV": "*fp32",
       "OUT": "*fp32", "INFO": "*i64", "Lq": "i32", "Lk": "i32", "D": "i32",
       "DV": "i32", "shift": "i32", "nb": "i32", "iz": "i32"}
rep = []
for causal in (False, True):
    for mode in (0, 1):
        for pmax in (255, 127):
            for acc64 in (False, True):
                c = dict(CAUSAL=causal, MODE=mode, PMAX=pmax, ACC64=acc64, BM=64, BN=64,
                         BD=128, BDV=32, NBP=32, WIDE=acc64)
                ptx = _compile(_intattention_kernel, sig, c, 4, num_stages=3)
                rep.append({"c": [causal, mode, pmax, acc64],
                            "bad": [ln.strip() for ln in ptx.splitlines()
                                    if FORBIDDEN.search(ln)][:5],
                            "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
                            "imma": len(re.findall(r"\\.s32\\.s8\\.s8", ptx))})
print(json.dumps(rep))
"""


def test_intattention_kernel_compiles_to_clean_ptx():
    """Every constexpr variant of the fused IntAttention kernel: no forbidden instruction,
    IEEE divisions (``div.rn``) only, both GEMMs on int8 tensor cores (s32 += s8 x s8)."""
    rep = _ptx_report(_IA_SCRIPT)
    assert len(rep) == 16
    for r in rep:
        assert r["bad"] == [], r
        assert all(d.startswith(("div.rn.", "div.s64", "div.u64")) for d in r["div"]), r
        assert r["imma"] >= 2, r


_CODES_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.int8codes import _int8_codes_kernel
from lowprec.gpu.rowstats import _row_amax_kernel
codes = []
for x in ("*fp32", "*fp16", "*i16"):  # (bfloat16 read as its bits)
    for s in ("*fp32", "*fp64"):
        for has_src in (False, True):
            sig = {"X": x, "SRC": "*i64" if has_src else x, "S": s, "OUT": "*i8", "L": "i32",
                   "D": "i32", "nl": "i32", "s_b": "i32", "s_l": "i32"}
            c = {"QMIN": -128 if has_src else -127, "BF16": x == "*i16", "HAS_SRC": has_src,
                 "BLOCK_L": 64, "BD": 128}
            ptx = _compile(_int8_codes_kernel, sig, c, 4)
            codes.append({"c": [x, s, has_src],
                          "bad": [ln.strip() for ln in ptx.splitlines()
                                  if FORBIDDEN.search(ln)][:5],
                          "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
                          "n_div": ptx.count("div.rn.f64")})
amax = []
for kind, x in ((0, "*i16"), (1, "*i16"), (2, "*i32")):
    sig = {"X": x, "OUT": "*fp64", "R": "i32", "L": "i32", "D": "i32", "s_n": "i32",
           "s_l": "i32", "s_d": "i32"}
    ptx = _compile(_row_amax_kernel, sig, {"KIND": kind, "BLOCK_R": 32, "BD": 128}, 4)
    amax.append({"kind": kind,
                 "bad": [ln.strip() for ln in ptx.splitlines() if FORBIDDEN.search(ln)][:5],
                 "float_ops": sorted(set(re.findall(
                     r"\\b(?:add|sub|mul|div|fma|max|min|abs|neg)\\.[a-z.]*f(?:16|32|64)\\b",
                     ptx))),
                 "int_max": len(re.findall(r"\\bmax\\.s32", ptx))})
print(json.dumps({"codes": codes, "amax": amax}))
"""


def test_int8_codes_kernel_compiles_to_clean_ptx():
    """The int8 codes kernel in every input dtype, scale dtype and indexing: nothing
    forbidden, IEEE float64 divisions only (the per-row reciprocal and the near-tie
    quotient; integer ones for the program's block).  The row maxima kernel in each stored
    dtype: nothing forbidden and no float arithmetic (integer maxima on the bits)."""
    rep = _ptx_report(_CODES_SCRIPT)
    assert len(rep["codes"]) == 12
    for r in rep["codes"]:
        assert r["bad"] == [] and r["n_div"] >= 2, r
        assert set(r["div"]) <= {"div.rn.f64", "div.s32", "div.s64"}, r
    assert len(rep["amax"]) == 3
    for r in rep["amax"]:
        assert r["bad"] == [] and r["float_ops"] == [] and r["int_max"] >= 1, r


_QF_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.qflash_kernel import _qflash_kernel
sig = {"Q8": "*i8", "K8": "*i8", "V8": "*i8", "CONST": "*i64", "SV": "*fp64",
       "OUT": "*fp32", "CNT": "*i64", "Lq": "i32", "Lk": "i32", "D": "i32", "DV": "i32",
       "shift": "i32", "bk": "i32", "nk": "i32", "m_init": "i32", "acc_limit": "i32",
       "fast_on": "i32"}
rep = []
for causal in (False, True):
    for division in (False, True):
        for acc in (False, True):
            c = dict(CAUSAL=causal, DIVISION=division, ACCUMULATE=acc, BM=64, BN=32, BD=128,
                     BDV=64)
            ptx = _compile(_qflash_kernel, sig, c, 4, num_stages=1)
            rep.append({"c": [causal, division, acc],
                        "bad": [ln.strip() for ln in ptx.splitlines()
                                if FORBIDDEN.search(ln)][:5],
                        "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
                        "imma": len(re.findall(r"\\.s32\\.s8\\.s8", ptx))})
print(json.dumps(rep))
"""


def test_qflash_kernel_compiles_to_clean_ptx():
    """Every constexpr variant of the QFlash kernel: nothing forbidden, IEEE or integer
    divisions only, both GEMMs on int8 tensor cores."""
    rep = _ptx_report(_QF_SCRIPT)
    assert len(rep) == 8
    for r in rep:
        assert r["bad"] == [], r
        assert all(d.startswith(("div.rn.", "div.s64", "div.s32", "div.u64", "div.u32"))
                   for d in r["div"]), r
        assert r["imma"] >= 2, r


_IF_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.exp2f import _exp2_kernel
from lowprec.gpu.intflash_kernel import _intflash_kernel, launch_config

def scan(ptx):
    lines = [ln.strip() for ln in ptx.splitlines()]
    bad, tests = [], 0
    for n, s in enumerate(lines):
        if not FORBIDDEN.search(s) or s.startswith(("fma.rn.f32", "fma.rn.f64")):
            continue
        nxt = next((x for x in lines[n + 1:] if x), "")
        if s.startswith("abs.ftz.f32") and nxt.startswith("setp.lt.f32") and \\
                "0f408FF000" in nxt:
            tests += 1  # libdevice exp2's range test on the high word of the double
            continue
        bad.append(s)
    mma = [s.split()[0] for s in lines if re.match(r"(wg)?mma\\.(sync|mma_async)", s)]
    return {"bad": bad[:5], "exp2": tests,
            "fma32": len([s for s in lines if s.startswith("fma.rn.f32")]),
            "fma64": len([s for s in lines if s.startswith("fma.rn.f64")]),
            "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
            "imma": len([m for m in mma if m.endswith(".s32.s8.s8")]),
            "float_mma": [m for m in mma if not m.endswith(".s32.s8.s8")]}

one = scan(_compile(_exp2_kernel, {"X": "*fp32", "OUT": "*fp32", "KEYS": "*i32",
                                   "VALS": "*fp32", "n": "i32"}, {"BLOCK": 128}, 4))
sig = {"Q8": "*i8", "K8": "*i8", "V": "*i8", "KV": "*i64", "SQ": "*fp32", "SK": "*fp32",
       "SV": "*fp32", "KEYS": "*i32", "VALS": "*fp32", "OUT": "*fp32", "CNT": "*i32",
       "b0": "i32", "Lq": "i32", "Lk": "i32", "D": "i32", "DV": "i32", "shift": "i32",
       "bk": "i32", "nk": "i32", "c_bits": "i32"}
rep = []
for causal in (False, True):
    for half in (False, True):
        bm, sub, subm, warps = launch_config(half, 64)
        c = dict(CAUSAL=causal, HALF=half, BM=bm, SUB=sub, SUBM=subm, BD=32, BDV=32)
        ptx = _compile(_intflash_kernel, dict(sig, V="*fp16" if half else "*i8"), c, warps,
                       num_stages=1)
        rep.append(dict(scan(ptx), c=c, threads=32 * warps))
print(json.dumps({"exp2": one, "kernel": rep}))
"""


def test_intflash_kernel_compiles_to_clean_ptx():
    """Every constexpr variant of the INT-FlashAttention kernel (causal x full/half) and its
    exp2 alone: nothing forbidden but libdevice's double ``exp2`` (its ``fma.rn.f64``
    polynomial and ``.ftz`` range test: the same count per exp2 as in the exp2 kernel) and
    the sequential dots' ``fma.rn.f32`` (exactly one per product of ``seq_dot`` in a key
    sub-tile: the row sums' ``BM x SUB x 16`` and half's ``BM x SUB x BDV``, all of exact
    products); IEEE or
    integer divisions; the integer GEMMs on int8 tensor cores and no float tensor-core
    product."""
    rep = _ptx_report(_IF_SCRIPT)
    one = rep["exp2"]
    assert one["bad"] == [] and one["exp2"] == 1 and one["fma64"] > 0 and one["fma32"] == 0, one
    assert len(rep["kernel"]) == 4
    for r in rep["kernel"]:
        c = r["c"]
        assert r["bad"] == [], r
        assert r["exp2"] > 0 and r["fma64"] == r["exp2"] * one["fma64"], r
        per = c["BM"] * c["SUB"] * (16 + (c["BDV"] if c["HALF"] else 0))
        assert r["fma32"] == per // r["threads"], r
        assert set(r["div"]) <= {"div.rn.f32", "div.s32"}, r
        assert r["imma"] >= (1 if c["HALF"] else 2) and r["float_mma"] == [], r


_STATS_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.callstats import (_ROWS_SHAPES, _SHAPES, _call_stats_kernel,
                                   _rows_counts_kernel)

def scan(ptx, c):
    return {"c": c, "bad": [ln.strip() for ln in ptx.splitlines() if FORBIDDEN.search(ln)][:5],
            "sqrt": sorted(set(re.findall(r"\\bsqrt\\.[a-z0-9.]+", ptx))),
            "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx)))}

rep = []
strides = ("sqz", "sqh", "sqm", "sqd", "skz", "skh", "skn", "skd")
for x in ("*fp32", "*fp16", "*bf16"):
    for noise in (False, True):
        sig = {"Q": x, "K": x, "OUT": "*fp32", "FLAGS": "*i8", "RR": "*i32", "PACK": "*i64",
               **{n: "i32" for n in strides + tuple(_SHAPES)}}
        ptx = _compile(_call_stats_kernel, sig,
                       {"NOISE": noise, "BM": 64, "BD": 64, "BDV": 64, "BF": 256}, 4)
        rep.append(scan(ptx, ["call_stats", x, noise]))
for x in ("*fp32", "*fp16", "*bf16", "*fp64"):
    for noise, tensor in ((False, False), (True, False), (True, True)):
        sig = {"Q": x, "K": x, "KV": "*i64", "TOP": "*fp64", "OUT": "*fp32", "PACK": "*i64",
               **{n: "i32" for n in _ROWS_SHAPES}}
        ptx = _compile(_rows_counts_kernel, sig,
                       {"NOISE": noise, "TENSOR": tensor, "BM": 64, "BD": 64, "BDV": 64}, 4)
        rep.append(scan(ptx, ["rows_counts", x, noise]))
print(json.dumps(rep))
"""


def test_stats_kernels_compile_to_clean_ptx():
    """The statistics kernels of ``lowprec.gpu.callstats``: the engine call's (each input
    dtype, with and without the noise estimate) and the row-wise schemes' shared counters
    (each stored dtype, without an estimate and with the entry's or the tensor's scales):
    nothing forbidden, the float64 square root and division IEEE (``sqrt.rn.f64``,
    ``div.rn.f64``) and only where the estimate is made."""
    rep = _ptx_report(_STATS_SCRIPT)
    assert [r["c"][0] for r in rep] == ["call_stats"] * 6 + ["rows_counts"] * 12
    for r in rep:
        assert r["bad"] == [], r
        noise = r["c"][2]
        assert r["sqrt"] == (["sqrt.rn.f64"] if noise else []), r
        assert set(r["div"]) <= {"div.rn.f64", "div.s32", "div.u32", "div.s64"}, r
        assert ("div.rn.f64" in r["div"]) == noise, r


_QO_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.quant_only_kernel import LAUNCH, _exp_f64_kernel, _quant_only_kernel

def scan(ptx):
    lines = [ln.strip() for ln in ptx.splitlines()]
    bad, tests = [], 0
    for n, s in enumerate(lines):
        if not FORBIDDEN.search(s) or s.startswith("fma.rn.f64"):
            continue
        nxt = next((x for x in lines[n + 1:] if x), "")
        if s.startswith("abs.ftz.f32") and nxt.startswith("setp.lt.f32") and \\
                "0f4086232B" in nxt:
            tests += 1  # libdevice exp's range test on the high word of the double
            continue
        bad.append(s)
    mma = [s.split()[0] for s in lines if re.match(r"(wg)?mma\\.(sync|mma_async)", s)]
    return {"bad": bad[:5], "exp": tests,
            "fma32": len([s for s in lines if s.startswith("fma.rn.f32")]),
            "fma64": len([s for s in lines if s.startswith("fma.rn.f64")]),
            "add64": len([s for s in lines if s.startswith("add.rn.f64")]),
            "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
            "imma": len([m for m in mma if m.endswith(".s32.s8.s8")]),
            "float_mma": [m for m in mma if not m.endswith(".s32.s8.s8")]}

one = scan(_compile(_exp_f64_kernel, {"X": "*fp64", "OUT": "*fp64", "n": "i32"},
                    {"BLOCK": 128}, 4))
sig = {"Q8": "*i8", "K8": "*i8", "V8": "*i8", "SQ": "*fp32", "SK": "*fp32", "SV": "*fp32",
       "OUT": "*fp32", "INFO": "*i32", "b0": "i32", "Lq": "i32", "Lk": "i32", "D": "i32",
       "DV": "i32", "shift": "i32", "sq_b": "i32", "sq_l": "i32", "scale_bits": "i32"}
rep = []
for launch in (LAUNCH, (64, 64, 32, 64, 8, 1)):
    bm, bn, sub, bn3, warps, stages = launch
    for causal in (False, True):
        c = dict(CAUSAL=causal, BM=bm, BN=bn, SUB=sub, BN3=bn3, BD=128, BDV=64)
        ptx = _compile(_quant_only_kernel, sig, c, warps, num_stages=stages)
        rep.append(dict(scan(ptx), c=c, threads=32 * warps))
print(json.dumps({"exp": one, "kernel": rep}))
"""


def test_quant_only_kernel_compiles_to_clean_ptx():
    """The fused ``quant_only`` kernel (causal or not, at its launch setting and another) and
    ``tl.exp`` of a float64 alone: nothing forbidden but libdevice's double ``exp`` (its
    ``fma.rn.f64`` polynomial and its ``.ftz`` range test on the high word, the same count per
    exp as alone, and at least an exp per lane of the two exp tiles, ``BM x (SUB + BN3)`` per
    program, spread over its threads: layouts may repeat lanes);
    no float32 FMA; IEEE float64 divisions only (``e / z`` and the output's ``/ 127``); the
    float64 row sum as ``add.rn.f64`` beyond the exps' own (the chain of ``seq_cols``, not a
    float64 tensor-core dot); the three score GEMMs and ``P8 v8`` on int8 tensor cores and no
    float tensor-core product."""
    rep = _ptx_report(_QO_SCRIPT)
    one = rep["exp"]
    assert one["bad"] == [] and one["exp"] == 1 and one["fma64"] > 0 and one["fma32"] == 0, one
    assert len(rep["kernel"]) == 4
    for r in rep["kernel"]:
        c = r["c"]
        assert r["bad"] == [], r
        assert r["exp"] >= c["BM"] * (c["SUB"] + c["BN3"]) // r["threads"], r
        assert r["fma64"] == r["exp"] * one["fma64"] and r["fma32"] == 0, r
        assert r["add64"] - r["exp"] * one["add64"] >= c["SUB"], r
        assert set(r["div"]) == {"div.rn.f64"}, r
        assert r["imma"] >= 4 and r["float_mma"] == [], r


_IVIT_SCRIPT = """
import json, re, sys
sys.path.insert(0, "scripts")
from gpu_ptx_check import FORBIDDEN, _compile
from lowprec.gpu.ivit_kernel import LAUNCH, _ibert_emax_kernel, _row_absmax_kernel, _rows_kernel

def scan(ptx):
    lines = [ln.strip() for ln in ptx.splitlines()]
    mma = [s.split()[0] for s in lines if re.match(r"(wg)?mma\\.(sync|mma_async)", s)]
    return {"bad": [s for s in lines if FORBIDDEN.search(s)][:5],
            "add32": len([s for s in lines if re.match(r"add\\.(rn\\.)?f32\\b", s)]),
            "mul64": len([s for s in lines if re.match(r"mul\\.(rn\\.)?f64\\b", s)]),
            "div": sorted(set(re.findall(r"\\bdiv\\.[a-z0-9.]+", ptx))),
            "imma": len([m for m in mma if m.endswith(".s32.s8.s8")]),
            "float_mma": [m for m in mma if not m.endswith(".s32.s8.s8")]}

sig = {"Q8": "*i8", "K8": "*i8", "V8": "*i8", "S64": "*fp64", "SX64": "*fp64", "CST": "*fp32",
       "MUL": "*fp64", "SVU": "*fp64", "MROW": "*fp32", "SROW": "*i32", "OUT": "*fp32",
       "INFO": "*i64", "b0": "i32",
       "Lq": "i32", "Lk": "i32", "D": "i32", "DV": "i32", "shift": "i32", "qmax": "i32",
       "kmax32": "i32"}
runs = [(LAUNCH, False, c, r, 16) for c in (False, True) for r in (False, True)]
runs += [(LAUNCH, False, True, True, 8), (LAUNCH, False, True, True, 2),
         ((64, 64, 32, 64, 8, 1), False, False, True, 16)]
runs += [(LAUNCH, True, False, False, 8), (LAUNCH, True, True, True, 16),
         ((64, 64, 32, 64, 8, 1), True, True, False, 13)]
rep = []
for launch, ibert, causal, req, bits in runs:
    bm, bn, sub, bn3, warps, stages = launch
    c = dict(IBERT=ibert, PRE=ibert, CAUSAL=causal, REQ=req, OUT_BITS=bits,
             ND=-(-(bits + int(ibert)) // 7), BM=bm, BN=bn, SUB=sub, BN3=bn3, BD=128, BDV=64)
    rep.append(dict(scan(_compile(_rows_kernel, sig, c, warps, num_stages=stages)), c=c))
sig = {"Q8": "*i8", "K8": "*i8", "S64": "*fp64", "SX64": "*fp64", "CST": "*fp32",
       "OUT": "*fp32", "MROW": "*fp32", "SROW": "*i32", "b0": "i32", "Lq": "i32", "Lk": "i32",
       "D": "i32", "shift": "i32", "qmax": "i32"}
emax = []
for causal, req in ((False, False), (True, True)):
    c = dict(CAUSAL=causal, REQ=req, BM=LAUNCH[0], BN=LAUNCH[1], BD=128)
    emax.append(dict(scan(_compile(_ibert_emax_kernel, sig, c, LAUNCH[4],
                                   num_stages=LAUNCH[5])), c=c))
sig = {"Q8": "*i8", "K8": "*i8", "OUT": "*i32", "b0": "i32", "Lq": "i32", "Lk": "i32",
       "D": "i32", "shift": "i32"}
amax = []
for causal in (False, True):
    c = dict(CAUSAL=causal, BM=LAUNCH[0], BN=LAUNCH[1], BD=128)
    amax.append(dict(scan(_compile(_row_absmax_kernel, sig, c, LAUNCH[4],
                                   num_stages=LAUNCH[5])), c=c))
print(json.dumps({"kernel": rep, "emax": emax, "amax": amax}))
"""


def test_ivit_kernel_compiles_to_clean_ptx():
    """The fused ``ivit`` and ``ibert`` kernel (causal or not, with and without the logit
    requantisation, 1, 2 and 3 digit accumulators, its launch setting and another),
    I-BERT's row ``max e`` kernel and the row ``max |S|`` kernel: nothing forbidden (no FMA,
    no ``.ftz``: the float32 floors are integer conversions, not libdevice's ``floorf``);
    IEEE divisions only (``div.rn.f32``, and ``div.rn.f64`` for the requantisation); the
    float32 row sum's chain of ``add.f32``; I-BERT's float64 products of its 16-bit
    requantisation (``mul.f64``); the score GEMMs and the digit products on int8 tensor
    cores and no float tensor-core product."""
    rep = _ptx_report(_IVIT_SCRIPT)
    assert len(rep["kernel"]) == 10 and len(rep["emax"]) == 2 and len(rep["amax"]) == 2
    for r in rep["kernel"]:
        c = r["c"]
        assert r["bad"] == [], r
        assert set(r["div"]) == ({"div.rn.f32", "div.rn.f64"} if c["REQ"] else {"div.rn.f32"}), r
        assert r["add32"] >= c["SUB"], r
        assert r["imma"] >= 4 and r["float_mma"] == [], r
        if c["IBERT"]:
            assert r["mul64"] >= 2, r
    for r in rep["emax"]:
        assert r["bad"] == [] and r["imma"] >= 2 and r["float_mma"] == [], r
        assert set(r["div"]) == ({"div.rn.f32", "div.rn.f64"} if r["c"]["REQ"]
                                 else {"div.rn.f32"}), r
    for r in rep["amax"]:
        assert r["bad"] == [] and r["div"] == [] and r["imma"] >= 1 and r["float_mma"] == [], r
