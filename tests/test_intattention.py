"""IntAttention family (specs/attention.md section 3): the integer core bit-exact against the slow
reference ``tests/naive/intattention.py``, the float pipelines against that reference and against
float64 attention, the baselines, errors and statistics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import normal_qkv, rel_err, structured_qkv
from naive import intattention as ref

import lowprec as lp
from lowprec.kernels import intattention as ia

#: the papers' whole-tensor int8 scales, which the naive twins compute (scale_scope=
#: "visible", the default, is checked by the alone-vs-padded tests of test_robustness.py)
TENSOR = {"scale_scope": "tensor"}

SPEC_LUT = [255, 206, 167, 135, 109, 88, 71, 57, 46, 38, 30, 25, 20, 16, 13, 10, 8, 7, 6, 4, 4,
            3, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0]  # attention.md 3, b = 5, c = 6.6


def rand_logits(rng, shape, spread):
    return rng.integers(-spread, spread + 1, size=shape).astype(np.int32)


# ------------------------------------------------------------------------------------------
# LUT and constants


def test_lut_matches_spec_table():
    assert ia.index_lut(5, 6.6).tolist() == SPEC_LUT
    assert ia.index_lut().dtype == np.uint8


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("c", [3.0, 6.6, 10.0])
def test_lut_matches_reference(bits, c):
    t = ia.index_lut(bits, c)
    assert t.tolist() == ref.lut(bits, c)
    assert len(t) == 2**bits and t[0] == 255 and t[-1] == 0
    assert np.all(np.diff(t.astype(int)) <= 0)


def test_deploy_multiplier_and_threshold():
    for T in (1, 7, 100, 3100, 6600, 12345, 2**24 - 1):
        for bits in (2, 5):
            assert ia.deploy_multiplier(T, bits) == ref.deploy_mult(T, bits)
    assert ia.clip_threshold(0.001) == 6600
    assert ia.clip_threshold(6.6 / 2.5) == 2  # half to even
    assert ia.clip_threshold(6.6 / 2.5, deploy=True) == 3  # half up, as the kernel
    np.testing.assert_array_equal(ia.clip_threshold(np.array([0.001, 0.002])), [6600, 3300])


# ------------------------------------------------------------------------------------------
# Integer core: bit-exact against the reference


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 33), (2, 4, 50), (5, 300)])
@pytest.mark.parametrize("rounding", ["floor", "nearest"])
@pytest.mark.parametrize("bits", [2, 5, 8])
def test_core_bitexact_random(shape, rounding, bits):
    rng = np.random.default_rng(hash((shape, rounding, bits)) % 2**32)
    s = rand_logits(rng, shape, 20000)
    cint = int(rng.integers(1, 30000))
    got = ia.index_softmax(s, cint, bits=bits, index_rounding=rounding)
    want = ref.index_softmax(s, cint, bits, rounding)
    assert got.dtype == np.uint8 and got.shape == s.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("c_int", [1, 2, 31, 62, 1000, 2**31 - 1])
def test_core_extreme_values(c_int):
    big = 2**31 - 1
    s = np.array([[big, -big - 1, 0, 5, big - c_int, -1],
                  [-big - 1] * 6,
                  [7, 7, 7, 7, 7, 7],
                  [0, 1, 2, 3, 4, 2**20]], dtype=np.int32)
    got, st = ia.index_softmax(s, c_int, return_stats=True)
    np.testing.assert_array_equal(got, ref.index_softmax(s, c_int))
    assert st.diff_overflows == 2  # big - (-big - 1) and big - (-1) exceed int32 (exact here)
    assert got[1].tolist() == [42] * 6  # all equal: Z = 1530, 65025 / 1530 = 42.5 -> 42


def test_core_tie_rounds_half_to_even():
    s = np.zeros((1, 6), dtype=np.int32)  # E = 255 each, Z = 1530, 65025 / 1530 = 42.5
    assert ia.index_softmax(s, 100).tolist() == [[42] * 6]
    s = np.zeros((1, 2), dtype=np.int32)  # 65025 / 510 = 127.5 -> 128
    assert ia.index_softmax(s, 100).tolist() == [[128, 128]]


def test_core_mask_and_empty_rows():
    rng = np.random.default_rng(1)
    s = rand_logits(rng, (6, 40), 5000)
    mask = rng.random((6, 40)) < 0.6
    mask[2] = False  # fully masked row
    mask[3] = False
    mask[3, 17] = True  # a single visible key
    got, st = ia.index_softmax(s, 4321, mask=mask, return_stats=True)
    np.testing.assert_array_equal(got, ref.index_softmax(s, 4321, mask=mask))
    assert got[2].tolist() == [0] * 40
    assert got[3, 17] == 255 and got[3].sum() == 255
    assert np.all(got[~mask] == 0)
    assert st.empty_rows == 1 and st.rows == 6 and st.logits == int(mask.sum())
    # a mask that broadcasts (one per column)
    colmask = rng.random(40) < 0.5
    np.testing.assert_array_equal(ia.index_softmax(s, 999, mask=colmask),
                                  ref.index_softmax(s, 999, mask=colmask))


def test_core_per_row_thresholds_and_stats():
    rng = np.random.default_rng(2)
    s = rand_logits(rng, (2, 3, 25), 3000)
    cint = rng.integers(1, 4000, size=(2, 3))
    got, st = ia.index_softmax(s, cint, return_stats=True)
    np.testing.assert_array_equal(got, ref.index_softmax(s, cint))
    # clipped = visible logits with rowmax - S >= c_int, counted independently
    d = s.max(axis=-1, keepdims=True).astype(np.int64) - s
    assert st.clipped == int(np.count_nonzero(d >= cint[..., None]))
    assert st.logits == s.size and st.rows == 6
    cint_b = rng.integers(1, 4000, size=(3,))  # broadcast over the leading dim
    np.testing.assert_array_equal(ia.index_softmax(s, cint_b), ref.index_softmax(s, cint_b))


@pytest.mark.parametrize("L", [1, 15, 16, 40, 300, 517])
@pytest.mark.parametrize("neon_tail", [False, True])
def test_core_deploy_bitexact(L, neon_tail):
    rng = np.random.default_rng(L + 7 * neon_tail)
    s = rand_logits(rng, (4, L), 4000)
    s[1] = 0  # flat row: Z = 255 L, wraps the uint16 sum for L >= 258
    cint = rng.integers(100, 9000, size=4)
    got, st = ia.index_softmax(s, cint, deploy=True, neon_tail=neon_tail, return_stats=True)
    want = ref.index_softmax(s, cint, deploy=True, neon_tail=neon_tail)
    np.testing.assert_array_equal(got, want)
    # wraps counted independently: rows whose exact LUT sum exceeds 65535
    lut = np.array(ref.lut(5, 6.6))
    z = []
    for r in range(4):
        row = [int(x) for x in s[r]]
        m = max(row)
        mult = ref.deploy_mult(int(cint[r]), 5)
        tail = (L // 16) * 16 if neon_tail else L
        idx = [(min(m - x, int(cint[r])) * mult + (2**25 if j < tail else 0)) >> 26
               for j, x in enumerate(row)]
        z.append(int(lut[idx].sum()))
    assert st.uint16_wraps == sum(zz >= 65536 for zz in z)


def test_deploy_flat_row_wraps():
    s = np.zeros((1, 300), dtype=np.int32)  # Z = 76500 -> 10964 after the uint16 wrap
    p, st = ia.index_softmax(s, 6600, deploy=True, return_stats=True)
    ns = int(np.float32(65280) / np.float32(10964) + np.float32(0.5))  # 6
    assert ns == 6
    assert p.tolist() == [[(255 * ns + 128) >> 8] * 300]
    assert st.uint16_wraps == 1 and st.wrap_rate == 1.0 and st.reciprocal_overflows == 0
    # the simulation does not wrap: RNE(65025 / 76500) = 1
    assert ia.index_softmax(s, 6600).tolist() == [[1] * 300]


def test_deploy_early_exit_and_reciprocal_overflow():
    # T = 3100: idx = round(D * 671089 / 2**26) = D / 100 for these D
    row = [0] * 257 + [-500, -1400]  # Z = 257 * 255 + 88 + 13 = 65636 -> Z16 = 100
    s = np.array([row], dtype=np.int32)
    p, st = ia.index_softmax(s, 3100, deploy=True, return_stats=True)
    np.testing.assert_array_equal(p, ref.index_softmax(s, 3100, deploy=True))
    ns = (int(np.float32(65280) / np.float32(100) + np.float32(0.5))) % 256  # 653 % 256
    assert ns == 141 and p[0, 0] == (255 * ns + 128) >> 8
    assert st.uint16_wraps == 1 and st.reciprocal_overflows == 1
    # Z = 255 exactly (every other key clipped): the kernel's early exit keeps P = E
    s2 = np.array([[0, -5000, -9000]], dtype=np.int32)
    assert ia.index_softmax(s2, 3100, deploy=True).tolist() == [[255, 0, 0]]
    # Z16 = 0: 257 * 255 + 1 * 255 ... choose 256 flat keys + E = 256 impossible; use 257 keys
    # of 255 and one E = 1 (idx 25..29 -> D = 2500): Z = 65535 + 1 = 65536 -> Z16 = 0
    s3 = np.array([[0] * 257 + [-2500]], dtype=np.int32)
    p3, st3 = ia.index_softmax(s3, 3100, deploy=True, return_stats=True)
    np.testing.assert_array_equal(p3, ref.index_softmax(s3, 3100, deploy=True))
    assert p3[0, 0] == (255 * 255 + 128) >> 8 and st3.reciprocal_overflows == 1


def test_core_int8_p_format_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    s = rand_logits(rng, (3, 20), 2000)
    p8 = ia.index_softmax(s, 1500, p_format="int8")
    assert p8.dtype == np.int8
    np.testing.assert_array_equal(p8, ref.index_softmax(s, 1500, pmax=127))
    pt = ia.index_softmax(torch.from_numpy(s), 1500)
    assert isinstance(pt, torch.Tensor) and pt.dtype == torch.uint8
    np.testing.assert_array_equal(pt.numpy(), ia.index_softmax(s, 1500))
    # other integer dtypes are accepted
    np.testing.assert_array_equal(ia.index_softmax(s.astype(np.int64), 1500),
                                  ia.index_softmax(s, 1500))


def test_core_single_key_and_probability_mass():
    s = np.arange(-8, 0, dtype=np.int32).reshape(8, 1)
    assert ia.index_softmax(s, 10).tolist() == [[255]] * 8
    rng = np.random.default_rng(4)
    s = rand_logits(rng, (50, 64), 3000)
    p = ia.index_softmax(s, 3000).astype(int)
    # rows sum to 255 up to one rounding unit per key
    assert np.all(np.abs(p.sum(axis=1) - 255) <= 64 // 2 + 1)


def test_core_close_to_float_softmax():
    rng = np.random.default_rng(5)
    alpha = 1e-3
    s = rand_logits(rng, (20, 128), 4000)  # logits in [-4, 4] natural units
    p = ia.index_softmax(s, ia.clip_threshold(alpha), index_rounding="nearest") / 255.0
    x = s * alpha
    e = np.exp(x - x.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    assert np.abs(p - sm).max() < 0.03  # LUT step c / 31 = 0.21 in log units, 8-bit P


def test_core_errors():
    s = np.zeros((2, 3), dtype=np.int32)
    with pytest.raises(TypeError, match="integer dtype"):
        ia.index_softmax(s.astype(np.float32), 10)
    with pytest.raises(TypeError, match="c_int"):
        ia.index_softmax(s, 10.0)
    with pytest.raises(ValueError, match="c_int must lie"):
        ia.index_softmax(s, 0)
    with pytest.raises(ValueError, match="c_int must lie"):
        ia.index_softmax(s, 2**31)
    with pytest.raises(ValueError, match="broadcast"):
        ia.index_softmax(s, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="bits"):
        ia.index_softmax(s, 10, bits=9)
    with pytest.raises(ValueError, match="index_rounding"):
        ia.index_softmax(s, 10, index_rounding="round")
    with pytest.raises(TypeError, match="mask"):
        ia.index_softmax(s, 10, mask=np.ones((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="mask"):
        ia.index_softmax(s, 10, mask=np.ones((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="p_format"):
        ia.index_softmax(s, 10, p_format="uint4")
    with pytest.raises(ValueError, match="p_format must be 'uint8'"):
        ia.index_softmax(s, 10, deploy=True, p_format="int8")
    with pytest.raises(ValueError, match="neon_tail"):
        ia.index_softmax(s, 10, neon_tail=True)
    with pytest.raises(ValueError, match="bits"):
        ia.index_softmax(s, 10, bits=6, deploy=True)
    with pytest.raises(ValueError, match="c_int must lie"):
        ia.index_softmax(s, 2**24, deploy=True)
    with pytest.raises(ValueError, match="outside int32"):
        ia.index_softmax(np.array([[2**40]], dtype=np.int64), 10)
    with pytest.raises(ValueError, match="c must be"):
        ia.index_softmax(s, 10, c=0.0)
    with pytest.raises(ValueError, match="bits"):
        ia.index_lut(0)
    with pytest.raises(ValueError, match="alpha"):
        ia.clip_threshold(-1.0)


# ------------------------------------------------------------------------------------------
# The intattention pipeline: bit-exact against the reference pipeline


PIPE_CASES = [
    dict(B=2, Lq=5, Lk=7, d=8),
    dict(B=1, Lq=1, Lk=1, d=4),
    dict(B=2, Lq=1, Lk=9, d=4, causal=True),
    dict(B=2, Lq=6, Lk=4, d=4, causal=True),  # first two rows see no key -> NaN
    dict(B=2, Lq=6, Lk=6, d=8, causal=True, granularity="per_channel"),
    dict(B=2, Lq=7, Lk=5, d=8, granularity="per_block", block=3),
    dict(B=2, Lq=4, Lk=20, d=8, deploy=True),
    dict(B=1, Lq=3, Lk=21, d=8, deploy=True, neon_tail=True),
    dict(B=2, Lq=4, Lk=6, d=8, pmax=127),
    dict(B=2, Lq=4, Lk=6, d=8, rounding="nearest", bits=3, c=4.0),
    dict(B=2, Lq=5, Lk=6, d=8, mask=True),
    dict(B=2, Lq=5, Lk=6, d=8, mask=True, causal=True, granularity="per_block", block=2),
    # causal with Lq > Lk (rows that see no key) through the fused row kernel
    dict(B=2, Lq=9, Lk=5, d=8, causal=True, bits=8),
    dict(B=2, Lq=9, Lk=5, d=8, causal=True, pmax=127),
    # long rows: the fused kernel's distance -> index table path
    dict(B=3, Lq=48, Lk=80, d=16),
    dict(B=2, Lq=40, Lk=40, d=16, causal=True, granularity="per_channel", rounding="nearest"),
]


@pytest.mark.parametrize("case", PIPE_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in
                                                                    c.items()))
def test_pipeline_bitexact_vs_reference(case):
    case = dict(case)
    rng = np.random.default_rng(len(str(case)))
    B, Lq, Lk, d = (case.pop(n) for n in ("B", "Lq", "Lk", "d"))
    q, k, v = normal_qkv(rng, B, Lq, Lk, d)
    mask = None
    if case.pop("mask", False):
        mask = (rng.standard_normal((B, Lq, Lk)) * 2).astype(np.float32)
        mask[rng.random((B, Lq, Lk)) < 0.3] = -np.inf
        mask[0, 1, :] = -np.inf  # a fully masked row
        mask[1, 0, 0] = -1e30  # saturates in logit units
    causal = case.pop("causal", False)
    pmax = case.pop("pmax", 255)
    opts = dict(case)
    if "rounding" in opts:
        opts["index_rounding"] = opts.pop("rounding")
    if pmax == 127:
        opts["p_format"] = "int8"
    got, st = lp.attention(q, k, v, "intattention", causal=causal, attn_mask=mask,
                           return_stats=True, **opts, **TENSOR)
    want = ref.intattention(q, k, v, causal=causal, mask=mask, pmax=pmax, **case)
    np.testing.assert_array_equal(got, want)
    assert st.calls == 1 and st.rows == B * Lq
    assert st.empty_rows == int(np.isnan(want[..., 0]).sum())
    if mask is not None:  # -1e30 is below MASK_FLOOR: a masked key (issue 12 item 6)
        assert st.mask_floored >= 1


def test_pipeline_mask_saturates_in_logit_units():
    """A finite mask above MASK_FLOOR that leaves the int32 logit range saturates to
    -(2**30 - 1) (counted), bit-exact against the reference."""
    rng = np.random.default_rng(12)
    q, k, v = normal_qkv(rng, 2, 5, 6, 8)
    q, k = q * 1e-2, k * 1e-2  # logit unit ~2e-8: -1000 is ~-5e10 units (> 2**30)
    mask = np.zeros((2, 5, 6), np.float32)
    mask[1, 0, 0] = -1000.0
    got, st = lp.attention(q, k, v, "intattention", attn_mask=mask, return_stats=True, **TENSOR)
    want = ref.intattention(q, k, v, mask=mask)
    np.testing.assert_array_equal(got, want)
    assert st.mask_saturated >= 1 and st.mask_floored == 0


def test_pipeline_thresholds_recorded():
    rng = np.random.default_rng(11)
    q, k, v = normal_qkv(rng, 3, 10, 12, 16)
    _, st = lp.attention(q, k, v, "intattention", return_stats=True, granularity="per_block",
                         block=4)
    sq = np.array([[ref.int8_scale(q[b, i:i + 4].reshape(-1)) for i in range(0, 10, 4)]
                   for b in range(3)])
    sk = np.array([ref.int8_scale(k[b].reshape(-1)) for b in range(3)])
    alpha = sq.astype(np.float64) * sk.astype(np.float64)[:, None] / 4.0
    np.testing.assert_array_equal(st.c_int[0], np.rint(6.6 / alpha).astype(np.int64))
    assert st.quantized == q.size + k.size + v.size and st.saturated == 0


# ------------------------------------------------------------------------------------------
# Accuracy against float64 attention (documented bounds)


# measured on these seeds (relative L2 error vs float64, random causal / structured):
# intattention 0.074 / 0.057, quant_only 0.071 / 0.038, index_softmax_only 0.062 / 0.049
# (exaq: tests/test_exaq.py); the bounds leave about 40 % margin
BOUNDS = {"intattention": (0.10, 0.08), "quant_only": (0.10, 0.055),
          "index_softmax_only": (0.09, 0.07)}


@pytest.mark.parametrize("scheme", list(BOUNDS))
def test_error_bound_vs_float64(scheme):
    rng = np.random.default_rng(21)
    q, k, v = normal_qkv(rng, 4, 128, 128, 64)
    want = lp.attention(q, k, v, "reference", causal=True).astype(np.float64)
    got = lp.attention(q, k, v, scheme, causal=True)
    b_rand, b_struct = BOUNDS[scheme]
    assert rel_err(got, want) < b_rand
    qs, ks, vs = structured_qkv(rng, 4, 128, 64)
    want = lp.attention(qs, ks, vs, "reference").astype(np.float64)
    assert rel_err(lp.attention(qs, ks, vs, scheme), want) < b_struct


def test_uint8_p_beats_int8_p():  # Table 9
    rng = np.random.default_rng(22)
    for q, k, v in (normal_qkv(rng, 4, 128, 128, 64), structured_qkv(rng, 4, 128, 64)):
        want = lp.attention(q, k, v, "reference").astype(np.float64)
        e_u = rel_err(lp.attention(q, k, v, "intattention", p_format="uint8"), want)
        e_i = rel_err(lp.attention(q, k, v, "intattention", p_format="int8"), want)
        assert e_u < e_i


def test_per_block_helps_outlier_rows():
    rng = np.random.default_rng(23)
    q, k, v = normal_qkv(rng, 2, 256, 256, 64)
    q[:, :8] *= 30.0  # a few outlier query tokens inflate the per-tensor q scale
    want = lp.attention(q, k, v, "reference").astype(np.float64)
    e_t = rel_err(lp.attention(q, k, v, "intattention"), want)
    e_b = rel_err(lp.attention(q, k, v, "intattention", granularity="per_block", block=32),
                  want)
    assert e_b < e_t


def test_long_flat_rows_underflow_and_deploy_wraps():
    rng = np.random.default_rng(24)
    q, k, v = normal_qkv(rng, 1, 16, 1024, 64, amp=0.3)  # flat attention over 1024 keys
    want = lp.attention(q, k, v, "reference").astype(np.float64)
    # simulation: every probability is about 1/1024 < 0.5/255, so every P rounds to 0 and the
    # output is 0 (relative error 1): the 8-bit P cannot carry flat rows longer than ~510 keys
    sim = lp.attention(q, k, v, "intattention")
    assert np.all(sim == 0) and rel_err(sim, want) == pytest.approx(1.0)
    # deploy: the uint16 row sum wraps in every row and the output drifts far away
    dep, st = lp.attention(q, k, v, "intattention", deploy=True, return_stats=True)
    assert st.uint16_wraps == 16 and st.wrap_rate == 1.0
    assert rel_err(dep, want) > 3.0


# ------------------------------------------------------------------------------------------
# Pipeline errors and input kinds


def test_pipeline_errors():
    rng = np.random.default_rng(31)
    q, k, v = normal_qkv(rng, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="does not fit int32"):
        lp.attention(q * 1e-20, k * 1e-20, v, "intattention")
    with pytest.raises(ValueError, match="< 1"):
        lp.attention(q * 1e4, k * 1e4, v, "intattention")
    bad = q.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        lp.attention(bad, k, v, "intattention")
    with pytest.raises(ValueError, match="granularity"):
        lp.attention(q, k, v, "intattention", granularity="per_row")
    with pytest.raises(ValueError, match="block"):
        lp.attention(q, k, v, "intattention", granularity="per_block", block=0)
    with pytest.raises(ValueError, match="p_format"):
        lp.attention(q, k, v, "intattention", p_format="fp8")
    with pytest.raises(ValueError, match="bits"):
        lp.attention(q, k, v, "intattention", bits=6, deploy=True)
    with pytest.raises(ValueError, match="unknown option"):
        lp.attention(q, k, v, "intattention", tau=1)
    with pytest.raises(ValueError, match="scale > 0"):
        lp.attention(q, k, v, "intattention", scale=-1.0)
    with pytest.raises(TypeError, match="deploy"):
        lp.attention(q, k, v, "intattention", deploy=1)


def test_pipeline_torch_and_dtypes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(32)
    q, k, v = normal_qkv(rng, 2, 6, 6, 8)
    want = lp.attention(q, k, v, "intattention")
    got = lp.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                       "intattention")
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), want)
    h = lp.attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                     "intattention")
    assert h.dtype == np.float16
    # leading dims (batch, heads) and a broadcast k/v
    q4 = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    k4 = rng.standard_normal((2, 1, 5, 8)).astype(np.float32)
    out = lp.attention(q4, k4, k4, "intattention", granularity="per_channel")
    assert out.shape == (2, 3, 5, 8)


def test_zero_inputs_and_constant_rows():
    q = np.zeros((1, 3, 4), dtype=np.float32)
    k = np.zeros((1, 5, 4), dtype=np.float32)
    v = np.arange(20, dtype=np.float32).reshape(1, 5, 4)
    out = lp.attention(q, k, v, "intattention")  # uniform attention: mean of v (8-bit P)
    assert np.allclose(out, v.mean(axis=1, keepdims=True), rtol=0.02)


# ------------------------------------------------------------------------------------------
# Baselines and softmax surrogates


def test_index_softmax_float_bitexact():
    rng = np.random.default_rng(41)
    x = (rng.standard_normal((30, 37)) * 3).astype(np.float32)
    x[3, 5] = -np.inf
    x[4, :] = -np.inf  # no finite entry -> NaN
    x[5, 2] = np.nan  # NaN row
    x[6, :] = 1.5  # constant row
    for bits, c, rnd in ((5, 6.6, "floor"), (3, 4.0, "nearest"), (8, 9.0, "floor")):
        got = ia.index_softmax_float(x, bits=bits, c=c, index_rounding=rnd)
        want = np.array([ref.float_softmax_row(r, bits, c, rnd) for r in x], dtype=np.float32)
        np.testing.assert_array_equal(got, want)
    p = lp.softmax(x.T, "index_softmax", axis=0)
    np.testing.assert_array_equal(p.T, ia.index_softmax_float(x))
    assert np.allclose(np.nansum(p[:, 7:], axis=0), 1.0, atol=1e-5)


def test_index_softmax_only_matches_composition():
    rng = np.random.default_rng(42)
    q, k, v = normal_qkv(rng, 2, 9, 11, 8)
    got = lp.attention(q, k, v, "index_softmax_only", causal=True)
    s = (np.einsum("bqd,bkd->bqk", q.astype(np.float64), k.astype(np.float64)) /
         math.sqrt(8)).astype(np.float32)
    vis = ref.visible(9, 11, True, None)
    s = np.where(vis, s, -np.inf).astype(np.float32)
    p = np.array([[ref.float_softmax_row(r) for r in s[b]] for b in range(2)], np.float32)
    want = np.einsum("bqk,bkd->bqd", p.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _quant_only_ref(q, k, v, causal):
    B, Lq, d = q.shape
    Lk = k.shape[1]
    q8, sq = ref.quantize_groups(q, "per_tensor")
    k8, sk = ref.quantize_groups(k, "per_tensor")
    v8, sv = ref.quantize_groups(v, "per_tensor")
    scale = np.float32(1 / math.sqrt(d))
    out = np.zeros((B, Lq, v.shape[2]), np.float32)
    vis = ref.visible(Lq, Lk, causal, None)
    for b in range(B):
        for i in range(Lq):
            sc = []
            for j in range(Lk):
                S = np.float32(sum(int(q8[b, i, t]) * int(k8[b, j, t]) for t in range(d)))
                sc.append(((S * scale) * sq[b, i]) * sk[b, 0])
            xs = [float(x) for x, ok in zip(sc, vis[i], strict=True) if ok]
            m = max(xs)
            z = sum(math.exp(x - m) for x in xs)
            P = [round(float(np.float32(np.float32(math.exp(float(x) - m) / z) *
                                        np.float32(127)))) if ok else 0
                 for x, ok in zip(sc, vis[i], strict=True)]
            for t in range(v.shape[2]):
                acc = sum(P[j] * int(v8[b, j, t]) for j in range(Lk))
                out[b, i, t] = np.float32(acc * float(sv[b, 0]) / 127)
    return out


def test_quant_only_matches_reference():
    rng = np.random.default_rng(43)
    q, k, v = normal_qkv(rng, 2, 6, 9, 8)
    got, st = lp.attention(q, k, v, "quant_only", causal=True, return_stats=True, **TENSOR)
    np.testing.assert_allclose(got, _quant_only_ref(q, k, v, True), rtol=1e-6, atol=1e-7)
    assert st.quantized == q.size + k.size + v.size
    out = lp.attention(q, k, v, "quant_only", granularity="per_channel", **TENSOR)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("scheme", ["quant_only", "index_softmax_only"])
def test_baselines_masks(scheme):
    rng = np.random.default_rng(46)
    q, k, v = normal_qkv(rng, 2, 6, 4, 8)
    out = lp.attention(q, k, v, scheme, causal=True)  # Lq > Lk: first two rows see no key
    assert np.isnan(out[:, :2]).all() and np.isfinite(out[:, 2:]).all()
    m = np.ones((2, 6, 4), dtype=bool)
    m[1, 3] = False
    out = lp.attention(q, k, v, scheme, attn_mask=m)
    assert np.isnan(out[1, 3]).all() and np.isfinite(out[0]).all()
    assert np.isfinite(np.delete(out[1], 3, axis=0)).all()


def test_registered_and_stats_merge():
    assert {"intattention", "quant_only", "index_softmax_only"} <= set(lp.schemes())
    assert {"index_softmax"} <= set(lp.schemes("softmax"))
    rng = np.random.default_rng(51)
    q, k, v = normal_qkv(rng, 2, 8, 8, 8)
    _, a = lp.attention(q, k, v, "intattention", return_stats=True)
    _, b = lp.attention(q, k, v, "intattention", causal=True, return_stats=True)
    m = a + b
    assert isinstance(m, ia.IntAttentionStats) and m.calls == 2
    assert m.logits == 2 * 64 + 2 * 36 and len(m.c_int) == 2 and sum([a, b]).calls == 2
    d = m.to_dict()
    json.dumps(d)
    assert 0.0 <= d["clip_rate"] <= 1.0 and d["head_logits"][1] == [36, 36]
    with pytest.raises(TypeError):
        _ = a + lp.stats.BapsStats()


# ------------------------------------------------------------------------------------------
# Studies (tiny sizes)


def test_studies_smoke():
    from lowprec.studies import intattention as study

    t9 = study.table9(heads=2, L=64, d=16)
    for name in study.WORKLOADS:
        for level in ("P", "out"):
            u, i = t9[name][level]["uint8"], t9[name][level]["int8"]
            assert u["rmse"] < i["rmse"] and u["cos"] > i["cos"]
    assert "paper" in study.format_table9(t9)
    f9 = study.figure9(bits=(2, 5), cs=(3.0, 6.6), heads=1, L=64, d=16)
    assert f9["rel_l2"].shape == (2, 2) and f9["rel_l2"][0, 1] > f9["rel_l2"][1, 1]
    assert f9["plateau"][f9["near_opt"]].all()
    assert "paper: plateau b >= 4" in study.format_figure9(f9)
    f0 = study.figure9(bits=(4, 5), cs=(6.6,), heads=1, L=64, d=16, spread=10.0,
                       plateau_tol=0.0)
    assert f0["plateau"].sum() == 1 and f0["plateau_tol"] == 0.0
    assert not np.array_equal(f0["rel_l2"][1], f9["rel_l2"][1, 1:])  # spread changes the input
    with pytest.raises(ValueError, match="plateau_tol"):
        study.figure9(bits=(4,), cs=(6.6,), heads=1, L=16, d=8, plateau_tol=-1.0)
    with pytest.raises(ValueError, match="workload"):
        study.workload("sinusoidal")
