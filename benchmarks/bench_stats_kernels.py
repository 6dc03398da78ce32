"""The statistics kernels of ``lowprec.gpu.callstats`` with one program per entry (the layout
before session 8), with the launchers' choice (``_row_splits``: rows split between programs
unless a split recomputes the key moments) and with rows split regardless, in one run, on a
GPU: ``rows_counts`` (the row-wise schemes' shared counters, noise models ``"int8_tensor"``
and ``"int8_entry"``) and ``call_stats`` (an engine call's, with the noise estimate) at (32
entries on 8 key/value heads, L, d), bfloat16, causal.  Every layout gives the same counters
(checked here).  A report: asserts nothing but that equality.

Usage (GPU machine, repository root)::

    PYTHONPATH=. python benchmarks/bench_stats_kernels.py
"""

from __future__ import annotations


def _calls(B: int, hkv: int, L: int, d: int) -> dict:
    """The three timed calls at one shape (random bfloat16 inputs)."""
    import torch
    import triton

    import lowprec.gpu.callstats as cs

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, L, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(hkv, L, d, device="cuda", generator=g).bfloat16()
    kv = torch.arange(B, device="cuda") // (B // hkv)
    out = torch.randn(B, L, d, device="cuda", generator=g)
    top = torch.tensor([4.0, 4.0, 4.0], dtype=torch.float64, device="cuda")
    nq = triton.cdiv(L, 128)
    flags = torch.zeros(B, nq, nq, dtype=torch.int8, device="cuda")
    rr = torch.ones(B, nq, dtype=torch.int32, device="cuda")
    calls = {f"rows_counts[{m}]": (lambda m=m: cs.rows_counts(
        q, k, kv, top, out, scale=0.125, causal=True, model=m, part_rows=False,
        noise_nats=0.5)) for m in ("int8_tensor", "int8_entry")}
    calls["call_stats[noise]"] = lambda: cs.call_stats(
        q.reshape(1, B, L, d), k.reshape(1, hkv, L, d), out, flags, rr, scale=0.125,
        causal=True, noise=True, step2=2.0**-16, noise_nats=0.5)
    return calls


def main() -> int:
    import torch
    import triton

    import lowprec.gpu.callstats as cs

    split = cs._row_splits

    def single(B, Lq, bm, **_):
        return 1, max(bm, -(-Lq // bm) * bm)

    for B, hkv, L, d in ((32, 8, 2048, 64), (32, 8, 4096, 128), (32, 8, 32768, 128)):
        calls = _calls(B, hkv, L, d)
        row = []
        layouts = (single, split, lambda B, Lq, bm, **_: split(B, Lq, bm))
        for name, f in calls.items():
            res = []
            for layout in layouts:
                cs._row_splits = layout
                try:
                    got = f()
                    torch.cuda.synchronize()
                    res.append((triton.testing.do_bench(f, warmup=10, rep=100), got))
                finally:
                    cs._row_splits = split
            assert all(torch.equal(res[0][1], r[1]) for r in res), name
            row.append(f"{name} " + " / ".join(f"{r[0]:.3f}" for r in res))
        print(f"(B={B}, L={L}, d={d}) ms, one program per entry / the launcher's split / "
              "split regardless: " + "; ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
