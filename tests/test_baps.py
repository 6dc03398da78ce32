"""BAPS (specs/attention.md section 2; seed baps.txt sections 3-4 and appendix A.1).

* the Numba engine equals the slow twin of ``tests/naive/attention.py`` bit for bit, with the
  same per-tile flags and restarted-row counts, for every configuration and option;
* properties of ``e2e_hif8`` (hypothesis): exact power-of-two rescaling, restart counts that
  never grow with tau, no restart when the critical tile holds every row maximum;
* ``exp2_in_format`` against the explicit chain on every input code, computed with the peer
  libraries (ml_dtypes, en-dtypes); ``restart_threshold``; the statistics objects;
* accuracy and restart behaviour on a causal attention-sink workload.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise

import conftest
import en_dtypes
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import attention as AR
from naive import formats as R

import lowprec as lp
from lowprec.kernels.baps import exp2_in_format, exp2_table, restart_threshold
from lowprec.stats import BapsStats

BF16 = np.dtype(ml_dtypes.bfloat16)
PEERS = {"hif8": en_dtypes.hifloat8, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2}
EXP2_PAIRS = [("hif8", "hif8"), ("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2")]


def rand_qkv(B, Lq, Lk, d, dv, seed=0, amp=2.0):
    return conftest.rand_qkv(B, Lq, Lk, d, dv, seed, amp)


def same_bits(a, b) -> bool:
    return conftest.same_bits(a, b, dtype=False)


def run_both(q, k, v, **kw):
    """Kernel (with stats) and twin on the same call; asserts they agree bit for bit."""
    out, stats = lp.attention(q, k, v, "baps", return_stats=True, **kw)
    tw = AR.twin_attention(q, k, v, scheme="baps", **kw)
    assert same_bits(out, tw.out), f"output differs from the twin ({kw})"
    assert np.array_equal(stats.flags[0], tw.flags), f"flags differ ({kw})"
    assert np.array_equal(stats.row_restarts[0], tw.row_restarts), f"row restarts differ ({kw})"
    return out, stats, tw


# ------------------------------------------------------------------------------------------
# the engine equals the twin, bit for bit

CASES = ["partial", "causal", "causal_tall", "L1", "masked", "additive"]


def _case(name):
    """Small problems: partial tiles, causal with Lq < Lk and Lq > Lk, L = 1, masks."""
    rng = np.random.default_rng(CASES.index(name))
    if name == "partial":
        q, k, v = rand_qkv(2, 19, 37, 8, 5, seed=1)
        return q, k, v, dict(block_q=8, block_k=8)
    if name == "causal":
        q, k, v = rand_qkv(2, 19, 37, 8, 5, seed=2)
        return q, k, v, dict(block_q=8, block_k=8, causal=True)
    if name == "causal_tall":  # Lq > Lk: the first rows see no key (NaN)
        q, k, v = rand_qkv(1, 23, 9, 6, 4, seed=3)
        return q, k, v, dict(block_q=4, block_k=4, causal=True)
    if name == "L1":
        q, k, v = rand_qkv(2, 1, 13, 4, 3, seed=4)
        return q, k, v, dict(block_q=4, block_k=5)
    if name == "masked":  # random boolean mask, a fully masked row and a fully masked tile
        q, k, v = rand_qkv(2, 12, 20, 6, 3, seed=5)
        m = rng.random((2, 12, 20)) < 0.7
        m[0, 3] = False
        m[1, :4, 5:10] = False
        return q, k, v, dict(block_q=4, block_k=5, attn_mask=m)
    if name == "additive":  # finite bias + -inf, shared by the batch
        q, k, v = rand_qkv(2, 10, 17, 5, 3, seed=6)
        bias = (rng.standard_normal((10, 17)) * 3).astype(np.float32)
        bias[rng.random((10, 17)) < 0.2] = -np.inf
        return q, k, v, dict(block_q=3, block_k=6, attn_mask=bias, causal=True)
    raise KeyError(name)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("config", AR.ALL_CONFIGS)
def test_engine_equals_twin_every_config(config, case):
    q, k, v, kw = _case(case)
    run_both(q, k, v, config=config, **kw)


E2E_OPTIONS = [
    dict(tau=0), dict(tau=1), dict(tau=2), dict(tau=3),
    dict(critical="first+last"), dict(critical="first+diagonal"),
    dict(critical=[2, 0, 2]), dict(critical=[3]), dict(critical=[1, 3], tau=0),
    dict(max_round="ceil"), dict(max_round="ceil", tau=0),
    dict(granularity="row"), dict(granularity="row", tau=0, critical="first+last"),
    dict(granularity="row", max_round="ceil", tau=2),
    dict(accum="float16"), dict(accum="bfloat16", tau=0),
    dict(exp2_fp16=False), dict(input_dtype="float32", tau=0),
]


@pytest.mark.parametrize("case", ["partial", "causal", "masked"])
@pytest.mark.parametrize("opts", E2E_OPTIONS, ids=[str(o) for o in E2E_OPTIONS])
def test_engine_equals_twin_e2e_options(opts, case):
    q, k, v, kw = _case(case)
    run_both(q, k, v, config="e2e_hif8", **kw, **opts)


FA2_OPTIONS = [(c, o) for c in ("default", "exp2_hif8", "exp2_e4m3", "exp2_e5m2",
                                "exp2_e4m3xe5m2", "naive_e2e")
               for o in (dict(accum="float16"), dict(accum="bfloat16"), dict(exp2_fp16=False),
                         dict(input_dtype="float32"))
               if not (c == "default" and "exp2_fp16" in o)]


@pytest.mark.parametrize("config,opts", FA2_OPTIONS, ids=[f"{c}-{o}" for c, o in FA2_OPTIONS])
def test_engine_equals_twin_fa2_options(config, opts):
    q, k, v, kw = _case("causal")
    run_both(q, k, v, config=config, **kw, **opts)


@pytest.mark.parametrize("amp", [1e-3, 30.0, 300.0])
@pytest.mark.parametrize("config", AR.ALL_CONFIGS)
def test_engine_equals_twin_extreme_scores(config, amp):
    """Tiny scores (all exp2 near 1) and huge ones (|S| up to ~1e5: exp2 underflow, HiF8 and
    E4M3/E5M2 saturation of the exp2 input, float16 accumulators overflowing)."""
    q, k, v = rand_qkv(1, 9, 14, 4, 3, seed=7, amp=amp)
    for acc in ("float32", "float16"):
        run_both(q, k, v, config=config, block_q=4, block_k=4, accum=acc)


@pytest.mark.parametrize("bq,bk", [(1, 1), (1, 5), (64, 64)])
def test_engine_equals_twin_block_sizes(bq, bk):
    q, k, v = rand_qkv(1, 7, 11, 4, 3, seed=8)
    for config in ("e2e_hif8", "exp2_hif8"):
        run_both(q, k, v, config=config, block_q=bq, block_k=bk, causal=True)


def test_flags_mark_critical_skipped_and_restarted_tiles():
    q, k, v = rand_qkv(1, 16, 24, 4, 3, seed=9, amp=3.0)
    _, st, tw = run_both(q, k, v, config="e2e_hif8", block_q=8, block_k=8, causal=True,
                         critical="first+diagonal", tau=0)
    f = st.flags[0][0]
    # causal, Lq = 16 < Lk = 24: query tile 0 (rows 0-7) sees keys <= 15: tile 2 skipped
    assert f[0, 2] == -2
    assert f[0, 0] == -1 and f[0, 1] == -1  # first and the diagonal tile (key 15 -> tile 1)
    assert f[1, 0] == -1 and f[1, 2] == -1  # rows 8-15: diagonal key 23 -> tile 2
    assert f[1, 1] in (0, 1)
    assert st.tiles[0][0] == 1 and st.restarts[0][0] == (f[1, 1] == 1)


def test_default_within_1e2_of_reference_bf16_inputs():
    rng = np.random.default_rng(10)
    for causal in (False, True):
        q, k, v = (rng.standard_normal((2, 40, 16)).astype(BF16) for _ in range(3))
        out = lp.attention(q, k, v, "baps", config="default", causal=causal, block_q=16,
                           block_k=16)
        assert out.dtype == BF16
        ref = lp.attention(*(a.astype(np.float64) for a in (q, k, v)), "reference",
                           causal=causal)
        err = np.abs(out.astype(np.float64) - ref)
        assert (err <= 1e-2 * np.maximum(np.abs(ref), 1.0)).all()  # bf16 output: ~2**-9 rel
        assert AR.relative_error(out, ref) < 1e-2


# ------------------------------------------------------------------------------------------
# properties of e2e_hif8 (hypothesis, small sizes)

problem = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "Lq": st.integers(1, 10), "Lk": st.integers(1, 24), "d": st.integers(1, 6),
    "bq": st.integers(1, 6), "bk": st.integers(1, 8),
    "amp": st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    "causal": st.booleans(),
})


def _draw(p, dv=2):
    q, k, v = rand_qkv(1, p["Lq"], p["Lk"], p["d"], dv, seed=p["seed"], amp=p["amp"])
    return q, k, v, dict(block_q=p["bq"], block_k=p["bk"], causal=p["causal"])


@settings(max_examples=30, deadline=None)
@given(p=problem, tau=st.integers(0, 3), gran=st.sampled_from(["tile", "row"]),
       mr=st.sampled_from(["rint", "ceil"]),
       crit=st.sampled_from(["first", "first+last", "first+diagonal"]))
def test_e2e_rescale_factors_are_exact_powers_of_two(p, tau, gran, mr, crit):
    q, k, v, kw = _draw(p)
    _, _, tw = run_both(q, k, v, config="e2e_hif8", tau=tau, granularity=gran, max_round=mr,
                        critical=crit, **kw)
    for _, _, _, alpha, m in tw.alphas:
        finite = np.isfinite(m)
        assert np.array_equal(m[finite], np.round(m[finite]))  # integer running max
        assert not np.isnan(m).any() and not (m == np.inf).any()
        for a in alpha:
            a = float(a)
            assert a == 0.0 or (0.0 < a <= 1.0 and math.frexp(a)[0] == 0.5), a


@settings(max_examples=30, deadline=None)
@given(p=problem, mr=st.sampled_from(["rint", "ceil"]))
def test_restart_count_never_increases_with_tau(p, mr):
    """Tile granularity: restarted tiles; row granularity: restarted rows (with multi-row
    tiles the *tile* count of row granularity is not monotone: a tile restarts when any of
    its rows does, and a larger tau can move a restart from one tile to another)."""
    q, k, v, kw = _draw(p)
    for gran in ("tile", "row"):
        counts = []
        for tau in range(4):
            _, s = lp.attention(q, k, v, "baps", config="e2e_hif8", tau=tau, granularity=gran,
                                max_round=mr, return_stats=True, **kw)
            counts.append(s.total_restarts if gran == "tile" else int(s.row_restarts[0].sum()))
        assert all(a >= b for a, b in pairwise(counts)), (gran, counts)


@settings(max_examples=30, deadline=None)
@given(p=problem, where=st.integers(0, 10**6), crit_kind=st.sampled_from(["first", "list"]))
def test_no_restart_when_the_critical_tile_holds_every_row_max(p, where, crit_kind):
    q, k, v, kw = _draw(p)
    Lk, bk = p["Lk"], p["bk"]
    nk = -(-Lk // bk)
    if p["causal"] or crit_kind == "first":
        t, j = 0, 0  # key 0 is visible from every row that sees any key
    else:
        t = where % nk
        j = t * bk + (where // nk) % min(bk, Lk - t * bk)
    # dim 0 carries a score that dominates every other (query, key) pair by a wide margin
    qx = np.concatenate([np.ones((1, p["Lq"], 1), np.float32), q], axis=2)
    kx = np.concatenate([np.zeros((1, Lk, 1), np.float32), k], axis=2)
    noise = float(np.abs(np.einsum("bid,bjd->bij", q.astype(np.float64), k)).max())
    kx[0, j, 0] = 2 * noise + 4
    qx, kx = (a.astype(BF16).astype(np.float32) for a in (qx, kx))
    s = np.einsum("bid,bjd->bij", qx.astype(np.float64), kx)
    vis = AR.dense_visibility(1, p["Lq"], Lk, p["causal"], None)[0]
    rows = vis.any(axis=1)
    assert (s[0, rows, j] > np.where(vis, s[0], -np.inf)[rows].max(axis=1, initial=-np.inf)
            - 1e-9).all()
    critical = "first" if t == 0 else [t]
    for mr, taus in (("rint", (1, 2, 3)), ("ceil", (0, 1, 2, 3))):
        for tau in taus:
            _, s_ = lp.attention(qx, kx, v, "baps", config="e2e_hif8", tau=tau, max_round=mr,
                                 critical=critical, return_stats=True, **kw)
            assert s_.total_restarts == 0, (mr, tau)


# ------------------------------------------------------------------------------------------
# exp2 in format, restart threshold


def _peer_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """Non-saturating default rounding of float32 ``x`` to ``fmt`` by the peer library."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float32).astype(PEERS[fmt]).astype(np.float32)


