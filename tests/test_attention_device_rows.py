"""The row-wise schemes' device paths (lowprec/kernels/device_rows.py and the schemes' device
functions) equal the CPU path bit for bit: outputs (NaN by position), every statistic, error
messages; masks (boolean, additive, ``finfo.min`` padding), causal with Lq != Lk, partial
blocks, GQA read by index, every option that changes the arithmetic.

Without a GPU (CI) the device path runs on CPU tensors under :func:`force_engine` (torch steps
on the CPU, the Triton row sums and fused kernels in the interpreter); on a GPU machine the same
tests put the tensors on ``cuda``.  ``quant_only``'s fused kernel (calls without a mask) has its
own cases below (``test_quant_only_fused*``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from conftest import HAS_CUDA  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.gpu._tiles import seq_cols  # noqa: E402
from lowprec.kernels import get_scheme  # noqa: E402
from lowprec.kernels.device import attention_device, force_engine  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
DEVICE = "cuda" if HAS_CUDA else "cpu"
SCHEMES = ["intattention", "quant_only", "index_softmax_only", "ivit", "ibert", "hccs",
           "qflash", "intflash", "exaq"]  # reference: tests/test_attention_device_schemes.py


def on_device():
    return contextlib.nullcontext() if HAS_CUDA else force_engine()


def dev(t):
    return t.to(DEVICE) if isinstance(t, torch.Tensor) else t


def qkv(Z=2, Hq=4, Hkv=2, Lq=40, Lk=56, d=16, dv=16, seed=0, amp=1.5, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(Z, Hq, Lq, d, generator=g) * amp).to(dtype)
    k = (torch.randn(Z, Hkv, Lk, d, generator=g) * amp).to(dtype)
    v = torch.randn(Z, Hkv, Lk, dv, generator=g).to(dtype)
    return q, k, v


def rep(q, k, v):
    """k, v with their heads repeated to q's (the CPU path's view of GQA)."""
    g = q.shape[-3] // k.shape[-3]
    return k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)


def same_out(a, b):
    b = b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb), "NaN positions differ"
    it = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ia = a.masked_fill(na, 0).contiguous().view(-1).view(it)
    ib = b.masked_fill(nb, 0).contiguous().view(-1).view(it)
    bad = int((ia != ib).sum())
    assert bad == 0, f"{bad} of {ia.numel()} outputs differ"


def same_stats(s1, s2):
    assert type(s1) is type(s2)
    d1, d2 = s1.to_dict(), s2.to_dict()
    assert d1.keys() == d2.keys()
    for key in d1:
        assert str(d1[key]) == str(d2[key]), f"{key}: {d1[key]} vs {d2[key]}"


def both(q, k, v, scheme, **kw):
    """CPU path and device path of one call (GQA: the device reads k, v heads by index, the
    CPU gets them repeated); returns the CPU result."""
    kr, vr = rep(q, k, v) if k.dim() >= 3 and k.shape[-3] != q.shape[-3] else (k, v)
    ref = lp.attention(q, kr, vr, scheme, return_stats=True, **kw)
    am = kw.pop("attn_mask", None)
    with on_device():
        if kr is k:
            got = lp.attention(dev(q), dev(k), dev(v), scheme, attn_mask=dev(am),
                               return_stats=True, **kw)
        else:
            call = {o: kw.pop(o) for o in ("causal", "scale") if o in kw}
            got = attention_device(get_scheme(scheme), dev(q), dev(k), dev(v),
                                   attn_mask=dev(am), return_stats=True, options=kw,
                                   gqa=True, **call)
    assert got[0].device.type == DEVICE
    same_out(ref[0], got[0])
    same_stats(ref[1], got[1])
    return ref


def masks(seed=3, Z=2, H=4, Lq=40, Lk=56):
    g = torch.Generator().manual_seed(seed)
    am = torch.rand(Z, 1, Lq, Lk, generator=g) > 0.3
    am[0, 0, 5] = False  # a row that sees no key
    add = torch.randn(Z, H, Lq, Lk, generator=g)
    add[..., :5] = -torch.inf
    add[1, :, :, 40:] = torch.finfo(torch.float32).min  # transformers' padding: floored
    return am, add


@pytest.mark.parametrize("scheme", SCHEMES)
def test_masks_causal_gqa(scheme):
    """No mask, causal Lq < Lk, a boolean mask broadcast over heads with a row that sees no
    key, an additive mask with -inf and finfo.min padding; GQA heads by index."""
    q, k, v = qkv(seed=1)
    am, add = masks()
    both(q, k, v, scheme)
    both(q, k, v, scheme, causal=True, attn_mask=am)
    st = both(q, k, v, scheme, attn_mask=add)[1]
    assert st.mask_floored > 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_causal_lq_greater_than_lk_and_dtypes(scheme):
    """Causal Lq > Lk (rows that see no key), bfloat16 and float64 inputs, 2-D inputs."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=48, Lk=24, seed=2, dtype=torch.bfloat16)
    st = both(q, k, v, scheme, causal=True)[1]
    assert scheme in ("quant_only", "ivit", "ibert", "hccs", "qflash", "intflash") or \
        st.empty_rows > 0
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=20, Lk=33, seed=3, dtype=torch.float64)
    both(q, k, v, scheme, scale=0.3)
    both(q[0, 0], k[0, 0], v[0, 0], scheme, causal=True)


