"""The GPU attention engine (lowprec/gpu/engine.py) equals the CPU engine bit for bit.

Every case runs :func:`lowprec.gpu.engine.run_engine_gpu` and
:func:`lowprec.kernels.online.run_engine` (or ``lp.attention``) on the same values and compares
outputs (as uint32 bits, NaN by class), per-tile flags and restarted-row counts.  Without a GPU
(CI) the Triton kernels run in Triton's interpreter on CPU tensors; on a GPU machine the same
tests run on ``cuda``.  The kernels are also compiled ahead of time for sm_90 and their PTX is
scanned (tests/gpu_engine_ptx.py, in a subprocess).

Interpreter set-up: ``TRITON_INTERPRET=1`` must be set before the engine module decorates its
kernels; ``tests/conftest.py`` sets it on a machine without CUDA before any test module is
imported, and its ``gpu_engine()`` skips a module that finds the engine built compiled
without a GPU (specs/gpu.md section 4).

The interpreter's ``tl.dot`` is NumPy's matmul (BLAS order); the fixture below replaces it by
the sequential order ``acc = fl(acc + fl(a_k b_k))``, k ascending, which is what the GPU's
``tl.dot(input_precision="ieee")`` (a fused multiply-add chain) computes whenever every product
is exact: the only place the engine uses it.  The replacement also asserts that every product
is exact, so the engine's guard is checked on every dot it lets through.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from conftest import gpu_engine  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.kernels import baps, online  # noqa: E402
from lowprec.kernels.tiling import prepare  # noqa: E402

ge, INTERPRETED, DEVICE = gpu_engine()  # Triton interpreter without CUDA
# NaN/Inf arithmetic is part of the cases (dead rows, overflowing scores): NumPy's warnings
# from inside the interpreter are expected
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
CONFIGS = ["flash"] + list(baps.CONFIGS)
DOTS = {"n": 0}  # exact dots executed (interpreter only)


@pytest.fixture(autouse=True, scope="module")
def sequential_dot():
    """The interpreter's tl.dot in the GPU's sequential order, asserting exact products
    (module docstring)."""
    if not INTERPRETED:
        yield
        return
    with ge.sequential_interpreter_dot(DOTS):
        yield


# ------------------------------------------------------------------------------------------
# helpers

_STORE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def rounded(a: np.ndarray, kind: str) -> np.ndarray:
    """float32 values of ``a`` rounded to ``kind`` (RNE)."""
    return a.astype(_NP[kind]).astype(np.float32)


def make_qkv(Z=1, Hq=2, Hkv=1, Lq=48, Lk=80, d=24, dv=20, kind="bf16", seed=0, amp=2.0):
    """float32 ``q (Z, Hq, Lq, d)``, ``k (Z, Hkv, Lk, d)``, ``v (Z, Hkv, Lk, dv)`` whose values
    are ``kind`` values (f32: arbitrary float32)."""
    rng = np.random.default_rng(seed)
    q = rounded((rng.standard_normal((Z, Hq, Lq, d)) * amp).astype(np.float32), kind)
    k = rounded((rng.standard_normal((Z, Hkv, Lk, d)) * amp).astype(np.float32), kind)
    v = rounded(rng.standard_normal((Z, Hkv, Lk, dv)).astype(np.float32), kind)
    return q, k, v


def config(name: str, **opts) -> online.EngineConfig:
    if name == "flash":
        return online.EngineConfig(flow=online.FA2, exp=online.EXP_FLOAT)
    return baps.make_config(name, **opts)


def cpu_run(q, k, v, cfg, *, causal=False, mask=None, mask_map=None, block_q=32, block_k=32,
            scale=None):
    """online.run_engine on 4-d inputs (GQA: key/value heads repeated for the CPU)."""
    Z, Hq, Lq, d = q.shape
    group = Hq // k.shape[1]
    B = Z * Hq
    k3 = np.repeat(k, group, axis=1).reshape(B, k.shape[2], d)
    v3 = np.repeat(v, group, axis=1).reshape(B, v.shape[2], v.shape[3])
    mm = np.zeros(B, np.int64) if mask_map is None else np.asarray(mask_map, np.int64)
    return online.run_engine(np.ascontiguousarray(q.reshape(B, Lq, d)), k3, v3,
                             scale=d ** -0.5 if scale is None else scale, causal=causal,
                             mask=mask, mask_map=mm, block_q=block_q, block_k=block_k, cfg=cfg)


def gpu_run(q, k, v, cfg, *, kind="f32", causal=False, mask=None, mask_map=None, block_q=32,
            block_k=32, scale=None, **kw):
    """run_engine_gpu on tensors stored as ``kind`` on DEVICE; numpy (B, ...) results."""
    d = q.shape[-1]
    t = [torch.from_numpy(np.array(a, dtype=np.float32)).to(_STORE[kind]).to(DEVICE)
         for a in (q, k, v)]
    mk = None if mask is None else torch.from_numpy(np.array(mask)).to(DEVICE)
    out, flags, rr = ge.run_engine_gpu(*t, scale=d ** -0.5 if scale is None else scale,
                                       causal=causal, mask=mk, mask_map=mask_map,
                                       block_q=block_q, block_k=block_k, cfg=cfg, **kw)
    B = q.shape[0] * q.shape[1]
    return (out.cpu().numpy().reshape(B, q.shape[2], v.shape[-1]), flags.cpu().numpy(),
            rr.cpu().numpy())


def assert_same(cpu, gpu, check_flags=True):
    """Outputs bit for bit (NaN by class), flags and restarted rows equal."""
    o1, f1, r1 = cpu
    o2, f2, r2 = gpu
    assert o1.shape == o2.shape
    n1, n2 = np.isnan(o1), np.isnan(o2)
    assert np.array_equal(n1, n2), f"NaN positions differ: {int((n1 != n2).sum())}"
    b1 = np.where(n1, 0, o1).astype(np.float32).view(np.uint32)
    b2 = np.where(n2, 0, o2).astype(np.float32).view(np.uint32)
    bad = int((b1 != b2).sum())
    assert bad == 0, f"{bad} of {b1.size} outputs differ; max |diff| " \
                     f"{np.nanmax(np.abs(o1.astype(np.float64) - o2)):.3g}"
    if check_flags:
        assert np.array_equal(f1, f2), "flags differ"
        assert np.array_equal(r1, r2), f"row restarts differ: {r1} vs {r2}"


def head_planes(Z, Hq, Lq, Lk, seed=0, p_masked=0.3, finite=False):
    """Additive planes ``(Z, Lq, Lk)`` shared by the heads of each batch entry, and the map."""
    rng = np.random.default_rng(seed)
    if finite:
        m = (rng.standard_normal((Z, Lq, Lk)) * 3).astype(np.float32)
    else:
        m = np.zeros((Z, Lq, Lk), np.float32)
    m[rng.random((Z, Lq, Lk)) < p_masked] = -np.inf
    return m, np.repeat(np.arange(Z), Hq)


def check(q, k, v, cfg, *, kind, cpu_inputs=None, **kw):
    """Run both and compare."""
    gk = {x: kw.pop(x) for x in ("round_inputs_bf16", "exact_dots", "o_mem", "rows", "unroll",
                                 "dk", "pv_stages", "qk_stages") if x in kw}
    cq, ck, cv = cpu_inputs or (q, k, v)
    cpu = cpu_run(cq, ck, cv, cfg, **kw)
    gpu = gpu_run(q, k, v, cfg, kind=kind, **kw, **gk)
    assert_same(cpu, gpu)
    return cpu, gpu


# ------------------------------------------------------------------------------------------
# every configuration


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_gqa_mask(name):
    """GQA (2 query heads on 1 key/value head), additive mask with -inf shared by the heads,
    odd d/dv, partial tiles; flash on arbitrary float32 values, baps on bf16 tensors."""
    kind = "f32" if name == "flash" else "bf16"
    q, k, v = make_qkv(kind=kind, seed=1)
    mask, mmap = head_planes(1, 2, 48, 80, seed=2, p_masked=0.2, finite=True)
    check(q, k, v, config(name), kind=kind, mask=mask, mask_map=mmap)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_causal_rounding_on_device(name):
    """Causal with Lq < Lk; baps from float32 tensors rounded to bf16 on the device (the
    ``input_dtype="bfloat16"`` step), flash on float32 tensors holding bf16 values; the O
    accumulator kept in memory (``o_mem``)."""
    q, k, v = make_qkv(Z=2, Hq=1, Hkv=1, Lq=40, Lk=72, d=16, dv=16, kind="f32", seed=3)
    if name == "flash":
        q, k, v = (rounded(a, "bf16") for a in (q, k, v))
        check(q, k, v, config(name), kind="f32", causal=True, o_mem=True)
    else:
        cpu_in = tuple(rounded(a, "bf16") for a in (q, k, v))
        check(q, k, v, config(name), kind="f32", causal=True, cpu_inputs=cpu_in,
              round_inputs_bf16=True, o_mem=True)


# ------------------------------------------------------------------------------------------
# masks and causal shapes


@pytest.mark.parametrize("name", ["flash", "e2e_hif8"])
def test_boolean_mask_dead_row_and_skipped_tile(name):
    """A boolean mask (as 0/-inf) broadcast over heads with a fully masked row and a fully
    masked key tile (skipped, flag -2), causal, Lq > Lk (rows with no key: NaN)."""
    kind = "bf16"
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=2, Lq=72, Lk=64, d=16, dv=16, kind=kind, seed=4)
    rng = np.random.default_rng(5)
    keep = rng.random((1, 72, 64)) > 0.25
    keep[:, 50, :] = False  # a dead row
    keep[:, :, 32:48] = False  # a dead key tile (block_k 16)
    mask = np.where(keep, 0.0, -np.inf).astype(np.float32)
    cpu, gpu = check(q, k, v, config(name), kind=kind, causal=True, mask=mask,
                     mask_map=np.zeros(2, np.int64), block_q=24, block_k=16)
    assert (cpu[1] == online.FLAG_SKIPPED).any() and np.isnan(cpu[0]).any()


def test_causal_lq_greater_than_lk_no_mask():
    """Causal, Lq > Lk without a mask: the first Lq - Lk rows see nothing (NaN, tiles
    skipped); exp2 in E4M3 with fp16 accumulators."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=1, Lq=70, Lk=40, d=16, dv=24, kind="f16", seed=6)
    check(q, k, v, config("exp2_e4m3", accum="float16"), kind="f16", causal=True,
          block_q=32, block_k=16)


