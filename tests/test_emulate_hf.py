"""lowprec.emulate with HuggingFace transformers models using eager attention (lowprec.torch.hf).

Tiny randomly initialised models built from configs (nothing is downloaded)."""

import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
nn = torch.nn

from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaModel,
    PreTrainedModel,
)

from lowprec.torch import emulate, hf  # noqa: E402

L = 12
BERT_ATTN = ["encoder.layer.0.attention.self", "encoder.layer.1.attention.self"]
LLAMA_ATTN = ["layers.0.self_attn", "layers.1.self_attn"]


def _bert(impl):
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, vocab_size=100, attn_implementation=impl)
    return BertModel(cfg).eval()


def _llama(impl):
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=100,
                      attn_implementation=impl)
    return LlamaModel(cfg).eval()


def _pair(build):
    """(eager model, sdpa model) with the same weights."""
    torch.manual_seed(0)
    eager = build("eager")
    sdpa = build("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    return eager, sdpa


@pytest.fixture(scope="module")
def bert():
    return _pair(_bert)


@pytest.fixture(scope="module")
def llama():
    return _pair(_llama)


@pytest.fixture(scope="module")
def batch():
    """ids (2, L); right-padded mask (sequence 1 has 8 tokens); left-padded mask + positions."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (2, L), generator=g)
    right = torch.ones(2, L, dtype=torch.long)
    right[1, 8:] = 0
    left = torch.ones(2, L, dtype=torch.long)
    left[1, :4] = 0
    pos = (left.cumsum(-1) - 1).clamp(min=0)
    return ids, right, left, pos


def _out(model, *args, **kw):
    with torch.no_grad():
        return model(*args, **kw).last_hidden_state


def test_reference_matches_eager_and_counts_per_module(bert, batch):
    model = bert[0]
    ids, right, _, _ = batch
    y0 = _out(model, ids, attention_mask=right)
    with emulate("reference", model=model, reference=True) as run:
        assert model.config._attn_implementation == hf.ATTN_NAME
        assert run.hf_switched == ["<root>"]
        y1 = _out(model, ids, attention_mask=right)
        _out(model, ids)
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(y1, y0, atol=2e-6, rtol=1e-5)
    assert list(run.stats.modules) == BERT_ATTN  # one call per attention layer per forward
    assert [m.calls for m in run.stats.modules.values()] == [2, 2]
    assert [c.masked for c in run.stats.calls] == [True, True, False, False]
    assert all(c.q_shape == (2, 4, L, 8) for c in run.stats.calls)
    assert run.stats.total().sqnr_db_min > 100  # float64 reference vs float32 SDPA


def test_eager_hf_model_is_now_emulated(bert, batch):
    """Before this integration the eager model escaped emulation; now a lossy scheme changes it."""
    model = bert[0]
    ids, right, _, _ = batch
    y0 = _out(model, ids, attention_mask=right)
    with emulate("hif8", model=model) as run:
        y1 = _out(model, ids, attention_mask=right)
    assert run.stats.total().calls == 2
    assert run.stats.total().scheme_stats.restartable == 2  # e2e_hif8's restart test ran
    assert 1e-5 < (y1 - y0).abs().max() < 0.1


@pytest.mark.parametrize("scheme", ["flash", "baps"])
def test_padding_mask_reaches_scheme_bert(bert, batch, scheme):
    model = bert[0]
    ids, right, _, _ = batch
    with emulate(scheme, model=model) as run:
        padded = _out(model, ids, attention_mask=right)
        alone = _out(model, ids[1:, :8])
        unmasked = _out(model, ids)
    torch.testing.assert_close(padded[1, :8], alone[0], atol=1e-5, rtol=1e-5)
    # without the mask the padding tokens are attended: clearly different
    assert (unmasked[1, :8] - alone[0]).abs().max() > 1e-3
    assert [c.masked for c in run.stats.calls] == [True, True, False, False, False, False]


@pytest.mark.parametrize("scheme", ["flash", "baps"])
def test_padding_mask_reaches_scheme_llama_left_padded(llama, batch, scheme):
    model = llama[0]
    ids, _, left, pos = batch
    with emulate(scheme, model=model) as run:
        padded = _out(model, ids, attention_mask=left, position_ids=pos)
        alone = _out(model, ids[1:, 4:])
        unmasked = _out(model, ids, position_ids=pos)
    torch.testing.assert_close(padded[1, 4:], alone[0], atol=1e-5, rtol=1e-5)
    assert (unmasked[1, 4:] - alone[0]).abs().max() > 1e-3
    first = run.stats.calls[:2]
    assert all(c.masked for c in first)
    assert [c.empty_rows for c in first] == [4 * 4, 4 * 4]  # 4 padded query rows x 4 heads


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_eager_and_sdpa_models_bit_identical(bert, llama, batch, which):
    eager, sdpa = bert if which == "bert" else llama
    ids, right, left, pos = batch
    calls = [dict(input_ids=ids), dict(input_ids=ids, attention_mask=right)]
    if which == "llama":
        calls.append(dict(input_ids=ids, attention_mask=left, position_ids=pos))
    with emulate("hif8", model=eager) as re_:
        ye = [_out(eager, **kw) for kw in calls]
    with emulate("hif8", model=sdpa) as rs:
        ys = [_out(sdpa, **kw) for kw in calls]
    assert rs.hf_switched == []  # sdpa models are intercepted as they are
    for a, b in zip(ye, ys, strict=True):
        assert torch.equal(a, b)
    key = ("module", "q_shape", "k_shape", "v_shape", "causal", "masked", "gqa", "empty_rows")
    assert [[getattr(c, k) for k in key] for c in re_.stats.calls] == \
        [[getattr(c, k) for k in key] for c in rs.stats.calls]
    assert re_.stats.restart_rate == rs.stats.restart_rate


def test_restored_after_exit_normal_and_exception(bert, batch):
    model = bert[0]
    ids, right, _, _ = batch
    y0 = _out(model, ids, attention_mask=right)
    with emulate("baps", model=model) as run:
        _out(model, ids, attention_mask=right)
    assert model.config._attn_implementation == "eager" and run.hf_switched == []
    assert torch.equal(_out(model, ids, attention_mask=right), y0)
    with pytest.raises(KeyError, match="boom"):
        with emulate("baps", model=model):
            assert model.config._attn_implementation == hf.ATTN_NAME
            _out(model, ids, attention_mask=right)
            raise KeyError("boom")
    assert model.config._attn_implementation == "eager"
    assert torch.equal(_out(model, ids, attention_mask=right), y0)
    assert hf._SWITCHED == {}


def test_exception_in_forward_restores(llama, batch):
    model = llama[0]
    ids = batch[0]
    y0 = _out(model, ids)
    with pytest.raises(ValueError, match="dropout_p"):
        model.train()
        try:
            with emulate("baps", model=model):
                model.config.attention_dropout = 0.5
                for layer in model.layers:
                    layer.self_attn.attention_dropout = 0.5
                _out(model, ids)
        finally:
            model.eval()
            for layer in model.layers:
                layer.self_attn.attention_dropout = 0.0
            model.config.attention_dropout = 0.0
    assert model.config._attn_implementation == "eager"
    assert torch.equal(_out(model, ids), y0)


def test_llama_gqa_causal_stats(llama, batch):
    model = llama[0]
    ids, _, left, pos = batch
    y0 = _out(model, ids)
    y0p = _out(model, ids, attention_mask=left, position_ids=pos)
    with emulate("reference", model=model) as run:
        y1 = _out(model, ids)
        y1p = _out(model, ids, attention_mask=left, position_ids=pos)
    torch.testing.assert_close(y1, y0, atol=2e-6, rtol=1e-5)
    keep = left.bool()
    torch.testing.assert_close(y1p[keep], y0p[keep], atol=2e-6, rtol=1e-5)
    assert list(run.stats.modules) == LLAMA_ATTN
    assert [m.calls for m in run.stats.modules.values()] == [2, 2]
    nomask, masked = run.stats.calls[:2], run.stats.calls[2:]
    # no padding: SDPA's is_causal with 2 k/v heads (enable_gqa); padding: boolean mask and
    # k/v heads repeated by transformers before the call
    assert all(c.causal and c.gqa and not c.masked and c.k_shape == (2, 2, L, 8)
               for c in nomask)
    assert all(c.masked and not c.gqa and c.k_shape == (2, 4, L, 8) for c in masked)
    with emulate("hif8", model=model) as run:
        _out(model, ids)
    assert run.stats.total().scheme_stats.restartable == 2 and run.stats.total().calls == 2


def test_plain_module_runs_unchanged():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(3, 8)
    with torch.no_grad():
        y0 = mlp(x)
        with pytest.warns(UserWarning, match="no attention call"), \
                emulate("baps", model=mlp) as run:
            assert run.hf_switched == []
            y1 = mlp(x)
    assert torch.equal(y0, y1)
    assert run.stats.calls == [] and run.stats.modules == {}


def test_hf_eager_false_leaves_models_alone(bert, batch):
    model = bert[0]
    ids, right, _, _ = batch
    y0 = _out(model, ids, attention_mask=right)
    for kw in ({"model": model}, {}):
        with pytest.warns(UserWarning, match="no attention call was emulated"), \
                emulate("hif8", hf_eager=False, **kw) as run:
            assert model.config._attn_implementation == "eager"
            y1 = _out(model, ids, attention_mask=right)
        assert torch.equal(y0, y1)
        assert run.stats.calls == [] and run.hf_switched == []
    with pytest.raises(TypeError, match="hf_eager"):
        emulate("baps", hf_eager="yes")


def test_unwatched_eager_model_switched_when_met(bert, batch):
    """Issue 12 item 9: without model= the outermost module called is met by the global hooks;
    an eager HF model in it is switched before its forward runs, named like model= does, and
    restored on exit."""
    eager, sdpa = bert
    ids, right, _, _ = batch
    with emulate("hif8", model=sdpa) as ref:
        want = _out(sdpa, ids, attention_mask=right)
    with emulate("hif8") as run:
        assert eager.config._attn_implementation == "eager"  # not met yet
        got = _out(eager, ids, attention_mask=right)
        assert eager.config._attn_implementation == hf.ATTN_NAME
        assert run.hf_switched == ["<root>"]
    assert eager.config._attn_implementation == "eager"
    assert torch.equal(got, want)
    assert list(run.stats.modules) == BERT_ATTN == list(ref.stats.modules)


def test_other_thread_gets_eager_result(bert, llama, batch):
    """The switch is per model: another thread without a context computes plain eager."""
    ids, right, left, pos = batch
    cases = [(bert[0], dict(input_ids=ids, attention_mask=right)),
             (llama[0], dict(input_ids=ids)),
             (llama[0], dict(input_ids=ids, attention_mask=left, position_ids=pos))]
    expected = [_out(m, **kw) for m, kw in cases]
    got = []

    def worker():
        got.extend(_out(m, **kw) for m, kw in cases)

    with emulate("hif8", model=[bert[0], llama[0]]) as run:
        assert run.hf_switched == ["0", "1"]
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert run.stats.calls == []
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_nested_contexts_and_watch(bert, batch):
    model = bert[0]
    ids, right, _, _ = batch
    with emulate("reference") as outer:
        assert model.config._attn_implementation == "eager"
        outer.watch(model)  # switched at once
        assert model.config._attn_implementation == hf.ATTN_NAME
        with emulate("hif8", model=model) as inner:
            _out(model, ids, attention_mask=right)
        assert model.config._attn_implementation == hf.ATTN_NAME  # outer still holds it
        _out(model, ids, attention_mask=right)
    assert model.config._attn_implementation == "eager"
    assert inner.stats.total().calls == 2 and outer.stats.total().calls == 2
    assert inner.stats.total().scheme_stats.restartable == 2
    assert outer.stats.total().scheme_stats is None and outer.stats.restart_rate is None


def test_registered_name_usable_directly(bert, batch):
    """A model built with attn_implementation="lowprec": eager outside, emulated inside."""
    ids, right, _, _ = batch
    assert hf.register() == "lowprec"
    torch.manual_seed(0)
    model = _bert("lowprec")
    model.load_state_dict(bert[0].state_dict())
    assert torch.equal(_out(model, ids, attention_mask=right),
                       _out(bert[0], ids, attention_mask=right))
    with emulate("hif8", model=model) as run:
        y = _out(model, ids, attention_mask=right)
    assert run.hf_switched == [] and run.stats.total().calls == 2
    with emulate("hif8", model=bert[1]):
        assert torch.equal(y, _out(bert[1], ids, attention_mask=right))


class _NoBackend(PreTrainedModel):
    """An eager HF model that does not dispatch through the AttentionInterface."""

    config_class = BertConfig
    _supports_attention_backend = False

    def __init__(self, config):
        super().__init__(config)
        self.lin = nn.Linear(4, 4)
        self.post_init()

    def forward(self, x):
        return self.lin(x)


def test_unsupported_eager_model_warns_and_is_left_alone():
    cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=8, vocab_size=10, attn_implementation="eager")
    model = _NoBackend(cfg)
    with pytest.warns(UserWarning, match="NOT emulated"):
        with emulate("baps", model=model) as run:
            assert run.hf_switched == []
    assert model.config._attn_implementation == "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.switch_eager(model, warn=False)


def test_attention_forward_direct_both_paths():
    """The registered function on its own: the generic eager fallback outside a context (this
    test module defines no eager_attention_forward), the SDPA path inside."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 5, 8, generator=g)
    k, v = torch.randn(2, 1, 2, 5, 8, generator=g)
    mod = nn.Module().eval()
    mod.is_causal, mod.num_key_value_groups = True, 2
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    tril = torch.ones(5, 5, dtype=torch.bool).tril()
    s = (q @ kr.transpose(-1, -2) * 0.3).masked_fill(~tril, float("-inf"))
    want = (s.softmax(-1) @ vr).transpose(1, 2)
    out, w = hf.attention_forward(mod, q, k, v, None, scaling=0.3)  # causal mask rebuilt
    torch.testing.assert_close(out, want)
    assert w.shape == (1, 4, 5, 5)
    out_b, _ = hf.attention_forward(mod, q, k, v, tril[None, None], scaling=0.3)  # bool mask
    torch.testing.assert_close(out_b, want)
    with torch.no_grad(), emulate("reference") as run:
        out_e, w_e = hf.attention_forward(mod, q, k, v, None, scaling=0.3)
        with pytest.raises(ValueError, match="softcap"):
            hf.attention_forward(mod, q, k, v, None, scaling=0.3, softcap=30.0)
    torch.testing.assert_close(out_e, want)
    assert w_e is None
    assert len(run.stats.calls) == 1 and run.stats.calls[0].causal and run.stats.calls[0].gqa
