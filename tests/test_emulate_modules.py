"""Issue 12 items 8, 9 and 18: ``lp.emulate`` catches every attention call and names every module,
with or without ``model=``.

* item 8: ``nn.MultiheadAttention`` and the ``nn.Transformer`` layers are emulated (their
  ``F.multi_head_attention_forward`` call is answered through the emulated SDPA path);
* item 9: without ``model=`` calls are named from the outermost module called (torch's global
  module hooks, ``lowprec.torch.naming``);
* item 18: a context that emulated nothing although modules (or softmax) ran warns on exit.
"""

from __future__ import annotations

import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import lowprec as lp  # noqa: E402
from lowprec.torch import emulate  # noqa: E402
from lowprec.torch.context import _live  # noqa: E402
from lowprec.torch.naming import AutoNames  # noqa: E402

E, H, L, N = 16, 4, 6, 2


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _global_hooks():
    from torch.nn.modules import module as m

    return len(m._global_forward_pre_hooks), len(m._global_forward_hooks)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(E, 3 * E)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, H, E // H).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)


class Net(nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.blocks = nn.ModuleList([Attn() for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


class HandNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(E, E)

    def forward(self, x):
        s = self.lin(x) @ x.transpose(-1, -2)
        return s.softmax(-1) @ x


class _Passthrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _no_warnings():
    return warnings.catch_warnings(record=True)


# ---- item 8: nn.MultiheadAttention and the nn.Transformer layers ----------------------------


def _torch_modules():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 32, batch_first=True)
    return {
        "mha": nn.MultiheadAttention(E, H).eval(),
        "encoder": nn.TransformerEncoder(layer, 2).eval(),
        "decoder_layer": nn.TransformerDecoderLayer(E, H, 32, batch_first=True).eval(),
        "transformer": nn.Transformer(E, H, 1, 1, 32, batch_first=True).eval(),
    }


EXPECTED = {  # qualified names of the attention calls, in call order
    "mha": ["<root>"],
    "encoder": ["layers.0.self_attn", "layers.1.self_attn"],
    "decoder_layer": ["self_attn", "multihead_attn"],
    "transformer": ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                    "decoder.layers.0.multihead_attn"],
}


def _run(name, m):
    x = _x(N, L, E)
    if name == "mha":
        xt = x.transpose(0, 1)  # (L, N, E)
        return m(xt, xt, xt, need_weights=False)[0]
    if name == "encoder":
        kpm = torch.zeros(N, L, dtype=torch.bool)
        kpm[1, 4:] = True
        return m(x, src_key_padding_mask=kpm)
    if name == "decoder_layer":
        return m(x, _x(N, L + 2, E, seed=1), tgt_is_causal=True,
                 tgt_mask=nn.Transformer.generate_square_subsequent_mask(L))
    return m(x, _x(N, L + 1, E, seed=2))


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("watched", [False, True])
def test_torch_attention_modules_intercepted_and_named(name, watched):
    m = _torch_modules()[name]
    with torch.no_grad():
        with emulate("reference", model=m if watched else None) as run:
            got = _run(name, m)
        with _Passthrough():  # torch's own non-fast path: the same maths as the emulated one
            want = _run(name, m)
    assert [c.module for c in run.stats.calls] == EXPECTED[name]
    assert list(run.stats.modules) == list(dict.fromkeys(EXPECTED[name]))
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert run._escaped == {}
    assert _global_hooks() == (0, 0)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_encoder_padding_and_lossy_scheme():
    """Padded keys reach the scheme as a mask (the flash output matches float attention on
    every real token; torch's nested-tensor fast path, used outside, zeroes the padding)."""
    m = _torch_modules()["encoder"]
    x = _x(N, L, E)
    kpm = torch.zeros(N, L, dtype=torch.bool)
    kpm[1, 3:] = True
    with torch.no_grad():
        want = m(x, src_key_padding_mask=kpm)
        with emulate("flash") as run:
            got = m(x, src_key_padding_mask=kpm)
        with emulate("intattention") as run2:
            lossy = m(x, src_key_padding_mask=kpm)
    assert all(c.masked for c in run.stats.calls) and len(run.stats.calls) == 2
    assert (got - want)[~kpm].abs().max() < 1e-5
    assert 1e-4 < (lossy - want)[~kpm].abs().max() < 1.0
    assert len(run2.stats.calls) == 2


def test_need_weights_output_emulated_weights_float():
    """need_weights=True (MHA's default): the output is emulated, the weights are torch's float
    softmax (documented in lowprec.torch.mha)."""
    mha = _torch_modules()["mha"]
    x = _x(L, N, E)
    with torch.no_grad():
        o_ref, w_ref = mha(x, x, x)
        with emulate("intattention") as run:
            o, w = mha(x, x, x)
    assert len(run.stats.calls) == 1
    assert not torch.equal(o, o_ref) and (o - o_ref).abs().max() < 0.2  # emulated
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)           # float


