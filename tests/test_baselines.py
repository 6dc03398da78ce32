"""I-ViT Shiftmax and I-BERT i-exp softmax (specs/attention.md section 7): bit-exact against the
float32-scalar / Python-int references of tests/ref_baselines.py, accuracy, statistics, errors,
the int8 attention schemes and the softmax surrogates."""

import json
import math

import numpy as np
import pytest
from naive.baselines import ibert_ref, ivit_ref

import lowprec as lp
from lowprec.kernels.baselines import BaselineStats, ibert_softmax, ivit_shiftmax

#: the papers' whole-tensor int8 scales, which the naive twins compute (scale_scope=
#: "visible", the default, is checked by the alone-vs-padded tests of test_robustness.py)
TENSOR = {"scale_scope": "tensor"}

FUNCS = {"ivit": (ivit_shiftmax, ivit_ref), "ibert": (ibert_softmax, ibert_ref)}
UNIT = {"ivit": lambda b: 2.0 ** -(b - 1), "ibert": lambda b: 2.0**-b}


def int_logits(rng, shape, s, spread=127):
    xi = rng.integers(-spread, spread + 1, size=shape)
    return (xi * np.float32(s)).astype(np.float32)


def same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # NaN == NaN here


@pytest.mark.parametrize("which", ["ivit", "ibert"])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("s", [0.01, 0.05, 0.3, 1.3e-4])
def test_bit_exact_random(which, exact, s):
    fn, ref = FUNCS[which]
    rng = np.random.default_rng(int(s * 1e6) + 7 * exact)
    spread = 127 if s > 1e-3 else 20000
    for shape in [(1, 1), (3, 1), (4, 7), (2, 3, 33), (2, 130)]:
        x = int_logits(rng, shape, s, spread)
        ob = int(rng.choice([8, 16, 4]))
        same(fn(x, s, ob, exact=exact), ref(x, s, ob, exact=exact))


@pytest.mark.parametrize("which", ["ivit", "ibert"])
@pytest.mark.parametrize("exact", [False, True])
def test_bit_exact_masks_and_specials(which, exact):
    fn, ref = FUNCS[which]
    rng = np.random.default_rng(3)
    s = 0.04
    x = int_logits(rng, (8, 20), s)
    x[0, 3] = -np.inf  # masked by value
    x[1, :] = -np.inf  # fully masked row -> NaN
    x[2, 5] = np.nan  # NaN row
    x[3, 7] = np.inf  # +inf row -> NaN
    x[4, 0] = -1e4 * np.float32(s)  # far below the exponent floor n * x0
    mask = rng.random((8, 20)) < 0.75
    mask[5] = False
    mask[5, 2] = True  # a single visible entry
    got, st = fn(x, s, 8, exact=exact, mask=mask, return_stats=True)
    want = ref(x, s, 8, exact=exact, vis=mask)
    same(got, want)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all() and np.isnan(got[3]).all()
    assert (got[~mask & ~np.isnan(got)] == 0).all()
    assert st.rows == 8 and st.empty_rows == 1 and st.nan_rows == 2
    assert st.floor_clamped >= (1 if mask[4, 0] else 0)


def test_tiny_scales_exact_wide_products():
    # I-BERT exact with c_int ~ 2.8e12: e16 = RNE(z m / 2**k) needs a 93-bit product
    rng = np.random.default_rng(5)
    for s in (3e-5, 1e-6):
        x = int_logits(rng, (5, 40), s, spread=2_000_000)
        same(ibert_softmax(x, s, exact=True), ibert_ref(x, s, exact=True))
        same(ivit_shiftmax(x, s, exact=True), ivit_ref(x, s, exact=True))
        same(ibert_softmax(x, s), ibert_ref(x, s))
        same(ivit_shiftmax(x, s), ivit_ref(x, s))


def test_float_and_exact_orders_agree_mostly():
    rng = np.random.default_rng(6)
    s = 0.05
    x = int_logits(rng, (300, 64), s)
    for which in ("ivit", "ibert"):
        fn, _ = FUNCS[which]
        d = np.abs(fn(x, s) - fn(x, s, exact=True))
        assert (d > 0).mean() < 0.01 and d.max() <= 1, which