@pytest.mark.parametrize("opts", [
    dict(granularity="per_channel"), dict(granularity="per_block", block=16),
    dict(deploy=True), dict(deploy=True, neon_tail=True, bits=4),
    dict(index_rounding="nearest", p_format="int8", bits=7, c=9.0),
    dict(scale_scope="tensor"),
])
def test_intattention_options(opts):
    """Every option of intattention that changes the arithmetic, with a causal, additive
    mask (bias in logit units, saturating) and partial query blocks."""
    q, k, v = qkv(seed=4)
    _, add = masks(seed=5)
    both(q, k, v, "intattention", causal=True, attn_mask=add, **opts)


def test_intattention_mask_saturation_and_small_scale():
    """A huge finite bias saturates the logits (mask_saturated); tiny q makes a fine c_int."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=24, Lk=24, seed=6)
    add = torch.zeros(1, 1, 24, 24)
    add[..., 3] = 1.0e6
    st = both(q, k, v, "intattention", attn_mask=add)[1]
    assert st.mask_saturated > 0
    both(q * 1e-3, k, v, "intattention", granularity="per_channel")


@pytest.mark.parametrize("opts", [dict(granularity="per_channel"),
                                  dict(granularity="per_block", block=16),
                                  dict(scale_scope="tensor")])
def test_quant_only_options(opts):
    q, k, v = qkv(seed=7)
    am, _ = masks(seed=8)
    both(q, k, v, "quant_only", causal=True, attn_mask=am, **opts)


@triton.jit
def _seq_cols_kernel(X, Z, OUT, N: tl.constexpr, BM: tl.constexpr):
    """``OUT = seq_cols(seq_cols(Z, X[:, :N]), X[:, N:])`` of a ``(BM, 2N)`` float array."""
    r = tl.arange(0, BM)
    x = tl.load(X + r[:, None] * (2 * N) + tl.arange(0, N)[None, :])
    x2 = tl.load(X + r[:, None] * (2 * N) + N + tl.arange(0, N)[None, :])
    tl.store(OUT + r, seq_cols(seq_cols(tl.load(Z + r), x, BM, N), x2, BM, N))


@pytest.fixture
def qo_launches(monkeypatch):
    """Counts the launches of ``quant_only``'s fused kernel (a test fails if the call took the
    torch path, or took the kernel where it should not)."""
    import lowprec.gpu.quant_only_kernel as qk

    calls = []
    real = qk.quant_only_rows

    def spy(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(qk, "quant_only_rows", spy)
    return calls


QO_CASES = [  # (qkv arguments, call options)
    (dict(), {}),  # GQA (4 query heads on 2 stored ones), 2 sequences
    (dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=100, d=24, dv=40), dict(causal=True)),  # partial tiles
    (dict(Z=1, Hq=2, Hkv=1, Lq=90, Lk=50, dtype=torch.float16), dict(causal=True)),  # no key
    (dict(Z=1, Hq=4, Hkv=2, Lq=70, Lk=33, dtype=torch.bfloat16),
     dict(granularity="per_block", block=16)),
    (dict(Z=1, Hq=2, Hkv=2, Lq=33, Lk=47, d=16, dv=8), dict(granularity="per_channel",
                                                            causal=True)),
    (dict(Z=2, Hq=2, Hkv=2, Lq=20, Lk=40, amp=3.0), dict(scale_scope="tensor", scale=0.3)),
]


@pytest.mark.parametrize("case", range(len(QO_CASES)))
def test_quant_only_fused(case, qo_launches):
    """``quant_only`` without a mask runs the fused kernel (one launch) and gives the CPU's
    bits and statistics: GQA, causal Lq < Lk and Lq > Lk (rows that see no key), partial row
    and key tiles, head dims that are not powers of two, per-block and per-channel scales,
    one scale per tensor, float16, bfloat16 and float32 inputs."""
    shape, kw = QO_CASES[case]
    q, k, v = qkv(seed=40 + case, **shape)
    st = both(q, k, v, "quant_only", **kw)[1]
    assert len(qo_launches) == 1
    if kw.get("causal") and shape["Lq"] > shape["Lk"]:
        assert st.empty_rows > 0


def test_quant_only_fused_launch_settings(monkeypatch, qo_launches):
    """Another launch setting (32 rows, 32-key tiles, the 32-column float64 chain, 64-key P
    tiles) gives the same bits."""
    import lowprec.gpu.quant_only_kernel as qk

    monkeypatch.setattr(qk, "LAUNCH", (32, 32, 32, 64, 4, 1))
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=45, Lk=90, seed=47)
    both(q, k, v, "quant_only", causal=True)
    assert len(qo_launches) == 1


def test_quant_only_fused_overflowing_scores(qo_launches):
    """Scores that overflow float32 (q near the float32 maximum): a row whose visible scores
    are all ``-inf`` (P8 = 0, output 0, unnormalized) and one whose maximum is ``+inf`` (a NaN
    row), as on the CPU."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=40, Lk=40, seed=30)
    q[0, 0, 0] = -torch.sign(k[0, 0, 0]) * 3e38  # row 0 sees key 0 only: its score is -inf
    q[0, 0, 5] = torch.sign(k[0, 0, 2]) * 3e38  # key 2 scores +inf
    out, st = both(q, k, v, "quant_only", causal=True)
    assert len(qo_launches) == 1
    assert torch.isnan(out[0, 0, 5]).all() and (out[0, 0, 0] == 0).all()
    assert st.unnormalized_rows > 0