def test_mask_planes_per_head_and_large_finite_values():
    """One additive plane per head (mask_map identity), large finite values that swamp the
    scores, and -inf."""
    q, k, v = make_qkv(Z=2, Hq=2, Hkv=1, Lq=32, Lk=48, d=16, dv=16, kind="bf16", seed=7)
    rng = np.random.default_rng(8)
    mask = (rng.standard_normal((4, 32, 48)) * 50).astype(np.float32)
    mask[rng.random(mask.shape) < 0.3] = -np.inf
    check(q, k, v, config("e2e_hif8", tau=0), kind="bf16", mask=mask,
          mask_map=np.arange(4), block_q=16, block_k=16)


# ------------------------------------------------------------------------------------------
# e2e_hif8 options and accumulators

E2E_OPTS = [
    dict(tau=0, critical="first+last"),
    dict(tau=2, critical="first+diagonal", max_round="ceil"),
    dict(tau=1, critical=[2, 0, 2, 1], granularity="row"),
    dict(tau=1, accum="float16", critical="first+last", granularity="row"),
    dict(tau=0, accum="bfloat16", max_round="ceil"),
]


@pytest.mark.parametrize("opts", E2E_OPTS, ids=lambda o: "-".join(f"{k}={v}" for k, v in
                                                                  o.items()))
