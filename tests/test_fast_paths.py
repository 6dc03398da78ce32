"""Branch-free fast paths of scalar helpers against the functions they stand in for, bit for bit.

* ``_fp.exp2_f32_or_unsure`` (INT-FlashAttention's vectorized ``exp2``) == ``_fp.exp2_f32``
  wherever it does not defer (returns -1), and it defers rarely;
* ``intflash._p8_of`` (P8 computed by three float16 roundings) == ``intflash._p8`` (the table).

The default run checks sampled float32 bit patterns and the boundary points; the full sweeps over
every float32 input are opt-in (``pytest -m exhaustive``, seconds each).
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit, prange

from lowprec.formats._bits import u32_as_f32
from lowprec.kernels._fp import exp2_f32, exp2_f32_or_unsure
from lowprec.kernels.intflash import _P8, _p8, _p8_of


@njit(parallel=True, cache=False)
def _exp2_mismatches(bits):
    """(mismatches, deferred) of exp2_f32_or_unsure over float32 bit patterns."""
    n = bits.shape[0]
    bad = np.zeros(n, np.bool_)
    unsure = np.zeros(n, np.bool_)
    for i in prange(n):
        x = u32_as_f32(bits[i])
        f = exp2_f32_or_unsure(x)
        if f == np.float32(-1.0):
            unsure[i] = True
        else:
            bad[i] = f != exp2_f32(x) or np.isnan(f)
    return bad.sum(), unsure.sum()


@njit(parallel=True, cache=False)
def _exp2_range(lo, hi):
    """(mismatches, deferred) over the bit patterns lo .. hi - 1, in blocks."""
    nb = 4096
    bad = np.zeros(nb, np.int64)
    uns = np.zeros(nb, np.int64)
    step = (hi - lo + nb - 1) // nb
    for t in prange(nb):
        for u in range(lo + t * step, min(hi, lo + (t + 1) * step)):
            x = u32_as_f32(np.uint32(u))
            f = exp2_f32_or_unsure(x)
            if f == np.float32(-1.0):
                uns[t] += 1
            elif f != exp2_f32(x):
                bad[t] += 1
    return bad.sum(), uns.sum()


@njit(parallel=True, cache=False)
def _p8_mismatches(lo, hi, table):
    nb = 4096
    bad = np.zeros(nb, np.int64)
    step = (hi - lo + nb - 1) // nb
    for t in prange(nb):
        for u in range(lo + t * step, min(hi, lo + (t + 1) * step)):
            p = u32_as_f32(np.uint32(u))
            bad[t] += _p8_of(p) != np.float32(_p8(p, table))
    return bad.sum()


_ONE = 0x3F800000  # float32 bits of 1.0


def _edge_bits() -> np.ndarray:
    """Integers, half-integers, the range ends, zeros, infinities, NaN and their neighbours."""
    xs = np.concatenate([np.arange(-160, 160, 0.5), [-126.0, 127.0, 128.0, -149.0, -150.0]])
    b = xs.astype(np.float32).view(np.uint32).astype(np.int64)
    b = np.concatenate([b - 1, b, b + 1, [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000]])
    return (b & 0xFFFFFFFF).astype(np.uint32)


def test_exp2_fast_path_sampled():
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
                           (rng.uniform(-130, 130, 2_000_000).astype(np.float32)
                            .view(np.uint32)), _edge_bits()])
    bad, unsure = _exp2_mismatches(bits)
    assert bad == 0
    inside = bits.view(np.float32)
    inside = (inside >= -126) & (inside <= 127)
    assert unsure <= (~inside).sum() + 100  # in [-126, 127] about one x in 10**6 defers


def test_p8_fast_path_sampled():
    h = np.arange(0x3C01, dtype=np.uint16).view(np.float16).astype(np.float32)
    mid = ((h[:-1] + h[1:]) / 2).astype(np.float32).view(np.uint32).astype(np.int64)
    for lo in np.concatenate([mid - 2, h.view(np.uint32).astype(np.int64) - 2]):
        lo = int(min(max(lo, 0), _ONE))
        assert _p8_mismatches(lo, min(lo + 5, _ONE + 1), _P8) == 0
    rng = np.random.default_rng(1)
    starts = rng.integers(0, _ONE, 64)
    for lo in starts:
        assert _p8_mismatches(int(lo), int(min(lo + 20000, _ONE + 1)), _P8) == 0


@pytest.mark.exhaustive
def test_exp2_fast_path_all_float32():
    bad = unsure = 0
    for lo in range(0, 1 << 32, 1 << 28):
        b, u = _exp2_range(lo, lo + (1 << 28))
        bad += b
        unsure += u
    assert bad == 0
    inside = (0x42FC0000 + 1) + (0x42FE0000 + 1)  # patterns of [-126, -0] and [0, 127]
    assert unsure - ((1 << 32) - inside) < 10_000  # 472 of 2.2e9 defer


@pytest.mark.exhaustive
def test_p8_fast_path_all_probabilities():
    assert _p8_mismatches(0, _ONE + 1, _P8) == 0