def _peer_codes_values(fmt: str) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(PEERS[fmt]).astype(np.float32)


@pytest.mark.parametrize("fin,fout", EXP2_PAIRS)
def test_exp2_in_format_on_every_input_code(fin, fout):
    """Algorithm 2: x (a code of fin) -> float16 exactly -> 2**x in float64 -> float16 RNE
    -> fout, computed here with ml_dtypes / en-dtypes and compared with the library on all
    256 codes (NaN codes give NaN)."""
    x = _peer_codes_values(fin)
    assert np.array_equal(x, lp.formats.decode(np.arange(256, dtype=np.uint8), fin),
                          equal_nan=True)
    h = x.astype(np.float16)
    assert np.array_equal(h.astype(np.float32), x, equal_nan=True)  # exact in float16
    with np.errstate(over="ignore"):
        y16 = np.exp2(h.astype(np.float64)).astype(np.float16)
    exp = _peer_round(y16.astype(np.float32), fout)
    got = exp2_in_format(x, fin, fout)
    assert got.dtype == np.float32
    assert np.array_equal(got, exp, equal_nan=True)
    assert np.array_equal(AR.exp2_chain(x, fin, fout), exp, equal_nan=True)
    assert np.array_equal(exp2_table(fin, fout), exp, equal_nan=True)
    # without the float16 step: 2**x rounded straight to fout (twin chain)
    got_nf = exp2_in_format(x, fin, fout, fp16=False)
    assert np.array_equal(got_nf, AR.exp2_chain(x, fin, fout, fp16=False), equal_nan=True)