@pytest.mark.parametrize("causal", [False, True])
def test_e2e_options(opts, causal):
    """tau 0/1/2, every critical mode (a list with duplicates), ceil, row granularity, fp16 and
    bf16 accumulators; causal Lq < Lk (the diagonal tile, invisible list tiles)."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=2, Lq=40, Lk=64, d=16, dv=16, kind="bf16", seed=9,
                       amp=3.0)
    check(q, k, v, config("e2e_hif8", **opts), kind="bf16", causal=causal, block_q=16,
          block_k=16)


@pytest.mark.parametrize("name,accum", [("default", "bfloat16"), ("naive_e2e", "float16")])
def test_fa2_accumulators(name, accum):
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=48, Lk=96, d=16, dv=16, kind="bf16", seed=10)
    check(q, k, v, config(name, accum=accum), kind="bf16", block_q=48, block_k=24)


def _odd_configs():
    e2e = baps.make_config("e2e_hif8", tau=1)
    return {
        # the FA2 flow with a critical set: only the visiting order changes
        "fa2-first+last": online.EngineConfig(flow=online.FA2, exp=online.EXP_FLOAT,
                                              crit=online.CRIT_FIRST_LAST),
        # the E2E flow on HiF8-rounded scores
        "e2e-pre_hif8": online.EngineConfig(flow=online.E2E, exp=online.EXP_TABLE,
                                            enc=online.ENC_HIF8, pre_hif8=True,
                                            crit=online.CRIT_FIRST_DIAG, thr=e2e.thr,
                                            table=e2e.table),
        # the E2E flow with float32 exp2 (P not rounded: the unfused P v loop)
        "e2e-float-exp": online.EngineConfig(flow=online.E2E, exp=online.EXP_FLOAT,
                                             crit=online.CRIT_FIRST, thr=e2e.thr,
                                             max_round=online.ROUND_CEIL),
    }


@pytest.mark.parametrize("name", ["fa2-first+last", "e2e-pre_hif8", "e2e-float-exp"])
def test_engine_config_combinations(name):
    """EngineConfig switch combinations no baps configuration uses (run_engine accepts them)."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=1, Lq=40, Lk=64, d=16, dv=16, kind="bf16", seed=19)
    check(q, k, v, _odd_configs()[name], kind="bf16", causal=True, block_q=16, block_k=16)


