"""The fused Triton kernels of the row-wise schemes equal the CPU path bit for bit, statistics
included.  IntAttention (``lowprec.gpu.index_attention``, the device path of
``intattention`` without a mask or deploy mode): both index roundings, both P formats,
causal with Lq < Lk and Lq > Lk (rows that see no key), partial row and key tiles, head dims
that are not powers of two, GQA read by index,
per-block and per-channel scales, the int64 accumulator.  QFlash
(``lowprec.gpu.qflash_kernel``, ``qflash`` without a mask): tile sizes that are not powers of
two, a partial last tile, division, Scale Accumulation (int32 wraps), per-tensor scales,
``m_init``.  The one-pass int8 codes.  Without a GPU the kernels run in Triton's interpreter
on CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_attention_device_rows import (  # noqa: E402
    DEVICE,
    both,
    dev,
    on_device,
    qkv,
    same_out,
    same_stats,
)

import lowprec as lp  # noqa: E402
import lowprec.gpu.index_attention as ia  # noqa: E402
from lowprec.kernels import device_rows as drows  # noqa: E402
from lowprec.kernels import intattention_device as idev  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused kernel's launches (so a test fails if the call took the torch path)."""
    calls = []
    real = ia.intattention_rows

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k)

    monkeypatch.setattr(ia, "intattention_rows", spy)
    return calls


CASES = [
    dict(Lq=40, Lk=56, d=16, dv=16, causal=False, opts={}),
    dict(Lq=70, Lk=50, d=24, dv=40, causal=True, opts={}),  # Lq > Lk: empty rows
    dict(Lq=65, Lk=130, d=80, dv=24, causal=True, opts=dict(index_rounding="nearest")),
    dict(Lq=64, Lk=64, d=32, dv=32, causal=False, opts=dict(p_format="int8", bits=5)),
    dict(Lq=33, Lk=97, d=16, dv=16, causal=False,
         opts=dict(granularity="per_block", block=16, bits=8, c=9.0)),
    dict(Lq=20, Lk=40, d=16, dv=16, causal=True, opts=dict(granularity="per_channel")),
    dict(Lq=30, Lk=30, d=16, dv=16, causal=False, opts=dict(bits=1)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_equals_cpu(case, fused_calls):
    c = CASES[case]
    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=c["Lq"], Lk=c["Lk"], d=c["d"], dv=c["dv"], seed=case)
    st = both(q, k, v, "intattention", causal=c["causal"], **c["opts"])[1]
    assert len(fused_calls) == 1
    assert st.clipped > 0
    if c["causal"] and c["Lq"] > c["Lk"]:
        assert st.empty_rows > 0


def test_fused_int64_accumulator(monkeypatch, fused_calls):
    """The int64 P v accumulator (keys beyond ACC32_MAX_KEYS) gives the same bits."""
    monkeypatch.setattr(ia, "ACC32_MAX_KEYS", 8)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=48, Lk=72, d=16, dv=16, seed=11)
    both(q, k, v, "intattention", causal=True)
    assert len(fused_calls) == 1


def test_fused_equals_torch_path(monkeypatch):
    """The fused kernel and the device's torch-operations path give the same bits and
    statistics on the same call (two device implementations of one pipeline)."""
    import lowprec as lp
    from lowprec.kernels.device import force_engine

    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=50, Lk=70, d=16, dv=16, seed=12, amp=3.0)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    with force_engine():
        a = lp.attention(q, k, v, "intattention", causal=True, return_stats=True)
        monkeypatch.setattr(drows, "FUSED_ON_INTERPRETER", False)
        if DEVICE == "cuda":
            monkeypatch.setattr(idev, "_fused_ok", lambda dp, dep: False)
        b = lp.attention(q, k, v, "intattention", causal=True, return_stats=True)
    assert torch.equal(a[0].view(torch.int32), b[0].view(torch.int32))
    assert a[1].to_dict() == b[1].to_dict()


