"""Host-side cost of one device attention call, counted on CPU tensors under Triton's
interpreter (no GPU needed): torch operations that launch a kernel (views excluded), Triton
launches, and host synchronisations (``.item()`` / ``int`` / ``float`` / ``bool`` of a tensor,
``.cpu()`` / ``.numpy()`` read-backs, tensors made from host values on the device: each is a
blocking copy on a GPU).  Counts, not timings: on a GPU each torch operation costs ~25 us of
host time and each synchronisation stalls the launch queue.

Counted: ``lp.attention(q, k, v, scheme, causal=True, return_stats=True)`` through the device
path (:func:`lowprec.kernels.device.force_engine`) with GQA as ``lp.emulate`` passes it, and
one forward of the tiny Llama of ``bench_gpu_emulate.py`` under ``lp.emulate(scheme)``.

Usage::

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/ops_per_call.py [--scheme intattention]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def counting():
    """Within the context, a Counter of ``ops`` (per aten name), ``triton`` launches and
    ``syncs`` (per kind)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    c = {"ops": collections.Counter(), "triton": collections.Counter(),
         "syncs": collections.Counter()}
    inside = [0]  # in a Triton launch: the interpreter's own copies are not counted

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket.__name__)
            if inside[0]:
                pass
            elif name == "_local_scalar_dense":
                c["syncs"]["item/int/float/bool"] += 1
            elif not (func.is_view or name in ("detach", "lift_fresh", "alias")):
                c["ops"][name] += 1
            return func(*args, **(kwargs or {}))

    from triton.runtime.interpreter import InterpretedFunction

    patches = []

    def patch(obj, attr, wrap):
        old = getattr(obj, attr)
        patches.append((obj, attr, old))
        setattr(obj, attr, wrap(old))

    def launch(old):
        def run(self, *a, **k):
            c["triton"][self.fn.__name__] += 1
            inside[0] += 1
            try:
                return old(self, *a, **k)
            finally:
                inside[0] -= 1
        return run

    def sync(kind):
        def wrap(old):
            def f(*a, **k):
                if not inside[0]:
                    c["syncs"][kind] += 1
                return old(*a, **k)
            return f
        return wrap

    def made(kind):
        def wrap(old):
            def f(*a, **k):
                if k.get("device") is not None and not inside[0]:
                    c["syncs"][kind] += 1
                return old(*a, **k)
            return f
        return wrap

    patch(InterpretedFunction, "run", launch)
    patch(torch.Tensor, "cpu", sync(".cpu()"))
    patch(torch, "tensor", made("torch.tensor(host, device=)"))
    patch(torch, "as_tensor", made("torch.as_tensor(host, device=)"))
    try:
        with Mode():
            yield c
    finally:
        for obj, attr, old in reversed(patches):
            setattr(obj, attr, old)


def _report(what: str, c) -> None:
    ops, tri, syn = c["ops"], c["triton"], c["syncs"]
    print(f"{what}: {sum(ops.values())} torch ops, {sum(tri.values())} Triton launches, "
          f"{sum(syn.values())} syncs")
    print("  ops:", dict(ops.most_common()))
    print("  triton:", dict(tri))
    print("  syncs:", dict(syn))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheme", default="intattention")
    p.add_argument("--shape", default="1,8,128,64", help="q's shape B,H,L,d")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--no-model", action="store_true")
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(__file__))
    import torch

    import lowprec as lp
    from lowprec.kernels import get_scheme
    from lowprec.kernels.device import attention_device, force_engine

    B, H, L, d = (int(x) for x in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, d, generator=g).to(torch.bfloat16)
    k = torch.randn(B, a.kv_heads, L, d, generator=g).to(torch.bfloat16)
    v = torch.randn(B, a.kv_heads, L, d, generator=g).to(torch.bfloat16)
    s = get_scheme(a.scheme)
    for defer in (False, True):
        call = dict(scale=None, causal=True, attn_mask=None, return_stats=True, options={},
                    gqa=True, with_empty=True, defer=defer)
        attention_device(s, q, k, v, **call)  # (warm: caches, Triton's)
        with counting() as c:
            res = attention_device(s, q, k, v, **call)
            st = res[1]
            if hasattr(st, "resolve"):
                st.resolve()
        _report(f"attention_device({a.scheme}, q {tuple(q.shape)}, kv heads {a.kv_heads}, "
                f"causal, gqa, return_stats, defer={defer})", c)
    if a.no_model:
        return 0
    from bench_gpu_emulate import SIZES, build

    model = build("tiny", "cpu")
    ids = torch.randint(0, model.config.vocab_size, (1, L), generator=g)
    with force_engine(), torch.no_grad():
        with lp.emulate(a.scheme, model=model):
            model(ids)
        with lp.emulate(a.scheme, model=model) as run, counting() as c:
            model(ids)
            assert run.stats.calls  # (reading the statistics resolves the deferred ones)
        with counting() as c0:
            model(ids)
    n = SIZES["tiny"]["num_hidden_layers"]
    _report(f"tiny Llama forward ({n} attention calls), plain", c0)
    _report(f"tiny Llama forward ({n} attention calls) under lp.emulate({a.scheme!r}), "
            "stats read", c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
