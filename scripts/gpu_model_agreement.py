"""Device against CPU on a real model's attention: SmolLM2-135M's own SDPA calls of one text
window, each answered under ``lp.emulate(scheme)`` on the GPU and on the CPU, outputs compared
bit for bit (float32 patterns, NaN by class) and the statistics' counters compared.

The inputs are the 30 SDPA calls of one plain float32 forward of the first ``--tokens`` tokens
of the evaluation text on the GPU (causal, GQA 9 / 3 heads, d = 64), copied to the host for
the CPU run: the same tensors on both sides.  A perplexity difference between GPU and CPU
runs of a scheme (whose model's float32 layers differ between the devices) is then either
the inputs or the scheme; this says which.

Usage (GPU machine, repository root; SmolLM2 installed)::

    python scripts/gpu_model_agreement.py --tokens 8192 --schemes qflash,intattention
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _capture(model, ids):
    """Every SDPA call of one forward: ``[(args, kwargs)]`` with tensors cloned."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    calls = []

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                calls.append((tuple(a.detach().clone() if torch.is_tensor(a) else a
                                    for a in args),
                              {k: (v.detach().clone() if torch.is_tensor(v) else v)
                               for k, v in kwargs.items()}))
            return func(*args, **kwargs)

    with torch.no_grad(), Capture():
        model.model(input_ids=ids)
    return calls


def _emulated(scheme, args, kwargs, device):
    """One call under ``lp.emulate(scheme)`` with its tensors on ``device``: ``(output as
    float32 NumPy, the statistics' key counters)``."""
    import torch
    import torch.nn.functional as F

    import lowprec as lp

    def mv(t):
        return t.to(device) if torch.is_tensor(t) else t

    a = tuple(mv(x) for x in args)
    kw = {k: mv(v) for k, v in kwargs.items()}
    with torch.no_grad(), lp.emulate(scheme) as run:
        out = F.scaled_dot_product_attention(*a, **kw)
    st = run.stats.total().scheme_stats
    return out.float().cpu().numpy(), ({} if st is None else st.key_counts())


def _mismatch(a: np.ndarray, b: np.ndarray) -> int:
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    return int((~same).sum())


def main(argv=None) -> int:
    """Capture, run each call on both sides, print one JSON line per call and a total."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--schemes", default="qflash,intattention")
    ap.add_argument("--layers", default="", help="comma-separated layer indices (default all)")
    ap.add_argument("--device", default="cuda", help="the device side (cpu: a self-check)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from lowprec.studies import models as M

    model, tok = M._smollm2(a.device)
    ids = M._token_ids(tok, None, a.tokens).to(a.device)
    calls = _capture(model, ids)
    layers = [int(x) for x in a.layers.split(",") if x] or list(range(len(calls)))
    res = []
    for scheme in a.schemes.split(","):
        bad_total, t0 = 0, time.perf_counter()
        for i in layers:
            args, kwargs = calls[i]
            g, cg = _emulated(scheme, args, kwargs, a.device)
            c, cc = _emulated(scheme, args, kwargs, "cpu")
            bad = _mismatch(g, c)
            diff = {k: (cg.get(k), cc.get(k)) for k in set(cg) | set(cc)
                    if str(cg.get(k)) != str(cc.get(k))}
            row = {"scheme": scheme, "layer": i, "outputs": int(g.size), "mismatch": bad,
                   "stats_diff": diff}
            res.append(row)
            bad_total += bad
            print(json.dumps(row, default=str), flush=True)
        print(f"{scheme}: {bad_total} differing outputs over {len(layers)} calls "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