def test_quant_only_masked_calls_take_torch_path(qo_launches):
    """A call with a mask keeps the torch-operations path (the kernel is not launched)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=24, Lk=30, seed=48)
    am = torch.rand(1, 1, 24, 30, generator=torch.Generator().manual_seed(1)) > 0.3
    both(q, k, v, "quant_only", causal=True, attn_mask=am)
    assert qo_launches == []


def test_quant_only_fused_equals_torch_path(monkeypatch, qo_launches):
    """The fused kernel and the device's torch-operations path give the same bits and
    statistics on the same call (two device implementations of one pipeline; both take the
    device's ``exp``: the interpreter's NumPy and torch's SLEEF on CPU tensors, the same
    libdevice function on a GPU)."""
    from lowprec.kernels import device_rows as drows
    from lowprec.kernels import intattention_device as idev

    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=50, Lk=70, seed=49, amp=3.0)
    call = dict(causal=True, return_stats=True, options={}, gqa=True)
    with on_device():
        a = attention_device(get_scheme("quant_only"), dev(q), dev(k), dev(v), **call)
        assert len(qo_launches) == 1
        monkeypatch.setattr(drows, "FUSED_ON_INTERPRETER", False)
        monkeypatch.setattr(idev, "fused_kernels", lambda dp: False)
        b = attention_device(get_scheme("quant_only"), dev(q), dev(k), dev(v), **call)
    assert len(qo_launches) == 1
    same_out(a[0].cpu(), b[0])
    same_stats(a[1], b[1])


def test_seq_cols_adds_left_to_right():
    """``_tiles.seq_cols`` (the kernel's float64 sum) adds a tile's columns one at a time, left
    to right, after the running value: rows whose sum depends on the order."""
    from lowprec.gpu._launch import LAUNCH_OPTS

    g = torch.Generator().manual_seed(0)
    for n in (16, 32):
        x = torch.randn(16, 2 * n, generator=g, dtype=torch.float64) * 1e3
        x[0] = 2.0**-53
        x[1] = 2.0**-53
        x[1, 5] = 1.0
        z0 = torch.randn(16, generator=g, dtype=torch.float64)
        z0[0], z0[1] = 1.0, 0.0
        want = z0.clone().numpy()
        for j in range(2 * n):
            want = want + x[:, j].numpy()
        got = torch.empty(16, dtype=torch.float64)
        xd, zd, gd = dev(x), dev(z0), dev(got)
        _seq_cols_kernel[(1,)](xd, zd, gd, N=n, BM=16, **LAUNCH_OPTS)
        got = gd.cpu().numpy()
        assert got[0] == 1.0 and got[1] > 1.0  # the order shows
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opts", [dict(bits=3, index_rounding="nearest"), dict(c=2.0)])
def test_index_softmax_only_options_and_nonfinite(opts):
    """Options, and scores that overflow float32 (+inf and NaN rows, nonfinite_rows)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=16, seed=9)
    q[0, 0, 3] *= 1e30
    q[0, 1, 4, 0] = torch.nan
    st = both(q, k, v, "index_softmax_only", causal=True, **opts)[1]
    assert st.nonfinite_rows > 0


