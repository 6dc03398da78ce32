"""lowprec.torch.emulate: the SDPA-intercepting context, its statistics and the Linear hooks."""

import json
import math
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import lowprec as lp  # noqa: E402
from lowprec.stats import BapsStats  # noqa: E402
from lowprec.torch import emulate  # noqa: E402

D, H = 32, 4


class Attn(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention."""

    def __init__(self, d=D, h=H, kv_heads=None):
        super().__init__()
        self.h, self.kvh = h, kv_heads or h
        self.dh = d // h
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * self.kvh * self.dh)
        self.o = nn.Linear(d, d)

    def forward(self, x, mask=None, causal=False):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.dh).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kvh, self.dh).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.kvh != self.h)
        return self.o(y.transpose(1, 2).reshape(B, L, -1))


class HandAttn(Attn):
    """The same attention by hand (matmul + softmax): must never be intercepted."""

    def forward(self, x, mask=None, causal=False):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.dh).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kvh, self.dh).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        if causal:
            s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
        if mask is not None:
            s = s + mask
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, -1))


class Block(nn.Module):
    def __init__(self, attn_cls=Attn, **kw):
        super().__init__()
        self.attn = attn_cls(**kw)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x, mask=None, causal=False):
        x = x + self.attn(x, mask, causal)
        return x + self.mlp(x)


class Tiny(nn.Module):
    """Two transformer blocks."""

    def __init__(self, attn_cls=Attn, **kw):
        super().__init__()
        self.blocks = nn.ModuleList([Block(attn_cls, **kw) for _ in range(2)])

    def forward(self, x, mask=None, causal=False):
        for b in self.blocks:
            x = b(x, mask, causal)
        return x


class Sdpa(nn.Module):
    """Calls SDPA on given tensors (captures exactly what the kernel gets)."""

    def forward(self, q, k, v, **kw):
        return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Tiny().eval()


def _x(B=2, L=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, D, generator=g)


def _qkv(shape_q, shape_k, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g).to(dtype)
    k = torch.randn(*shape_k, generator=g).to(dtype)
    v = torch.randn(*shape_k, generator=g).to(dtype)
    return q, k, v


def _no_hooks(m):
    return all(not mod._forward_pre_hooks and not mod._forward_hooks for mod in m.modules())


def _mode_depth():
    return torch._C._len_torch_function_stack()


# ---- inside vs outside -------------------------------------------------------------------


def test_outside_bit_identical_and_inside_changes(model):
    x = _x()
    with torch.no_grad():
        y0 = model(x, causal=True)
        with emulate("hif8", model=model) as run:
            y1 = model(x, causal=True)
        y2 = model(x, causal=True)
    assert torch.equal(y0, y2)
    assert not torch.equal(y0, y1)          # HiF8 attention changes the output
    assert (y1 - y0).abs().max() < 0.2      # ... by a bounded amount
    assert run.stats.total().calls == 2
    assert _no_hooks(model) and _mode_depth() == 0


def test_hand_attention_untouched():
    torch.manual_seed(0)
    m = Tiny(HandAttn).eval()
    x = _x()
    with torch.no_grad():
        y0 = m(x, causal=True)
        with pytest.warns(UserWarning, match="no attention call was emulated"), \
                emulate("intattention", model=m) as run:
            y1 = m(x, causal=True)
    assert torch.equal(y0, y1)
    assert run.stats.calls == [] and run.stats.modules == {}


@pytest.mark.parametrize("case", ["plain", "causal", "causal_short_q", "causal_long_q", "bool",
                                  "additive", "scale", "3d", "5d", "bf16"])
def test_reference_matches_sdpa(case):
    dt = torch.bfloat16 if case == "bf16" else torch.float32
    sq, sk = (2, 3, 7, 8), (2, 3, 7, 8)
    if case == "causal_short_q":
        sq = (2, 3, 3, 8)
    if case == "causal_long_q":
        sq = (2, 3, 9, 8)
    if case == "3d":
        sq, sk = (3, 5, 8), (3, 6, 8)
    if case == "5d":
        sq, sk = (2, 2, 2, 5, 8), (2, 2, 2, 5, 8)
    q, k, v = _qkv(sq, sk, dtype=dt)
    kw = {}
    if case.startswith("causal"):
        kw["is_causal"] = True
    if case == "bool":
        g = torch.Generator().manual_seed(3)
        m = torch.rand(sq[0], 1, sq[-2], sk[-2], generator=g) > 0.3
        m[..., 0] = True
        kw["attn_mask"] = m
    if case == "additive":
        g = torch.Generator().manual_seed(4)
        kw["attn_mask"] = torch.randn(sq[-2], sk[-2], generator=g)
    if case == "scale":
        kw["scale"] = 0.05
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    with emulate("reference"):
        got = F.scaled_dot_product_attention(q, k, v, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-2 if dt == torch.bfloat16 else 2e-6
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_flash_and_baps_error_bounds():
    q, k, v = _qkv((2, 4, 200, 32), (2, 4, 200, 32), seed=5)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with emulate("flash", reference=True) as r1:
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (got - want).abs().max() < 1e-5
    with emulate("hif8", tau=1, reference=True) as r2:
        got2 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rel = float((got2 - want).norm() / want.norm())
    assert rel < 0.05                                    # documented: HiF8 softmax, ~30 dB
    sq = r2.stats.modules["<unknown>"].sqnr_db[0]
    assert sq == pytest.approx(-20 * math.log10(rel), abs=0.01)
    assert r1.stats.modules["<unknown>"].sqnr_db[0] > 100


def test_kernel_call_is_exactly_lowprec_attention():
    """What the context computes is lp.attention on the same tensors, bit for bit, and the
    statistics are the scheme's (ARR/PRR of BAPS)."""
    q, k, v = _qkv((1, 2, 96, 16), (1, 2, 96, 16), seed=7)
    q = q * 3
    opts = dict(config="e2e_hif8", tau=0, block_q=16, block_k=16)
    m = Sdpa()
    with emulate("baps", model=m, **opts) as run:
        got = m(q, k, v, is_causal=True)
    want, st = lp.attention(q, k, v, "baps", causal=True, return_stats=True, **opts)
    assert torch.equal(got, want)
    ms = run.stats.modules["<root>"]
    assert ms.calls == 1
    assert ms.restart_rate == st.restart_rate
    assert ms.peak_restart_rate == st.peak_restart_rate
    assert run.stats.restart_rate == st.restart_rate
    assert 0 < st.restart_rate <= 1                       # the test exercises restarts


def test_top_left_causal_for_short_queries():
    """torch's is_causal is top-left aligned; lowprec's causal is bottom-right: the context
    must follow torch."""
    q, k, v = _qkv((1, 1, 3, 8), (1, 1, 6, 8), seed=2)
    tl = torch.ones(3, 6, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=tl)
    with emulate("flash"):
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


# ---- masks, padding, GQA -----------------------------------------------------------------


def test_padded_batch_additive_mask(model):
    """Right padding: an additive (B, 1, 1, L) mask with -inf at padded keys; the real tokens'
    outputs must not depend on the padding content."""
    x = _x(B=2, L=10)
    lengths = [10, 6]
    pad = torch.zeros(2, 1, 1, 10)
    pad[1, ..., 6:] = float("-inf")
    x2 = x.clone()
    x2[1, 6:] = 100.0                                     # garbage in the padding
    with torch.no_grad():
        want = model(x, pad)
        with emulate("reference", model=model):
            a = model(x, pad)
            b = model(x2, pad)
        with emulate("hif8", model=model):
            c = model(x, pad)
            d = model(x2, pad)
        with emulate("intattention", model=model) as run:
            e = model(x, pad)               # int8 scales from the rows and keys taking part
            f = model(x2, pad)              # (scale_scope="visible"): padding content ignored
        with pytest.warns(UserWarning, match="noisy_rows"), \
                emulate("intattention", model=model, scale_scope="tensor"):
            g = model(x, pad)               # the papers' whole-tensor scales see the padding
            h = model(x2, pad)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(a[i, :n], want[i, :n], atol=1e-5, rtol=1e-5)
        assert torch.equal(a[i, :n], b[i, :n])
        assert torch.equal(c[i, :n], d[i, :n])           # padding really masked under HiF8
        assert torch.equal(e[i, :n], f[i, :n])
        assert F.cosine_similarity(e[i, :n].flatten(), want[i, :n].flatten(), 0) > 0.99
    assert not torch.equal(g[0], h[0])  # even the unpadded sequence's scales see the garbage
    assert not any(m.scheme_stats.noisy_rows for m in run.stats.modules.values() if m.calls)
    assert torch.isfinite(c).all() and torch.isfinite(e).all()


def test_fully_masked_rows_zero_like_torch_or_nan():
    """Left padding + causal leaves the first (padded) queries with no key: torch gives 0."""
    q, k, v = _qkv((2, 2, 5, 8), (2, 2, 5, 8), seed=9)
    m = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    m[1, ..., :2] = False                                 # batch 1: two left-padded keys
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True)
    with emulate("reference") as run:
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(got[1, :, :2], torch.zeros(2, 2, 8))
    assert run.stats.calls[0].empty_rows == 4             # 2 rows x 2 heads
    with emulate("reference", empty_rows="nan"):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True)
    assert torch.isnan(got[1, :, :2]).all() and torch.isfinite(got[0]).all()


