"""Windows beyond a model's trained length (issue 15 item 4): ``long_context_rope`` and the
``device`` / ``long_context`` options of the SmolLM2 studies."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lowprec.studies import models as S  # noqa: E402

TRAINED = 64


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, vocab_size=100,
                                   max_position_embeddings=TRAINED,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _linear_scaled(factor: float):
    """The same model built with transformers' own linear RoPE scaling (an independent route
    to position interpolation)."""
    m = _llama()
    cfg = m.config
    cfg.rope_parameters = {**cfg.rope_parameters, "rope_type": "linear", "factor": factor}
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_interpolation_equals_transformers_linear_rope():
    """Beyond the trained length, "interpolate" divides the inverse frequencies by L / trained:
    the logits equal those of the model configured with ``rope_type="linear"``, and the
    frequencies are restored on exit."""
    L = 4 * TRAINED
    m = _llama()
    ids = torch.randint(0, 100, (1, L), generator=torch.Generator().manual_seed(1))
    inv0 = m.model.rotary_emb.inv_freq.clone()
    with torch.no_grad():
        plain = m(ids).logits
        assert S.rope_factor(m, L, "interpolate") == 4.0
        assert S.rope_factor(m, L, "extrapolate") == S.rope_factor(m, TRAINED) == 1.0
        with S.long_context_rope(m, L, "interpolate") as f:
            assert f == 4.0
            assert torch.equal(m.model.rotary_emb.inv_freq, inv0 / 4)
            ours = m(ids).logits
        ref = _linear_scaled(4.0)(ids).logits
    assert torch.equal(m.model.rotary_emb.inv_freq, inv0)
    assert (ours - ref).abs().max() < 1e-5
    assert (ours - plain).abs().max() > 1e-4  # the interpolation changed the logits


@pytest.mark.parametrize("L, mode", [(TRAINED, "interpolate"), (4 * TRAINED, "extrapolate")])
def test_left_alone(L, mode):
    """Within the trained length, or with "extrapolate", nothing changes."""
    m = _llama()
    inv0 = m.model.rotary_emb.inv_freq.clone()
    with S.long_context_rope(m, L, mode) as f:
        assert f == 1.0
        assert torch.equal(m.model.rotary_emb.inv_freq, inv0)


def test_restored_after_an_error():
    m = _llama()
    inv0 = m.model.rotary_emb.inv_freq.clone()
    with pytest.raises(KeyError), S.long_context_rope(m, 3 * TRAINED):
        raise KeyError("inside")
    assert torch.equal(m.model.rotary_emb.inv_freq, inv0)


@pytest.mark.parametrize("bad", ["linear", None, ""])
def test_bad_mode(bad):
    with pytest.raises(ValueError, match="long_context"), \
            S.long_context_rope(_llama(), 10, bad):
        pass
    with pytest.raises(ValueError, match="long_context"):
        S.perplexity_float32(max_tokens=16, windows=1, long_context=bad)


def test_rope_note():
    assert S._rope_note({"rope_factor": 1.0}) == ""
    assert "interpolated by 4" in S._rope_note({"rope_factor": 4.0})
    assert "extrapolated" in S._rope_note({"long_context": "extrapolate", "tokens": 16384})
    assert S._rope_note({"long_context": "extrapolate", "tokens": 8192}) == ""


def test_sdpa_without_gqa_same_attention():
    """The repeated-heads route (entered for a CUDA device; the mode itself runs on CPU
    tensors here) gives torch's GQA attention, equal to the explicitly repeated call; for a
    CPU device nothing changes."""
    import torch.nn.functional as F

    q = torch.randn(1, 4, 8, 16, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 8, 16, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    kr, vr = (t.repeat_interleave(2, dim=-3) for t in (k, v))
    rep = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
    with S._sdpa_without_gqa("cuda"):
        routed = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        plain = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
    assert torch.equal(routed, rep) and torch.equal(plain, rep)
    assert torch.allclose(routed, ref, rtol=0, atol=1e-12)
    with S._sdpa_without_gqa("cpu"):
        same = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(same, ref)
