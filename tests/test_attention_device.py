"""``lp.attention`` and ``lp.emulate`` on a device (lowprec/kernels/device.py) equal the CPU path
bit for bit: outputs (NaN by position), statistics (flags, restarted rows, every counter),
error messages.

Without a GPU (CI) the device path runs on CPU tensors under :func:`force_engine`, the GPU
engine in Triton's interpreter (``TRITON_INTERPRET=1``, set here or by tests/conftest.py before
the engine is imported; see tests/test_gpu_engine.py); on a GPU machine the same tests put the
tensors on ``cuda``, where ``lp.attention`` dispatches by itself, and the ``gpu`` tests check
what only a real device shows (the returned device, no CPU fallback warning).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402
from conftest import gpu_engine  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.kernels import baps  # noqa: E402
from lowprec.kernels.device import attention_device, force_engine  # noqa: E402

ge, INTERPRETED, DEVICE = gpu_engine()  # Triton interpreter without CUDA
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
CONFIGS = list(baps.CONFIGS)
_DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
       "f64": torch.float64}


def on_device():
    """The device path for DEVICE tensors: forced on the CPU, by dispatch on a GPU."""
    return force_engine() if INTERPRETED else contextlib.nullcontext()


def dev(t):
    return t.to(DEVICE) if isinstance(t, torch.Tensor) else t


def qkv(Z=2, Hq=2, Hkv=2, Lq=40, Lk=56, d=16, dv=16, kind="f32", seed=0, amp=1.5):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(Z, Hq, Lq, d, generator=g) * amp).to(_DT[kind])
    k = (torch.randn(Z, Hkv, Lk, d, generator=g) * amp).to(_DT[kind])
    v = torch.randn(Z, Hkv, Lk, dv, generator=g).to(_DT[kind])
    return q, k, v


def assert_same_out(a, b):
    b = b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb), "NaN positions differ"
    ia = a.masked_fill(na, 0).contiguous().view(-1).view({2: torch.int16, 4: torch.int32,
                                                          8: torch.int64}[a.element_size()])
    ib = b.masked_fill(nb, 0).contiguous().view(-1).view(ia.dtype)
    bad = int((ia != ib).sum())
    assert bad == 0, f"{bad} of {ia.numel()} outputs differ"


def assert_same_stats(s1, s2):
    assert type(s1) is type(s2)
    d1, d2 = s1.to_dict(), s2.to_dict()
    assert d1.keys() == d2.keys()
    for key in d1:
        assert str(d1[key]) == str(d2[key]), f"{key}: {d1[key]} vs {d2[key]}"
    for f1, f2 in zip(s1.flags, s2.flags, strict=True):
        assert f1.dtype == f2.dtype and np.array_equal(f1, f2)


def both(q, k, v, scheme, **kw):
    """CPU path and device path of one call; returns the CPU result."""
    ref = lp.attention(q, k, v, scheme, return_stats=True, **kw)
    am = kw.pop("attn_mask", None)
    with on_device():
        got = lp.attention(dev(q), dev(k), dev(v), scheme, attn_mask=dev(am),
                           return_stats=True, **kw)
    assert got[0].device.type == DEVICE
    assert_same_out(ref[0], got[0])
    assert_same_stats(ref[1], got[1])
    return ref


# ------------------------------------------------------------------------------------------
# every configuration, masks, causal shapes


@pytest.mark.parametrize("name", ["flash"] + CONFIGS)
def test_every_config_bool_mask_broadcast_causal(name):
    """A boolean mask broadcast over heads (one plane per batch entry), causal Lq < Lk,
    partial tiles (40 = 16 + 16 + 8 rows, 56 keys in tiles of 24), bf16 inputs."""
    q, k, v = qkv(kind="bf16", seed=1)
    am = torch.rand(2, 1, 40, 56, generator=torch.Generator().manual_seed(2)) > 0.25
    opts = {} if name == "flash" else {"config": name}
    both(q, k, v, "flash" if name == "flash" else "baps", causal=True, attn_mask=am,
         block_q=16, block_k=24, **opts)


@pytest.mark.parametrize("opts", [
    dict(tau=0, critical="first+last", granularity="row"),
    dict(tau=2, critical=[1, 0], max_round="ceil", accum="float16"),
    dict(critical="first+diagonal", accum="bfloat16", input_dtype="float32"),
], ids=["tau0-row", "list-ceil-f16", "diag-bf16acc-f32in"])
def test_e2e_options_additive_per_head_planes(opts):
    """Additive float mask with finite values and -inf, one plane per (batch, head), fp16
    inputs; every e2e_hif8 option."""
    q, k, v = qkv(Z=1, Hq=3, Hkv=3, Lq=33, Lk=48, kind="f16", seed=3, amp=2.5)
    g = torch.Generator().manual_seed(4)
    m = torch.randn(1, 3, 33, 48, generator=g) * 2
    m[torch.rand(m.shape, generator=g) < 0.3] = -float("inf")
    _, st = both(q, k, v, "baps", config="e2e_hif8", attn_mask=m, block_q=16, block_k=16,
                 **opts)
    assert st.total_tiles > 0


def test_causal_lq_greater_than_lk_dead_rows_and_nonfinite():
    """Causal with Lq > Lk: the first rows see no key (NaN); an Inf in v makes rows that see it
    non-finite (``nonfinite_rows``); float32 inputs, flash."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=50, Lk=30, kind="f32", seed=5)
    v[0, 1, 3, 2] = float("inf")
    out, st = both(q, k, v, "flash", causal=True, block_q=16, block_k=16)
    assert torch.isnan(out[0, 0, :20]).all() and st.nonfinite_rows > 0


