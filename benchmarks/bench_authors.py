"""lowprec's integer schemes against the authors' own Triton kernels, in one process (issue 15).

The authors' kernels are not part of lowprec and nothing in lowprec imports them: they are
loaded by file path from ``--authors-dir`` (default ``.authors``, git-ignored), laid out as

    <authors-dir>/qflash/qflash/kernel.py          github.com/EfficientCompLab/qflash
    <authors-dir>/INT-FlashAttention/configs.py    github.com/INT-FlashAttention2024/
                                                   INT-FlashAttention
    <authors-dir>/INT-FlashAttention/flash_atten_full_int8.py, flash_atten_int8.py

(``<authors-dir>/README.txt`` names the commits).  Their files are used as published; two
things are done around them at run time, never to their text:

* INT-FlashAttention's files do ``from configs import *``: their ``configs.py`` is loaded under
  the module name ``configs`` while they load (``--intfa-config`` replaces its ``configs`` list
  with one configuration before they load: their autotuning is then skipped).  They also
  ``import pytest``, unused: when pytest is missing an empty stand-in module is registered.
* QFlash's ``qflash_forward`` quantises on the host and then runs the kernel, or with
  ``return_mode='latency'`` hands the launch closure to ``triton.testing.do_bench``.  To time
  the kernel alone, the module's global ``triton`` is replaced for that one call by a stand-in
  whose ``testing.do_bench`` returns the closure; the closure (the int8 tensors and host
  constants already made) is then timed here.  ``QFLASH_AUTOTUNE`` is read when the file is
  imported: it is loaded once per value of ``--qflash-autotune`` (``default``: their one
  32 x 32 configuration; ``fast``: their 4-configuration autotuning).

Measured per ``L`` in ``--lengths`` at ``(1, H, L, d)`` (default ``(1, 32, L, 128)``), inputs
``randn * 1.5`` in ``--dtype`` (default float16, as the anchors of specs/gpu.md section 5),
non-causal and causal, all with ``triton.testing.do_bench`` medians (a call slower than
``--slow`` seconds is timed once and not run at longer lengths):

* ``sdpa_<dtype>``, ``sdpa_fp32``: ``torch.nn.functional.scaled_dot_product_attention``
  (float32 inputs cast once, outside the timing);
* ``qflash_kernel[...]`` / ``qflash_host[...]``: the authors' QFlash kernel alone / the whole
  ``qflash_forward`` (per-tensor amax, ``.item()``, int8 casts, kernel, ``o * o_scale``).
  QFlash has no causal flag; its causal rows (``--qflash-causal-mask``) pass a dense boolean
  lower-triangular ``attn_mask``, which their code turns into a ``(1, H, L, L)`` int32 bias
  (2 GiB at 4096, 32 GiB at 16384) for a kernel that visits every tile;
* ``intfa_full_kernel`` / ``intfa_full_host``, ``intfa_half_kernel`` / ``intfa_half_host``:
  INT-FlashAttention full-INT8 (``attention_full_int8``) and half-INT8 (``attention_int8``),
  alone on inputs quantised beforehand, and with that quantisation inside the timing.  The
  quantisation is the one of their benchmark.py (``quant_pertoken`` for q, k: ``amax / 127``
  per token; ``quant_pertensor`` for v: per head; ``round(x / s)`` to int8, float16 scales),
  written here in torch: their benchmark.py imports pandas and is not loaded.
  Their API takes float16 (bfloat16 inputs are cast once, outside the timing),
  ``sm_scale = 1 / sqrt(d)``.  Their causal full-INT8 kernel drops the running max between
  its two stages (lowprec.kernels.intflash): its causal output is wrong, its time is not;
* ``ours:<scheme>``: ``lp.attention(q, k, v, scheme, causal=c, **options)`` (the whole call,
  statistics off, as bench_gpu_schemes.py) for ``--ours`` (``name`` or
  ``name:option=value:...``).

Then a table of ratios (ours / authors'): issue 15's targets are ``qflash`` and ``intflash``
within 1.5x of their authors' kernels, other integer schemes within 2x of the QFlash kernel.
The QFlash reference is the faster of the ``--qflash-autotune`` variants.  A kernel that fails
to load or run gets its error in its row; the others still run.  A report: asserts nothing.

Usage (GPU machine, repository root, ``.authors`` carried)::

    PYTHONPATH=. python benchmarks/bench_authors.py [--lengths 4096,16384] [--dtype fp16]
        [--authors-dir .authors] [--json out.json]

INT-FlashAttention's own autotuning (about 45 of its 66 configurations compile at d = 128) takes
minutes per kernel and length the first time (Triton's cache keeps the compiled kernels); the
chosen configuration is printed in each row, and ``--intfa-config BM,BN,STAGES,WARPS`` pins it.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import re
import sys
import types

QFLASH_FILE = os.path.join("qflash", "qflash", "kernel.py")
INTFA_DIR = "INT-FlashAttention"
INTFA_FILES = {"configs": "configs.py", "full": "flash_atten_full_int8.py",
               "half": "flash_atten_int8.py"}
TARGET_OWN, TARGET_QFLASH = 1.5, 2.0


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--authors-dir", default=".authors",
                   help="folder with qflash/ and INT-FlashAttention/ (default .authors)")
    p.add_argument("--lengths", default="4096,16384")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    p.add_argument("--ours", default="qflash,intflash,intflash:variant=half,intattention",
                   help="lowprec schemes, comma-separated, each 'name' or "
                   "'name:option=value:...' (default %(default)s)")
    p.add_argument("--authors", default="qflash,intfa_full,intfa_half",
                   help="authors' kernels to run (default %(default)s)")
    p.add_argument("--qflash-autotune", default="default,fast",
                   help="QFLASH_AUTOTUNE values to load QFlash's kernel with (default "
                   "%(default)s)")
    p.add_argument("--qflash-causal-mask", action="store_true",
                   help="also time QFlash causal through a dense boolean attn_mask")
    p.add_argument("--intfa-config", default=None, metavar="BM,BN,STAGES,WARPS",
                   help="one configuration for INT-FlashAttention instead of their autotuning")
    p.add_argument("--slow", type=float, default=2.0,
                   help="seconds per call above which a measurement is timed once and dropped "
                   "at longer lengths")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _parse_ours(spec: str) -> list[tuple[str, str, dict]]:
    """``[(label, scheme, options)]`` from ``name[:k=v...],...``."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, *opts = item.split(":")
        kw = {}
        for o in opts:
            k, _, v = o.partition("=")
            try:
                kw[k] = ast.literal_eval(v)
            except (ValueError, SyntaxError):
                kw[k] = v
        out.append((item, name, kw))
    return out


