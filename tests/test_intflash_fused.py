"""The fused INT-FlashAttention kernel (``lowprec.gpu.intflash_kernel``, the device path of
``intflash`` without a mask) equals the CPU path bit for bit, statistics included: both
variants, causal with ``Lq < Lk`` and ``Lq > Lk`` (rows that see no key), partial key tiles,
``block_k`` not a power of two and above 128 (several key sub-tiles), ``block_q`` that only
the tile counts see, ``scale_dtype="float16"``, GQA read by index, float16 overflows of the
output.  Its float32 exp2 (``lowprec.gpu.exp2f``) equals the CPU's on every input of the
near-boundary table, their neighbours, the range ends and random inputs, and reads the table
exactly where it must; the interpreter's sequential dot sums in order.  Without a GPU the
kernels run in Triton's interpreter on CPU tensors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from test_attention_device_rows import DEVICE, both, on_device, qkv  # noqa: E402

import lowprec.gpu.intflash_kernel as ik  # noqa: E402
from lowprec.gpu._tiles import seq_dot  # noqa: E402
from lowprec.gpu.engine import _round_f16  # noqa: E402
from lowprec.gpu.exp2f import near_boundary as _near_bits  # noqa: E402
from lowprec.kernels import device_rows as drows  # noqa: E402
from lowprec.kernels import intflash_device as fdev  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused kernel's launches (a test fails if the call took the torch path)."""
    calls = []
    real = ik.intflash_rows

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k)

    monkeypatch.setattr(ik, "intflash_rows", spy)
    return calls


CASES = [
    dict(Lq=40, Lk=56, d=16, dv=16, causal=False, opts=dict(block_k=16)),
    dict(Lq=70, Lk=50, d=24, dv=40, causal=True, opts=dict(block_k=16, block_q=32)),
    dict(Lq=65, Lk=130, d=80, dv=24, causal=True, opts=dict(block_k=48, block_q=16)),
    dict(Lq=64, Lk=64, d=32, dv=32, causal=False, opts=dict(block_k=32, scale_dtype="float16")),
    dict(Lq=150, Lk=250, d=16, dv=16, causal=True, opts=dict(block_k=150, block_q=16)),
    dict(Lq=40, Lk=56, d=16, dv=16, causal=False, opts=dict(variant="half", block_k=16)),
    dict(Lq=50, Lk=90, d=24, dv=40, causal=True, opts=dict(variant="half", block_k=24, block_q=16)),
    dict(Lq=70, Lk=40, d=16, dv=16, causal=True,
         opts=dict(variant="half", block_k=8, block_q=16, scale_dtype="float16")),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_equals_cpu(case, fused_calls):
    c = CASES[case]
    q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=c["Lq"], Lk=c["Lk"], d=c["d"], dv=c["dv"], seed=case)
    st = both(q, k, v, "intflash", causal=c["causal"], **c["opts"])[1]
    assert len(fused_calls) == 1
    d = st.to_dict()
    assert d["total_rescales"] > 0
    if c["causal"]:
        assert d["total_skipped_tiles"] > 0


def test_fused_entries_in_several_launches(monkeypatch, fused_calls):
    """More entries than a grid's y dimension holds: launched in parts (``b0``)."""
    from lowprec.gpu import _tiles

    monkeypatch.setattr(_tiles, "GRID_Y_MAX", 3)
    q, k, v = qkv(Z=2, Hq=2, Hkv=1, Lq=20, Lk=40, d=16, dv=16, seed=4)
    both(q, k, v, "intflash", causal=True, block_k=16, variant="half")
    assert len(fused_calls) == 1