def test_fused_wide_index_product(fused_calls):
    """Tiny q: thresholds so large that ``nb * c_int`` passes 2**31 (the int64 index
    product)."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=40, Lk=40, d=16, dv=16, seed=13)
    q = q * 2e-3
    st = both(q, k, v, "intattention", bits=8, causal=True)[1]
    assert max(int(c.max()) for c in st.c_int) * 255 >= 2**31
    assert len(fused_calls) == 1


def test_int8_codes_kernel_ties_and_clamps():
    """The one-pass int8 codes kernel equals ``clamp(RNE(fl64(x) / s), -127, 127)`` in
    float64 torch operations: exact halves of both signs (to even), values past 127.5, a
    subnormal scale (quotients far beyond int32), per-row and per-entry scales, entries read
    through an index."""
    from lowprec.gpu.int8codes import int8_codes
    from lowprec.kernels.device_rows import codes

    g = torch.Generator().manual_seed(5)
    halves = torch.arange(-130, 131, dtype=torch.float64) + 0.5
    x = torch.cat([halves, halves * 0.999999, torch.randn(500, generator=g, dtype=torch.float64)
                   * 80, torch.tensor([0.0, -0.0, 1e30, -1e30])]).float()
    n = x.numel()
    X = x.reshape(1, n, 1).repeat(3, 1, 1).reshape(3, n, 1)
    X = torch.cat([X, X * 0.37], dim=2).contiguous()  # (3, n, 2)
    s_rows = torch.tensor([1.0, 0.25, 2.0**-140], dtype=torch.float32)[:, None].expand(3, n)
    X, s_rows = X.to(DEVICE), s_rows.to(DEVICE)
    got = int8_codes(X, s_rows.contiguous())
    want = codes(X, s_rows)
    assert torch.equal(got.to(torch.float64), want)
    src = torch.tensor([2, 0, 0, 1], device=DEVICE)
    s_ent = torch.tensor([0.5, 3.0, 1.0, 2.0**-149], dtype=torch.float32, device=DEVICE)
    got = int8_codes(X, s_ent, src)
    want = codes(X[src], s_ent[:, None].expand(4, n))
    assert torch.equal(got.to(torch.float64), want)
    assert int((got == 127).sum()) > 0 and int((got == -127).sum()) > 0


@pytest.fixture
def qflash_calls(monkeypatch):
    import lowprec.gpu.qflash_kernel as qk

    calls = []
    real = qk.qflash_rows

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k)

    monkeypatch.setattr(qk, "qflash_rows", spy)
    return calls


QF_CASES = [
    dict(Lq=40, Lk=56, d=16, dv=16, causal=False, opts={}),
    dict(Lq=70, Lk=50, d=24, dv=40, causal=True, opts={}),  # Lq > Lk
    dict(Lq=130, Lk=200, d=64, dv=32, causal=False, opts=dict(division=True)),
    dict(Lq=64, Lk=64, d=32, dv=32, causal=True, opts=dict(block_k=16)),
    dict(Lq=33, Lk=97, d=16, dv=16, causal=False,
         opts=dict(block_k=48, scale_update="accumulate")),
    dict(Lq=20, Lk=70, d=16, dv=16, causal=True, opts=dict(scale_scope="tensor", m_init=-100)),
]


@pytest.mark.parametrize("case", range(len(QF_CASES)))
def test_qflash_fused_equals_cpu(case, qflash_calls):
    c = QF_CASES[case]
    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=c["Lq"], Lk=c["Lk"], d=c["d"], dv=c["dv"], seed=case)
    st = both(q, k, v, "qflash", causal=c["causal"], **c["opts"])[1]
    assert len(qflash_calls) == 1
    d = st.to_dict()
    assert sum(sum(r) for r in d["rescales"]) > 0
    if c["opts"].get("scale_update") == "accumulate":
        assert sum(sum(r) for r in d["int32_wraps"]) > 0


@pytest.fixture
def qflash_paths(monkeypatch):
    """Counts the QFlash kernel's fast tiles and its checked ``acc`` updates (the interpreter
    calls the kernel's helpers through the module's globals; compiled kernels are not
    counted)."""
    import lowprec.gpu.qflash_kernel as qk
    from lowprec.gpu._launch import interpreting

    calls = {"_fast_p": 0, "_acc_checked": 0}
    for name in calls if interpreting() else ():
        orig = getattr(qk, name)

        def spy(*a, _orig=orig, _name=name, **k):
            calls[_name] += 1
            return _orig(*a, **k)

        monkeypatch.setattr(qk, name, spy)
    return calls


def _amp(x, a):
    return [t * a for t in x]


QF_FAST = [  # (amplitude of q and k, d, options, causal, seed)
    (1.5, 32, {}, False, 40), (1.5, 32, {}, True, 41), (1.5, 32, dict(division=True), False, 42),
    (1.5, 32, dict(block_k=48), False, 43),  # key lanes past the tile
    (5.0, 4, {}, False, 45),  # wrapped and negative P8 in fast tiles
    (8.0, 32, {}, True, 45),  # x exp_M overflows: rows the guard sends to the checked steps
    (0.05, 32, {}, False, 46),  # exp_M = 0
    (1.5, 32, dict(m_init=2**31 - 1), False, 47),
    (8.0, 32, dict(m_init=-(2**31), division=True), False, 48),
    (1.5, 32, dict(scale_update="accumulate", block_k=16), False, 49),
]


@pytest.mark.parametrize("case", range(len(QF_FAST)))
def test_qflash_fast_tiles(case, qflash_paths, monkeypatch):
    """The fast tiles (int32 steps without wrap tests where :func:`_rows_safe` proves none
    can wrap; ScaleRelease of ``acc`` unchecked while the row's bound allows) give the CPU's
    outputs and statistics, and the kernel with every tile checked gives the same; with the
    ``acc`` bound lowered the update switches to the checked one part-way."""
    import lowprec.gpu.qflash_kernel as qk
    from lowprec.gpu._launch import interpreting

    amp, d, opts, causal, seed = QF_FAST[case]
    Lq, Lk = (160, 160) if causal else (70, 100)  # causal: tiles no row of a block sees
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=Lq, Lk=Lk, d=d, dv=24, seed=seed)
    q, k = q * amp, k * amp
    both(q, k, v, "qflash", causal=causal, **opts)
    for name in qflash_paths:
        qflash_paths[name] = 0
    with on_device():
        args = (dev(q), dev(k), dev(v), "qflash")
        fast = lp.attention(*args, causal=causal, return_stats=True, **opts)
        n_fast = dict(qflash_paths)
        real = qk.qflash_rows
        monkeypatch.setattr(qk, "qflash_rows", lambda *a, **kw: real(*a, **kw, fast=False))
        slow = lp.attention(*args, causal=causal, return_stats=True, **opts)
        monkeypatch.setattr(qk, "qflash_rows", real)
        monkeypatch.setattr(qk, "ACC_LIMIT", 3000)
        n_slow = dict(qflash_paths)
        low = lp.attention(*args, causal=causal, return_stats=True, **opts)
    n_low = {k: qflash_paths[k] - n_slow[k] for k in n_slow}
    for other in (slow, low):
        same_out(fast[0].cpu(), other[0])
        same_stats(fast[1], other[1])
    if case in (0, 1, 2, 3, 4) and interpreting():  # fast tiles; the unchecked acc update
        assert n_fast["_fast_p"] > 0  # until the lowered bound sends it to the checked one
        assert n_fast["_acc_checked"] < n_low["_acc_checked"]
    if case == 4:
        assert fast[1].total_negative_weights > 0
    if case == 5:
        assert fast[1].total_exp_overflows > 0


@pytest.mark.parametrize("causal", [False, True])
def test_qflash_fast_tiles_any_constants(causal, qflash_paths):
    """The fast tiles against the checked ones on one launch of 12 entries with random
    constants (``R`` from 1 to 2**20, ``exp_M`` down to -2**16, ``req_M`` up to 2**23: negative
    and wrapped P8, overflowing products, rows the guard rejects) and random int8 codes,
    ``m_init`` above the scores (causal) or below: outputs and every counter equal."""
    import lowprec.gpu.qflash_kernel as qk

    g = torch.Generator().manual_seed(7 + causal)
    B, Lq, Lk, d, dv = 12, 64, 100, 8, 16
    R = torch.randint(1, 1 << 20, (B,), generator=g) >> torch.randint(0, 20, (B,), generator=g)
    R = R.clamp(min=1)
    eM = -(torch.randint(0, 1 << 16, (B,), generator=g) >> torch.randint(0, 16, (B,), generator=g))
    rM = torch.randint(0, 1 << 23, (B,), generator=g) >> torch.randint(0, 20, (B,), generator=g)
    lM = torch.round((1 << 30) / R.double()).long()
    const = torch.stack([R, eM, rM, lM, lM], 1).long().to(DEVICE)
    q8, k8, v8 = (torch.randint(-128, 128, (B, n, w), generator=g, dtype=torch.int8).to(DEVICE)
                  for n, w in ((Lq, d), (Lk, d), (Lk, dv)))
    sv = torch.rand(B, generator=g, dtype=torch.float64).to(DEVICE)
    kw = dict(causal=causal, block_k=32, m_init=(1 << 12) if causal else -(1 << 20),
              division=False, accumulate=False)
    fast = qk.qflash_rows(q8, k8, v8, const, sv, **kw)
    slow = qk.qflash_rows(q8, k8, v8, const, sv, **kw, fast=False)
    assert torch.equal(fast[1], slow[1])
    same_out(fast[0].cpu(), slow[0])
    assert int(fast[1][..., 7].sum()) > 0 and int(fast[1][..., 2].sum()) > 0
    from lowprec.gpu._launch import interpreting

    if interpreting():
        assert qflash_paths["_fast_p"] > 0 and qflash_paths["_acc_checked"] > 0