# ------------------------------------------------------------------------------------------
# inputs: dtypes, the exact-product guard, block sizes


@pytest.mark.parametrize("name", ["flash", "exp2_hif8", "naive_e2e", "e2e_hif8"])
def test_row_blocks_and_launch_settings(name):
    """FA2 query tiles split into row blocks (``rows``, not dividing the tile: the last block
    is partial) visit the whole tile's key tiles (a block whose rows see nothing of a visible
    key tile still multiplies P = 0 into v); E2E ignores ``rows``.  Other launch settings
    (loop steps, pipelining, O in memory) give the same bits."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=1, Lq=45, Lk=70, d=16, dv=16, kind="bf16", seed=21)
    mask, mmap = head_planes(1, 2, 45, 70, seed=22, p_masked=0.3)
    for causal in (False, True):
        check(q, k, v, config(name), kind="bf16", causal=causal, mask=mask, mask_map=mmap,
              block_q=32, block_k=16, rows=12, unroll=3, dk=5, pv_stages=0, qk_stages=2)
    check(q, k, v, config(name), kind="bf16", causal=True, block_q=32, block_k=16, rows=8,
          o_mem=True, pv_stages=2, qk_stages=0)


def test_float32_values_take_the_outer_paths():
    """baps with ``input_dtype="float32"``: float32 values make the products inexact, so both
    products run the unfused loops; no exact dot may run."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=1, Lq=32, Lk=48, d=16, dv=16, kind="f32", seed=11)
    n0 = DOTS["n"]
    check(q, k, v, config("e2e_hif8"), kind="f32", causal=True, block_q=16, block_k=16)
    if INTERPRETED:
        assert DOTS["n"] == n0


def test_bf16_values_take_the_exact_dots():
    n0 = DOTS["n"]
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=32, Lk=32, d=16, dv=16, kind="bf16", seed=12)
    check(q, k, v, config("exp2_hif8"), kind="bf16")
    if INTERPRETED:
        assert DOTS["n"] > n0


