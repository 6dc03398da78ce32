"""Device paths of ``intflash``, ``exaq`` and ``reference`` (issue 15 "GPU II" items 1-2) against
the CPU path: outputs bit for bit (NaN by position) and every statistic, on the options that
change the arithmetic, the hazards and the errors; the device's float32 ``exp2``
(``lowprec/kernels/_fp_device.py``) against the CPU's.  The masks, causal ``Lq != Lk``, dtypes,
GQA and empty shapes of ``intflash`` and ``exaq`` run in tests/test_attention_device_rows.py
with the other row-wise schemes.

``reference`` (float64) is not pinned bit for bit (its GEMMs, ``exp`` and row sums run in each
device's own order): float32 outputs are compared bit for bit (measured: equal), float64 outputs
to a few float64 ulps of the row's scale.

Without a GPU the device path runs on CPU tensors under :func:`force_engine`; on a GPU machine
the tensors are on ``cuda``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_attention_device_rows import (  # noqa: E402
    DEVICE,
    both,
    dev,
    masks,
    on_device,
    qkv,
    same_out,
)

import lowprec as lp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# ------------------------------------------------------------------------------------------
# intflash


@pytest.mark.parametrize("opts", [
    dict(variant="half"), dict(scale_dtype="float16"), dict(scale_scope="tensor"),
    dict(block_q=8, block_k=24), dict(variant="half", block_k=16, scale_dtype="float16"),
])
def test_intflash_options(opts):
    """Both variants, float16 scales, one scope per tensor, partial query and key tiles; causal
    Lq < Lk with a boolean mask (a row that sees no key) and an additive mask."""
    q, k, v = qkv(seed=31)
    am, add = masks(seed=32)
    opts = {"block_q": 16, "block_k": 16, **opts}
    st = both(q, k, v, "intflash", causal=True, attn_mask=am, **opts)[1]
    assert st.total_skipped_tiles > 0 and st.total_rescales > 0
    both(q, k, v, "intflash", attn_mask=add, **opts)


def test_intflash_hazards():
    """float16 output overflow (large v), zero and subnormal scales (q rows of 0 and of
    2.6e-43: saturated codes), causal Lq > Lk and bfloat16 inputs."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=1, Lq=24, Lk=40, seed=33)
    st = both(q, k, v * 1e5, "intflash", block_k=16)[1]
    assert st.total_fp16_overflows > 0
    q[0, 0, :4] = 0.0
    row = q[0, 1, :4]  # amax / 127 = 1.45 subnormal steps: the scale rounds down, codes clamp
    q[0, 1, :4] = row / row.abs().amax(dim=-1, keepdim=True) * 2.58e-43
    st = both(q, k, v, "intflash")[1]
    assert st.total_saturated > 0
    both(q, k, v, "intflash", variant="half", causal=True)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=48, Lk=24, seed=34, dtype=torch.bfloat16)
    both(q, k, v, "intflash", causal=True, block_q=16, block_k=8)


