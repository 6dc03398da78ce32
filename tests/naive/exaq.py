"""Slow, obviously correct twin of EXAQ (lowprec.kernels.exaq; specs/attention.md 3): the
clipped low-bit quantisation of the max-centred scores, in float64 numpy."""

from __future__ import annotations

import numpy as np


def exaq_probs(x: np.ndarray, bits: int) -> np.ndarray:
    """EXAQ softmax of float32 rows ``x (N, L)`` (no masking; sigma over all of ``x``), in
    float64 numpy with the same clipping rule as the spec."""
    ab = {2: (-1.66, -1.85), 3: (-1.75, -2.06), 4: (-1.83, -2.27)}[bits]
    xc = (x.astype(np.float64) - x.max(axis=1, keepdims=True)).astype(np.float32)
    xc = xc.astype(np.float64)
    sigma = xc.std()
    C = ab[0] * sigma + ab[1]
    if not np.isfinite(C) or C >= 0:
        C = -1e-6
    lo = max(C, xc.min())
    delta = -lo / (2**bits - 1)
    xv = np.clip(xc, lo, 0.0)
    if delta > 0:
        xv = lo + np.clip(np.rint((xv - lo) / delta), 0, 2**bits - 1) * delta
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
