"""Bit comparison of ``lowprec.kernels.intflash.intflash_core`` with the authors' INT-FlashAttention
Triton kernels run by Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors).

The authors' code (github.com/INT-FlashAttention2024/INT-FlashAttention, files
``flash_atten_full_int8.py`` and ``flash_atten_int8.py``) carries no license, so it is not part of
this repository: give the folder that holds those two files with ``--authors``.  Their kernels
are loaded from there, autotuned over one configuration (``BLOCK_M = BLOCK_N = --block``), and
launched directly with float16 or float32 output tensors.  Their causal full-INT8 kernel drops the
running max between its two stages (lowprec's docstring); ``--fix-causal-full`` (default) patches
that one line in the loaded text so that causal full-INT8 can be compared at all.

Interpreter semantics that decide the last bits (triton 3.7.1, numpy 2.x):
  * ``tl.math.exp2`` is ``np.exp2`` on float32 arrays: numpy's SIMD (AVX-512: SVML) float32
    exp2, within 1 ulp but not correctly rounded, and different on CPUs without AVX-512;
    ``--exp2 cr`` patches it to ``float32(exp2(float64(x)))`` (lowprec's pinned exp2).
  * ``tl.sum`` is ``np.sum`` (pairwise: 8 interleaved partial sums for rows of 8..128);
    ``--sum seq`` patches it to a left-to-right float32 sum (lowprec's pinned order).
  * ``tl.dot`` is ``np.matmul`` (int8 -> int32 exact; fp16 p x fp16 v in float32, products
    exact, the BLAS summation order).
A GPU does neither: ``ex2.approx.ftz.f32`` and a layout-dependent tree (specs/gpu.md 2-4).

Usage::

    PYTHONPATH=. python scripts/intflash_triton_oracle.py --authors /path/to/INT-FlashAttention \\
        [--exp2 numpy|cr] [--sum numpy|seq] [--blocks 32,64] [--seeds 3] [--sm-scale 1.3]
        [--device cuda --save gpu.npz] [--against gpu.npz]

Prints one line per case (mismatching float16 / float32 outputs) and the totals; exit status 1
when any output differs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import types

import numpy as np


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--authors", required=True, help="folder with flash_atten_full_int8.py and "
                   "flash_atten_int8.py")
    p.add_argument("--exp2", choices=("numpy", "cr"), default="numpy")
    p.add_argument("--sum", choices=("numpy", "seq"), default="numpy")
    p.add_argument("--blocks", default="32,64")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sm-scale", type=float, default=None,
                   help="softmax scale (default 1 / sqrt(d); the authors' benchmark uses 1.3)")
    p.add_argument("--variants", default="full,half")
    p.add_argument("--no-fix-causal-full", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: Triton's interpreter (default); cuda: the compiled kernels on a GPU")
    p.add_argument("--save", help="write the authors' outputs to this .npz")
    p.add_argument("--against", help="also count differences from the authors' outputs saved "
                   "in this .npz (e.g. a GPU run)")
    return p.parse_args(argv)


def _patch_interpreter(exp2: str, sum_: str):
    import triton.runtime.interpreter as interp

    if exp2 == "cr":
        def create_exp2(self, arg):
            d = arg.data
            if d.dtype == np.float32:
                return interp.TensorHandle(np.exp2(d.astype(np.float64)).astype(np.float32),
                                           arg.dtype.scalar)
            return self.unary_op(arg, np.exp2)
        interp.InterpreterBuilder.create_exp2 = create_exp2
    if sum_ == "seq":
        def seq_sum(self, input):
            d = input.handle.data
            ax = self.axis if self.axis is not None else 0
            if self.axis is None:
                d = d.reshape(-1)
            moved = np.moveaxis(d, ax, 0)
            acc = moved[0].copy()
            for j in range(1, moved.shape[0]):
                acc = (acc + moved[j]).astype(d.dtype)
            if self.keep_dims:
                acc = np.expand_dims(acc, ax)
            return self.to_tensor(acc, input.dtype)
        interp.ReduceOps.sum = seq_sum


def _load(authors: str, name: str, block: int, fix_causal: bool):
    import triton

    cfg = types.ModuleType("configs")
    cfg.configs = [triton.Config({"BLOCK_M": block, "BLOCK_N": block}, num_stages=1,
                                 num_warps=4)]
    cfg.keep = lambda c: True
    cfg.is_hip = lambda: False
    sys.modules["configs"] = cfg
    path = os.path.join(authors, name + ".py")
    src = open(path).read()
    if fix_causal and name == "flash_atten_full_int8":
        # their stage-1 call returns (acc, l_i) only, so stage 2 restarts from m_i = -inf
        src = re.sub(r"return acc, l_i[ \t]*$", "return acc, l_i, m_i", src, flags=re.M)
        src = src.replace("acc, l_i = _attn_fwd_inner_full_int8(", "acc, l_i, m_i = "
                          "_attn_fwd_inner_full_int8(")
        # Triton reads a kernel's text back from its file: load the patched text from a copy
        path = os.path.join(tempfile.mkdtemp(prefix="intflash_oracle_"), name + ".py")
        with open(path, "w") as f:
            f.write(src)
    mod = types.ModuleType(f"_authors_{name}_{block}")
    mod.__file__ = path
    sys.modules[mod.__name__] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def _authors_out(mod, variant, q8, k8, v, sq, sk, sv, causal, sm_scale, out_dtype, device):
    import torch

    q8, k8, v, sq, sk, sv = (x.to(device) for x in (q8, k8, v, sq, sk, sv))
    Z, H, N, D = q8.shape
    o = torch.empty((Z, H, N, D), dtype=out_dtype, device=device)
    grid = lambda a: (N // a["BLOCK_M"], Z * H, 1)  # noqa: E731
    common = (q8.stride(0), q8.stride(1), q8.stride(2), q8.stride(3),
              k8.stride(0), k8.stride(1), k8.stride(2), k8.stride(3),
              v.stride(0), v.stride(1), v.stride(2), v.stride(3),
              o.stride(0), o.stride(1), o.stride(2), o.stride(3),
              sq.stride(0), sq.stride(1), sq.stride(2))
    stage = 3 if causal else 1
    if variant == "full":
        mod._attn_fwd_full_int8[grid](q8, k8, v, sq, sk, sv, sm_scale, o, *common,
                                      sv.stride(0), sv.stride(1), Z, H, N_CTX=N, HEAD_DIM=D,
                                      STAGE=stage)
    else:
        M = torch.empty((Z, H, N), dtype=torch.float32, device=device)
        mod._attn_fwd_int8[grid](q8, k8, v, sq, sk, sm_scale, M, o, *common, Z, H, N_CTX=N,
                                 HEAD_DIM=D, STAGE=stage)
    return o.cpu().numpy()


def main(argv=None) -> int:
    a = _args(argv)
    if a.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates anything
        _patch_interpreter(a.exp2, a.sum)
    import torch

    from lowprec.kernels.intflash import intflash_core, quantize_inputs

    blocks = [int(b) for b in a.blocks.split(",")]
    variants = a.variants.split(",")
    total = {"f16": 0, "f32": 0, "n": 0, "saved_f16": 0, "saved_f32": 0}
    saved = dict(np.load(a.against)) if a.against else None
    keep = {}
    for block in blocks:
        mods = {"full": _load(a.authors, "flash_atten_full_int8", block,
                              not a.no_fix_causal_full),
                "half": _load(a.authors, "flash_atten_int8", block, False)}
        shapes = [(1, 2, 128, 64), (2, 1, 256, 64)] + ([(1, 2, 128, 32)] if block <= 32 else [])
        for variant in variants:
            for causal in (False, True):
                for shape in shapes:
                    for seed in range(a.seeds):
                        rng = np.random.default_rng(1000 * seed + block)
                        Z, H, N, D = shape
                        amp = (1.0, 2.0, 3.0)[seed % 3]
                        q = (rng.standard_normal(shape) * amp).astype(np.float32)
                        k = (rng.standard_normal(shape) * amp).astype(np.float32)
                        vf = rng.standard_normal(shape).astype(np.float32)
                        qi = quantize_inputs(q, k, vf, scale_dtype="float16")
                        sm = 1.0 / D ** 0.5 if a.sm_scale is None else a.sm_scale
                        vv = qi.v8 if variant == "full" else vf.astype(np.float16)
                        t = lambda x, dt=None: torch.from_numpy(np.ascontiguousarray(  # noqa
                            x if dt is None else x.astype(dt)))
                        args = (t(qi.q8), t(qi.k8).contiguous(), t(vv), t(qi.s_q, np.float16),
                                t(qi.s_k, np.float16), t(qi.s_v, np.float16), causal, sm)
                        row = []
                        for od, key in ((torch.float16, "f16"), (torch.float32, "f32")):
                            ref = _authors_out(mods[variant], variant, *args, od, a.device)
                            name = f"{block}_{variant}_{int(causal)}_{'x'.join(map(str, shape))}" \
                                f"_{seed}_{key}"
                            keep[name] = ref
                            got = np.asarray(intflash_core(
                                qi.q8, qi.k8, vv, qi.s_q, qi.s_k, qi.s_v, sm, block_q=block,
                                block_k=block, causal=causal, variant=variant,
                                output="float16" if key == "f16" else "float32"))
                            it = np.uint16 if key == "f16" else np.uint32
                            bad = int((ref.view(it) != got.view(it)).sum())
                            total[key] += bad
                            row.append(bad)
                            if saved is not None:
                                sb = int((ref.view(it) != saved[name].view(it)).sum())
                                total["saved_" + key] += sb
                                row.append(sb)
                        total["n"] += ref.size
                        print(f"block {block} {variant} causal={causal!s:5} shape {shape} seed "
                              f"{seed}: f16 {row[0]} / f32 {row[-2 if saved else -1]} of "
                              f"{ref.size} differ"
                              + (f" (vs --against: f16 {row[1]}, f32 {row[3]})" if saved else ""),
                              flush=True)
    if a.save:
        np.savez_compressed(a.save, **keep)
    if saved is not None:
        print(f"authors' outputs here vs --against: float16 {total['saved_f16']}, float32 "
              f"{total['saved_f32']} differ")
    print(f"device={a.device} exp2={a.exp2} sum={a.sum} sm_scale={a.sm_scale or '1/sqrt(d)'}: "
          f"float16 outputs differing {total['f16']}, float32 {total['f32']}, of {total['n']} "
          "each")
    return 1 if total["f16"] or total["f32"] else 0


if __name__ == "__main__":
    sys.exit(main())