def test_exp2_in_format_spot_values_and_saturation():
    assert exp2_in_format(np.array([-1.0, -0.3, 0.0]), "hif8").tolist() == [0.5, 0.8125, 1.0]
    # -1000 saturates to -448 in E4M3 (2**-448 -> 0); non-saturating it is NaN
    assert exp2_in_format(np.array([-1000.0]), "e4m3")[0] == 0.0
    assert np.isnan(exp2_in_format(np.array([-1000.0]), "e4m3", saturate=False)[0])
    assert exp2_in_format(np.array([-np.inf]), "hif8")[0] == 0.0
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(500) * 6).astype(np.float32)
    for fin, fout in EXP2_PAIRS:
        assert np.array_equal(exp2_in_format(x, fin, fout), AR.exp2_chain(x, fin, fout),
                              equal_nan=True)
    with pytest.raises(ValueError, match="hif8, e4m3, e5m2"):
        exp2_in_format(x, "e3m4")
    with pytest.raises(ValueError, match="fmt_out"):
        exp2_in_format(x, "hif8", "int8")
    with pytest.raises(TypeError):
        exp2_in_format(x, "hif8", fp16=1)


def _hif8_mant_bits(e: int) -> int:
    """HiF8 mantissa bits of binade 2**e (formats.md 1.1: 3 bits for |e| <= 3, 2 for |e| <= 7,
    1 for |e| <= 15)."""
    return 3 if abs(e) <= 3 else 2 if abs(e) <= 7 else 1