def test_fused_hazards(fused_calls):
    """Outputs beyond float16 (``fp16_overflows``) and codes saturated by subnormal scales
    (rows of q, keys and a v head of tiny values), default options; a call without
    statistics gives the same outputs."""
    import lowprec as lp
    from lowprec.kernels import get_scheme
    from lowprec.kernels.device import attention_device

    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=48, Lk=80, d=16, dv=16, seed=9)
    q[..., :3, :] *= 1e-43
    k[..., 5:9, :] *= 1e-43
    st = both(q, k, v * 1e5, "intflash", causal=True)[1]
    d = st.to_dict()
    assert d["total_fp16_overflows"] > 0 and min(d["saturated"][0][:2]) > 0
    v = v * 1e-43
    v[0, 0, 0, 0] = 290 * 2.0**-149  # s_v = fl32(290 / 127) = 2 units: code 145 saturates
    st = both(q, k, v, "intflash", block_k=32)[1]
    assert st.to_dict()["saturated"][0][2] > 0
    assert len(fused_calls) == 2
    with on_device():
        a = attention_device(get_scheme("intflash"), q.to(DEVICE), k.to(DEVICE), v.to(DEVICE),
                             return_stats=False, options=dict(block_k=32), gqa=True)
    b = lp.attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
                     "intflash", block_k=32)
    assert torch.equal(a.cpu().view(torch.int32), b.view(torch.int32))


def test_fused_equals_torch_path(monkeypatch):
    """The fused kernel and the device's torch-operations path give the same bits and
    statistics on the same call (two device implementations of one pipeline)."""
    import lowprec as lp
    from lowprec.kernels.device import force_engine

    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=50, Lk=70, d=16, dv=16, seed=12, amp=3.0)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    for variant in ("full", "half"):
        kw = dict(causal=True, return_stats=True, variant=variant, block_k=16)
        with force_engine():
            a = lp.attention(q, k, v, "intflash", **kw)
            with monkeypatch.context() as mp:
                mp.setattr(drows, "FUSED_ON_INTERPRETER", False)
                if DEVICE == "cuda":
                    mp.setattr(fdev, "_fused_ok", lambda dp: False)
                b = lp.attention(q, k, v, "intflash", **kw)
        assert torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
        assert a[1].to_dict() == b[1].to_dict()