@pytest.mark.parametrize("name", ["default", "e2e_hif8"])
def test_outer_paths_on_narrow_values(name):
    """exact_dots=False: the unfused loops give the same bits on bf16 values."""
    q, k, v = make_qkv(Z=1, Hq=2, Hkv=1, Lq=40, Lk=40, d=16, dv=16, kind="bf16", seed=13)
    check(q, k, v, config(name), kind="bf16", causal=True, exact_dots=False, block_q=16,
          block_k=24)


@pytest.mark.parametrize("name", ["default", "e2e_hif8"])
def test_guard_underflow_and_overflow(name):
    """Tiny values (products below 2**-126 are inexact) and huge ones (scores overflow to
    +inf: NaN rows, the ceil max's int64 overflow) must fall back, bit for bit."""
    q, k, v = make_qkv(Z=1, Hq=3, Hkv=1, Lq=32, Lk=48, d=16, dv=16, kind="bf16", seed=14)
    q[0, 0] *= np.float32(2.0**-70)  # head 0: q k products near 2**-140
    k[0, 0, :16] *= np.float32(2.0**-60)
    v[0, 0, 16:32] *= np.float32(2.0**-125)  # P v products below 2**-126, inexact
    q[0, 2, 5] *= np.float32(2.0**100)  # head 2: one row overflows to +inf
    k[0, 0, 40] *= np.float32(2.0**40)
    cfg = config(name, max_round="ceil") if name == "e2e_hif8" else config(name)
    check(q, k, v, cfg, kind="bf16", block_q=16, block_k=16)


def test_strided_inputs_and_expanded_mask_planes():
    """q, k, v as (Z, H, L, d) views of (Z, L, H, d) tensors (how models hold them: the
    launcher reads strides, no copy) and one mask plane expanded to every head (stride 0)."""
    q, k, v = make_qkv(Z=1, Hq=4, Hkv=2, Lq=40, Lk=56, d=16, dv=16, kind="bf16", seed=17)
    plane, _ = head_planes(1, 4, 40, 56, seed=18, finite=True)
    cfg = config("e2e_hif8")
    cpu = cpu_run(q, k, v, cfg, causal=True, mask=plane, mask_map=np.zeros(4, np.int64),
                  block_q=16, block_k=16)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
                  .to(torch.bfloat16).to(DEVICE).transpose(1, 2) for a in (q, k, v))
    assert not tq.is_contiguous()
    tm = torch.from_numpy(plane).to(DEVICE).expand(4, 40, 56)  # 4 planes, stride 0
    out, flags, rr = ge.run_engine_gpu(tq, tk, tv, scale=16 ** -0.5, causal=True, mask=tm,
                                       mask_map=np.arange(4), block_q=16, block_k=16, cfg=cfg)
    assert_same(cpu, (out.cpu().numpy().reshape(4, 40, 16), flags.cpu().numpy(),
                      rr.cpu().numpy()))


def test_nan_score_drives_a_tile_restart():
    """A NaN score (0 * Inf) next to a large finite one in the same row: the CPU's row max
    ignores NaN (fast-math; measured in every position), so that row restarts the whole tile
    (tile granularity) and every other row takes its updated max.  The GPU must agree."""
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=16, Lk=32, d=16, dv=16, kind="bf16", seed=20,
                       amp=0.5)
    q[0, 0, :, 0] = -1.0
    q[0, 0, :, 1] = 0.0
    q[0, 0, 3, 0] = 0.0  # row 3: 0 * Inf = NaN with key 20, the others -Inf
    q[0, 0, 3, 1] = 8.0
    k[0, 0, 20] = 0.0
    k[0, 0, 20, 0] = np.inf
    k[0, 0, 21] = 0.0
    k[0, 0, 21, 1] = 8.0  # row 3's score with key 21 is far above its max so far
    cpu, _ = check(q, k, v, config("e2e_hif8"), kind="bf16", block_q=16, block_k=16)
    assert cpu[1][0, 0, 1] == 1, "the scenario must restart key tile 1"