@pytest.mark.parametrize("which", ["ivit", "ibert"])
def test_accuracy_against_softmax(which):
    rng = np.random.default_rng(8)
    s = 0.03
    x = int_logits(rng, (200, 64), s)
    x64 = x.astype(np.float64)
    p = np.exp(x64 - x64.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    fn, _ = FUNCS[which]
    # measured max |error| 0.0196 / 0.0164 (I-ViT, 8 / 16 bits) and 0.0118 / 0.0104 (I-BERT):
    # I-ViT's exp2 is a linear fit per octave; both round ln 2 / s to an integer
    # (x0 = floor(-0.6931 / 0.03) = -24 stands for 0.72 nats); floors lose an output unit
    tol = {"ivit": 0.025, "ibert": 0.015}[which]
    for ob in (8, 16):
        y = fn(x, s, ob) * UNIT[which](ob)
        assert np.abs(y - p).max() < tol, (ob, np.abs(y - p).max())


def test_known_values():
    # one visible entry: e = |x0| 2**15 (I-ViT), f = floor(2**31 / e), y = e f >> 24 = 127
    y = ivit_shiftmax(np.array([[0.0]], np.float32), 0.1)
    assert y[0, 0] == 127
    y = ivit_shiftmax(np.array([[0.0]], np.float32), 0.1, out_bits=16)
    assert y[0, 0] == (10 * 2**15 * (2**31 // (10 * 2**15))) >> 16
    # two equal logits: e16 = 32767 each, f = floor(2**32 / 65534), y = 32767 f >> 24 = 127
    y = ibert_softmax(np.array([[0.5, 0.5]], np.float32), 0.05, exact=True)
    assert y[0, 0] == y[0, 1] == (32767 * (2**32 // 65534)) >> 24 == 127
    # float32 order: s16 rounding gives e16 = 32766, and fl32(32766 * 65540) = 2**31 -> 128
    y = ibert_softmax(np.array([[0.5, 0.5]], np.float32), 0.05)
    assert y[0, 0] == y[0, 1] == 128


def test_stats_sum_clamp_and_merge():
    # a fine scale makes e = |x0| 2**15 large: a flat row of 64 overflows 2**31 - 1
    x = np.zeros((2, 64), np.float32)
    y, st = ivit_shiftmax(x, 1e-4, return_stats=True)
    assert st.sum_clamped == 2 and isinstance(st, BaselineStats)
    # f = floor(2**31 / 2**31) = 1: the row sums to Z / 2**31 (here 64 * 10000 * 2**15 / 2**31)
    assert y[0, 0] == (10000 * 2**15) >> 24 and y.sum(axis=1).max() * 2**-7 > 9
    y2, st2 = ivit_shiftmax(x, 1e-4, exact=True, return_stats=True)
    assert st2.sum_clamped == 2
    tot = st + st2
    assert tot.calls == 2 and tot.rows == 4
    assert json.loads(json.dumps(tot.to_dict()))["sum_clamped"] == 4
    x = np.array([[0.0, -10.0, -25.0, -30.0]], np.float32)  # floor: 30 * -14 * 0.05 = -21
    _, st = ibert_softmax(x, 0.05, return_stats=True)
    assert st.floor_clamped == 2 and st.zero_outputs >= 1


def test_errors():
    x = np.zeros((2, 4), np.float32)
    for fn in (ivit_shiftmax, ibert_softmax):
        with pytest.raises(ValueError, match="scale"):
            fn(x, 0.0)
        with pytest.raises(ValueError, match="scale"):
            fn(x, float("nan"))
        with pytest.raises(TypeError, match="scale"):
            fn(x, True)
        with pytest.raises(ValueError, match="out_bits"):
            fn(x, 0.1, 1)
        with pytest.raises(ValueError, match="out_bits"):
            fn(x, 0.1, 17)
        with pytest.raises(TypeError, match="dtype"):
            fn(np.zeros((2, 4), np.int32), 0.1)
        with pytest.raises(TypeError, match="bool"):
            fn(x, 0.1, mask=np.ones((2, 4)))
        with pytest.raises(ValueError, match="broadcast"):
            fn(x, 0.1, mask=np.ones((3, 4), bool))
        with pytest.raises(ValueError, match="int32"):
            fn(np.array([[1e6, 0.0]], np.float32), 1e-4, exact=True)
        with pytest.raises(TypeError, match="exact"):
            fn(x, 0.1, exact=1)
    with pytest.raises(ValueError, match="too large"):
        ibert_softmax(x, 2.0)
    with pytest.raises(ValueError, match="too small"):
        ibert_softmax(x, 1e-10, exact=True)


def test_torch_roundtrip():
    torch = pytest.importorskip("torch")
    x = torch.tensor([[0.0, 0.1, -0.2]], dtype=torch.float32)
    y = ivit_shiftmax(x, 0.05)
    assert isinstance(y, torch.Tensor)
    same(y.numpy(), ivit_ref(x.numpy(), 0.05))


# ------------------------------------------------------------------------- attention schemes


# the schemes' defaults (attention.md 7 leaves them open): I-ViT's models run 8-bit logits and
# IntSoftmax(16); I-BERT feeds the int32 scores and outputs 8 bits
SCHEME_DEFAULTS = {"ivit": {"out_bits": 16, "logit_bits": 8},
                   "ibert": {"out_bits": 8, "logit_bits": None}}


def pipeline_ref(q, k, v, which, out_bits=None, exact=False, causal=False, mask=None,
                 logit_bits="default"):
    """The scheme composed from lp.encode, int64 numpy GEMMs and the references."""
    if out_bits is None:
        out_bits = SCHEME_DEFAULTS[which]["out_bits"]
    if logit_bits == "default":
        logit_bits = SCHEME_DEFAULTS[which]["logit_bits"]
    Lq, d = q.shape[-2:]
    Lk = k.shape[-2]
    enc = [lp.encode(a, "int8") for a in (q, k, v)]
    q8, k8, v8 = (e.codes.astype(np.int64) for e in enc)
    s_q, s_k, s_v = (float(e.scales.reshape(-1)[0]) for e in enc)
    S = q8 @ np.swapaxes(k8, -1, -2)
    vis = np.ones(S.shape, bool)
    if causal:
        vis &= np.arange(Lk)[None, :] <= np.arange(Lq)[:, None] + (Lk - Lq)
    if mask is not None:
        vis &= mask
    s_in = np.float32(np.float64(s_q) * np.float64(s_k) / math.sqrt(d))
    x = (S.astype(np.float64) * np.float64(s_in)).astype(np.float32)
    if logit_bits is not None:
        qmax = 2 ** (logit_bits - 1) - 1
        s_x = np.float32(float(np.abs(x[vis]).max()) / qmax)
        xi = np.clip(np.rint(x.astype(np.float64) / np.float64(s_x)), -qmax, qmax)
        x = (xi * np.float64(s_x)).astype(np.float32)
        s_in = s_x
    y = FUNCS[which][1](x, float(s_in), out_bits, exact=exact, vis=vis)
    bad = np.isnan(y).any(axis=-1)
    P = np.where(vis & ~bad[..., None], y, 0).astype(np.int64)
    O = P @ v8
    out = (O.astype(np.float64) * (np.float64(s_v) * UNIT[which](out_bits))).astype(np.float32)
    out[bad] = np.nan
    return out


@pytest.mark.parametrize("which", ["ivit", "ibert"])
@pytest.mark.parametrize("opts", [{}, {"causal": True, "out_bits": 16},
                                  {"exact": True, "logit_bits": 8}, {"logit_bits": 8},
                                  {"logit_bits": None, "out_bits": 8}])
def test_attention_bit_exact(which, opts):
    rng = np.random.default_rng(12)
    q = (rng.normal(size=(2, 2, 7, 8)) * 2).astype(np.float32)
    k = (rng.normal(size=(2, 2, 10, 8)) * 2).astype(np.float32)
    v = rng.normal(size=(2, 2, 10, 4)).astype(np.float32)
    out, st = lp.attention(q, k, v, which, return_stats=True, **opts, **TENSOR)
    causal = opts.pop("causal", False)
    same(out, pipeline_ref(q, k, v, which, causal=causal, **opts))
    assert isinstance(st, BaselineStats) and st.rows == 2 * 2 * 7


@pytest.mark.parametrize("which", ["ivit", "ibert"])
def test_attention_mask_bit_exact(which):
    rng = np.random.default_rng(13)
    q, k, v = (rng.normal(size=(3, 6, 8)).astype(np.float32) for _ in range(3))
    mask = rng.random((3, 6, 6)) < 0.7
    mask[1, 2] = False
    out = lp.attention(q, k, v, which, attn_mask=mask, **TENSOR)
    same(out, pipeline_ref(q, k, v, which, mask=mask))
    assert np.isnan(out[1, 2]).all()


def test_attention_error_bounds():
    rng = np.random.default_rng(14)
    q, k, v = (rng.normal(size=(2, 4, 64, 32)).astype(np.float32) for _ in range(3))
    ref = lp.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                       "reference")

    def rel(**kw):
        o = lp.attention(q, k, v, **kw)
        return float(np.sqrt(np.mean((o - ref) ** 2) / np.mean(ref**2)))

    # measured 0.017, 0.036, 0.093: documented bounds with margin
    assert rel(scheme="ibert", out_bits=16) < 0.03
    assert rel(scheme="ivit", out_bits=16, logit_bits=8) < 0.06
    assert rel(scheme="ivit") == rel(scheme="ivit", out_bits=16, logit_bits=8)  # the default
    assert rel(scheme="ibert") < 0.15
    # I-ViT on the fine int32 logit scale: the row sum clamps at 2**31 - 1 and mass is lost
    _, st = lp.attention(q, k, v, "ivit", return_stats=True, logit_bits=None, out_bits=8)
    assert st.sum_clamped > 0


def test_ivit_long_rows():
    # issue 4: the spec's literal composition (int32 logits, 8-bit P) clamps every row sum at
    # 2**31 - 1 on long rows (f = 1, rows sum to Z / 2**31 >> 1); the default (I-ViT's 8-bit
    # logits, 16-bit P) does not, and stays within a few % of float64 attention
    rng = np.random.default_rng(17)
    q, k, v = (rng.normal(size=(1, 1, 2048, 64)).astype(np.float32) for _ in range(3))
    ref = lp.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                       "reference")

    def rel(o):
        return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))

    o, st = lp.attention(q, k, v, "ivit", return_stats=True)
    assert st.sum_clamped == 0 and rel(o) < 0.15  # measured 0.08
    o8, st8 = lp.attention(q, k, v, "ivit", return_stats=True, logit_bits=None, out_bits=8)
    assert st8.sum_clamped == st8.rows == 2048 and rel(o8) > 2  # measured 8
    # a clamped row: f = floor(2**31 / 2**31) = 1, y = floor(e / 2**24), so sum(y) 2**-7 is
    # about Z_true / 2**31 (> 1; less the floors) - the published arithmetic, kept as an option
    enc = [lp.encode(a, "int8") for a in (q, k)]
    S = enc[0].codes.astype(np.int64)[0, 0] @ enc[1].codes.astype(np.int64)[0, 0].T
    s_in = np.float32(float(enc[0].scales.reshape(-1)[0]) * float(enc[1].scales.reshape(-1)[0])
                      / 8.0)
    y = ivit_shiftmax((S * np.float64(s_in)).astype(np.float32), float(s_in))
    assert np.median(y.sum(axis=-1) * 2.0**-7) > 2  # measured 6.1


def test_softmax_surrogates():
    rng = np.random.default_rng(15)
    x = rng.normal(size=(3, 5, 40)).astype(np.float32) * 2
    amax = float(np.abs(x).max())
    s = np.float32(amax / 127)
    xi = np.clip(np.rint(x.astype(np.float64) / np.float64(s)), -127, 127)
    xq = (xi * np.float64(s)).astype(np.float32)
    for which in ("ivit", "ibert"):
        p = lp.softmax(x, scheme=which)
        assert p.dtype == np.float32 and p.shape == x.shape
        same(p, (FUNCS[which][1](xq, float(s)) * np.float32(UNIT[which](8))).astype(np.float32))
        p16 = lp.softmax(np.swapaxes(x, 0, 2), scheme=which, axis=0, out_bits=16, scale=0.01)
        x64 = x.astype(np.float64)
        ref = np.exp(x64 - x64.max(axis=-1, keepdims=True))
        ref /= ref.sum(axis=-1, keepdims=True)
        assert np.abs(np.swapaxes(p16, 0, 2) - ref).max() < 0.02
    with pytest.raises(ValueError, match="unknown option"):
        lp.softmax(x, scheme="ivit", logit_bits=8)


@pytest.mark.parametrize("which", ["ivit", "ibert"])
def test_attention_edge_shapes(which):
    rng = np.random.default_rng(16)
    for Lq, Lk in ((1, 1), (3, 1), (0, 4), (4, 0)):
        q = rng.normal(size=(2, Lq, 4)).astype(np.float32)
        k = rng.normal(size=(2, Lk, 4)).astype(np.float32)
        v = rng.normal(size=(2, Lk, 3)).astype(np.float32)
        out = lp.attention(q, k, v, which, **TENSOR)
        assert out.shape == (2, Lq, 3)
        if Lk == 0 and Lq:
            assert np.isnan(out).all()
        if Lk and Lq:
            same(out, pipeline_ref(q, k, v, which))
    with pytest.raises(ValueError, match="logit_bits"):
        lp.attention(q, q, q, which, logit_bits=1, **TENSOR)