def test_gqa():
    q, k, v = _qkv((2, 6, 7, 8), (2, 2, 7, 8), seed=11)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with emulate("reference") as run:
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        with pytest.raises(ValueError, match="multiple"):
            F.scaled_dot_product_attention(q[:, :5], k, v, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    assert run.stats.calls[0].gqa and run.stats.calls[0].k_shape == (2, 2, 7, 8)
    torch.manual_seed(0)
    m = Tiny(kv_heads=2).eval()
    x = _x()
    with torch.no_grad():
        y0 = m(x, causal=True)
        with emulate("reference", model=m):
            y1 = m(x, causal=True)
    torch.testing.assert_close(y1, y0, atol=1e-5, rtol=1e-5)


# ---- context mechanics ---------------------------------------------------------------------


def test_nesting_inner_wins_outer_restored(model):
    x = _x()
    with torch.no_grad():
        want_ref = model(x)
        with emulate("reference", model=model) as outer:
            model(x)
            with emulate("hif8", model=model) as inner:
                y_in = model(x)
                assert _mode_depth() == 2
            y_out = model(x)
        y_after = model(x)
    assert outer.stats.total().calls == 4                  # 2 before + 2 after the inner
    assert inner.stats.total().calls == 2
    assert isinstance(inner.stats.total().scheme_stats, BapsStats)  # the inner one emulated
    assert outer.stats.total().scheme_stats is None                 # reference: no statistics
    torch.testing.assert_close(y_out, want_ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(y_in, want_ref, atol=1e-4)
    assert torch.equal(y_after, want_ref)
    assert _no_hooks(model) and _mode_depth() == 0


def test_inner_context_uses_outer_modules(model):
    with torch.no_grad(), emulate("reference", model=model), emulate("flash") as inner:
        model(_x())
    assert set(inner.stats.modules) == {"blocks.0.attn", "blocks.1.attn"}


def test_exception_inside_restores(model):
    x = _x()
    with torch.no_grad():
        y0 = model(x)
        with pytest.raises(KeyError), emulate("hif8", model=model, activations="e4m3",
                                              weights="e4m3"):
            model(x)
            raise KeyError("boom")
        assert _no_hooks(model) and _mode_depth() == 0
        assert torch.equal(model(x), y0)


def test_exception_inside_module_forward(model):
    """An exception raised inside a watched module: the module stack is unwound
    (always_call hooks), later calls are attributed correctly."""
    m = Sdpa()
    q, k, v = _qkv((1, 1, 4, 8), (1, 1, 4, 8))
    with emulate("reference", model=m) as run:
        with pytest.raises(ValueError):
            m(q, k, v, dropout_p=0.5)
        F.scaled_dot_product_attention(q, k, v)
    assert list(run.stats.modules) == ["<unknown>"]


def test_threads_isolated(model):
    x = _x()
    with torch.no_grad():
        want = model(x)
    entered, done = threading.Event(), threading.Event()
    res = {}

    def worker():
        entered.wait(5)
        with torch.no_grad():
            res["other"] = model(x)
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    with torch.no_grad(), emulate("hif8", model=model, activations="e4m3") as run:
        entered.set()
        assert done.wait(10)
        res["inside"] = model(x)
    t.join()
    assert torch.equal(res["other"], want)                  # the other thread saw plain torch
    assert not torch.equal(res["inside"], want)
    assert run.stats.total().calls == 2                     # only this thread's calls


def test_reentry_and_watch(model):
    ctx = emulate("reference")
    with torch.no_grad(), ctx as run:
        with pytest.raises(RuntimeError, match="already active"):
            ctx.__enter__()
        model(_x())                       # no model=: named by the global hooks (item 9)
        assert list(run.stats.modules) == ["blocks.0.attn", "blocks.1.attn"]
        run.watch(model, prefix="net")    # explicit names win from now on
        model(_x())
    assert list(run.stats.modules) == ["blocks.0.attn", "blocks.1.attn", "net.blocks.0.attn",
                                       "net.blocks.1.attn"]
    assert _no_hooks(model)


# ---- errors --------------------------------------------------------------------------------


def test_bad_scheme_and_options():
    with pytest.raises(ValueError, match="intattention"):
        emulate("nope")
    with pytest.raises(ValueError, match="allowed"):
        emulate("baps", colour="red")
    with pytest.raises(ValueError, match="tau"):
        emulate("baps", config="e2e_hif8", tau=-1)
    with pytest.raises(ValueError, match="config"):
        emulate("baps", config="nope")
    with pytest.raises(ValueError, match="shorthand"):
        emulate("hif8", config="default")
    with pytest.raises(ValueError, match="e4m3"):
        emulate("reference", activations="int8", model=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="model="):
        emulate("reference", weights="e4m3")
    with pytest.raises(ValueError, match="zero"):
        emulate("reference", empty_rows="keep")
    with pytest.raises(TypeError):
        emulate("reference", model="m")
    with pytest.raises(TypeError):
        emulate("reference", include=[1])
    assert _mode_depth() == 0


def test_dropout_and_grad_errors():
    q, k, v = _qkv((1, 2, 4, 8), (1, 2, 4, 8))
    with emulate("reference"):
        with pytest.raises(ValueError, match="dropout"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        qg = q.clone().requires_grad_()
        with pytest.raises(RuntimeError, match="no_grad"):
            F.scaled_dot_product_attention(qg, k, v)
        with torch.no_grad():
            F.scaled_dot_product_attention(qg, k, v)        # fine without grad mode
    m = Tiny()
    with emulate("reference", model=m), pytest.raises(RuntimeError, match="grad"):
        m(_x())                                             # parameters require grad
    assert _mode_depth() == 0 and _no_hooks(m)


# ---- statistics ----------------------------------------------------------------------------


def test_stats_attribution_and_json(model, tmp_path):
    x = _x(L=40)
    q, k, v = _qkv((1, 2, 8, 8), (1, 2, 8, 8))
    with torch.no_grad(), emulate("hif8", tau=1, block_q=8, block_k=8, model=model,
                                  reference=True) as run:
        model(x, causal=True)
        model(x, causal=True)
        F.scaled_dot_product_attention(q, k, v)             # outside any watched module
    st = run.stats
    assert list(st.modules) == ["blocks.0.attn", "blocks.1.attn", "<unknown>"]
    assert [m.calls for m in st.modules.values()] == [2, 2, 1]
    assert len(st.calls) == 5 and [c.index for c in st.calls] == list(range(5))
    assert [c.module for c in st.calls] == ["blocks.0.attn", "blocks.1.attn"] * 2 + ["<unknown>"]
    manual = sum((c.stats for c in st.calls), 0)
    assert st.restart_rate == manual.restart_rate
    assert st.peak_restart_rate == manual.peak_restart_rate
    assert 0 <= st.restart_rate <= st.peak_restart_rate <= 1
    d = st.to_dict()
    assert set(d) == set(st.modules)
    a0 = d["blocks.0.attn"]
    assert a0["calls"] == 2 and 10 < a0["sqnr_db_min"] <= a0["sqnr_db_mean"] < 80
    assert a0["restart_rate"] == st.modules["blocks.0.attn"].scheme_stats.restart_rate
    path = tmp_path / "stats.json"
    st.to_json(path)
    doc = json.loads(path.read_text())
    assert doc["modules"] == json.loads(json.dumps(d))
    assert doc["scheme"] == "baps" and doc["options"]["config"] == "e2e_hif8"
    assert len(doc["calls"]) == 5 and doc["totals"]["calls"] == 5
    table = st.summary()
    for name in ("blocks.0.attn", "blocks.1.attn", "<unknown>", "TOTAL", "ARR", "SQNR"):
        assert name in table


def test_other_scheme_stats_merge(model):
    with torch.no_grad(), emulate("intattention", model=model) as run:
        model(_x())
        model(_x(seed=2))
    ms = run.stats.modules["blocks.0.attn"]
    assert type(ms.scheme_stats).__name__ == "IntAttentionStats"
    assert ms.scheme_stats.calls == 2
    assert ms.restart_rate is None and run.stats.restart_rate is None
    assert run.stats.to_dict()["blocks.0.attn"]["scheme.calls"] == 2
    json.dumps(run.stats.to_dict(full=True), allow_nan=False)


# ---- Linear hooks --------------------------------------------------------------------------


def test_linear_hooks_select_and_exact(model):
    x = _x()
    before = {k: t.clone() for k, t in model.state_dict().items()}
    lin = model.blocks[0].mlp[0]
    seen = {}

    def spy(mod, args, out):                                # sees what F.linear returned
        seen["out"] = out

    h = lin.register_forward_hook(spy)
    with torch.no_grad(), emulate("reference", model=model, activations="hif8", weights="e4m3",
                                  include=["blocks.0.mlp.*"], exclude=["*.2"]) as run:
        model(x)
        assert torch.equal(lin.weight, before["blocks.0.mlp.0.weight"])  # not written
    h.remove()
    after = model.state_dict()
    for k_, t in before.items():
        assert torch.equal(after[k_], t) and after[k_].dtype == t.dtype
    quant = {n for n, m in run.stats.modules.items() if m.quant is not None}
    assert quant == {"blocks.0.mlp.0"}
    # recompute the selected Linear by hand from its (float) input
    with torch.no_grad():
        h0 = model.blocks[0]
        xin = x + h0.attn(x)
    xq = torch.from_numpy(lp.quantize(xin.numpy(), "hif8", saturate=True))
    wq = torch.from_numpy(lp.quantize(lin.weight.detach().numpy(), "e4m3", saturate=True))
    want = F.linear(xq, wq, lin.bias.detach())
    torch.testing.assert_close(seen["out"], want, atol=1e-5, rtol=1e-5)
    qs = run.stats.modules["blocks.0.mlp.0"].quant
    assert qs.act_calls == 1 and qs.act_elements == xin.numel()
    assert qs.w_quantizations == 1 and qs.w_elements == lin.weight.numel()


def test_linear_saturation_and_underflow_counts():
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    with torch.no_grad():
        lin.weight.mul_(1e-3)                               # many weights below E4M3's range
    x = torch.linspace(-1000, 1000, 64).reshape(8, 8)
    x[0, :3] = torch.tensor([1e-5, -1e-6, 0.0])
    xn, wn = x.numpy(), lin.weight.detach().numpy()
    with torch.no_grad(), emulate("reference", model=lin, activations="e4m3",
                                  weights="e4m3") as run:
        y = lin(x)
        lin(x)
    qs = run.stats.modules["<root>"].quant
    assert qs.act_calls == 2 and qs.act_elements == 128
    assert qs.act_saturated == 2 * int((np.abs(xn) > 448).sum())
    assert qs.act_saturated > 0
    assert qs.act_underflow == 2 * 2                        # 1e-5 and -1e-6 round to 0
    assert qs.w_quantizations == 1                          # cached across calls
    assert qs.w_underflow == int(((np.abs(wn) < 2.0 ** -10) & (wn != 0)).sum()) > 0
    assert qs.act_saturation == qs.act_saturated / 128
    assert torch.isfinite(y).all()                          # saturate=True: clamped, no NaN


def test_linear_hooks_bf16_dtype_kept():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(torch.bfloat16)
    x = torch.randn(3, 8).to(torch.bfloat16)
    with torch.no_grad(), emulate("reference", model=lin, activations="hif8", weights="hif8"):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    xq = torch.from_numpy(lp.quantize(x.float().numpy(), "hif8", saturate=True))
    wq = torch.from_numpy(lp.quantize(lin.weight.float().detach().numpy(), "hif8",
                                      saturate=True))
    want = F.linear(xq.bfloat16(), wq.bfloat16(), lin.bias.detach())
    assert torch.equal(y, want)


def test_boolean_causal_mask_is_causal():
    """A boolean lower-triangle mask (what transformers materializes under torch.compile) is
    emulated as ``is_causal=True``: same bits, statistics and record as the causal call; a
    mask that differs in one entry, or has a batch dim, is kept as a mask."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))
    tril = torch.ones(40, 40, dtype=torch.bool).tril()
    holed = tril.clone()
    holed[30, 3] = False
    with emulate("baps", config="e2e_hif8", tau=0, block_q=8, block_k=8) as run:
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=tril[None, None])
        b2 = F.scaled_dot_product_attention(q, k, v, attn_mask=tril[None, None])  # cached
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=holed)
        d = F.scaled_dot_product_attention(q, k, v, attn_mask=tril.expand(1, 2, 40, 40))
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert torch.equal(a.view(torch.int32), b2.view(torch.int32))
    r = run.stats.calls
    assert [(c_.causal, c_.masked) for c_ in r] == [(True, False)] * 3 + [(False, True)] * 2
    assert str(r[0].stats.to_dict()) == str(r[1].stats.to_dict())
    assert not torch.equal(a, c)
    assert torch.equal(a.view(torch.int32), d.view(torch.int32))  # same visibility either way


def test_reused_causal_verdict_is_checked_again():
    """A mask buffer found causal is not compared again on the host while its memory and
    version are unchanged (whichever tensor object holds it), but the reused answer is
    checked on the device: contents
    rewritten without a version bump (as torch.compile's generated code rewrites a buffer it
    reuses; here through ``.data``) raise at the exit instead of running as causal
    unnoticed; ``mask_cache=False`` compares in every call and gets the mask right."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    m = torch.ones(1, 1, 24, 24, dtype=torch.bool).tril()
    opts = dict(config="e2e_hif8", block_q=8, block_k=8)
    compared = []
    real_equal = torch.equal

    def counting(*a):
        compared.append(1)
        return real_equal(*a)

    torch.equal = counting
    try:
        with emulate("baps", **opts) as run:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            b = F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # the verdict reused
            # a new tensor object on the same memory (as torch.compile's segments get a
            # buffer): reused too
            b2 = F.scaled_dot_product_attention(q, k, v, attn_mask=m.view(1, 1, 24, 24))
    finally:
        torch.equal = real_equal
    assert len(compared) == 1
    assert torch.equal(a, b) and torch.equal(a, b2)
    assert [c.causal for c in run.stats.calls] == [True] * 3
    v0 = m._version
    with pytest.raises(RuntimeError, match=r"call\(s\) \[1\].*without a version bump"):
        with emulate("baps", **opts):
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            m.data[0, 0, 20, :] = False  # (no version bump)
            assert m._version == v0
            F.scaled_dot_product_attention(q, k, v, attn_mask=m.view(1, 1, 24, 24))
    with emulate("baps", mask_cache=False, **opts) as run:
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    want = lp.attention(q, k, v, "baps", attn_mask=m, **opts)
    assert torch.isnan(want[0, :, 20]).all()  # row 20 sees no key now
    want[0, :, 20] = 0.0  # (emulate's empty_rows="zero")
    assert torch.equal(c.view(torch.int32), want.view(torch.int32))
    assert [(x.causal, x.masked) for x in run.stats.calls] == [(False, True)]
    with pytest.raises(TypeError, match="mask_cache must be a bool"):
        emulate("baps", mask_cache=1)


class _MaskBuffer(torch.nn.Module):
    """Attention with a boolean mask held in one buffer, as torch.compile's generated code
    holds the mask of every forward: the caller rewrites it between forwards (``.data``, no
    version bump)."""

    def __init__(self, L):
        super().__init__()
        self.register_buffer("mask", torch.ones(1, 1, L, L, dtype=torch.bool).tril())

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


@pytest.mark.parametrize("watched", [True, False])
def test_causal_verdicts_last_one_forward(watched):
    """A compiled model writes a padded batch's mask into the buffer that held the causal mask
    of the forward before (reproduced with inductor on a transformers Llama: full, padded,
    full, padded batches raised at the exit when the answers lasted the context): each
    outermost forward starts without answers, so the padded forward compares its mask and
    runs it as a mask, with or without ``model=``; within a forward the answer is reused."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    mod = _MaskBuffer(24)
    pad = mod.mask.clone()
    pad[..., :3] = False
    pad[..., :3, 0] = True  # every row keeps a key
    opts = dict(config="e2e_hif8", block_q=8, block_k=8)
    with emulate("baps", model=mod if watched else None, **opts) as run:
        a = mod(q, k, v)
        v0 = mod.mask._version
        mod.mask.data.copy_(pad)
        assert mod.mask._version == v0
        b = mod(q, k, v)
    assert torch.equal(a, lp.attention(q, k, v, "baps", causal=True, **opts))
    assert torch.equal(b.view(torch.int32),
                       lp.attention(q, k, v, "baps", attn_mask=pad, **opts).view(torch.int32))
    assert [(c.causal, c.masked) for c in run.stats.calls] == [(True, False), (False, True)]
