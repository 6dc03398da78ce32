"""``lp.emulate`` on a transformers model whose layers sit on different devices (issue 18 item
1): ``device_map`` / accelerate placements, each attention call computed where its tensors
are, the statistics of every device merged into one report, outputs and report equal bit for
bit to the one-device run (times aside).

Without a GPU: accelerate's hooks with every layer on ``"cpu"`` and a layer offloaded to
``"disk"`` (transformers' ``device_map``); and a model whose layers alternate between the
device path (forced on CPU tensors: the GPU engine in Triton's interpreter, statistics
deferred as on a GPU) and the CPU path, merged in call order.  With one GPU (``gpu``): layers
on ``cuda:0`` and ``cpu``.  With two (``multigpu``): layers on ``cuda:0`` and ``cuda:1``.
"""

import contextlib
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from conftest import HAS_CUDA  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.kernels import device as kdev  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
#: the two kinds of device path: the GPU engine and a row-wise scheme (both defer statistics)
SCHEMES = {"hif8": {"tau": 1, "block_q": 4, "block_k": 4}, "intattention": {}}
LAYERS = 3


def _llama():
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=100,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _device_map(layers: list) -> dict:
    """A device map: embeddings and rotary embedding with layer 0, norm and head with the
    last layer, layer i on ``layers[i]``."""
    dm = {"model.embed_tokens": layers[0], "model.rotary_emb": layers[0]}
    dm.update({f"model.layers.{i}": d for i, d in enumerate(layers)})
    dm.update({"model.norm": layers[-1], "lm_head": layers[-1]})
    return dm


def _ids():
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))


def _timeless(obj):
    if isinstance(obj, dict):
        return {k: _timeless(v) for k, v in obj.items() if k != "seconds"}
    if isinstance(obj, list):
        return [_timeless(v) for v in obj]
    return obj


def _run(model, scheme, ids, **extra):
    """``(logits on the CPU, JSON report without times)`` of one emulated forward."""
    with torch.no_grad(), lp.emulate(scheme, model=model, **SCHEMES[scheme], **extra) as run:
        out = model(input_ids=ids).logits
    rep = json.loads(run.stats.to_json(full=True))
    assert [c["module"] for c in rep["calls"]] == [f"model.layers.{i}.self_attn"
                                                   for i in range(LAYERS)]
    return out.cpu(), _timeless(rep)


def _same(a, b):
    (oa, ra), (ob, rb) = a, b
    assert oa.dtype == ob.dtype and torch.equal(oa.view(torch.int32), ob.view(torch.int32))
    assert ra == rb


@contextlib.contextmanager
def _device_calls():
    """The devices of the calls that took the device path (``attention_device``), in order."""
    seen, real = [], kdev.attention_device

    def spy(s, q, *a, **k):
        seen.append(str(q.device))
        return real(s, q, *a, **k)

    kdev.attention_device = spy
    try:
        yield seen
    finally:
        kdev.attention_device = real


@pytest.fixture(scope="module")
def plain():
    """The model on one device (the CPU) and its emulated runs."""
    m = _llama()
    return m, {s: _run(m, s, _ids(), reference=True) for s in SCHEMES}


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_device_map_all_cpu(plain, scheme):
    """Every layer mapped to "cpu", accelerate's hooks attached (as with several devices)."""
    m = _llama()
    m = accelerate.dispatch_model(m, _device_map(["cpu"] * LAYERS), force_hooks=True)
    assert hasattr(m.model.layers[1], "_hf_hook")
    _same(_run(m, scheme, _ids(), reference=True), plain[1][scheme])


def test_device_map_disk_offload(plain, tmp_path):
    """transformers' ``device_map`` with the middle layer offloaded to disk (weights loaded
    by accelerate's hook at each forward, computed on the CPU)."""
    _llama().save_pretrained(tmp_path / "m")
    m = LlamaForCausalLM.from_pretrained(
        tmp_path / "m", device_map=_device_map(["cpu", "disk", "cpu"]),
        offload_folder=str(tmp_path / "offload")).eval()
    assert m.hf_device_map["model.layers.1"] == "disk"
    for scheme in SCHEMES:
        _same(_run(m, scheme, _ids(), reference=True), plain[1][scheme])