def test_tile_counts():
    """The analytic tile counts equal the torch path's per-pair count (causal, both
    alignments, partial tiles)."""
    for Lq, Lk, Br, Bc in ((70, 50, 32, 16), (65, 130, 16, 48), (5, 40, 4, 8), (9, 9, 9, 9)):
        nq, nk = -(-Lq // Br), -(-Lk // Bc)
        tiles = 0
        for qt in range(nq):
            last = min((qt + 1) * Br, Lq) - 1 + Lk - Lq
            tiles += sum(1 for t in range(nk) if t * Bc <= last)
        assert fdev.tile_counts(Lq, Lk, Br, Bc, True) == (tiles, nq * nk - tiles)
        assert fdev.tile_counts(Lq, Lk, Br, Bc, False) == (nq * nk, 0)


# ----------------------------------------------------------------------------------------
# the kernels' float32 exp2


def _exp2_inputs():
    from lowprec.kernels._exp2_near import NEAR_MIDPOINT

    bits = np.array(NEAR_MIDPOINT, dtype=np.int64)
    near = np.concatenate([bits + d for d in (-2, -1, 0, 1, 2)]).astype(np.uint32)
    rng = np.random.default_rng(0)
    rnd = (-rng.random(1 << 16) * 152).astype(np.float32)
    ends = np.array([0.0, -0.0, -1e-45, -2.0**-30, -126, -127, -149, -149.5, -150, -150.01,
                     -151, -1e30, -np.inf, np.nan], dtype=np.float32)
    return np.concatenate([near.view(np.float32), rnd, ends]), bits.astype(np.uint32)


def test_exp2_kernel_equals_cpu():
    """``exp2f.exp2_f32`` in a kernel equals the CPU's ``_fp.exp2_f32`` bit for bit on every
    table input and its neighbours, 2**16 random inputs of [-152, 0] and the range ends."""
    from lowprec.gpu.exp2f import exp2_rows
    from lowprec.kernels._fp import exp2_f32

    x, _ = _exp2_inputs()
    got = exp2_rows(torch.from_numpy(x).to(DEVICE)).cpu().numpy()
    want = np.array([exp2_f32(np.float32(t)) for t in x], dtype=np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:10]


def test_exp2_kernel_reads_the_table():
    """With the table's values marked, the lanes whose float64 exp2 lies near a float32
    rounding boundary and whose input is in the table read the table (and only they): the
    branch, the binary search and the guard work, whatever the float64 exp2 in use."""
    from lowprec.gpu.exp2f import exp2_rows, near_table
    from lowprec.kernels._fp import exp2_f32
    from lowprec.kernels._fp_device import EXP2_GUARD, near_boundary

    x, bits = _exp2_inputs()
    keys, vals = near_table(DEVICE)
    marks = -(1.0 + torch.arange(vals.numel(), dtype=torch.float32, device=DEVICE))
    got = exp2_rows(torch.from_numpy(x).to(DEVICE), table=(keys, marks)).cpu().numpy()
    r = torch.exp2(torch.from_numpy(x).to(DEVICE).double()).cpu().numpy()
    if DEVICE == "cpu":  # the interpreter's exp2 is NumPy's
        r = np.exp2(x.astype(np.float64))
    # the kernel's flag: within the guard where float32(r) is normal, every r of the float32
    # subnormal range [2**-150, 2**-126)
    sub = (r >= 2.0**-150) & (r < 2.0**-126)
    near = np.array([near_boundary(t, EXP2_GUARD) for t in r])
    flagged = (near | sub) & np.isin(x.view(np.uint32), bits)
    assert (near & ~sub & np.isin(x.view(np.uint32), bits)).sum() >= 50 and (flagged & sub).any()
    assert flagged.sum() >= 100
    kh = keys.cpu().numpy()
    pos = np.searchsorted(kh, x[flagged].view(np.int32))
    assert np.array_equal(got[flagged], -(1.0 + pos).astype(np.float32))
    want = np.array([exp2_f32(np.float32(t)) for t in x[~flagged]], dtype=np.float32)
    g = got[~flagged]
    assert ((g.view(np.uint32) == want.view(np.uint32)) | (np.isnan(g) & np.isnan(want))).all()


@triton.jit
def _round_f16_kernel(X, O, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(O + r, _round_f16(tl.load(X + r)))


def test_round_f16_signs():
    """The kernels' float16 rounding (``engine._round_f16``) equals the CPU's ``round_f16``
    on the bits, signs of zero included: a tiny negative rounds to -0, -0 itself to +0 (the
    CPU's ``-r if x < 0 else r``; an output ``fp32(acc / l) = -0`` of ``intflash``)."""
    from lowprec.kernels._fp import round_f16

    x = np.array([0.0, -0.0, 1e-30, -1e-30, 2.0**-25, -(2.0**-25), 1.5 * 2.0**-24,
                  -1.5 * 2.0**-24, -(2.0**-14), 65519.0, -65520.0, 1.0 / 3, -np.inf, np.nan,
                  -1.401298464324817e-45] + [0.0] * 17, dtype=np.float32)
    o = torch.empty(32, device=DEVICE)
    _round_f16_kernel[(1,)](torch.from_numpy(x).to(DEVICE), o, BLOCK=32)
    want = np.array([round_f16(t) for t in x], dtype=np.float32)
    got = o.cpu().numpy()
    assert np.array_equal(got.view(np.uint32)[:13], want.view(np.uint32)[:13])
    assert np.isnan(got[13]) and got.view(np.uint32)[14] == want.view(np.uint32)[14] == 1 << 31


@triton.jit
def _seq_dot_kernel(A, B, O):
    r = tl.arange(0, 16)
    kk = tl.arange(0, 32)
    a = tl.load(A + r[:, None] * 32 + kk[None, :])
    b = tl.load(B + kk[:, None] * 16 + r[None, :])
    tl.store(O + r[:, None] * 16 + r[None, :], seq_dot(a, b, tl.zeros([16, 16], tl.float32)))


def test_sequential_interpreter_dots():
    """Under ``sequential_interpreter_dots`` a float ``seq_dot`` adds its products in k order
    (``1 + 2**-24 + ... = 1``: a tree would carry the small terms), integer dots stay exact,
    and an inexact product raises."""
    from lowprec.gpu._launch import interpreting
    from lowprec.gpu._tiles import sequential_interpreter_dots

    if not interpreting():
        pytest.skip("the interpreter's dot")
    k = _seq_dot_kernel
    a = torch.full((16, 32), 2.0**-24)
    a[:, 0] = 1.0
    b = torch.ones(32, 16)
    o = torch.empty(16, 16)
    with sequential_interpreter_dots():
        k[(1,)](a, b, o)
    assert torch.equal(o, torch.ones(16, 16))
    a[0, 1] = 1.0 + 2.0**-20
    b[1, 0] = 1.0 + 2.0**-20
    with sequential_interpreter_dots(), pytest.raises(Exception, match="inexact"):
        k[(1,)](a, b, o)


@triton.jit
def _near_kernel(R, O, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < n
    r = tl.load(R + i, mask=ok, other=0.0)
    tl.store(O + i, _near_bits(r, 64).to(tl.int32), mask=ok)


def test_near_boundary_on_the_bits():
    """The kernels' integer near-boundary test equals ``_fp_device.near_boundary`` (exact
    float64 arithmetic) wherever ``float32(r)`` is normal: at 0, 1, 63, 64, 65 and 1000 ulps
    from midpoints of random float32 neighbours on either side, on float32 values, 1, inf and
    NaN.  It flags every ``r`` of the float32 subnormal range ``[2**-150, 2**-126)`` and none
    below (where the exact test flags ``r`` just under the boundary ``2**-150``: no float32
    ``x`` has ``2**x`` there, ``2**x`` of the float32 below -150 being ``2**-16`` relative
    below it)."""
    from lowprec.gpu._launch import LAUNCH_OPTS
    from lowprec.kernels._fp_device import near_boundary

    rng = np.random.default_rng(1)
    fb = np.exp2(rng.uniform(-126, 0, 256)).astype(np.float32).view(np.int32)
    lo, hi = fb.view(np.float32).astype(np.float64), (fb + 1).view(np.float32).astype(np.float64)
    mb = ((lo + hi) / 2).view(np.int64)
    steps = np.array([0, 1, 63, 64, 65, 1000], dtype=np.int64)
    r = np.concatenate([(mb[:, None] + steps).ravel(), (mb[:, None] - steps).ravel()])
    r = np.concatenate([r.view(np.float64), np.exp2(rng.uniform(-150, -126, 64)), lo,
                        [0.0, 1.0, 0.5, 2.0**-126, np.nextafter(2.0**-126, 0), 2.0**-150,
                         np.nextafter(2.0**-150, 0), 2.0**-160, np.inf, np.nan, 1.5 * 2.0**-126]])
    out = torch.empty(r.size, dtype=torch.int32, device=DEVICE)
    _near_kernel[(1,)](torch.from_numpy(r).to(DEVICE), out, r.size,
                       BLOCK=triton.next_power_of_2(r.size), **LAUNCH_OPTS)
    got = out.cpu().numpy().astype(bool)
    subr = (r >= 2.0**-150) & (r < 2.0**-126)
    exact = np.array([bool(near_boundary(t, 64)) for t in r])
    normal = r >= 2.0**-126
    assert np.array_equal(got[normal], exact[normal]), r[normal][got[normal] != exact[normal]]
    assert got[subr].all() and not got[~normal & ~subr].any()
    assert exact[:256 * 6].sum() == 256 * 4 and exact[256 * 6:256 * 12].sum() == 256 * 4
    assert exact[r == np.nextafter(2.0**-150, 0)].all()  # the one place the two differ