@pytest.mark.parametrize("tau", [0, 1, 2, 3, 4, 5, 7, 8, 16, 100, 1000])
def test_restart_threshold(tau):
    thr = restart_threshold(tau)
    if tau == 0:
        exp = 2.0 ** -23  # half the smallest HiF8 value 2**-22, ties away from zero
    else:  # midpoint between the largest HiF8 value <= tau and the next one
        e = math.floor(math.log2(tau))
        ulp = 2.0 ** (e - _hif8_mant_bits(e))
        exp = math.floor(tau / ulp) * ulp + ulp / 2
    assert thr == exp
    if tau <= 3:
        assert thr == [2.0 ** -23, 1.0625, 2.125, 3.125][tau]
    below = float(np.nextafter(np.float32(thr), np.float32(0)))
    assert R.round_ref_value(thr, "hif8", "nearest_away") > tau
    assert R.round_ref_value(below, "hif8", "nearest_away") <= tau


# ------------------------------------------------------------------------------------------
# statistics


def test_stats_from_flags_merge_and_json():
    q, k, v = rand_qkv(3, 24, 40, 4, 2, seed=12, amp=3.0)
    kw = dict(config="e2e_hif8", block_q=8, block_k=8, causal=True, tau=0)
    _, s1, tw = run_both(q, k, v, **kw)
    fl = tw.flags
    tiles = ((fl == 0) | (fl == 1)).sum(axis=(1, 2))
    restarts = (fl == 1).sum(axis=(1, 2))
    assert isinstance(s1, BapsStats) and s1.calls == 1
    assert s1.tiles[0].tolist() == tiles.tolist()
    assert s1.restarts[0].tolist() == restarts.tolist()
    assert s1.total_tiles == tiles.sum() and s1.total_restarts == restarts.sum()
    assert s1.restart_rate == pytest.approx(restarts.sum() / tiles.sum())
    assert s1.peak_restart_rate == pytest.approx((restarts / tiles).max())
    assert 0 < s1.restart_rate <= s1.peak_restart_rate <= 1
    np.testing.assert_allclose(s1.rates(), restarts / tiles)
    # a second call, merged
    q2, k2, v2 = rand_qkv(1, 16, 16, 4, 2, seed=13, amp=0.1)
    _, s2, tw2 = run_both(q2, k2, v2, **kw)
    for merged in (s1 + s2, s1.merge(s2), sum([s1, s2])):
        assert merged.calls == 2
        assert merged.total_tiles == s1.total_tiles + s2.total_tiles
        assert merged.restart_rate == pytest.approx(
            (s1.total_restarts + s2.total_restarts) / (s1.total_tiles + s2.total_tiles))
        assert merged.peak_restart_rate == max(s1.peak_restart_rate, s2.peak_restart_rate)
        assert len(merged.rates()) == len(s1.rates()) + len(s2.rates())
    d = json.loads(json.dumps((s1 + s2).to_dict()))
    for key in ("tiles", "restarts", "row_restarts", "calls", "total_tiles", "total_restarts",
                "restart_rate", "peak_restart_rate", "rates"):
        assert key in d
    assert "flags" not in d
    assert d["restart_rate"] == pytest.approx((s1 + s2).restart_rate)
    assert d["row_restarts"][0] == tw.row_restarts.tolist()
    df = json.loads(json.dumps(s1.to_dict(flags=True)))
    assert np.array_equal(np.array(df["flags"][0]), fl)
    with pytest.raises(TypeError):
        s1 + 1