@pytest.mark.parametrize("scheme,opts", [
    ("intattention", {}),  # noise model "int8_tensor"
    ("intattention", {"granularity": "per_block", "block": 16}),  # "int8_entry"
    ("quant_only", {"scale_scope": "tensor"}),  # "int8_tensor", the whole tensors' scales
    ("index_softmax_only", {}),  # no noise model; an Inf in v: non-finite rows
])
def test_shared_counters_fused(scheme, opts, monkeypatch):
    """The counters every row-wise scheme shares (non-finite, noisy and no-key rows) of a call
    without a mask come from one kernel (``lowprec.gpu.callstats.rows_counts``): equal to the
    CPU's and to the torch operations' (the path masked calls take) on calls where they are
    neither 0 nor full: rows of growing size so that some are noisy and some not, causal
    Lq > Lk (rows that see no key), GQA by index."""
    import lowprec.gpu.callstats as cs
    from lowprec.kernels import device as dmod

    g = torch.Generator().manual_seed(80)
    q = torch.randn(1, 4, 48, 16, generator=g) * torch.linspace(0.01, 2.0, 48)[:, None]
    k = torch.randn(1, 2, 40, 16, generator=g) * 30.0
    v = torch.randn(1, 2, 40, 16, generator=g)
    if scheme == "index_softmax_only":
        v[0, 1, 5, 3] = torch.inf
    calls = []
    real = cs.rows_counts
    monkeypatch.setattr(cs, "rows_counts", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ref = both(q, k, v, scheme, causal=True, **opts)[1]
    assert calls
    if scheme == "index_softmax_only":
        assert 0 < ref.nonfinite_rows < 4 * 40 and ref.empty_rows == 4 * 8
    else:
        assert 0 < ref.noisy_rows < 4 * 40 and ref.empty_rows == 4 * 8
    s = get_scheme(scheme)
    with on_device():
        a = attention_device(s, dev(q), dev(k), dev(v), causal=True, return_stats=True,
                             options=opts, gqa=True, with_empty=True)
        # each entry's rows split between programs at 13 rows (the kernel masks each
        # split's end), as at long lengths on a GPU
        monkeypatch.setattr(cs, "_row_splits", lambda B, Lq, bm, **_: (-(-Lq // 13), 13))
        c = attention_device(s, dev(q), dev(k), dev(v), causal=True, return_stats=True,
                             options=opts, gqa=True, with_empty=True)
        n = len(calls)
        monkeypatch.setattr(dmod, "_stats_kernels", lambda t: False)
        b = attention_device(s, dev(q), dev(k), dev(v), causal=True, return_stats=True,
                             options=opts, gqa=True, with_empty=True)
    assert len(calls) == n
    same_stats(a[1], ref)
    same_stats(c[1], ref)
    same_stats(b[1], ref)
    assert a[3] == b[3] == 4 * 8


IS_CASES = [  # (qkv arguments, call options)
    (dict(), {}),  # GQA (4 query heads on 2 stored ones), 2 sequences
    (dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=100, d=24, dv=40), dict(causal=True)),  # partial tiles
    (dict(Z=1, Hq=2, Hkv=1, Lq=90, Lk=50, dtype=torch.float16), dict(causal=True)),  # no key
    (dict(Z=1, Hq=4, Hkv=2, Lq=70, Lk=33, dtype=torch.bfloat16),
     dict(bits=3, index_rounding="nearest")),
    (dict(Z=1, Hq=2, Hkv=2, Lq=33, Lk=47, d=20, dv=8), dict(c=2.0, bits=8, causal=True)),
    (dict(Z=2, Hq=2, Hkv=2, Lq=20, Lk=40, amp=3.0), dict(scale=0.3, bits=1)),
    (dict(Z=1, Hq=2, Hkv=2, Lq=30, Lk=65, amp=4.0, dtype=torch.float64),
     dict(index_rounding="nearest", c=9.5, causal=True)),
]


@pytest.mark.parametrize("case", range(len(IS_CASES)))
def test_index_softmax_only_cases(case):
    """``index_softmax_only`` without a mask gives the CPU's bits and statistics: GQA, causal
    Lq < Lk and Lq > Lk (rows that see no key: NaN rows), partial row blocks, head dims that
    are not powers of two, ``bits`` 1, 3, 8, ``c``, both index roundings, float16, bfloat16,
    float32 and float64 inputs."""
    shape, kw = IS_CASES[case]
    q, k, v = qkv(seed=60 + case, **shape)
    st = both(q, k, v, "index_softmax_only", **kw)[1]
    if kw.get("causal") and shape["Lq"] > shape["Lk"]:
        assert st.empty_rows > 0


def test_index_softmax_only_nonfinite_rows():
    """Non-finite inputs: a q row of +inf (its scores are +-inf or NaN: a
    NaN row), a row whose scores overflow to +inf (NaN) and one whose only visible score is
    -inf (no finite score: NaN), an infinite v past a causal block's last visible key (the
    CPU's GEMM multiplies it by P = 0: NaN in that column of the rows before it, +-inf or NaN
in the others)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=100, Lk=100, seed=70)
    q[0, 0, 7] = torch.inf
    q[0, 0, 9] = torch.sign(k[0, 0, 2]) * 3e38  # key 2 scores +inf
    q[0, 0, 0] = -torch.sign(k[0, 0, 0]) * 3e38  # row 0 sees key 0 only: its score is -inf
    v[0, 1, 90, 3] = torch.inf
    out, st = both(q, k, v, "index_softmax_only", causal=True)
    assert torch.isnan(out[0, 0, [0, 7, 9]]).all() and st.empty_rows == 3
    assert torch.isnan(out[0, 1, :90, 3]).all() and not torch.isfinite(out[0, 1, :, 3]).any()
    assert torch.isfinite(out[0, 1, :, 2]).all()
    out = both(q, k, v, "index_softmax_only")[0]  # (not causal: every key in the product)
    assert not torch.isfinite(out[0, 1, :, 3]).any()


@pytest.mark.parametrize("case", ["nan_q", "bad_option", "c_int", "nan_mask", "deploy_pf",
                                  "neg_scale"])
def test_same_errors(case):
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=8, seed=10)
    kw = {}
    scheme = "intattention"
    if case == "nan_q":
        q[0, 1, 2, 3] = torch.nan
    elif case == "bad_option":
        kw = {"granularity": "per_row"}
    elif case == "c_int":
        q = q * 1e-12
    elif case == "nan_mask":
        m = torch.zeros(8, 8)
        m[1, 1] = torch.nan
        kw = {"attn_mask": m, "granularity": "bogus"}
    elif case == "deploy_pf":
        kw = {"deploy": True, "p_format": "int8"}
    else:
        kw = {"scale": -1.0}
    with pytest.raises((ValueError, TypeError)) as e1:
        lp.attention(q, k, v, scheme, **kw)
    with on_device(), pytest.raises(type(e1.value)) as e2:
        lp.attention(dev(q), dev(k), dev(v), scheme,
                     **{a: dev(b) for a, b in kw.items()})
    assert str(e1.value) == str(e2.value)


@pytest.mark.parametrize("scheme,opts", [
    ("intattention", {}), ("intattention", dict(granularity="per_channel")),
    ("intattention", dict(granularity="per_block", block=16)),
    ("intattention", dict(scale_scope="tensor")), ("intattention", dict(p_format="int8")),
    ("quant_only", {}), ("hccs", {}), ("qflash", {}), ("index_softmax_only", {}),
])
def test_llama_shaped_calls_defer_their_statistics(scheme, opts):
    """The call ``lp.emulate`` makes for a Llama layer (one sequence, causal with Lq == Lk, no
    mask, GQA by index, bfloat16; every row and key takes part): the CPU's outputs and
    statistics; with ``defer=True`` the statistics arrive as a Pending that resolves to the
    immediate call's (and the output is the same)."""
    from lowprec.kernels.device import Pending

    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=40, Lk=40, seed=14, dtype=torch.bfloat16)
    if scheme == "index_softmax_only":  # a NaN score (a NaN row: nonfinite_rows)
        q[0, 1, 4, 0] = torch.nan
    both(q, k, v, scheme, causal=True, **opts)
    call = dict(causal=True, return_stats=True, options=opts, gqa=True, with_empty=True)
    with on_device():
        now = attention_device(get_scheme(scheme), dev(q), dev(k), dev(v), **call)
        later = attention_device(get_scheme(scheme), dev(q), dev(k), dev(v), defer=True,
                                 **call)
    assert isinstance(later[1], Pending) and later[3] is None
    same_out(now[0].cpu(), later[0])
    st, n_none = later[1].resolve()
    same_stats(now[1], st)
    assert n_none == now[3] == 0 and later[1].resolve()[0] is st
    assert scheme != "index_softmax_only" or st.nonfinite_rows > 0


@pytest.mark.parametrize("scheme", ["intattention", "quant_only"])
def test_deferred_call_reads_back_for_its_checks_only(monkeypatch, scheme):
    """``intattention`` and ``quant_only`` with ``defer=True`` read back once in the call (the
    inputs' largest values and the scales, for the checks and intattention's thresholds), not
    for their statistics; an input with NaN still raises in the call."""
    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=32, Lk=32, seed=15, dtype=torch.bfloat16)
    call = dict(causal=True, return_stats=True, options={}, gqa=True, with_empty=True)
    s = get_scheme(scheme)
    reads = []
    cpu = torch.Tensor.cpu

    def counted(t, *a, **kw):
        reads.append(t.shape)
        return cpu(t, *a, **kw)

    with on_device():
        attention_device(s, dev(q), dev(k), dev(v), defer=True, **call)  # (warm the caches)
        monkeypatch.setattr(torch.Tensor, "cpu", counted)
        res = attention_device(s, dev(q), dev(k), dev(v), defer=True, **call)
        assert len(reads) == 1
        res[1].resolve()
        q[0, 2, 5, 1] = torch.nan
        with pytest.raises(ValueError, match="q contains NaN or Inf"):
            attention_device(s, dev(q), dev(k), dev(v), defer=True, **call)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_empty_shapes(scheme):
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=0, Lk=8, seed=11)
    both(q, k, v, scheme)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=4, Lk=0, seed=11)
    both(q, k, v, scheme)