def test_noisy_rows_and_float64_inputs():
    """float64 inputs (rounded to float32 on the device, the output float64 again), large
    logits (bfloat16 input noise above 0.5 nat: ``noisy_rows``), causal Lq == Lk, a boolean
    key-padding mask (taking-part rows and keys)."""
    q, k, v = qkv(Z=2, Hq=2, Hkv=1, Lq=32, Lk=32, kind="f64", seed=6, amp=20.0)
    am = torch.ones(2, 1, 1, 32, dtype=torch.bool)
    am[1, ..., 25:] = False
    out, st = both(q, k, v, "baps", config="default", causal=True, attn_mask=am, block_q=16,
                   block_k=16)
    assert out.dtype == torch.float64 and st.noisy_rows > 0


def test_fused_call_stats_noisy_nonfinite_dead_rows(monkeypatch):
    """The statistics of a call without a mask come from one kernel
    (``lowprec.gpu.callstats``): equal to the CPU's and to the torch operations' (the path
    masked calls take), with every counter non-zero and not full: some rows noisy and some
    not (logits growing with the row), non-finite rows (an Inf in v), rows that see no key
    (causal Lq > Lk), GQA by index, float16 inputs."""
    import lowprec.gpu.callstats as cs
    from lowprec.kernels import device as dmod

    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=48, Lk=36, kind="f32", seed=11, amp=1.0)
    q = (q * torch.linspace(1.0, 700.0, 48)[:, None]).to(torch.float16)
    k, v = k.to(torch.float16), v.to(torch.float16)
    v[0, 1, 20, 3] = float("inf")
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (k, v))
    _, ref = both(q, kr, vr, "baps", config="e2e_hif8", causal=True, block_q=16, block_k=8)
    assert 0 < ref.noisy_rows < 4 * 36 and ref.nonfinite_rows > 0
    calls = []
    real = cs.call_stats
    monkeypatch.setattr(cs, "call_stats", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    s = lp.kernels.get_scheme("baps")
    opts = {"config": "e2e_hif8", "block_q": 16, "block_k": 8}
    with on_device():
        _, st_f, none_f, n_f = attention_device(s, dev(q), dev(k), dev(v), causal=True,
                                                gqa=True, options=opts, return_stats=True,
                                                with_empty=True)
        # each entry's rows split between programs at 13 rows (not a multiple of the row
        # block: the kernel masks each split's end), as at long lengths on a GPU
        monkeypatch.setattr(cs, "_row_splits", lambda B, Lq, bm, **_: (-(-Lq // 13), 13))
        _, st_s, _, _ = attention_device(s, dev(q), dev(k), dev(v), causal=True, gqa=True,
                                         options=opts, return_stats=True, with_empty=True)
        monkeypatch.setattr(dmod, "_stats_kernels", lambda t: False)
        _, st_t, none_t, n_t = attention_device(s, dev(q), dev(k), dev(v), causal=True,
                                                gqa=True, options=opts, return_stats=True,
                                                with_empty=True)
    assert calls == [1, 1]
    assert_same_stats(st_f, ref)
    assert_same_stats(st_s, ref)
    assert_same_stats(st_t, ref)
    assert n_f == n_t == 4 * (48 - 36) and torch.equal(none_f, none_t)


def test_checked_call_signatures_are_reused():
    """A call like an earlier one (scheme, shapes, dtypes, scale, causal, gqa, options) skips
    its checks and gives the same bits; a call that differs in any of them is checked again:
    ``causal=1`` (an int) still raises although ``causal=True`` passed, an invalid option is
    not remembered, nor is a call with an unhashable option value."""
    from lowprec.kernels import device as dmod

    dmod._SETUPS.clear()
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=24, Lk=24, kind="bf16", seed=12)
    s = lp.kernels.get_scheme("baps")
    opts = {"config": "e2e_hif8", "block_q": 8, "block_k": 8}
    with on_device():
        a, sa = attention_device(s, dev(q), dev(k), dev(v), causal=True, options=opts,
                                 return_stats=True)
        assert len(dmod._SETUPS) == 1
        b, sb = attention_device(s, dev(q), dev(k), dev(v), causal=True, options=opts,
                                 return_stats=True)
        assert len(dmod._SETUPS) == 1
        with pytest.raises(TypeError, match="causal must be a bool"):
            attention_device(s, dev(q), dev(k), dev(v), causal=1, options=opts)
        with pytest.raises(ValueError, match="tau must be"):
            attention_device(s, dev(q), dev(k), dev(v), causal=True,
                             options={**opts, "tau": -1})
        attention_device(s, dev(q), dev(k), dev(v), causal=True,
                         options={**opts, "critical": [1, 0], "config": "e2e_hif8"})
        assert len(dmod._SETUPS) == 2  # (a list option: frozen into the key)
        assert dmod._setup_key(s, q, k, v, None, True, False, {"x": {}}) is None
    assert_same_out(a.cpu(), b)
    assert_same_stats(sa, sb)
    ref = lp.attention(q, k, v, "baps", causal=True, return_stats=True, **opts)
    assert_same_out(ref[0], a)
    assert_same_stats(ref[1], sa)


def test_lead_broadcast_and_2d_inputs():
    """k/v with one head broadcast over the query heads (read by index), q without a batch dim
    broadcast against k's; 2-d inputs."""
    q, k, v = qkv(Z=1, Hq=3, Hkv=1, Lq=20, Lk=24, kind="bf16", seed=7)
    k2 = torch.cat([k, k * 0.5])  # batch 2
    v2 = torch.cat([v, v + 1])
    both(q[0], k2, v2, "baps", config="exp2_hif8", block_q=8, block_k=16)
    both(q[0, 0], k[0, 0], v[0, 0], "flash", causal=True, block_q=8, block_k=8)


def test_gqa_by_index():
    """``attention_device(gqa=True)``: 4 query heads on 2 key/value heads read by index, equal
    to the CPU path on repeated heads, with a mask and causal."""
    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=24, Lk=40, kind="bf16", seed=8)
    am = torch.rand(1, 1, 24, 40, generator=torch.Generator().manual_seed(9)) > 0.2
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (k, v))
    s = lp.kernels.get_scheme("baps")
    for opts in ({"config": "e2e_hif8", "block_q": 16, "block_k": 16},
                 {"config": "naive_e2e", "block_q": 8, "block_k": 16}):
        ref = lp.attention(q, kr, vr, "baps", causal=True, attn_mask=am, return_stats=True,
                           **opts)
        got = attention_device(s, dev(q), dev(k), dev(v), causal=True, attn_mask=dev(am),
                               return_stats=True, options=opts, gqa=True)
        assert_same_out(ref[0], got[0])
        assert_same_stats(ref[1], got[1])


def test_empty_shapes():
    for shape in [(1, 2, 5, 0, 8, 8), (1, 2, 0, 7, 8, 8), (0, 2, 5, 7, 8, 8),
                  (1, 2, 5, 7, 8, 0)]:
        Z, H, Lq, Lk, d, dv = shape
        q, k, v = qkv(Z=Z, Hq=H, Hkv=H, Lq=Lq, Lk=Lk, d=d, dv=dv, seed=10)
        both(q, k, v, "baps", config="e2e_hif8", causal=True)
        both(q, k, v, "flash")


def test_without_stats_and_numpy_mask():
    """``return_stats=False`` and a NumPy additive mask (copied to the device)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=16, seed=11)
    m = np.zeros((16, 16), np.float32)
    m[:, 3] = -np.inf
    ref = lp.attention(q, k, v, "flash", attn_mask=m)
    with on_device():
        got = lp.attention(dev(q), dev(k), dev(v), "flash", attn_mask=m)
    assert_same_out(ref, got)


def _message(fn):
    try:
        fn()
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", ["int", "d", "lk", "lead", "nan", "inf", "maskshape",
                                  "maskdtype", "option", "unknown", "critical", "block",
                                  "e2e_only", "input_dtype", "scale", "causal", "empty_option"])
def test_same_errors(case):
    """Every validation error of the CPU path, with the same type and message."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=8, d=8, dv=8, seed=12)
    kw = {"scheme": "baps"}
    if case == "int":
        q = q.to(torch.int32)
    elif case == "d":
        k = k[..., :4]
    elif case == "lk":
        v = v[..., :5, :]
    elif case == "lead":
        k, v = torch.cat([k, k, k]), torch.cat([v, v, v])
        q = torch.cat([q, q])
    elif case in ("nan", "inf"):
        m = torch.zeros(8, 8)
        m[1, 2] = float("nan") if case == "nan" else float("inf")
        kw["attn_mask"] = m
    elif case == "maskshape":
        kw["attn_mask"] = torch.zeros(3, 8, 8, dtype=torch.bool)
    elif case == "maskdtype":
        kw["attn_mask"] = torch.zeros(8, 8, dtype=torch.int64)
    elif case == "option":
        kw["config"] = "nope"
    elif case == "unknown":
        kw["colour"] = 1
    elif case == "critical":
        kw.update(critical=[0, 7], block_k=4)
    elif case == "block":
        kw["block_q"] = 0
    elif case == "e2e_only":
        kw.update(config="default", tau=2)
    elif case == "input_dtype":
        kw["input_dtype"] = "float16"
    elif case == "scale":
        kw["scale"] = "x"
    elif case == "causal":
        kw["causal"] = 1
    elif case == "empty_option":
        q, k, v = q[..., :0, :], k[..., :0, :], v[..., :0, :]
        kw["accum"] = "float8"
    want = _message(lambda: lp.attention(q, k, v, **kw))
    assert want is not None
    am = kw.pop("attn_mask", None)
    with on_device():
        got = _message(lambda: lp.attention(dev(q), dev(k), dev(v), attn_mask=dev(am), **kw))
    assert got == want


def test_inputs_must_share_q_device():
    q, k, v = qkv(Z=1, Hq=1, Hkv=1, Lq=8, Lk=8, seed=16)
    with on_device(), pytest.raises(ValueError, match="runs on q's device"):
        lp.attention(dev(q), k.numpy(), dev(v), "flash")


# ------------------------------------------------------------------------------------------
# lp.emulate


class _Attn(torch.nn.Module):
    """Three SDPA calls: GQA causal self-attention, top-left causal with Lq != Lk (a mask on
    the device), an additive mask."""

    def forward(self, q, k, v, m):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        b = F.scaled_dot_product_attention(q[..., :24, :], k[..., :40, :], v[..., :40, :],
                                           is_causal=True, enable_gqa=True)
        c = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                           v.repeat_interleave(2, 1), attn_mask=m)
        return a, b, c


