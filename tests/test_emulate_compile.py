"""``torch.compile`` inside ``lp.emulate`` (issue 15 item 3): the custom ops of
``lowprec.torch.ops``, module names under compile, reuse of a compiled model by later contexts.

Bit-identity: a compiled emulated model equals the eager emulated model when the rest of the
model compiles to torch's eager bits.  Inductor keeps them for Linear, views and adds (the
models compiled with the default backend here); its fused kernels for GELU, LayerNorm or
softmax may round differently from eager, emulated or not, so models with those use
``backend="aot_eager"`` (graph capture and the same custom ops, eager ATen kernels).
"""

import threading

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import lowprec as lp  # noqa: E402
from lowprec.torch import context, emulate  # noqa: E402

pytestmark = [  # torch's own, about the hooks of a context without model= and its imports
    pytest.mark.filterwarnings(
        "ignore:Using `torch.compile\\(module\\)` when there are global hooks:UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated"),
]
D, H, L = 32, 4, 8


class Attn(nn.Module):
    """q, k, v from one Linear, SDPA, heads merged: compiles to eager's bits."""

    def __init__(self, d=D, h=H):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.h = h

    def forward(self, x, mask=None, causal=False):
        B, n, d = x.shape
        q, k, v = self.qkv(x).view(B, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return y.transpose(1, 2).reshape(B, n, d)


class Net(nn.Module):
    def __init__(self, attn=Attn):
        super().__init__()
        self.blocks = nn.ModuleList([attn(), attn()])

    def forward(self, x, mask=None, causal=False):
        for b in self.blocks:
            x = x + b(x, mask, causal)
        return x


class BreakAttn(Attn):
    """Attention with a graph break: Dynamo compiles its forward as a frame of its own, whose
    code both instances share."""

    def forward(self, x, mask=None, causal=False):
        y = super().forward(x, mask, causal)
        torch._dynamo.graph_break()
        return y


def _net(attn=Attn, seed=0):
    torch.manual_seed(seed)
    return Net(attn).eval()


def _x(seed=1, n=L):
    return torch.randn(2, n, D, generator=torch.Generator().manual_seed(seed))


def _masks():
    g = torch.Generator().manual_seed(2)
    boolean = torch.rand(2, 1, L, L, generator=g) > 0.3
    boolean[..., 0] = True
    additive = torch.randn(2, H, L, L, generator=g)
    return {"causal": {"causal": True}, "bool": {"mask": boolean},
            "additive": {"mask": additive}}


def _records(run):
    """Every call's module and scheme statistics (time left out)."""
    return [(c.module, c.q_shape, c.causal, c.masked, c.empty_rows,
             None if c.stats is None else c.stats.to_dict()) for c in run.stats.calls]


def _unique_graphs():
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.fixture
def op_calls(monkeypatch):
    """Counts the calls answered by ``lowprec::sdpa`` (it names them through _site_name)."""
    seen = []
    orig = context.Emulation._site_name

    def spy(self, index):
        name = orig(self, index)
        seen.append(name)
        return name

    monkeypatch.setattr(context.Emulation, "_site_name", spy)
    return seen


@pytest.fixture(scope="module")
def compiled():
    """One model compiled once (default backend, fullgraph=False) and shared by the tests:
    every later context reuses its graphs."""
    torch._dynamo.reset()
    m = _net()
    return m, torch.compile(m)


@pytest.mark.parametrize("mask", ["causal", "bool", "additive"])
def test_compiled_equals_eager(compiled, mask, op_calls):
    m, cm = compiled
    x, kw = _x(), _masks()[mask]
    with torch.no_grad():
        for i, scheme in enumerate(("hif8", "intattention")):
            with emulate(scheme, model=m) as eager:
                want = m(x, **kw)
            before = _unique_graphs()
            with emulate(scheme, model=m) as run:
                got = cm(x, **kw)
            if i:  # a later context with another scheme: the same graph, no recompilation
                assert _unique_graphs() == before
            assert torch.equal(got, want), (scheme, mask)
            assert _records(run) == _records(eager)
            assert [c.module for c in run.stats.calls] == ["blocks.0", "blocks.1"]
            assert run.stats.summary() and run.stats.to_dict()["blocks.0"]["calls"] == 1
    assert len(op_calls) == 4  # every call went through the custom op


def test_compiled_reused_by_later_contexts(compiled):
    """A context reports what ran inside it, whatever context the graph was traced in;
    outside every context the compiled model computes torch's attention again."""
    m, cm = compiled
    x = _x(3)
    with torch.no_grad():
        plain = m(x, causal=True)
        with emulate("hif8", model=m) as a:
            want = m(x, causal=True)
        with emulate("hif8", model={"net": m}) as b:  # other names: looked up at run time
            assert torch.equal(cm(x, causal=True), want)
            assert torch.equal(cm(x, causal=True), want)
        assert [c.module for c in b.stats.calls] == ["net.blocks.0", "net.blocks.1"] * 2
        with emulate("hif8", model=cm) as wrapped:  # the wrapper stands for its model
            assert torch.equal(cm(x, causal=True), want)
        assert [c.module for c in wrapped.stats.calls] == ["blocks.0", "blocks.1"]
        assert a.stats.to_dict()["blocks.0"]["calls"] == 1  # nothing added to the old context
        out = cm(x, causal=True)  # no context: retraced (Dynamo guards the mode stack)
        assert torch.allclose(out, plain, atol=1e-6) and not torch.equal(out, want)
        assert len(b.stats.calls) == 4


def test_nested_contexts_innermost_in_effect(compiled):
    m, cm = compiled
    x = _x(4)
    with torch.no_grad():
        with emulate("intattention", model=m):
            want = m(x, causal=True)
        with emulate("hif8", model=m) as outer, emulate("intattention", model=m) as inner:
            got = cm(x, causal=True)
    assert torch.equal(got, want)
    assert len(inner.stats.calls) == 2 and not outer.stats.calls


def test_other_thread_without_context(compiled):
    m, cm = compiled
    x = _x(5)
    res = {}

    def worker():
        with torch.no_grad():
            res["y"] = cm(x, causal=True)

    with torch.no_grad():
        plain = m(x, causal=True)
        with emulate("hif8", model=m) as run:
            t = threading.Thread(target=worker)
            t.start()
            t.join()
    assert torch.allclose(res["y"], plain, atol=1e-6) and not run.stats.calls


def test_auto_names_and_graph_breaks(op_calls):
    """Without model= (global hooks) and with a graph break inside each attention module:
    Dynamo compiles BreakAttn.forward once for both instances; the calls are still named
    after the instance that runs."""
    torch._dynamo.reset()
    m = _net(BreakAttn, seed=3)
    x, kw = _x(6), _masks()["bool"]
    cm = torch.compile(m, backend="aot_eager")
    with torch.no_grad():
        for model in (m, None):
            with emulate("hif8", model=model) as eager:
                want = m(x, **kw)
            with emulate("hif8", model=model) as run:
                got = cm(x, **kw)
            assert torch.equal(got, want)
            assert _records(run) == _records(eager)
            assert [c.module for c in run.stats.calls] == ["blocks.0", "blocks.1"]
    assert len(op_calls) == 4


def test_fullgraph_tiny_mha_encoder(op_calls):
    """fullgraph=True: no graph break of ours (Linear with GELU blocks, nn.MultiheadAttention,
    nn.TransformerEncoder with a key padding mask), equal to eager with eager kernels."""
    from test_emulate import Tiny

    torch._dynamo.reset()
    torch.manual_seed(0)
    tiny = Tiny().eval()
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True), 2,
        enable_nested_tensor=False).eval()
    x = _x(7)
    kpm = torch.zeros(2, L, dtype=torch.bool)
    kpm[1, 5:] = True
    cases = [(tiny, (x,), {"causal": True}, ["blocks.0.attn", "blocks.1.attn"]),
             (mha, (x, x, x), {}, ["<root>"]),
             (enc, (x,), {"src_key_padding_mask": kpm},
              ["layers.0.self_attn", "layers.1.self_attn"])]
    with torch.no_grad():
        for model, args, kw, names in cases:
            cm = torch.compile(model, backend="aot_eager", fullgraph=True)
            with emulate("intattention", model=model) as eager:
                want = model(*args, **kw)
            with emulate("intattention", model=model) as run:
                got = cm(*args, **kw)
            want = want[0] if isinstance(want, tuple) else want
            got = got[0] if isinstance(got, tuple) else got
            assert torch.equal(got, want)
            assert [c.module for c in run.stats.calls] == names
            assert _records(run) == _records(eager)
    assert len(op_calls) == 5