def test_intflash_v_outside_the_visible_keys():
    """A non-finite v at a key that no row sees is left out of v's scale (variant full, scope
    visible), as on the CPU: no error, the same bits."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=16, Lk=16, seed=35)
    am = torch.ones(16, 16, dtype=torch.bool)
    am[:, 3] = False
    v[0, 1, 3, 0] = torch.inf
    both(q, k, v, "intflash", attn_mask=am)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("case", ["nan_v", "f16_q", "f16_v", "half_v", "variant", "scale_dtype",
                                  "scope", "block"])
def test_intflash_errors(case):
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=8, seed=36)
    kw = {}
    if case == "nan_v":
        v[0, 1, 2, 3] = torch.nan
    elif case == "f16_q":
        q[0, 0, 1, 1] = 1e5
        kw = {"scale_dtype": "float16"}
    elif case == "f16_v":
        v[0, 1, 2, 1] = 7e4
        kw = {"scale_dtype": "float16", "variant": "half"}
    elif case == "half_v":
        v[0, 1, 2, 1] = 7e4
        kw = {"variant": "half"}
    else:
        kw = {"variant": dict(variant="int4"), "scale_dtype": dict(scale_dtype="bfloat16"),
              "scope": dict(scale_scope="rows", variant="bogus"),
              "block": dict(block_q=0)}[case]
    with pytest.raises((ValueError, TypeError)) as e1:
        lp.attention(q, k, v, "intflash", **kw)
    with on_device(), pytest.raises(type(e1.value)) as e2:
        lp.attention(dev(q), dev(k), dev(v), "intflash", **kw)
    assert str(e1.value) == str(e2.value)


# ------------------------------------------------------------------------------------------
# exaq


@pytest.mark.parametrize("opts", [dict(bits=2), dict(bits=4), dict(scale_scope="tensor")])
def test_exaq_options(opts):
    """Every bit width and one calibration per call, causal with a boolean mask and an additive
    one (the per-sequence groups of ``scale_scope="visible"`` otherwise)."""
    q, k, v = qkv(seed=37)
    am, add = masks(seed=38)
    st = both(q, k, v, "exaq", causal=True, attn_mask=am, **opts)[1]
    assert st.empty_rows > 0 and (st.exaq_merged > 0) == (opts.get("bits") == 2)
    both(q, k, v, "exaq", attn_mask=add, **opts)


def test_exaq_flat_and_degenerate_groups():
    """Flat rows (q = 0: every level collapses, lo = 0); a sequence whose rows that take part
    all overflow (no counted score: its rows run through the CPU's kernel) next to a normal
    one; scores beyond float32 (NaN and Inf rows, nonfinite_rows)."""
    q, k, v = qkv(Z=2, Hq=2, Hkv=2, Lq=16, Lk=16, seed=39)
    both(q * 0, k, v, "exaq")
    am = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    am[0, :, :, 3] = False  # key 3 of sequence 0 is padding: its query row does not take part
    q2 = q.clone()
    q2[0, :, [r for r in range(16) if r != 3], 0] = torch.inf
    k2 = k.abs()
    st = both(q2, k2, v, "exaq", attn_mask=am, bits=2)[1]
    assert np.isnan(st.exaq_clip[0][0]) and st.nonfinite_rows > 0
    q3 = q.clone()
    q3[1, 0, 3] *= 1e30
    q3[0, 1, 4, 0] = torch.nan
    st = both(q3, k, v, "exaq", causal=True)[1]
    assert st.nonfinite_rows > 0


def test_exaq_level_exponentials_are_the_kernels():
    """The host table of the level exponentials (Python's ``math.exp``) equals what the CPU's
    Numba kernel computes (``np.exp`` there: the same C library function)."""
    import math

    from numba import njit

    @njit(cache=False)
    def kernel_exp(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = np.exp(a[i])
        return out

    x = np.random.default_rng(5).uniform(-60.0, 0.0, 200_000)
    want = kernel_exp(x)
    assert all(math.exp(t) == w for t, w in zip(x.tolist(), want.tolist(), strict=True))


# ------------------------------------------------------------------------------------------
# reference


def reference_both(q, k, v, **kw):
    """The CPU and device ``reference`` of one call: float32 outputs bit for bit, float64
    outputs within a few float64 ulps of the row's largest weight of v (the NaN positions
    equal); returns the CPU output."""
    ref = lp.attention(q, k, v, "reference", **kw)
    am = kw.pop("attn_mask", None)
    with on_device():
        got = lp.attention(dev(q), dev(k), dev(v), "reference", attn_mask=dev(am), **kw)
    assert got.device.type == DEVICE and got.dtype == ref.dtype
    if ref.dtype != torch.float64:
        same_out(ref, got)
        return ref
    got = got.cpu()
    assert torch.equal(torch.isnan(ref), torch.isnan(got))
    ok = ~torch.isnan(ref)
    scale = v.abs().amax().item()
    assert ((ref - got)[ok].abs() <= 64 * 2.0**-52 * scale).all()
    return ref


def test_reference_masks_causal_gqa():
    """float32 outputs bit for bit: masks (a row that sees no key: NaN), causal Lq < Lk and
    Lq > Lk, an additive mask, GQA (k/v heads broadcast), 2-D inputs, float16 inputs."""
    q, k, v = qkv(seed=40)
    am, add = masks(seed=41)
    reference_both(q, k[:, :1], v[:, :1])
    out = reference_both(q, k[:, :1], v[:, :1], causal=True, attn_mask=am)
    assert torch.isnan(out).any()
    reference_both(q, k[:, :1], v[:, :1], attn_mask=add)
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=48, Lk=24, seed=42, dtype=torch.float16)
    assert torch.isnan(reference_both(q, k, v, causal=True)).any()
    reference_both(q[0, 0], k[0, 0], v[0, 0], causal=True, scale=0.3)


def test_reference_float64():
    """float64 inputs stay float64 (the CPU's ``keep_float64``): within a few ulps."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=20, Lk=33, seed=43, dtype=torch.float64)
    am = torch.rand(1, 1, 20, 33, generator=torch.Generator().manual_seed(44)) > 0.3
    am[..., 2, :] = False  # a row that sees no key
    reference_both(q, k, v)
    reference_both(q, k, v, causal=True, attn_mask=am)
    q32 = q.float()
    assert lp.attention(q32, k, v, "reference").dtype == torch.float32


# ------------------------------------------------------------------------------------------
# exp2 on the device


_CPU_EXP2 = []


def _cpu_exp2(x: np.ndarray) -> np.ndarray:
    """The CPU's ``_fp.exp2_f32`` of every element (one compiled loop, made once)."""
    if not _CPU_EXP2:
        from numba import njit, prange

        from lowprec.kernels._fp import exp2_f32

        @njit(parallel=True, cache=False)
        def run(a):
            out = np.empty_like(a)
            for i in prange(a.size):
                out[i] = exp2_f32(a[i])
            return out

        _CPU_EXP2.append(run)
    return _CPU_EXP2[0](x)


def _exp2_mismatches(bits: np.ndarray) -> int:
    from lowprec.kernels._fp_device import exp2_f32

    x = bits.astype(np.uint32).view(np.float32)
    want = _cpu_exp2(x)
    got = exp2_f32(dev(torch.from_numpy(x))).cpu().numpy()
    bad = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    return int(bad.sum())


def test_device_exp2_equals_the_cpus():
    """Every table input and its neighbours, the range ends, -0, -inf, NaN and 2**18 random
    inputs of [-150, 0] (where the device's float64 exp2 sits near a float32 midpoint it takes
    the CPU's value from the table)."""
    from lowprec.kernels._exp2_near import NEAR_MIDPOINT

    near = np.array(NEAR_MIDPOINT, dtype=np.int64)
    ends = np.float32([-150.0, -149.0, -126.0, -1.0, -2.0**-25, -2.0**-24]).view(np.uint32)
    rng = np.random.default_rng(0)
    bits = np.concatenate([near - 1, near, near + 1, ends.astype(np.int64) - 1, ends,
                           [0x80000000, 0xFF800000, 0x7FC00000],
                           rng.integers(0x80000000, 0xC3160001, 1 << 18)])
    assert _exp2_mismatches(bits) == 0


@pytest.mark.exhaustive
def test_device_exp2_all_inputs():
    """Every float32 in [-150, 0] (1.1e9 inputs; minutes on a CPU, seconds on a GPU)."""
    hi = int(np.float32(-150.0).view(np.uint32)) + 1
    step = 1 << 24
    bad = sum(_exp2_mismatches(np.arange(lo, min(hi, lo + step), dtype=np.int64))
              for lo in range(0x80000000, hi, step))
    assert bad == 0


@pytest.mark.exhaustive
def test_exp2_near_table_is_current():
    """The shipped table equals a fresh scan (scripts/make_exp2_near.py --check)."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "make_exp2_near.py"),
                        "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