def _load_file(path: str, name: str):
    """Import the file ``path`` as module ``name`` (registered in sys.modules: Triton reads a
    kernel's source back through its module)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def load_qflash(authors_dir: str, autotune: str):
    """The authors' qflash/kernel.py, imported with ``QFLASH_AUTOTUNE=autotune``."""
    old = os.environ.get("QFLASH_AUTOTUNE")
    os.environ["QFLASH_AUTOTUNE"] = autotune
    try:
        return _load_file(os.path.join(authors_dir, QFLASH_FILE),
                          f"_authors_qflash_kernel_{autotune}")
    finally:
        if old is None:
            os.environ.pop("QFLASH_AUTOTUNE", None)
        else:
            os.environ["QFLASH_AUTOTUNE"] = old


def load_intfa(authors_dir: str, pin: str | None = None) -> dict:
    """The authors' INT-FlashAttention modules ``{"configs", "full", "half"}`` (each
    entry a module, or the exception its import raised).  Their ``from configs import *``
    finds their configs.py under the name ``configs`` while they load; the name's previous
    owner (if any) is put back afterwards."""
    import triton

    folder = os.path.join(authors_dir, INTFA_DIR)
    old_configs = sys.modules.get("configs")
    stub = None
    try:
        import pytest  # noqa: F401  (their files import it and never use it)
    except ImportError:
        stub = sys.modules["pytest"] = types.ModuleType("pytest")
    mods: dict = {}
    try:
        cfg = _load_file(os.path.join(folder, INTFA_FILES["configs"]), "configs")
        if pin:
            bm, bn, st, w = (int(x) for x in pin.split(","))
            cfg.configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=st,
                                         num_warps=w)]
            cfg.keep = lambda conf: True
        mods["configs"] = cfg
        for key in ("full", "half"):
            try:
                mods[key] = _load_file(os.path.join(folder, INTFA_FILES[key]),
                                       f"_authors_intfa_{key}")
            except Exception as e:  # reported in the rows that need it
                mods[key] = e
    except Exception as e:
        for key in ("configs", "full", "half"):
            mods.setdefault(key, e)
    finally:
        if old_configs is None:
            sys.modules.pop("configs", None)
        else:
            sys.modules["configs"] = old_configs
        if stub is not None and sys.modules.get("pytest") is stub:
            del sys.modules["pytest"]
    return mods