def test_stats_without_non_critical_tiles():
    q, k, v = rand_qkv(2, 5, 7, 4, 2, seed=14)
    _, s = lp.attention(q, k, v, "baps", config="e2e_hif8", return_stats=True)  # one tile
    # no non-critical tile, no restart rate (issue 12 item 19: None, not 0.0)
    assert s.total_tiles == 0 and s.restart_rate is None and s.peak_restart_rate is None
    assert s.rates().size == 0
    assert BapsStats().restart_rate is None and BapsStats().peak_restart_rate is None
    for config in ("default", "exp2_hif8", "naive_e2e"):  # no restart mechanism at all
        q, k, v = rand_qkv(1, 300, 300, 8, 1, seed=15)
        _, s = lp.attention(q, k, v, "baps", config=config, return_stats=True)
        assert s.total_tiles > 0 and s.restart_rate is None and s.peak_restart_rate is None


# ------------------------------------------------------------------------------------------
# front-end errors specific to baps


@pytest.mark.parametrize("opts,exc,msg", [
    (dict(config="fp8"), ValueError, r"config 'fp8' is not one of default, exp2_hif8"),
    (dict(config="default", tau=1), ValueError, r"apply only to config 'e2e_hif8'"),
    (dict(config="exp2_e4m3", critical="first"), ValueError, r"apply only to config"),
    (dict(config="e2e_hif8", tau=-1), ValueError, r"tau must be a non-negative int"),
    (dict(config="e2e_hif8", tau=1.0), ValueError, r"tau must be a non-negative int"),
    (dict(config="e2e_hif8", critical="middle"), ValueError,
     r"critical 'middle' is not one of first, first\+last, first\+diagonal"),
    (dict(config="e2e_hif8", critical=[]), ValueError, r"non-empty"),
    (dict(config="e2e_hif8", critical=[-1]), ValueError, r"non-negative"),
    (dict(config="e2e_hif8", critical=[0, 9], block_k=4), ValueError,
     r"critical tile indices \[9\] are out of range: there are 2 key tiles"),
    (dict(config="e2e_hif8", max_round="floor"), ValueError, r"max_round 'floor' .* rint, ceil"),
    (dict(config="e2e_hif8", granularity="col"), ValueError, r"granularity 'col' .* tile, row"),
    (dict(accum="float64"), ValueError, r"accum 'float64' is not one of float32, float16"),
    (dict(input_dtype="float16"), ValueError, r"input_dtype 'float16' .* bfloat16, float32"),
    (dict(exp2_fp16="yes"), TypeError, r"exp2_fp16 must be a bool"),
    (dict(block_q=0), ValueError, r"block_q must be a positive int"),
    (dict(fmt="hif8"), ValueError, r"unknown option\(s\) fmt for scheme 'baps'"),
])
def test_baps_bad_options(opts, exc, msg):
    q, k, v = rand_qkv(1, 4, 6, 4, 2, seed=15)
    with pytest.raises(exc, match=msg):
        lp.attention(q, k, v, "baps", **opts)