@pytest.mark.parametrize("scheme,opts", [
    ("ivit", dict(logit_bits=None, out_bits=8)), ("ivit", dict(scale_scope="tensor")),
    ("ivit", dict(logit_bits=5, out_bits=12)), ("ibert", dict(logit_bits=8)),
    ("ibert", dict(out_bits=16, scale_scope="tensor")), ("ivit", dict(exact=True)),
    ("ivit", dict(exact=True, logit_bits=None, out_bits=8)), ("ibert", dict(exact=True)),
    ("ibert", dict(exact=True, logit_bits=6, out_bits=12, scale_scope="tensor")),
])
def test_baselines_options(scheme, opts):
    """ivit / ibert options that change the arithmetic (fine int32 logits whose sums clamp at
    2**31, 8-bit and 5-bit logits, output bits, one group for the whole tensor), causal with a
    boolean mask (a row that sees no key) and an additive one."""
    q, k, v = qkv(seed=13)
    am, add = masks(seed=14)
    st = both(q, k, v, scheme, causal=True, attn_mask=am, **opts)[1]
    assert st.zero_outputs > 0
    st = both(q, k, v, scheme, attn_mask=add, **opts)[1]
    if scheme == "ivit" and opts.get("logit_bits", 8) is None:
        assert st.unnormalized_rows > 0