@pytest.mark.parametrize("scheme,opts", [("flash", {}), ("hif8", {"tau": 0}),
                                         ("baps", {"config": "exp2_e4m3"})])
def test_emulate_device_path(scheme, opts):
    """``lp.emulate`` on the device path: outputs, per-module statistics and empty rows as on
    the CPU path (only the timing differs), padded rows zeroed."""
    g = torch.Generator().manual_seed(13)
    q = torch.randn(1, 4, 48, 16, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 2, 48, 16, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 2, 48, 16, generator=g).to(torch.bfloat16)
    m = torch.zeros(1, 1, 48, 48, dtype=torch.bfloat16)
    m[..., 40:] = float("-inf")
    m[..., 7, :] = float("-inf")  # a row that sees no key: zeroed like torch
    model = _Attn()
    with torch.no_grad(), lp.emulate(scheme, model=model, block_q=16, block_k=16,
                                     reference=True, **opts) as r1:
        ref = model(q, k, v, m)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*moved to the CPU")
        with torch.no_grad(), on_device(), lp.emulate(scheme, model=model, block_q=16,
                                                      block_k=16, reference=True,
                                                      **opts) as r2:
            got = model(dev(q), dev(k), dev(v), dev(m))
    for a, b in zip(ref, got, strict=True):
        assert b.device.type == DEVICE
        assert_same_out(a, b)
    d1, d2 = r1.stats.to_dict(), r2.stats.to_dict()
    assert d2["<root>"]["sqnr_db_min"] > 10
    # the reference= SDPA is torch's float32 kernel of the device: its own rounding on a GPU
    drop = ("seconds",) if INTERPRETED else ("seconds", "sqnr_db_mean", "sqnr_db_min",
                                             "sqnr_db_pooled")
    for mod in d1:
        for key in drop:
            d1[mod].pop(key)
            d2[mod].pop(key)
    assert str(d1) == str(d2)
    assert d1["<root>"]["empty_rows"] > 0
    for c1, c2 in zip(r1.stats.calls, r2.stats.calls, strict=True):
        assert_same_stats(c1.stats, c2.stats)