def test_fused_functions_not_reached_under_the_mode():
    """torch's fused MHA / encoder-layer fast paths are skipped under a mode (so nothing escapes
    through them); a direct call to one is reported on exit."""
    mods = _torch_modules()
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), emulate("flash"), Spy():
        for name, m in mods.items():
            _run(name, m)
    assert not [s for s in seen if "native_multi_head" in s or "encoder_layer_fwd" in s]
    mha = mods["mha"]
    x = _x(N, L, E)
    with pytest.warns(UserWarning, match="_native_multi_head_attention"):
        with torch.no_grad(), emulate("flash") as run:
            torch._native_multi_head_attention(x, x, x, E, H, mha.in_proj_weight,
                                               mha.in_proj_bias, mha.out_proj.weight,
                                               mha.out_proj.bias)
    assert run._escaped == {"torch._native_multi_head_attention": 1}


def test_aten_sdpa_is_emulated():
    q, k, v = (_x(1, 2, 5, 8, seed=i) for i in range(3))
    with emulate("intattention") as run:
        got = torch.ops.aten.scaled_dot_product_attention(q, k, v)
    assert len(run.stats.calls) == 1
    assert not torch.equal(got, F.scaled_dot_product_attention(q, k, v))


# ---- item 9: names without model= ----------------------------------------------------------


def test_auto_names_equal_explicit_names():
    torch.manual_seed(0)
    net = Net()
    x = _x(N, L, E)
    with torch.no_grad():
        with emulate("flash", model=net) as explicit:
            y1 = net(x)
        with emulate("flash") as auto:
            y2 = net(x)
            net.blocks[1](x)              # a submodule called on its own keeps its name
            F.scaled_dot_product_attention(*(_x(1, 1, 3, 4, seed=i) for i in range(3)))
    assert torch.equal(y1, y2)
    assert [c.module for c in explicit.stats.calls] == ["blocks.0", "blocks.1"]
    assert [c.module for c in auto.stats.calls] == ["blocks.0", "blocks.1", "blocks.1",
                                                    "<unknown>"]
    assert _global_hooks() == (0, 0)


def test_two_models_and_absorbed_submodule():
    torch.manual_seed(0)
    a, b = Net(), Net(1)
    x = _x(N, L, E)
    with torch.no_grad(), emulate("flash") as run:
        a.blocks[0](x)   # met first on its own: "<root>" for now
        a(x)             # the whole model contains it: renamed blocks.0
        b(x)             # another model: prefixed with its class name
        Net(1)(x)        # a third one of the same class
    assert [c.module for c in run.stats.calls] == ["blocks.0", "blocks.0", "blocks.1",
                                                   "Net.blocks.0", "Net#2.blocks.0"]
    assert run.stats.modules["blocks.0"].calls == 2
    assert list(run.stats.modules) == ["blocks.0", "blocks.1", "Net.blocks.0", "Net#2.blocks.0"]


def test_auto_names_unregistered_and_added_modules():
    torch.manual_seed(0)

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Net(1)
            self.hidden = [Attn()]  # not registered

        def forward(self, x):
            return self.inner(x) + self.hidden[0](x)

    h = Holder()
    with torch.no_grad(), emulate("flash") as run:
        h(_x(N, L, E))
        h.late = Attn()             # registered after the names were computed
        h.late(_x(N, L, E))
        h(_x(N, L, E))
    assert [c.module for c in run.stats.calls] == ["inner.blocks.0", "Attn", "late",
                                                   "inner.blocks.0", "Attn"]