def test_fullgraph_inductor_quantized_linear():
    """fullgraph=True with the default backend, Linear inputs and weights fake-quantized
    (the lowprec::linear_input / linear_weight ops): bits and statistics as eager."""
    torch._dynamo.reset()
    m = _net(seed=4)
    x = _x(8)
    opts = {"activations": "e4m3", "weights": "e5m2", "exclude": ["blocks.1.*"]}
    with torch.no_grad():
        with emulate("hif8", model=m, **opts) as eager:
            want = m(x, causal=True)
        cm = torch.compile(m, fullgraph=True)
        with emulate("hif8", model=m, **opts) as run:
            got = cm(x, causal=True)
        with emulate("hif8", model=m) as plain_linear:  # another mode class: retraced
            assert not torch.equal(cm(x, causal=True), got)
    assert torch.equal(got, want)
    assert run.stats.to_dict().keys() == eager.stats.to_dict().keys()
    for name, mod in eager.stats.modules.items():
        got_q = run.stats.modules[name].quant
        assert (got_q is None) == (mod.quant is None)
        if mod.quant is not None:
            assert got_q.to_dict() == mod.quant.to_dict()
    assert run.stats.modules["blocks.0.qkv"].quant.w_quantizations == 1
    assert "blocks.1.qkv" not in run.stats.modules
    assert len(plain_linear.stats.calls) == 2