# ------------------------------------------------------------------------------------------
# the hif8_exp2 softmax surrogate


def test_hif8_exp2_softmax_surrogate():
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((5, 6)) * 4).astype(np.float32)
    x[1, 2] = -np.inf
    x[4] = -np.inf
    p = lp.softmax(x, scheme="hif8_exp2")
    x2 = x * AR.LOG2E_F32
    for r in range(4):
        m = np.rint(x2[r].max())
        P = AR.exp2_chain((x2[r] - m).astype(np.float32), "hif8", "hif8", saturate_in=False)
        np.testing.assert_allclose(p[r], P / P.astype(np.float64).sum(), rtol=1e-6)
    assert p[1, 2] == 0.0
    assert np.isnan(p[4]).all()
    np.testing.assert_allclose(p[:4].sum(axis=1), 1.0, rtol=1e-6)
    pt = lp.softmax(x.T.copy(), scheme="hif8_exp2", axis=0)
    assert np.array_equal(pt.T, p, equal_nan=True)


# ------------------------------------------------------------------------------------------
# attention-sink workload: restart rate against tau, accuracy of the configurations


def sink_workload(L=512, heads=8, d=32, seed=0):
    """Causal heads with an attention sink at key 0 and a competing recency bump.

    Scores (natural-log units): ``q k^T / sqrt(d)`` with small random q, k, plus an additive
    bias ``sink_h`` on key 0 (every query) and ``rec_h * (1 - delta / 16)`` on the 15 keys
    before each query (``delta = i - j``); ``sink_h ~ U(4, 8)``, ``rec_h = sink_h + U(-1.5,
    1.5)``, so the recent keys sometimes beat the sink (restarts on the diagonal tiles).
    Inputs are bfloat16 values.  Returns ``(q, k, v, bias)``.
    """
    rng = np.random.default_rng(seed)
    q, k, v = ((rng.standard_normal((heads, L, d)) * s).astype(BF16).astype(np.float32)
               for s in (0.5, 0.5, 1.0))
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    sink = rng.uniform(4, 8, size=(heads, 1, 1))
    rec = sink + rng.uniform(-1.5, 1.5, size=(heads, 1, 1))
    w = 16
    near = (i - j >= 0) & (i - j < w) & (j > 0)
    bias = np.where(j == 0, sink, 0.0) + np.where(near, rec * (1 - (i - j) / w), 0.0)
    return q, k, v, np.where(j <= i, bias, -np.inf).astype(np.float32)


@pytest.fixture(scope="module")
def sink():
    q, k, v, bias = sink_workload()
    ref = lp.attention(*(a.astype(np.float64) for a in (q, k, v)), "reference", causal=True,
                       attn_mask=bias)
    return q, k, v, bias, ref


def test_sink_restart_rate_falls_with_tau(sink):
    q, k, v, bias, _ = sink
    arr = []
    for tau in range(3):
        _, s = lp.attention(q, k, v, "baps", config="e2e_hif8", tau=tau, causal=True,
                            attn_mask=bias, block_q=64, block_k=64, return_stats=True)
        assert s.total_tiles > 100
        arr.append(s.restart_rate)
    assert arr[0] >= arr[1] >= arr[2]
    assert arr[2] < arr[0]
    assert arr[0] > 0.05  # the workload does exercise restarts


def test_sink_accuracy_e2e_vs_naive(sink):
    q, k, v, bias, ref = sink
    err = {}
    for cfg in AR.ALL_CONFIGS:
        out = lp.attention(q, k, v, "baps", config=cfg, causal=True, attn_mask=bias,
                           block_q=64, block_k=64)
        err[cfg] = AR.relative_error(out, ref)
    assert err["default"] < 1e-5
    assert err["e2e_hif8"] < 0.05
    assert err["naive_e2e"] > 1.5 * err["e2e_hif8"]
    # Table 1 orientation: exp2 in E4M3 loses the most, HiF8 and E4M3xE5M2 the least
    assert err["exp2_e4m3"] > max(err["exp2_hif8"], err["exp2_e4m3xe5m2"])
