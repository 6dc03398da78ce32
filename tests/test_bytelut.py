"""The attention engine's table-driven 8-bit rounding (``kernels/_bytelut.py``) equals the
format codecs' scalar encoders: on every binade boundary and a random sample in the default
suite, on all 2^32 float32 bit patterns with ``-m exhaustive``."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec.formats.hif8 import HIF8_SPEC
from lowprec.formats.minifloat import E4M3_SPEC, E5M2_SPEC, scalar_code32
from lowprec.formats.rounding import RNA, RNE
from lowprec.kernels import _bytelut as bl
from lowprec.kernels import online as on

# the engine's roundings and the codecs' own scalar encoders for them (the oracle)
ENCS = {
    "hif8_rna": (on.ENC_HIF8, scalar_code32(HIF8_SPEC, RNA, False)),
    "hif8_rna_sat": (on.ENC_HIF8_SAT, scalar_code32(HIF8_SPEC, RNA, True)),
    "e4m3_rne_sat": (on.ENC_E4M3_SAT, scalar_code32(E4M3_SPEC, RNE, True)),
    "e5m2_rne_sat": (on.ENC_E5M2_SAT, scalar_code32(E5M2_SPEC, RNE, True)),
}


def _edge_patterns() -> np.ndarray:
    """Every binade start and end, +-1 and +-2 ulps, the midpoints of 3-bit grids and their
    neighbours, for both signs."""
    e = np.arange(256, dtype=np.int64) << 23
    offs = [0, 1, 2, (1 << 23) - 1, (1 << 23) - 2]
    for w in range(4):
        step = 1 << (23 - w)
        for k in range(1 << w):
            mid = k * step + step // 2
            offs += [mid - 1, mid, mid + 1]
    u = (e[:, None] + np.array(offs, dtype=np.int64)[None, :]).ravel()
    u = u[(u >= 0) & (u < (1 << 31))]
    return np.concatenate([u, u | (1 << 31)]).astype(np.uint32)


@pytest.mark.parametrize("name", list(ENCS))
def test_edges_and_sample(name):
    enc, func = ENCS[name]
    addm1, sh, lut = on.byte_tables(enc)
    rng = np.random.default_rng(7)
    u = np.concatenate([_edge_patterns(),
                        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)])
    got, want = bl.codes_of(u, addm1, sh, lut, func)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{name}: {bad.size} mismatches, first {hex(int(u[bad[0]]))}"


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", list(ENCS))
def test_all_patterns(name):
    enc, func = ENCS[name]
    assert bl.verify(func, on.byte_tables(enc)) == 0