def test_baselines_flat_rows_tiny_units_and_clamped_sums():
    """ibert: q = 0 makes every logit 0 (flat rows, e = max e everywhere); tiny q and k a
    logit unit below the float32 range (the unit-1 fallback); ivit with one key per row, and
    fine int32 logits on 200 keys whose sums clamp at 2**31 (sum_clamped)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=24, Lk=24, seed=15)
    both(q * 0, k, v, "ibert")
    both(q * 1e-30, k * 1e-30, v, "ibert", causal=True)
    both(q, k[..., :1, :], v[..., :1, :], "ivit")
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=8, Lk=200, seed=15, amp=0.5)
    st = both(q, k, v, "ivit", logit_bits=None, out_bits=8)[1]
    assert st.sum_clamped > 0


@pytest.mark.parametrize("case", ["exact", "logit_bits", "out_bits", "scale", "nan_k",
                                  "ibert_coarse"])
def test_baselines_errors(case):
    """ivit / ibert raise the CPU's errors (exact=True: a scale too small for I-BERT's int64
    polynomial)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=8, seed=16)
    scheme, kw = "ivit", {}
    if case == "exact":  # a logit unit too fine for I-BERT's int64 polynomial
        scheme, kw = "ibert", {"exact": True}
        q, k = q * 1e-4, k * 1e-4
    elif case == "logit_bits":
        kw = {"logit_bits": 1, "exact": True}
    elif case == "out_bits":
        scheme, kw = "ibert", {"out_bits": 17}
    elif case == "scale":
        kw = {"scale": 0.0}
    elif case == "nan_k":
        k[0, 1, 3, 2] = torch.inf
    else:
        scheme, kw = "ibert", {"scale": 1e6}
    with on_device(), pytest.raises((ValueError, TypeError)) as e2:
        lp.attention(dev(q), dev(k), dev(v), scheme, **kw)
    with pytest.raises(type(e2.value)) as e1:
        lp.attention(q, k, v, scheme, **kw)
    assert str(e1.value) == str(e2.value)


def hccs_params(B, S, Dmax, x_scale, n=56):
    from lowprec.kernels.hccs import HccsParams

    return HccsParams(B=B, S=S, Dmax=Dmax, x_scale=x_scale, n=n)


