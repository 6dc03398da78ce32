"""Agreement of the device paths whose float64 steps are not pinned (``reference``, ``exaq``;
``index_softmax_only`` too) with the CPU path: the device functions run on CPU torch tensors
(``force_engine``; on a GPU machine pass ``--cuda`` to run them on CUDA tensors) against
``lp.attention`` on the same values, outputs compared as bit patterns (NaN by position).

Cases per seed: shapes (1, 8, 512, 512, d 64) and (2, 4, 256, 384, d 128), amplitude 0.5, 1.5
or 4 (by seed), no mask, causal, a key-padding mask and an additive mask; ``reference`` with
float32, float16 and float64 inputs, ``exaq`` with 2, 3 and 4 bits.  Prints per scheme (and
input dtype) the differing outputs, the outputs compared, the largest difference in units of
the output's last place and in absolute value.

Usage: ``python scripts/device_agreement.py [--seeds 6] [--schemes reference exaq] [--cuda]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = ((1, 8, 512, 512, 64), (2, 4, 256, 384, 128))
AMPS = (0.5, 1.5, 4.0)


def _diff(a, b):
    """(differing, compared, max ulps, max |a - b|) of two outputs of one dtype."""
    import torch

    a = (a.float() if a.dtype != torch.float64 else a).cpu().numpy()
    b = (b.float() if b.dtype != torch.float64 else b).cpu().numpy()
    na, nb = np.isnan(a), np.isnan(b)
    it = np.int64 if a.dtype == np.float64 else np.int32
    ia, ib = a.view(it).astype(np.int64), b.view(it).astype(np.int64)
    both = ~na & ~nb
    d = (ia != ib) & both
    ulps = np.abs(ia - ib)[d]
    absd = float(np.abs(a - b)[both].max()) if both.any() else 0.0
    return (int((na != nb).sum() + d.sum()), int(a.size), int(ulps.max()) if ulps.size else 0,
            absd)


def cases(seed: int):
    """``(name, q, k, v, kw)`` of one seed (CPU tensors)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for Z, H, Lq, Lk, d in SHAPES:
        amp = AMPS[seed % len(AMPS)]
        q = torch.randn(Z, H, Lq, d, generator=g) * amp
        k = torch.randn(Z, H, Lk, d, generator=g) * amp
        v = torch.randn(Z, H, Lk, d, generator=g)
        pad = torch.ones(Z, 1, 1, Lk, dtype=torch.bool)
        pad[..., Lk - Lk // 8:] = False
        add = torch.randn(Z, H, Lq, Lk, generator=g)
        for kw in ({}, {"causal": True}, {"attn_mask": pad}, {"attn_mask": add}):
            yield q, k, v, kw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--schemes", nargs="+", default=["reference", "exaq"])
    ap.add_argument("--cuda", action="store_true")
    a = ap.parse_args(argv)
    if not a.cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import contextlib
    import warnings

    import torch

    import lowprec as lp
    from lowprec.kernels.device import force_engine

    warnings.filterwarnings("ignore")
    dev = "cuda" if a.cuda else "cpu"
    ctx = contextlib.nullcontext if a.cuda else force_engine
    runs = {"reference": [("dtype", t) for t in (torch.float32, torch.float16, torch.float64)],
            "exaq": [("bits", b) for b in (2, 3, 4)],
            "index_softmax_only": [("bits", 5)]}
    total: dict = {}
    t0 = time.time()
    for seed in range(a.seeds):
        for q, k, v, kw in cases(seed):
            for scheme in a.schemes:
                for what, val in runs[scheme]:
                    opts, args = {}, (q, k, v)
                    if what == "dtype":
                        args = tuple(t.to(val) for t in args)
                    else:
                        opts = {"bits": val}
                    ref = lp.attention(*args, scheme, **kw, **opts)
                    with ctx():
                        got = lp.attention(*(t.to(dev) for t in args), scheme,
                                           **{n: (t.to(dev) if hasattr(t, "to") else t)
                                              for n, t in kw.items()}, **opts)
                    key = scheme + (f" {str(val)[6:]}" if what == "dtype" else "")
                    r = _diff(ref, got)
                    s = total.setdefault(key, [0, 0, 0, 0.0])
                    s[0] += r[0]
                    s[1] += r[1]
                    s[2] = max(s[2], r[2])
                    s[3] = max(s[3], r[3])
        print(f"seed {seed} done ({time.time() - t0:.0f} s)", flush=True)
    for key, (n, m, u, ad) in total.items():
        print(f"{key}: {n} of {m} outputs differ; at most {u} ulps, {ad:.3g} absolute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
