"""Host time of one device attention call on a GPU: how long the host spends issuing a call
before it can go on (the launches, the allocations, the checks, the statistics' packing), the
quantity that bounds ``lp.emulate``'s forward when the kernels are short.

At a small shape (default (1, 32, 256, 64) queries on 8 key/value heads, bf16, causal with GQA,
as a Llama layer at 256 tokens) so that the GPU keeps up: each row is the median over rounds
of (host seconds to issue 20 calls) / 20, with the GPU synchronised between rounds.  Rows:

* ``torch add``: one small torch operation (the floor of any call);
* ``sdpa bf16``: torch's own SDPA call;
* ``run_engine_gpu``: the engine's launches alone (``e2e_hif8``, 128 x 128 tiles);
* ``attention_device``: ``hif8`` through :func:`lowprec.kernels.device.attention_device`,
  without statistics and with deferred statistics (what ``lp.emulate`` asks);
* ``emulate <scheme>``: ``F.scaled_dot_product_attention`` inside ``lp.emulate(scheme)``.

A report: asserts nothing.  Machines differ (docs/design.md, "Session 7 measurements").

Usage (GPU machine, repository root)::

    PYTHONPATH=. python benchmarks/host_per_call.py [--L 256] [--schemes hif8,intattention]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def host_ms(fn, n: int = 20, rounds: int = 15) -> float:
    """Median host milliseconds per call of ``fn`` over ``rounds`` batches of ``n`` calls."""
    import torch

    fn()
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t) / n)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e3


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    import lowprec as lp
    from lowprec.gpu.engine import run_engine_gpu
    from lowprec.kernels import get_scheme
    from lowprec.kernels.baps import make_config
    from lowprec.kernels.device import attention_device

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--L", type=int, default=256)
    ap.add_argument("--schemes", default="hif8,intattention")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    warnings.simplefilter("ignore")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((1, 32, a.L, 64), generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn((1, 8, a.L, 64), generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn((1, 8, a.L, 64), generator=g, device="cuda").to(torch.bfloat16)
    x = torch.randn(1024, device="cuda")
    baps, opts = get_scheme("baps"), {"config": "e2e_hif8"}
    cfg = make_config("e2e_hif8")
    rows = {
        "torch add": lambda: x + 1,
        "sdpa bf16": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                            enable_gqa=True),
        "run_engine_gpu": lambda: run_engine_gpu(q, k, v, scale=0.125, causal=True,
                                                 block_q=128, block_k=128, cfg=cfg),
        "attention_device": lambda: attention_device(baps, q, k, v, causal=True, gqa=True,
                                                     options=opts),
        "attention_device stats": lambda: attention_device(
            baps, q, k, v, causal=True, gqa=True, options=opts, return_stats=True,
            with_empty=True, defer=True),
    }
    res = {name: host_ms(fn) for name, fn in rows.items()}
    for s in a.schemes.split(","):
        with lp.emulate(s):
            res[f"emulate {s}"] = host_ms(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                       enable_gqa=True), n=10, rounds=7)
    print(f"{torch.cuda.get_device_name()}, (1, 32, {a.L}, 64) bf16 causal GQA")
    for name, ms in res.items():
        print(f"  {name:28s} {ms:8.3f} ms of host time a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
