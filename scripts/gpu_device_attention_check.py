"""Check ``lp.attention`` on CUDA tensors against the CPU path at long sequences (GPU machine;
the front end of issue 15: ``scripts/gpu_attention_check.py`` checks the bare engine).

For bf16 and float32 inputs, causal and not, ``flash`` and ``baps`` ``e2e_hif8``: the call on
CUDA tensors (the GPU engine) and on the same values as CPU tensors (the Numba engine) must give
the same output bits (NaN by position) and equal statistics (flags, restarted rows, counters).
One more case: GQA read by index with an additive key-padding mask (device) against repeated
heads (CPU).  Writes one JSON line per case to ``--out`` and prints a summary.

    python scripts/gpu_device_attention_check.py --L 4096 --heads 4 --out $OUT/check.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

if "--device" in sys.argv and "cpu" in sys.argv:  # dry run: the engine in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.kernels.device import attention_device, force_engine  # noqa: E402


def compare(ref, got) -> dict:
    o1, s1 = ref
    o2, s2 = got
    o2 = o2.cpu()
    n1, n2 = torch.isnan(o1), torch.isnan(o2)
    iv = {2: torch.int16, 4: torch.int32}[o1.element_size()]
    b1 = o1.masked_fill(n1, 0).contiguous().view(iv)
    b2 = o2.masked_fill(n2, 0).contiguous().view(iv)
    d1, d2 = s1.to_dict(), s2.to_dict()
    stats_equal = all(str(d1[k]) == str(d2[k]) for k in d1) and d1.keys() == d2.keys()
    flags_equal = all(np.array_equal(a, b) for a, b in zip(s1.flags, s2.flags, strict=True))
    return {"nan_positions_equal": bool(torch.equal(n1, n2)),
            "outputs_differing": int((b1 != b2).sum()), "outputs": int(b1.numel()),
            "stats_equal": bool(stats_equal), "flags_equal": bool(flags_equal),
            "restart_rate": d1.get("restart_rate"), "total_tiles": d1.get("total_tiles"),
            "nonfinite_rows": d1.get("nonfinite_rows"), "noisy_rows": d1.get("noisy_rows")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--out", default="gpu_device_attention_check.jsonl")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of the script (device path forced on CPU tensors, "
                         "the engine in Triton's interpreter; use a small --L)")
    a = ap.parse_args()
    dev = a.device
    force = force_engine() if dev == "cpu" else contextlib.nullcontext()
    with force:
        return run(a, dev)


def run(a, dev) -> int:
    g = torch.Generator().manual_seed(0)
    H, L, d = a.heads, a.L, a.d
    base = [torch.randn(1, H, L, d, generator=g) * s for s in (1.5, 1.5, 1.0)]
    base[1][:, :, 0] += 2.0  # an attention sink: restarts happen
    ok = True
    with open(a.out, "w") as fh:
        cases = [(dt, causal, sch) for dt in ("bfloat16", "float32") for causal in (False, True)
                 for sch in ("flash", "e2e_hif8")]
        for dt, causal, sch in cases:
            q, k, v = (t.to(getattr(torch, dt)) for t in base)
            opts = {} if sch == "flash" else {"config": "e2e_hif8", "tau": 1}
            name = "flash" if sch == "flash" else "baps"
            t0 = time.perf_counter()
            ref = lp.attention(q, k, v, name, causal=causal, return_stats=True, **opts)
            t1 = time.perf_counter()
            qc, kc, vc = (t.to(dev) for t in (q, k, v))
            got = lp.attention(qc, kc, vc, name, causal=causal, return_stats=True, **opts)
            if dev == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            rec = {"dtype": dt, "causal": causal, "scheme": sch, "shape": [1, H, L, d],
                   "device": str(got[0].device), "cpu_s": round(t1 - t0, 3),
                   "gpu_s_first_call": round(t2 - t1, 3), **compare(ref, got)}
            good = rec["nan_positions_equal"] and not rec["outputs_differing"] and \
                rec["stats_equal"] and rec["flags_equal"] and rec["device"].startswith(dev)
            ok &= good
            rec["ok"] = bool(good)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(json.dumps(rec), flush=True)
        # GQA by index + additive key-padding mask, bf16, causal
        q, k, v = (t.to(torch.bfloat16) for t in base)
        k, v = k[:, : H // 2], v[:, : H // 2]
        m = torch.zeros(1, 1, 1, L)
        m[..., L - 300:] = float("-inf")
        m[..., : L // 3] = -2.5
        opts = {"config": "e2e_hif8", "tau": 1}
        ref = lp.attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), "baps",
                           causal=True, attn_mask=m, return_stats=True, **opts)
        got = attention_device(lp.kernels.get_scheme("baps"), q.to(dev), k.to(dev), v.to(dev),
                               causal=True, attn_mask=m.to(dev), return_stats=True,
                               options=opts, gqa=True)
        rec = {"case": "gqa-by-index+additive-mask", "dtype": "bfloat16", "causal": True,
               "scheme": "e2e_hif8", **compare(ref, got)}
        good = rec["nan_positions_equal"] and not rec["outputs_differing"] and \
            rec["stats_equal"] and rec["flags_equal"]
        ok &= good
        rec["ok"] = bool(good)
        fh.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)
    print("ALL OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