class _CaptureTriton:
    """Stands in for qflash/kernel.py's global ``triton`` during one ``qflash_forward(...,
    return_mode='latency')`` call: ``testing.do_bench(kernel, ...)`` returns ``kernel``."""

    def __init__(self, real):
        self._real = real
        self.testing = types.SimpleNamespace(do_bench=lambda fn, *a, **k: fn)

    def __getattr__(self, name):
        return getattr(self._real, name)


def qflash_launcher(mod, q, k, v, attn_mask=None):
    """The authors' QFlash launch closure, with their host quantisation already done."""
    real = mod.triton
    mod.triton = _CaptureTriton(real)
    try:
        fn = mod.qflash_forward(q, k, v, attn_mask=attn_mask, return_mode="latency")
    finally:
        mod.triton = real
    if not callable(fn):
        raise TypeError(f"qflash_forward(return_mode='latency') gave {type(fn).__name__}, "
                        "not the launch closure")
    return fn


def _commits(authors_dir: str) -> list[str]:
    """The commits that ``<authors-dir>/README.txt`` names (empty when it is missing)."""
    try:
        with open(os.path.join(authors_dir, "README.txt")) as fh:
            return re.findall(r"commit ([0-9a-f]{40})", fh.read())
    except OSError:
        return []


def _best_config(kernel) -> str | None:
    cfg = getattr(kernel, "best_config", None)
    return None if cfg is None else str(cfg)


def _fmt(x, width=8, digits=3):
    return f"{x:{width}.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) \
        else f"{'-':>{width}s}"


def main(argv=None) -> int:
    """Print one JSON line per measurement and a table of ratios; exit status 0."""
    a = _args(argv)
    import torch
    import triton

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_gpu_schemes import gpu_timer

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    H, d = a.heads, a.d
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    authors = {s.strip() for s in a.authors.split(",") if s.strip()}
    ours = _parse_ours(a.ours)
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[a.causal]
    sm_scale = 1.0 / math.sqrt(d)
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, authors_dir=os.path.abspath(a.authors_dir),
               authors_commits=_commits(a.authors_dir))
    print(json.dumps({"env": env}), flush=True)

    # the authors' modules (an import error is kept and reported in the rows)
    qf = {}
    if "qflash" in authors:
        for t in (s.strip() for s in a.qflash_autotune.split(",") if s.strip()):
            try:
                qf[t] = load_qflash(a.authors_dir, t)
            except Exception as e:
                qf[t] = e
    intfa = load_intfa(a.authors_dir, a.intfa_config) \
        if authors & {"intfa_full", "intfa_half"} else {}

    rows, dropped = [], set()

    timed = gpu_timer(a.slow)  # the first call (Triton compiles / autotunes) is not timed

    def measure(L, causal, case):
        """Time one case: ``make()`` builds the timed callable (outside the timing); a case
        whose ``make`` is an exception reports it."""
        name, group, make, tuned, extra = case
        if name in dropped:
            return
        row = dict(name=name, group=group, L=L, causal=causal, **extra)
        try:
            if isinstance(make, BaseException):
                raise make
            fn = make()
            ms, slow = timed(fn)
            row["ms"] = round(ms, 4)
            if slow:
                row["timed_once"] = True
                dropped.add(name)
            if tuned is not None:
                row["config"] = _best_config(tuned)
            del fn
        except Exception as e:  # reported; the others still run
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()

    for L in [int(x) for x in a.lengths.split(",") if x]:
        t = _inputs(torch, (1, H, L, d), dtype)
        for causal in causals:
            for case in _cases(a, t, causal, qf, intfa, authors, ours, sm_scale):
                measure(L, causal, case)
        del t
        torch.cuda.empty_cache()

    if a.json or os.environ.get("OUT"):
        path = a.json or os.path.join(os.environ["OUT"], "bench_authors.json")
        with open(path, "w") as fh:
            json.dump({"env": env, "args": vars(a), "rows": rows}, fh, indent=1)
    _table(rows, ours)
    return 0


