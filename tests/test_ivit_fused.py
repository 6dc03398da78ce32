"""The fused Triton kernel of ``ivit`` (``lowprec.gpu.ivit_kernel``: the device path of I-ViT
Shiftmax in float32 order without a mask) equals the CPU path bit for bit, statistics
included: plain, causal with Lq = Lk, Lq < Lk and Lq > Lk (rows that see no key), partial row
and key tiles, GQA read by index, ``logit_bits`` None / 8 / 5, ``out_bits`` 2 / 8 / 12 / 16,
``scale_scope`` both ways, floor clamps, clamped sums whose ``y`` needs the int64 digit path,
rows with an overflowing logit (NaN rows), the int64 accumulator forced, bfloat16 inputs; and
the same bits as the device's torch-operations path.  Without a GPU the kernels run in
Triton's interpreter on CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_attention_device_rows import DEVICE, both, dev, on_device, qkv  # noqa: E402

import lowprec as lp  # noqa: E402
import lowprec.gpu.ivit_kernel as ik  # noqa: E402
from lowprec.kernels import device_rows as drows  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def fused_calls(monkeypatch):
    """Records the fused kernel's launches (a test fails if the call took the torch path):
    per launch ``(options, info)``."""
    calls = []
    real = ik.ivit_rows

    def spy(*a, **k):
        res = real(*a, **k)
        calls.append((k, res[1]))
        return res

    monkeypatch.setattr(ik, "ivit_rows", spy)
    return calls


# (shape, options, counters that must be non-zero)
CASES = [
    ("plain", dict(Z=1, Hq=2, Hkv=2, Lq=40, Lk=56), dict(), ("floor_clamped", "zero_outputs")),
    ("causal_square", dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=70, d=24, dv=40),
     dict(causal=True), ("floor_clamped",)),
    ("causal_lq_lt_lk", dict(Z=1, Hq=2, Hkv=1, Lq=33, Lk=97, d=80, dv=24),
     dict(causal=True, logit_bits=5, out_bits=12), ("zero_outputs",)),
    ("causal_lq_gt_lk", dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=30),
     dict(causal=True, out_bits=8), ("empty_rows",)),
    ("gqa_tensor_scope", dict(Z=2, Hq=4, Hkv=2, Lq=20, Lk=45, seed=5),
     dict(scale_scope="tensor"), ()),
    ("gqa_no_requant_8", dict(Z=2, Hq=4, Hkv=2, Lq=20, Lk=45, seed=6, amp=3.0),
     dict(logit_bits=None, out_bits=8), ()),
    ("out_bits_2", dict(Z=1, Hq=2, Hkv=2, Lq=24, Lk=64, seed=7),
     dict(out_bits=2, causal=True), ("zero_outputs", "unnormalized_rows")),
    ("clamped_sums_8", dict(Z=1, Hq=2, Hkv=1, Lq=8, Lk=200, seed=15, amp=0.5),
     dict(logit_bits=None, out_bits=8), ("sum_clamped", "unnormalized_rows")),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_ivit_fused_equals_cpu(case, fused_calls):
    _, shape, opts, nonzero = CASES[case]
    q, k, v = qkv(**shape)
    st = both(q, k, v, "ivit", **opts)[1]
    assert len(fused_calls) == 1
    for name in nonzero:
        assert getattr(st, name) > 0, (name, st)


def test_ivit_fused_large_y(fused_calls):
    """Tiny q and k without requantisation: a logit unit near 2**-22, so ``x0`` near
    ``-2**22``, every ``e`` near ``2**37`` and the sums clamp (``f = 1``): ``y`` passes
    ``2**21`` and the kernel takes its six-digit int64 products; 16 and 8 output bits."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=24, Lk=40, seed=21, amp=0.02)
    st = both(q, k, v, "ivit", logit_bits=None, out_bits=16)[1]
    assert st.sum_clamped > 0 and st.unnormalized_rows > 0
    st = both(q, k, v, "ivit", logit_bits=None, out_bits=8, causal=True)[1]
    assert st.sum_clamped > 0
    assert len(fused_calls) == 2
    # some y beyond the digits of the int32 path (3 for 16 bits, 2 for 8): the mean y of a
    # row bounds its largest from below
    for (_, info), bits in zip(fused_calls, (21, 14), strict=True):
        assert float((info[..., 4].double() / 40).max()) >= 2**bits


