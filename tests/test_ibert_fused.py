"""The fused Triton kernels of ``ibert`` (``lowprec.gpu.ivit_kernel``: ``ibert_emax`` and
``ibert_rows``, the device path of I-BERT's integer softmax in float32 order without a mask)
equal the CPU path bit for bit, statistics included: plain, causal with Lq = Lk, Lq < Lk and
Lq > Lk (rows that see no key), partial row and key tiles, GQA read by index, ``logit_bits``
None / 8 / 5, ``out_bits`` 2 / 8 / 12 / 16, ``scale_scope`` both ways, floor clamps, the
16-bit requantisation saturating (a doubled multiplier on both paths: with the CPU's
multiplier ``max(e)`` lands within a few float32 roundings of 32767), the int64 accumulator
forced, bfloat16 inputs, a scale too large for I-BERT (the same error); a group with ``m31 =
0`` (no positive ``e``: unreachable through ``lp.attention``, whose every good row has ``e =
ci 2**30`` at its maximum and whose bad rows need a scale I-BERT refuses) through the kernel
itself; and the same bits as the device's torch-operations path.  Without a GPU the kernels
run in Triton's interpreter on CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_attention_device_rows import both, dev, on_device, qkv  # noqa: E402
from test_ivit_fused import same_as_torch_path  # noqa: E402

import lowprec as lp  # noqa: E402
import lowprec.gpu.ivit_kernel as ik  # noqa: E402
from lowprec.kernels import baselines as bl  # noqa: E402
from lowprec.kernels import baselines_device as bdev  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def fused_calls(monkeypatch):
    """Records the fused kernels' launches (a test fails if the call took the torch path):
    per call of ``ibert_rows`` ``(options, info)``; ``ibert_emax``'s calls counted apart."""
    calls = []
    real_rows, real_emax = ik.ibert_rows, ik.ibert_emax

    def spy(*a, **k):
        res = real_rows(*a, **k)
        calls.append((k, res[1]))
        return res

    def spy_emax(*a, **k):
        calls.append(("emax", None))
        return real_emax(*a, **k)

    monkeypatch.setattr(ik, "ibert_rows", spy)
    monkeypatch.setattr(ik, "ibert_emax", spy_emax)
    return calls


def _rows_calls(calls):
    assert [c[0] == "emax" for c in calls] == [True, False] * (len(calls) // 2), calls
    return calls[1::2]


# (shape, options, counters that must be non-zero)
CASES = [
    ("plain", dict(Z=1, Hq=2, Hkv=2, Lq=40, Lk=56), dict(), ("zero_outputs",)),
    ("causal_square", dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=70, d=24, dv=40, amp=3.0),
     dict(causal=True, out_bits=16), ("floor_clamped", "zero_outputs")),
    ("causal_lq_lt_lk", dict(Z=1, Hq=2, Hkv=1, Lq=33, Lk=97, d=80, dv=24, amp=0.8),
     dict(causal=True, logit_bits=5, out_bits=12), ()),
    ("causal_lq_gt_lk", dict(Z=1, Hq=2, Hkv=2, Lq=70, Lk=30, amp=2.5),
     dict(causal=True, out_bits=8), ("empty_rows", "floor_clamped")),
    ("gqa_tensor_scope", dict(Z=2, Hq=4, Hkv=2, Lq=20, Lk=45, seed=5),
     dict(scale_scope="tensor", logit_bits=8), ()),
    ("gqa_visible_8", dict(Z=2, Hq=4, Hkv=2, Lq=20, Lk=45, seed=6, amp=3.0),
     dict(logit_bits=8, out_bits=8), ("floor_clamped",)),
    ("out_bits_2", dict(Z=1, Hq=2, Hkv=2, Lq=24, Lk=64, seed=7),
     dict(out_bits=2, causal=True), ("zero_outputs", "unnormalized_rows")),
    ("out_bits_16_wide", dict(Z=1, Hq=1, Hkv=1, Lq=66, Lk=140, d=40, dv=72, seed=8, amp=4.0),
     dict(out_bits=16), ("floor_clamped",)),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_ibert_fused_equals_cpu(case, fused_calls):
    _, shape, opts, nonzero = CASES[case]
    q, k, v = qkv(**shape)
    st = both(q, k, v, "ibert", **opts)[1]
    assert len(_rows_calls(fused_calls)) == 1
    for name in nonzero:
        assert getattr(st, name) > 0, (name, st)


def test_ibert_fused_requant_saturates(monkeypatch, fused_calls):
    """A multiplier twice the CPU's on both paths (``_frexp_multiplier`` patched in both
    modules): every ``e`` above half the group's largest requantises past 32767 and clamps
    (``requant_clamped``), the same bits and counts."""
    real = bl._frexp_multiplier

    def doubled(ratio):
        m31, sh = real(ratio)
        return m31, sh - 1

    monkeypatch.setattr(bl, "_frexp_multiplier", doubled)
    monkeypatch.setattr(bdev, "_frexp_multiplier", doubled)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=36, Lk=50, seed=9, amp=0.7)
    st = both(q, k, v, "ibert", causal=True, out_bits=16)[1]
    assert st.requant_clamped > 80, st
    st = both(q, k, v, "ibert", logit_bits=8)[1]
    assert st.requant_clamped > 0, st
    assert len(_rows_calls(fused_calls)) == 2
    assert sum(int(info[..., 2].sum()) for _, info in fused_calls[1::2]) > 80