def _inputs(torch, shape, dtype) -> dict:
    """q, k, v (``randn * 1.5`` in ``dtype``), their float32 and float16 copies, and the
    INT-FlashAttention quantisation of the float16 ones (``pre``)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, device="cuda").mul_(1.5).to(dtype)
               for _ in range(3))
    t = dict(q=q, k=k, v=v, q32=q.float(), k32=k.float(), v32=v.float())
    t["qh"], t["kh"], t["vh"] = (x.half() for x in (q, k, v))  # INT-FlashAttention: float16
    q8, qs = quant_per_token(t["qh"])
    k8, ks = quant_per_token(t["kh"])
    v8, vs = quant_per_head(t["vh"])
    t["pre"] = dict(q8=q8, qs=qs, k8=k8, ks=ks, v8=v8, vs=vs)
    return t


def quant_per_token(x):
    """``(x8, s)``: ``s = amax(|x|) / 127`` per token (last axis) in x's dtype, ``x8 =
    int8(round(x / s))``: INT-FlashAttention's q and k quantisation (their benchmark.py)."""
    s = x.abs().amax(dim=-1) / 127
    return (x / s[..., None]).round().char(), s


def quant_per_head(x):
    """``(x8, s)`` with one scale per (batch, head): INT-FlashAttention's v quantisation."""
    s = x.abs().amax(dim=(-2, -1)) / 127
    return (x / s[..., None, None]).round().char(), s


def _cases(a, t, causal, qf, intfa, authors, ours, sm_scale):
    """``(name, group, make, tuned kernel or None, extra row fields)`` for one (L, causal)."""
    import torch
    import torch.nn.functional as F

    def sdpa(x, y, z):
        return lambda: lambda: F.scaled_dot_product_attention(x, y, z, is_causal=causal)

    out = [(f"sdpa_{a.dtype}", "sdpa", sdpa(t["q"], t["k"], t["v"]), None, {}),
           ("sdpa_fp32", "sdpa", sdpa(t["q32"], t["k32"], t["v32"]), None, {})]

    # the authors' QFlash: no causal mode (a dense boolean mask on request)
    q, k, v = t["q"], t["k"], t["v"]
    for tune, mod in qf.items():
        if causal and not a.qflash_causal_mask:
            break
        kn, hn = f"qflash_kernel[{tune}]", f"qflash_host[{tune}]"
        if isinstance(mod, BaseException):
            out += [(kn, "authors", mod, None, {}), (hn, "authors", mod, None, {})]
            continue
        extra = {"via_mask": True} if causal else {}
        tuned = mod.qflash_masked_kernel if causal else mod.qflash_kernel

        def kernel(mod=mod):
            mask = _causal_mask(torch, q.shape[-2]) if causal else None
            return qflash_launcher(mod, q, k, v, attn_mask=mask)

        def host(mod=mod):
            mask = _causal_mask(torch, q.shape[-2]) if causal else None
            return lambda: mod.qflash_forward(q, k, v, attn_mask=mask)

        out += [(kn, "authors", kernel, tuned, extra), (hn, "authors", host, tuned, extra)]

    # the authors' INT-FlashAttention, full and half INT8 (float16 inputs, their API)
    pre = t["pre"]
    qh, kh, vh = t["qh"], t["kh"], t["vh"]
    for key, fname, kname in (("full", "attention_full_int8", "_attn_fwd_full_int8"),
                              ("half", "attention_int8", "_attn_fwd_int8")):
        if f"intfa_{key}" not in authors:
            continue
        mod = intfa.get(key)
        kn, hn = f"intfa_{key}_kernel", f"intfa_{key}_host"
        if isinstance(mod, BaseException):
            out += [(kn, "authors", mod, None, {}), (hn, "authors", mod, None, {})]
            continue
        f = getattr(mod, fname)
        if key == "full":
            def kernel(f=f):
                return lambda: f(pre["q8"], pre["k8"], pre["v8"], pre["qs"], pre["ks"],
                                 pre["vs"], causal, sm_scale)

            def host(f=f):
                return lambda: _full_host(f, qh, kh, vh, causal, sm_scale)
        else:
            def kernel(f=f):
                return lambda: f(pre["q8"], pre["k8"], vh, pre["qs"], pre["ks"], causal,
                                 sm_scale)

            def host(f=f):
                return lambda: _half_host(f, qh, kh, vh, causal, sm_scale)
        tuned = getattr(mod, kname)
        out += [(kn, "authors", kernel, tuned, {}), (hn, "authors", host, tuned, {})]

    # ours: the whole lp.attention call, statistics off
    import lowprec as lp

    for label, scheme, kw in ours:
        def run(scheme=scheme, kw=kw):
            return lambda: lp.attention(q, k, v, scheme, causal=causal, **kw)

        out.append((f"ours:{label}", "ours", run, None, {}))
    return out