def test_ivit_fused_int64_accumulator(monkeypatch, fused_calls):
    """The int64 accumulator (rows longer than ``ACC32_MAX_KEYS``) gives the same bits."""
    monkeypatch.setattr(ik, "ACC32_MAX_KEYS", 8)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=30, Lk=50, seed=22)
    both(q, k, v, "ivit", causal=True)
    both(q, k, v, "ivit", logit_bits=None, out_bits=8)
    assert len(fused_calls) == 2


def test_ivit_fused_overflowing_logits(fused_calls):
    """Huge q and k: logits ``fp32(S s)`` that overflow to ``+-inf``: rows with a ``+inf``
    are NaN (``nan_rows``), ``-inf`` keys take no part; with ``logit_bits`` the range is
    infinite and both paths raise the same error."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=40, seed=23)
    q, k = q * 1e19, k * 1e19
    st = both(q, k, v, "ivit", logit_bits=None)[1]
    assert st.nan_rows > 0 and st.nan_rows < 32
    with on_device(), pytest.raises(ValueError) as e2:
        lp.attention(dev(q), dev(k), dev(v), "ivit")
    with pytest.raises(ValueError) as e1:
        lp.attention(q, k, v, "ivit")
    assert str(e1.value) == str(e2.value)


def test_ivit_fused_bfloat16(fused_calls):
    """bfloat16 inputs read as stored, causal with partial tiles."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=65, Lk=81, seed=24, dtype=torch.bfloat16)
    both(q, k, v, "ivit", causal=True)
    assert len(fused_calls) == 1


def same_as_torch_path(monkeypatch, scheme, option_sets):
    """The fused kernels and the device's torch-operations path give the same bits and
    statistics on the same causal call, for each of ``option_sets``."""
    from lowprec.kernels import baselines_device as bdev
    from lowprec.kernels.device import force_engine

    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=50, Lk=70, d=16, dv=16, seed=25, amp=3.0)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    for opts in option_sets:
        with force_engine(), monkeypatch.context() as mp:
            a = lp.attention(q, k, v, scheme, causal=True, return_stats=True, **opts)
            mp.setattr(drows, "FUSED_ON_INTERPRETER", False)
            if DEVICE == "cuda":
                mp.setattr(bdev, "fused_kernels", lambda dp: False)
            b = lp.attention(q, k, v, scheme, causal=True, return_stats=True, **opts)
        assert torch.equal(a[0].view(torch.int32), b[0].view(torch.int32))
        assert a[1].to_dict() == b[1].to_dict()


def test_ivit_fused_equals_torch_path(monkeypatch):
    """The fused kernel and the device's torch-operations path give the same bits and
    statistics on the same call."""
    same_as_torch_path(monkeypatch, "ivit", (dict(), dict(logit_bits=None, out_bits=8)))


def test_floor_without_libdevice():
    """The kernel's float32 ``floor`` (integer conversions; libdevice's ``floorf`` flushes
    subnormals) equals torch's on halves, integers, the ``2**23`` boundary, subnormals of
    both signs, the extremes, infinities and NaN (zero results compared as values: the
    kernel's floor of ``-0.0`` is ``+0.0``)."""
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def kern(X, Y, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        ok = offs < n
        tl.store(Y + offs, ik._floor(tl.load(X + offs, mask=ok, other=0.0)), mask=ok)

    sub = np.array([1, 2, 3, 2**23 - 1, 2**23, 2**23 + 1], dtype=np.uint32).view(np.float32)
    base = np.concatenate([np.arange(-20, 21) * 0.25, [2.0**23 - 0.5, 2.0**23, 2.0**23 + 2,
                           2.0**24 + 2, 3e38, np.inf, 1e-30, -1e-30, 0.0, -0.0], sub])
    g = torch.Generator().manual_seed(3)
    rnd = (torch.randn(2000, generator=g) * torch.exp2(torch.randint(-30, 40, (2000,),
                                                                       generator=g))).numpy()
    vals = np.concatenate([base, -base, rnd, [np.nan]]).astype(np.float32)
    x = dev(torch.from_numpy(vals))
    y = torch.empty_like(x)
    kern[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    ref = torch.floor(x)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    fin = ~torch.isnan(ref)
    assert torch.equal(y[fin], ref[fin])