def test_block_sizes_not_powers_of_two_and_larger_than_l():
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=50, Lk=70, d=20, dv=12, kind="bf16", seed=15)
    check(q, k, v, config("e2e_hif8", critical="first+last"), kind="bf16", causal=True,
          block_q=24, block_k=27)
    check(q, k, v, config("exp2_e5m2"), kind="bf16", block_q=64, block_k=100)


def test_empty_inputs():
    cfg = config("e2e_hif8")
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=8, Lk=0, d=16, dv=16, kind="bf16")
    out, flags, rr = gpu_run(q, k, v, cfg, kind="bf16")
    assert np.isnan(out).all() and flags.shape == (1, 1, 0) and rr.tolist() == [0]
    q, k, v = make_qkv(Z=1, Hq=1, Hkv=1, Lq=0, Lk=8, d=16, dv=16, kind="bf16")
    out, flags, rr = gpu_run(q, k, v, cfg, kind="bf16")
    assert out.shape == (1, 0, 16) and flags.shape == (1, 0, 1)


def test_bad_arguments():
    q, k, v = make_qkv(Z=1, Hq=3, Hkv=2, Lq=8, Lk=8, d=16, dv=16)
    t = [torch.from_numpy(a) for a in (q, k, v)]
    with pytest.raises(ValueError, match="multiple of Hkv"):
        ge.run_engine_gpu(*t, scale=1.0, causal=False, block_q=8, block_k=8,
                          cfg=config("flash"))
    t[1] = t[1][:, :1]
    t[2] = t[2][:, :1]
    with pytest.raises(ValueError, match="out of range"):
        ge.run_engine_gpu(*t, scale=1.0, causal=False, block_q=8, block_k=4,
                          cfg=config("e2e_hif8", critical=[0, 5]))
    with pytest.raises(ValueError, match="block_k"):
        ge.run_engine_gpu(*t, scale=1.0, causal=False, block_q=8, block_k=0,
                          cfg=config("flash"))


# ------------------------------------------------------------------------------------------
# the integration contract: what lp.attention computes, from its normalized Problem


@pytest.mark.parametrize("name", ["flash", "e2e_hif8"])
def test_through_lp_attention_problem(name):
    """``lp.attention`` (CPU) against the GPU launcher fed from ``tiling.prepare``'s Problem:
    a boolean mask broadcast over heads (one plane per batch entry, shared through
    mask_map), causal, and the statistics' flags and restarted rows."""
    rng = np.random.default_rng(16)
    q = rng.standard_normal((2, 2, 40, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 56, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 56, 16)).astype(np.float32)
    am = rng.random((2, 1, 40, 56)) > 0.2
    opts = {} if name == "flash" else {"config": name, "tau": 1}
    scheme = "flash" if name == "flash" else "baps"
    out, st = lp.attention(q, k, v, scheme, causal=True, attn_mask=am, block_q=16,
                           block_k=16, return_stats=True, **opts)
    prob, _ = prepare(q, k, v, causal=True, attn_mask=am)
    assert prob.mask.shape[0] == 2  # planes shared by the heads
    g = gpu_run(prob.q[:, None], prob.k[:, None], prob.v[:, None], config(name), kind="f32",
                causal=True, mask=prob.mask, mask_map=prob.mask_map, block_q=16, block_k=16,
                round_inputs_bf16=name != "flash")
    assert_same((out.reshape(4, 40, 16), st.flags[0], st.row_restarts[0]), g)


# ------------------------------------------------------------------------------------------
# ahead-of-time compilation for sm_90 and the PTX scan


def test_ptx_has_no_forbidden_instructions():
    """Every kernel variant compiles for sm_90 (Triton's own compiler, no GPU) and its PTX
    has no approximate, flushing or saturating instruction and no fused multiply-add outside
    the exact dots (tests/gpu_engine_ptx.py)."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in
                                                  env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p])
    res = subprocess.run([sys.executable, os.path.join(root, "tests", "gpu_engine_ptx.py"),
                          "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert res.stdout.strip(), res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    bad = {f"{r['kernel']} {r['variant']}": r["findings"] for r in report["results"]
           if r["findings"]}
    assert not bad, bad
    assert res.returncode == 0