def test_hf_llama_compiled():
    """A transformers model, eager attention switched to lowprec's and an sdpa one, compiled
    whole (fullgraph=True) inside the context: as eager, padding included."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(9))
    am = torch.ones(2, 12, dtype=torch.long)
    am[1, :3] = 0
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, vocab_size=100,
                                       attn_implementation=impl)
        model = transformers.LlamaModel(cfg).eval()
        cm = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            with emulate("hif8", model=model) as eager:
                want = model(input_ids=ids, attention_mask=am).last_hidden_state
            with emulate("hif8", model=model) as run:
                got = cm(input_ids=ids, attention_mask=am).last_hidden_state
        assert torch.equal(got, want), impl
        assert [c.module for c in run.stats.calls] == ["layers.0.self_attn",
                                                       "layers.1.self_attn"]
        assert _records(run) == _records(eager)


def test_errors_under_compile():
    torch._dynamo.reset()

    class Drop(Attn):
        def forward(self, x):
            B, n, d = x.shape
            q, k, v = self.qkv(x).view(B, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    m = Drop()
    x = _x(10)
    with torch.no_grad(), emulate("hif8", model=m):
        with pytest.raises(ValueError, match="dropout"):
            torch.compile(m, backend="aot_eager")(x)
    a = Attn()
    with emulate("hif8", model=a), pytest.raises(RuntimeError, match="grad"):
        torch.compile(a, backend="aot_eager")(x)


def test_op_outside_every_context():
    """``torch.ops.lowprec.sdpa`` with no active context computes torch's SDPA; inside one
    it emulates (named ``<unknown>``: no site)."""
    q, k, v = (torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    out = torch.ops.lowprec.sdpa(q, k, v, None, 0.0, True, None, False, -1)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    with emulate("hif8") as run:
        got = torch.ops.lowprec.sdpa(q, k, v, None, 0.0, True, None, False, -1)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(got, want)
    assert [c.module for c in run.stats.calls] == ["<unknown>", "<unknown>"]
    torch.library.opcheck(torch.ops.lowprec.sdpa.default, (q, k, v, None, 0.0, True, None,
                                                          False, -1))


def test_context_module_stack_after_exception_in_compiled_model(compiled):
    """Forward hooks are registered without always_call (Dynamo would guard each context's
    hook ids and recompile): a module that raises leaves stale stack entries, dropped."""
    m, cm = compiled
    with torch.no_grad(), emulate("hif8", model=m) as run:
        with pytest.raises(RuntimeError):
            m(torch.randn(2, L, D + 1))
        q = torch.randn(1, 1, 4, 8)
        F.scaled_dot_product_attention(q, q, q)
    assert [c.module for c in run.stats.calls] == ["<unknown>"]
    assert lp.emulate is emulate