def test_auto_names_only_in_entering_thread():
    torch.manual_seed(0)
    net = Net()
    x = _x(N, L, E)
    with torch.no_grad():
        want = net(x)
    res = {}

    def other():
        with torch.no_grad():
            res["y"] = net(x)

    with torch.no_grad(), emulate("intattention") as run:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        net(x)
    assert torch.equal(res["y"], want)
    assert [c.module for c in run.stats.calls] == ["blocks.0", "blocks.1"]
    assert run._modules_run == 5  # net, 2 x (block, its Linear): this thread's calls only


def test_auto_names_exception_unwinds_and_hooks_removed():
    net = Net()

    class Boom(nn.Module):
        def forward(self, x):
            net(x)
            raise KeyError("boom")

    with torch.no_grad(), emulate("flash") as run:
        with pytest.raises(KeyError):
            Boom()(_x(N, L, E))
        assert _live(run._astack) == []  # the raising modules' entries are stale: dropped
        F.scaled_dot_product_attention(*(_x(1, 1, 3, 4, seed=i) for i in range(3)))
    assert [c.module for c in run.stats.calls][-1] == "<unknown>"
    with pytest.raises(ValueError), emulate("flash"):
        raise ValueError
    assert _global_hooks() == (0, 0)


def test_auto_names_class_unit():
    net = Net()
    names = AutoNames()
    assert names.meet(net) == ("<root>", {})
    assert names.meet(net.blocks[1].qkv) == ("blocks.1.qkv", {})
    other = Attn()
    assert names.meet(other) == ("Attn", {})
    big = nn.Sequential(net)
    name, renames = names.meet(big)
    assert name == "<root>" and renames["<root>"] == "0"
    assert renames["blocks.1.qkv"] == "0.blocks.1.qkv" and "Attn" not in renames
    assert names.meet(net.blocks[0]) == ("0.blocks.0", {})
    names.clear()
    assert names.roots == []


def test_minilm_without_model_names_every_layer():
    """Acceptance: MiniLM (transformers) without model=: every attention call intercepted and
    attributed to its module's qualified name."""
    from lowprec.torch.models import ModelNotInstalledError, load_model

    try:
        model, tok = load_model("minilm")
    except ModelNotInstalledError as e:
        pytest.skip(str(e))
    batch = tok(["a short one", "a somewhat longer sentence for the padding"], padding=True,
                return_tensors="pt")
    with torch.no_grad(), emulate("flash") as run:
        model(**batch)
    want = [f"encoder.layer.{i}.attention.self" for i in range(6)]
    assert [c.module for c in run.stats.calls] == want
    assert all(c.masked for c in run.stats.calls)


# ---- item 18: nothing emulated -------------------------------------------------------------


def test_warns_when_attention_is_written_by_hand():
    m = HandNet()
    with pytest.warns(UserWarning, match=r"no attention call was emulated; 1 softmax"):
        with torch.no_grad(), lp.emulate("intattention") as run:
            m(_x(N, L, E))
    assert run.stats.calls == []


def test_warns_when_modules_ran_without_attention():
    mlp = nn.Sequential(nn.Linear(E, E), nn.ReLU())
    with pytest.warns(UserWarning, match=r"3 module call\(s\) ran, none of them calling"):
        with torch.no_grad(), lp.emulate("flash"):
            mlp(_x(N, E))


def test_no_exit_warning_when_not_needed():
    net = Net()
    lin = nn.Linear(E, E)
    with _no_warnings() as w:
        warnings.simplefilter("always")
        with lp.emulate("flash"):        # nothing ran
            pass
        with torch.no_grad(), lp.emulate("flash"):
            net(_x(N, L, E))
        with torch.no_grad(), lp.emulate("reference", model=lin, activations="e4m3"):
            lin(_x(N, E))                # Linear quantization only: nothing to warn about
        with torch.no_grad(), lp.emulate("flash"):   # the inner context emulated the calls
            with lp.emulate("intattention"):
                net(_x(N, L, E))
        with pytest.raises(KeyError), lp.emulate("flash"):  # not on an exception
            HandNet()(_x(N, L, E))
            raise KeyError
    assert [str(x.message) for x in w] == []


def test_exit_from_another_thread_is_refused():
    ctx = lp.emulate("flash")
    ctx.__enter__()
    err = []

    def other():
        try:
            ctx.__exit__(None, None, None)
        except RuntimeError as e:
            err.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert err and "thread that entered" in err[0]
    assert ctx.active
    ctx.__exit__(None, None, None)
    assert not ctx.active and torch._C._len_torch_function_stack() == 0