def test_emulate_device_statistics_arrive_when_read():
    """The device path of the GPU engine does not wait for its statistics: a call is recorded
    when ``run.stats`` is read (or the context exits), in call order, with the CPU path's
    statistics; a hazard (here ``nonfinite_rows``, an Inf in v) warns at the exit."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=32, Lk=32, kind="bf16", seed=21)
    v2 = v.clone()
    v2[0, 1, 3, 0] = float("inf")
    pad = torch.ones(32, 32, dtype=torch.bool)
    pad[:, 28:] = False
    opts = dict(block_q=16, block_k=16, tau=0)

    with torch.no_grad(), lp.emulate("hif8", **opts) as r1:
        a1 = F.scaled_dot_product_attention(q, k, v, attn_mask=pad)
        b1 = F.scaled_dot_product_attention(q, k, v2, is_causal=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with torch.no_grad(), on_device(), lp.emulate("hif8", **opts) as r2:
            a2 = F.scaled_dot_product_attention(dev(q), dev(k), dev(v), attn_mask=dev(pad))
            assert len(r2._deferred) == 1  # nothing read back yet
            assert r2.stats.total().calls == 1 and not r2._deferred  # reading records it
            b2 = F.scaled_dot_product_attention(dev(q), dev(k), dev(v2), is_causal=True)
            assert len(r2._deferred) == 1
            assert not [x for x in w if "hazard" in str(x.message)]
        hazards = [x for x in w if "hazard" in str(x.message)]
    assert len(hazards) == 1 and "nonfinite_rows" in str(hazards[0].message)
    assert_same_out(a1, a2)
    assert_same_out(b1, b2)
    assert [c.index for c in r2.stats.calls] == [0, 1] and r2.stats.calls[1].causal
    for c1, c2 in zip(r1.stats.calls, r2.stats.calls, strict=True):
        assert_same_stats(c1.stats, c2.stats)
        assert c2.seconds > 0
    assert r2.stats.calls[1].stats.nonfinite_rows > 0


def test_emulate_other_schemes_keep_the_cpu_path(cpu_only_scheme):
    """A scheme without a device path is not routed to it."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=16, seed=14)
    with torch.no_grad(), force_engine(), lp.emulate(cpu_only_scheme) as run:
        out = F.scaled_dot_product_attention(q, k, v)
    assert out.device.type == "cpu" and run.stats.calls[0].stats is not None


# ------------------------------------------------------------------------------------------
# a real GPU


@pytest.mark.gpu
def test_cuda_dispatch_and_fallback(cpu_only_scheme):
    """On CUDA: lp.attention returns a CUDA tensor for flash/baps; schemes without a device
    path keep rejecting CUDA tensors; lp.emulate warns for them and not for flash/baps."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=64, Lk=64, kind="bf16", seed=15)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    out = lp.attention(qc, kc, vc, "baps", causal=True)
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="CPU"):
        lp.attention(qc, kc, vc, cpu_only_scheme)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*moved to the CPU")
        with torch.no_grad(), lp.emulate("hif8"):
            F.scaled_dot_product_attention(qc, kc, vc)
    with pytest.warns(UserWarning, match="moved to the CPU"):
        with torch.no_grad(), lp.emulate(cpu_only_scheme):
            res = F.scaled_dot_product_attention(qc, kc, vc)
    assert res.device.type == "cuda"