def _causal_mask(torch, L):
    return torch.ones(L, L, dtype=torch.bool, device="cuda").tril()


def _full_host(f, qh, kh, vh, causal, sm_scale):
    """INT-FlashAttention full-INT8 with the host quantisation of q, k, v in the timing."""
    q8, qs = quant_per_token(qh)
    k8, ks = quant_per_token(kh)
    v8, vs = quant_per_head(vh)
    return f(q8, k8, v8, qs, ks, vs, causal, sm_scale)


def _half_host(f, qh, kh, vh, causal, sm_scale):
    """INT-FlashAttention half-INT8 (v stays float16) with the host quantisation of q, k."""
    q8, qs = quant_per_token(qh)
    k8, ks = quant_per_token(kh)
    return f(q8, k8, vh, qs, ks, causal, sm_scale)


def _table(rows, ours):
    """Times per (L, causal) and the ratios ours / authors'."""
    ms = {(r["name"], r["L"], r["causal"]): r.get("ms") for r in rows}
    keys = sorted({(r["L"], r["causal"]) for r in rows})
    names = list(dict.fromkeys(r["name"] for r in rows))
    heads = [f"{L} {'causal' if c else 'full'}" for L, c in keys]
    print(f"\n{'ms':34s}" + "".join(f" {h:>14s}" for h in heads))
    for n in names:
        print(f"{n:34s}" + "".join(f" {_fmt(ms.get((n, L, c)), 14)}" for L, c in keys))

    def best(prefix, L, c):
        got = [(v, n) for (n, L2, c2), v in ms.items()
               if n.startswith(prefix) and L2 == L and c2 == c and v is not None]
        return min(got) if got else (None, None)

    print("\nratios ours / authors' (kernel alone | with their host quantisation); issue 15: "
          f"qflash, intflash <= {TARGET_OWN}x their authors' kernel; other integer schemes "
          f"<= {TARGET_QFLASH}x the QFlash kernel")
    print(f"{'ours':34s} {'L':>6s} {'causal':>6s} {'ms':>9s} {'reference':>22s} {'x kernel':>9s}"
          f" {'x host':>7s} {'target':>7s}")
    for label, scheme, kw in ours:
        own = _own(scheme, kw)
        for L, c in keys:
            m = ms.get((f"ours:{label}", L, c))
            for ref in dict.fromkeys([own, "qflash"] if own else ["qflash"]):
                kt, kname = best(f"{ref}_kernel", L, c)
                ht, _ = best(f"{ref}_host", L, c)
                # the QFlash kernel beside intflash's own kernels: for information
                target = TARGET_OWN if ref == own else None if own else TARGET_QFLASH
                if target is None and kname is None:
                    continue
                rk = m / kt if m and kt else None
                rh = m / ht if m and ht else None
                print(f"{label:34s} {L:6d} {str(c):>6s} {_fmt(m, 9)} "
                      f"{(kname or ref + ' n/a'):>22s} {_fmt(rk, 9, 2)} {_fmt(rh, 7, 2)} "
                      f"{(f'{target}x' if target else '-'):>7s}")


def _own(scheme: str, kw: dict) -> str | None:
    """The authors' kernel a scheme of ours is measured against (issue 15's 1.5x)."""
    if scheme == "qflash":
        return "qflash"
    if scheme == "intflash":
        return "intfa_half" if kw.get("variant") == "half" else "intfa_full"
    return None


if __name__ == "__main__":
    sys.exit(main())