def test_ibert_fused_int64_accumulator(monkeypatch, fused_calls):
    """The int64 accumulator (rows longer than ``ACC32_MAX_KEYS``) gives the same bits."""
    monkeypatch.setattr(ik, "ACC32_MAX_KEYS", 8)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=30, Lk=50, seed=22)
    both(q, k, v, "ibert", causal=True, out_bits=16)
    both(q, k, v, "ibert", logit_bits=8)
    assert len(_rows_calls(fused_calls)) == 2


def test_ibert_fused_scale_too_large(fused_calls):
    """Large logits with 5-bit requantisation: a logit scale too large for I-BERT
    (``floor(c / s**2) = 0``); both paths raise the same error."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=40, seed=23, amp=4.0)
    with on_device(), pytest.raises(ValueError) as e2:
        lp.attention(dev(q), dev(k), dev(v), "ibert", logit_bits=5)
    with pytest.raises(ValueError) as e1:
        lp.attention(q, k, v, "ibert", logit_bits=5)
    assert str(e1.value) == str(e2.value)
    assert "too large for I-BERT" in str(e1.value)


def test_ibert_fused_bfloat16(fused_calls):
    """bfloat16 inputs read as stored, causal with partial tiles."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=65, Lk=81, seed=24, dtype=torch.bfloat16)
    both(q, k, v, "ibert", causal=True)
    assert len(_rows_calls(fused_calls)) == 1


def test_ibert_fused_equals_torch_path(monkeypatch):
    """The fused kernels and the device's torch-operations path give the same bits and
    statistics on the same call."""
    same_as_torch_path(monkeypatch, "ibert", (dict(), dict(logit_bits=8, out_bits=16)))


def test_ibert_rows_dead_group():
    """``m31 = 0`` for one entry (a group without a positive ``e``): its good rows are NaN,
    state ``STATE_DEAD``, no requantisation clamp, zero output or ``y`` counted; the other
    entry's rows are unchanged (the kernel called directly, after ``ibert_emax``)."""
    import numpy as np

    g = torch.Generator().manual_seed(31)
    B, L, d = 2, 40, 16
    q8, k8, v8 = (torch.randint(-127, 128, (B, L, d), generator=g, dtype=torch.int8)
                  for _ in range(3))
    q8, k8, v8 = (dev(t) for t in (q8, k8, v8))
    s = np.float32(2.0**-11)
    x0, bi, ci = bl._ibert_consts(s, False)
    cst = dev(torch.tensor([[s, x0, np.float32(30) * x0, bi, ci]] * B, dtype=torch.float32))
    s64 = dev(torch.full((B,), float(s), dtype=torch.float64))
    kw = dict(qmax=0, causal=True, requant=False)
    em = ik.ibert_emax(q8, k8, s64, s64, cst, **kw)
    assert float(em.min()) == float(ci) * 2.0**30  # every row's largest e: t = 0, e = ci 2**30
    m31, inv = bdev._ibert_mult({0: s}, np.zeros(B, np.int64), np.full(B, float(em.max())))
    mul = torch.from_numpy(np.stack([m31, inv], axis=1))
    svu = dev(torch.full((B,), 2.0**-8, dtype=torch.float64))
    out, info = ik.ibert_rows(q8, k8, v8, s64, s64, cst, dev(mul), svu, out_bits=8, **kw)
    mul[0] = 0.0
    out0, info0 = ik.ibert_rows(q8, k8, v8, s64, s64, cst, dev(mul), svu, out_bits=8, **kw)
    assert bool(torch.isnan(out0[0]).all()) and not bool(torch.isnan(out0[1]).any())
    assert torch.equal(out0[1].view(torch.int32), out[1].view(torch.int32))
    assert torch.equal(info0[1], info[1])
    assert bool((info0[0, :, 0] == ik.STATE_DEAD).all())
    assert torch.equal(info0[0, :, 1], info[0, :, 1])  # the floor clamps still count
    assert int(info0[0, :, 2:].abs().sum()) == 0
    assert int(info[0, :, 3].sum()) > 0 and bool((info[0, :, 0] == ik.STATE_ROW).all())
