"""Bit-identity of the GPU attention engine against the CPU engine at long context.

Runs :func:`lowprec.gpu.engine.run_engine_gpu` (CUDA) and :func:`lowprec.kernels.online.run_engine`
(Numba, all host cores) on the same inputs for ``flash`` and every ``baps`` configuration, at
L = 4096 (4 query heads on 2 key/value heads: GQA) and L = 16384 (2 query heads on 1), causal
and not, with bfloat16 inputs and float32 inputs (``flash`` uses the float32 values, ``baps``
rounds them to bfloat16 first, on the device, as ``input_dtype="bfloat16"`` does), plus at
L = 4096: ``e2e_hif8`` on unrounded float32 values (``input_dtype="float32"``: the unfused
product loops) and a key-padding boolean mask shared by the heads.  Outputs are compared as
uint32 bits (NaN by class), per-tile flags and restarted-row counts exactly.

Usage (GPU machine, repository root)::

    PYTHONPATH=. python scripts/gpu_attention_check.py            # about 3-5 minutes
    PYTHONPATH=. python scripts/gpu_attention_check.py --lengths 4096 --configs flash,e2e_hif8
    PYTHONPATH=. python scripts/gpu_attention_check.py --device cpu --lengths 64,96   # no GPU:
        # the Triton interpreter at tiny sizes (checks the script itself)

Prints one line per case and a summary; writes ``$OUT/gpu_attention_check.json`` when ``OUT``
is set.  Exit status 1 when any case differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time

CONFIGS = ("flash", "default", "exp2_hif8", "exp2_e4m3", "exp2_e5m2", "exp2_e4m3xe5m2",
           "e2e_hif8", "naive_e2e")
HEADS = {4096: (4, 2), 16384: (2, 1)}  # L -> (query heads, key/value heads)
AMP = 2.0  # input standard deviation: base-2 scores of a few units, restarts at every tau


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="4096,16384", help="comma-separated sequence lengths")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configs")
    p.add_argument("--d", type=int, default=128, help="head dimension")
    p.add_argument("--block", type=int, default=128, help="block_q = block_k")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: Triton interpreter (tiny sizes only)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run every case, print and save the report; 0 when every case is bit-identical."""
    a = _args(argv)
    if a.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the engine's kernels are decorated
    import ml_dtypes
    import numpy as np
    import torch
    import triton

    from lowprec.gpu.engine import run_engine_gpu, sequential_interpreter_dot
    from lowprec.kernels import baps, online

    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (use --device cpu for the interpreter)", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    lengths = [int(x) for x in a.lengths.split(",") if x]
    configs = [c for c in a.configs.split(",") if c]
    bad_cfg = [c for c in configs if c not in CONFIGS]
    if bad_cfg:
        print(f"unknown configs {bad_cfg}; choose from {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(a.seed)
    cases = []
    t_all = time.time()

    def cfg_of(name, **opts):
        if name == "flash":
            return online.EngineConfig(flow=online.FA2, exp=online.EXP_FLOAT)
        return baps.make_config(name, **opts)

    def run_case(name, L, Hq, Hkv, causal, dtype, *, input_f32=False, mask=False):
        d = a.d
        group = Hq // Hkv
        q = (rng.standard_normal((1, Hq, L, d)) * AMP).astype(np.float32)
        k = (rng.standard_normal((1, Hkv, L, d)) * AMP).astype(np.float32)
        v = rng.standard_normal((1, Hkv, L, d)).astype(np.float32)
        if dtype == "bf16":
            q, k, v = (x.astype(bf16).astype(np.float32) for x in (q, k, v))
        round_dev = name != "flash" and dtype == "f32" and not input_f32
        # the CPU computes with what baps hands its engine: bf16-rounded values by default
        cq, ck, cv = ((x.astype(bf16).astype(np.float32) for x in (q, k, v)) if round_dev
                      else (q, k, v))
        B = Hq
        planes = mmap = None
        if mask:  # key padding per batch entry: one plane shared by the heads
            keep = np.ones((1, L, L), dtype=bool)
            keep[:, :, L - L // 5:] = False
            keep[:, : L // 50, :] = rng.random((1, L // 50, L)) > 0.5
            planes = np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
            mmap = np.zeros(B, dtype=np.int64)
        cfg = cfg_of(name)
        t0 = time.time()
        ref = online.run_engine(
            np.ascontiguousarray(cq.reshape(B, L, d)),
            np.ascontiguousarray(np.repeat(ck, group, axis=1).reshape(B, L, d)),
            np.ascontiguousarray(np.repeat(cv, group, axis=1).reshape(B, L, d)),
            scale=d ** -0.5, causal=causal, mask=planes,
            mask_map=mmap if mmap is not None else np.zeros(B, np.int64),
            block_q=a.block, block_k=a.block, cfg=cfg)
        t_cpu = time.time() - t0
        store = torch.bfloat16 if dtype == "bf16" else torch.float32
        tq, tk, tv = (torch.from_numpy(x).to(store).to(dev) for x in (q, k, v))
        tm = None if planes is None else torch.from_numpy(planes).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.time()
        out, flags, rr = run_engine_gpu(tq, tk, tv, scale=d ** -0.5, causal=causal, mask=tm,
                                        mask_map=mmap, block_q=a.block, block_k=a.block,
                                        cfg=cfg, round_inputs_bf16=round_dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t_gpu = time.time() - t0
        o_gpu = out.float().cpu().numpy().reshape(B, L, d)
        o_cpu = ref[0]
        n1, n2 = np.isnan(o_cpu), np.isnan(o_gpu)
        same_nan = bool(np.array_equal(n1, n2))
        diff = np.where(n1 | n2, 0, o_cpu).view(np.uint32) != \
            np.where(n1 | n2, 0, o_gpu).view(np.uint32)
        n_diff = int(diff.sum())
        flags_eq = bool(np.array_equal(ref[1], flags.cpu().numpy()))
        rr_eq = bool(np.array_equal(ref[2], rr.cpu().numpy()))
        ok = same_nan and n_diff == 0 and flags_eq and rr_eq
        rec = dict(config=name, L=L, heads=[Hq, Hkv], causal=causal, inputs=dtype,
                   input_dtype_f32=input_f32, mask=mask, equal=ok, differing_outputs=n_diff,
                   nan_positions_equal=same_nan, flags_equal=flags_eq,
                   row_restarts_equal=rr_eq, restarted_rows=int(ref[2].sum()),
                   tiles_restarted=int((ref[1] == 1).sum()), cpu_s=round(t_cpu, 3),
                   gpu_s_first_call=round(t_gpu, 3))
        if n_diff:
            idx = np.argwhere(diff)[0].tolist()
            rec["first_difference"] = dict(index=idx, cpu=float(o_cpu[tuple(idx)]),
                                           gpu=float(o_gpu[tuple(idx)]))
        cases.append(rec)
        extra = " f32-values" if input_f32 else (" mask" if mask else "")
        print(f"{'OK  ' if ok else 'DIFF'} {name:15s} L={L:<6d} heads={Hq}/{Hkv} "
              f"causal={causal!s:5s} inputs={dtype}{extra:11s} diff={n_diff} "
              f"flags={'=' if flags_eq else '!='} restarts={int(ref[2].sum())} "
              f"cpu {t_cpu:6.2f} s  gpu {t_gpu:6.2f} s", flush=True)

    stack = contextlib.ExitStack()
    if a.device == "cpu":  # the interpreter's tl.dot in the GPU's order (engine docstring)
        stack.enter_context(sequential_interpreter_dot())
    with stack:
        run_all(run_case, lengths, configs)
    n_bad = sum(not c["equal"] for c in cases)

    report = dict(device=(torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu "
                          "(Triton interpreter)"), torch=torch.__version__,
                  triton=triton.__version__, python=platform.python_version(),
                  host_cores=os.cpu_count(), cases=cases, all_equal=n_bad == 0,
                  cases_differing=n_bad, seconds=round(time.time() - t_all, 1))
    print(f"{len(cases) - n_bad}/{len(cases)} cases bit-identical (outputs, flags, restarts) "
          f"in {report['seconds']} s on {report['device']}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "gpu_attention_check.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 1 if n_bad else 0


def run_all(run_case, lengths, configs) -> None:
    """The case list: every config x inputs x causal at every length; at the shortest length
    also e2e_hif8 on float32 values and a masked case."""
    for L in lengths:
        Hq, Hkv = HEADS.get(L, (2, 1))
        for name in configs:
            for dtype in ("bf16", "f32"):
                for causal in (False, True):
                    run_case(name, L, Hq, Hkv, causal, dtype)
        if L == min(lengths):
            for name in [c for c in ("e2e_hif8",) if c in configs]:
                run_case(name, L, Hq, Hkv, True, "f32", input_f32=True)
            for name in [c for c in ("flash", "e2e_hif8") if c in configs]:
                run_case(name, L, Hq, Hkv, False, "bf16", mask=True)


if __name__ == "__main__":
    sys.exit(main())