@pytest.mark.parametrize("opts", [
    dict(path="i8_div", out_shift=2), dict(path="i8_clb"), dict(dequant="rowsum"),
    dict(scale_scope="tensor", path="i8_clb", clb_T=128),
])
def test_hccs_given_params(opts):
    """hccs with given per-head parameters (logits clamped by a small x_scale:
    logit_saturated), every output path and option, causal with a boolean mask and an
    additive one; one set broadcast over the heads as a dict."""
    q, k, v = qkv(seed=17)
    am, add = masks(seed=18)
    p = hccs_params([400, 380, 300, 410], [10, 5, 3, 2], [20, 30, 40, 60],
                    [0.05, 0.04, 0.03, 0.06])
    st = both(q, k, v, "hccs", causal=True, attn_mask=am, params=p, **opts)[1]
    assert st.logit_saturated > 0 and st.clipped > 0
    one = hccs_params([500], [4], [50], [0.1]).to_dict()
    both(q, k, v, "hccs", attn_mask=add, params=one, **opts)


def test_hccs_hazards():
    """i8_clb saturation (a dominant key: clipped keys give s = 5), the i8_div reciprocal
    beyond int16 (causal Lq = Lk: the first row sees one key, Z = B < 256), parameters
    checked for another row length."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=56, Lk=56, seed=19)
    q = q.abs()
    k[..., 0, :] = 6.0  # key 0 dominates every row
    p = hccs_params([585], [10], [58], [0.4])
    st = both(q, k, v, "hccs", params=p, path="i8_clb")[1]
    assert st.out_saturated > 0
    st = both(q, k, v, "hccs", causal=True, params=hccs_params([200], [2], [40], [0.05]),
              path="i8_div")[1]
    assert st.rho_int16_overflow > 0
    both(q[..., :30, :], k[..., :30, :], v[..., :30, :], "hccs",
         params=hccs_params([500], [2], [50], [0.05], n=64))


@pytest.mark.parametrize("case", ["heads", "n", "path", "out_shift", "params_type"])
def test_hccs_errors(case):
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=8, seed=20)
    kw = {"heads": dict(params=hccs_params([500] * 3, [2] * 3, [50] * 3, [0.1] * 3, n=32)),
          "n": dict(params=hccs_params([500], [9], [53], [0.1], n=32)),
          "path": dict(path="i4"), "out_shift": dict(path="i16_div", out_shift=1),
          "params_type": dict(params=[1, 2])}[case]
    with pytest.raises((ValueError, TypeError)) as e1:
        lp.attention(q, k, v, "hccs", **kw)
    with on_device(), pytest.raises(type(e1.value)) as e2:
        lp.attention(dev(q), dev(k), dev(v), "hccs", **kw)
    assert str(e1.value) == str(e2.value)


def test_mul_shift_rne_matches_cpu():
    """The device's 93-bit ``RNE(z m / 2**k)`` of exact I-BERT equals the CPU kernel's on
    every branch (k <= 0, 1..31, > 31, beyond 94 bits, saturation, ties)."""
    from lowprec.kernels._baselines_exact import _mul_shift_rne
    from lowprec.kernels.baselines_device import mul_shift_rne

    rng = np.random.default_rng(0)
    z = np.concatenate([rng.integers(0, 2**62, 400), rng.integers(0, 2**20, 400),
                        [0, 1, 3, 2**31, 2**40 + 2**9, 5 * 2**33]]).astype(np.int64)
    ks = np.concatenate([rng.integers(-40, 130, z.size - 6), [0, 1, 2, 10, 33, 100]])
    for m in (0, 1, 2**30 + 12345, 2**31, 1717986918):
        want = np.array([_mul_shift_rne(np.int64(a), np.int64(m), int(b))
                         for a, b in zip(z, ks, strict=True)])
        got = mul_shift_rne(dev(torch.from_numpy(z)), m, dev(torch.from_numpy(ks))).cpu()
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("opts", [dict(block_k=16), dict(division=True, block_k=24),
                                  dict(scale_scope="tensor", m_init=-(1 << 21)),
                                  dict(scale_update="accumulate", block_k=8),
                                  dict(scale_update="accumulate", division=True)])
def test_qflash_options(opts):
    """qflash's options (key tiles with a partial last tile, ShiftExp2 by division, one scale
    set per tensor, the paper's m_init, Scale Accumulation over 7 tiles, whose sums wrap
    int32), causal with a boolean mask and an additive one."""
    q, k, v = qkv(seed=21)
    am, add = masks(seed=22)
    st = both(q, k, v, "qflash", causal=True, attn_mask=am, **opts)[1]
    assert st.total_rescales > 0
    both(q, k, v, "qflash", attn_mask=add, **opts)


def test_qflash_hazards():
    """Every hazard path of QFlash equal on the device: exp_M = 0 (small amplitude),
    overflowing x exp_M (large), int32, requant and output wraps (extreme m_init, ShiftExp2 by
    multiply-shift and by division), negative weights (amplitude 16, d = 32),
    rows whose scores all lie below m_init (q = 1, k = -1, d = 128)."""
    rng = np.random.default_rng(23)
    shape = (1, 2, 49, 32)
    small = [torch.from_numpy(rng.uniform(-0.3, 0.3, shape).astype(np.float32))
             for _ in range(3)]
    assert both(*small, "qflash")[1].exp_M_zero == 1
    big = [torch.from_numpy(rng.uniform(-64, 64, shape).astype(np.float32)) for _ in range(3)]
    st = both(*big, "qflash", causal=True)[1]
    assert st.total_exp_overflows > 0
    st = both(*big, "qflash", m_init=2**31 - 1)[1]  # m - m_new wraps, P8 and outputs wrap
    assert st.total_int32_wraps > 0 and st.total_requant_wraps > 0 and st.total_output_wraps
    st = both(*big, "qflash", m_init=-(2**31), division=True)[1]
    assert st.total_int32_wraps > 0
    rng2 = np.random.default_rng(0)
    mid = [torch.from_numpy(rng2.uniform(-16, 16, shape).astype(np.float32)) for _ in range(3)]
    assert both(*mid, "qflash")[1].total_negative_weights > 0
    q = torch.ones(1, 1, 8, 128)
    st = both(q, -q, torch.randn(1, 1, 8, 16), "qflash")[1]
    assert st.total_m_init_rows > 0


@pytest.mark.parametrize("case", ["raise_exp_M", "raise_hazards", "on_hazard", "m_init",
                                  "big_scale", "nan_v"])
def test_qflash_errors(case):
    rng = np.random.default_rng(24)
    amp = {"raise_exp_M": 0.3, "raise_hazards": 64.0}.get(case, 1.0)
    q, k, v = (torch.from_numpy(rng.uniform(-amp, amp, (1, 2, 20, 32)).astype(np.float32))
               for _ in range(3))
    kw = {"raise_exp_M": dict(on_hazard="raise"), "raise_hazards": dict(on_hazard="raise"),
          "on_hazard": dict(on_hazard="ignore"), "m_init": dict(m_init=0.5),
          "big_scale": dict(scale=1e9), "nan_v": {}}[case]
    if case == "nan_v":
        v[0, 1, 2, 3] = torch.nan
    with pytest.raises((ValueError, TypeError)) as e1:
        lp.attention(q, k, v, "qflash", **kw)
    with on_device(), pytest.raises(type(e1.value)) as e2:
        lp.attention(dev(q), dev(k), dev(v), "qflash", **kw)
    assert str(e1.value) == str(e2.value)


@pytest.mark.parametrize("scheme", ["intattention", "intflash", "exaq"])
def test_emulate_device_path(scheme):
    """lp.emulate routes a device scheme's SDPA calls to the device path (GQA by index, a
    causal call with Lq != Lk folded into a mask): the same outputs and statistics."""
    import torch.nn.functional as F

    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=12, Lk=20, seed=12)
    res = []
    for ctx in (contextlib.nullcontext(), on_device()):
        with torch.no_grad(), ctx, lp.emulate(scheme) as run:
            a = (dev(q), dev(k), dev(v)) if not isinstance(ctx, contextlib.nullcontext) \
                else (q, k, v)
            out = F.scaled_dot_product_attention(*a, is_causal=True, enable_gqa=True)
        res.append((out, run.stats.calls[0].stats))
    same_out(res[0][0], res[1][0])
    same_stats(res[0][1], res[1][1])


def test_sequential_row_sum():
    """seq_rowsum adds left to right: a row whose sum depends on the order."""
    from lowprec.gpu.rowsum import seq_rowsum

    x = torch.tensor([[1.0, 2.0**-53, 2.0**-53, 2.0**-53, 2.0**-53]] * 3, dtype=torch.float64)
    x[1] = torch.tensor([2.0**-53] * 4 + [1.0], dtype=torch.float64)
    want = np.zeros(3)
    for r in range(3):
        for t in x[r].numpy():
            want[r] += t
    got = seq_rowsum(dev(x)).cpu().numpy()
    assert got[0] == 1.0 and got[1] > 1.0  # the order shows
    np.testing.assert_array_equal(got, want)
    x32 = torch.randn(7, 300, generator=torch.Generator().manual_seed(0)) * 1e3
    w32 = np.zeros(7, np.float32)
    for j in range(300):
        w32 = (w32 + x32[:, j].numpy()).astype(np.float32)
    np.testing.assert_array_equal(seq_rowsum(dev(x32)).cpu().numpy(), w32)