@pytest.mark.skipif(HAS_CUDA, reason="forces the device path on CPU tensors: needs Triton's "
                    "interpreter (a machine without CUDA)")
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_device_and_cpu_paths_merge_in_call_order(plain, scheme):
    """Layers 0 and 2 take the device path (forced on CPU tensors, the GPU engine in
    Triton's interpreter; statistics deferred as on a GPU), layer 1 the CPU path:
    one report, records in call order, equal to the all-CPU run."""
    m = plain[0]
    forced = []

    def pre(mod, args):
        forced.append(kdev.force_engine())
        forced[-1].__enter__()

    def post(mod, args, out):
        forced.pop().__exit__(None, None, None)

    handles = [h for i in (0, 2) for h in (
        m.model.layers[i].register_forward_pre_hook(pre),
        m.model.layers[i].register_forward_hook(post))]
    try:
        with _device_calls() as seen, torch.no_grad(), \
                lp.emulate(scheme, model=m, reference=True, **SCHEMES[scheme]) as run:
            out = m(input_ids=_ids()).logits
            # device calls (the engine's and the row-wise ones) defer their statistics: layer
            # 0's were recorded when layer 1's CPU call was, layer 2's are still on their way
            assert len(run._deferred) == 1
            rep = _timeless(json.loads(run.stats.to_json(full=True)))
    finally:
        for h in handles:
            h.remove()
    assert seen == ["cpu", "cpu"]
    assert [c["index"] for c in rep["calls"]] == list(range(LAYERS))
    _same((out, rep), plain[1][scheme])


# --------------------------------------------------------------------------------------------
# GPUs


def _gpu_split(devices: list, main_device):
    """The model with layer i on ``devices[i]`` (accelerate; a layer on "cpu" is computed on
    the CPU when the main device is the CPU)."""
    return accelerate.dispatch_model(_llama(), _device_map(devices), main_device=main_device)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_layers_on_cuda_and_cpu(scheme, monkeypatch):
    """Layers 0 and 2 on ``cuda:0``, layer 1 on the CPU: the GPU layers' attention on the GPU
    (no transfer), the CPU layer's on the CPU; outputs and report equal to the same placement
    with every attention call on the CPU (torch's own float kernels differ between CPU and
    GPU, so a one-device model is no bit-for-bit reference here; the two-GPU test has one)."""
    m, ids = _gpu_split([0, "cpu", 0], "cpu"), _ids()
    assert m.model.layers[0].self_attn.q_proj.weight.device.type == "cuda"
    assert m.model.layers[1].self_attn.q_proj.weight.device.type == "cpu"
    with _device_calls() as seen:
        split = _run(m, scheme, ids)
    assert seen == ["cuda:0", "cuda:0"]
    monkeypatch.setattr(kdev, "wants_device", lambda s, q: False)  # all on the CPU path
    with pytest.warns(UserWarning, match="moved to the CPU"):
        cpu = _run(m, scheme, ids)
    _same(split, cpu)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_layers_on_two_gpus(scheme):
    """Layers on ``cuda:0``, ``cuda:1``, ``cuda:0``: each call on its own GPU, statistics of
    both merged; outputs and report (SQNR against torch's SDPA included) equal to the model
    on ``cuda:0`` alone."""
    m, ids = _gpu_split([0, 1, 0], 0), _ids().to("cuda:0")
    assert m.model.layers[1].self_attn.q_proj.weight.device == torch.device("cuda:1")
    with _device_calls() as seen:
        split = _run(m, scheme, ids, reference=True)
    assert seen == ["cuda:0", "cuda:1", "cuda:0"]
    one = _llama().to("cuda:0")
    with _device_calls() as seen:
        whole = _run(one, scheme, ids, reference=True)
    assert seen == ["cuda:0"] * LAYERS
    _same(split, whole)
