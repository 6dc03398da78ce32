"""Float helpers of the device paths, the twins of :mod:`._fp` for torch tensors: the float32
``exp2`` of the CPU's kernels on any device, bit for bit.

The CPU computes ``_fp.exp2_f32(x) = float32(exp2(float64(x)))`` with the C library's float64
``exp2`` (glibc: error below one ulp).  A device has its own float64 ``exp2`` (CUDA's, or SLEEF's
on CPU tensors: error at most one ulp), so the two float64 values may differ in their last bits;
they round to the same float32 unless one of them lies within a few float64 ulps of a float32
rounding boundary (a midpoint between two float32 values).  :func:`exp2_f32` therefore

1. evaluates ``r = exp2(float64(x))`` on the device and rounds it to float32 (RNE, subnormals
   kept: torch's float64 -> float32 conversion on both devices);
2. flags ``x`` where ``r`` lies within :data:`EXP2_GUARD` float64 ulps of a boundary
   (:func:`near_boundary_t`, exact float64 arithmetic);
3. takes the CPU's own value for the flagged ``x`` from a table: ``_exp2_near.NEAR_MIDPOINT``
   lists every float32 ``x`` in ``[-150, 0]`` whose float64 ``exp2`` (the C library's) lies
   within :data:`NEAR_ULPS` ulps of a boundary (found by scanning all 1.1e9 such inputs,
   ``scripts/make_exp2_near.py``), and the values are computed once per process by the CPU's
   ``_fp.exp2_f32`` itself.

Why this is exact for every float32 ``x <= 0`` (also ``-inf`` and NaN): an unflagged ``r`` is
more than 64 ulps from every boundary, and the CPU's value lies within two ulps of it (one ulp
each from the exact ``2**x``), so both round to the same float32; a flagged ``x`` has the CPU's
value within 66 < 256 ulps of a boundary, so it is in the table.  Below -150 both give 0 (2**-150
is a tie, rounded to even) or a far-from-boundary subnormal; at 0 both give 1.  Positive ``x``
(not used by the schemes) is exact too except at flagged inputs, where the table has no entry and
the device's rounding is kept.  Cost: one float64 ``exp2``, a few elementwise operations and a
binary search in the small table per element; no host synchronisation.
"""

from __future__ import annotations

import numpy as np

from ..formats._jit import jit

#: float64 ulps around a float32 rounding boundary within which the device defers to the table
EXP2_GUARD = 64
#: the table's radius (``> EXP2_GUARD + 2``: both float64 exp2 are within one ulp of 2**x)
NEAR_ULPS = 256
#: the table covers ``[EXP2_LO, 0]``: below, 2**x rounds to 0 or far from any boundary
EXP2_LO = -150.0


@jit(inline="always")
def near_boundary(r, ulps):
    """Whether a float64 ``r >= 0`` lies within ``ulps`` float64 ulps of a float32 rounding
    boundary (False for float32 values, 0, inf and NaN): the scalar twin of
    :func:`near_boundary_t` (the table scan's test)."""
    f = np.float32(r)
    fd = np.float64(f)
    if not (r > 0.0) or fd == r or r == np.inf:
        return False
    nb = np.nextafter(f, np.float32(np.inf) if r > fd else np.float32(0.0))
    mid = (fd + np.float64(nb)) * 0.5
    return abs(r - mid) <= ulps * (np.nextafter(r, np.inf) - r)


def near_boundary_t(r, ulps: int):
    """:func:`near_boundary` of a float64 tensor, elementwise (every step exact: the midpoint
    of two adjacent float32 values and a difference of nearby float64 values)."""
    import torch

    f = r.to(torch.float32)
    fd = f.double()
    toward = torch.where(r > fd, torch.full_like(f, np.inf), torch.zeros_like(f))
    mid = (fd + torch.nextafter(f, toward).double()) * 0.5
    ulp = torch.nextafter(r, torch.full_like(r, np.inf)) - r
    return (r > 0) & (fd != r) & (r != np.inf) & ((r - mid).abs() <= ulps * ulp)


_TABLES: dict = {}


def _near_table(device):
    """``(keys int64 ascending, values float32)`` on ``device``: the signed int32 bit patterns of
    the table's ``x`` and the CPU's ``exp2_f32`` of each (built once per device)."""
    import torch

    key = str(device)
    if key not in _TABLES:
        from ._exp2_near import NEAR_MIDPOINT
        from ._fp import exp2_f32 as cpu_exp2

        bits = np.array(NEAR_MIDPOINT, dtype=np.uint32)
        xs = bits.view(np.float32)
        vals = np.array([cpu_exp2(x) for x in xs], dtype=np.float32)
        signed = bits.view(np.int32).astype(np.int64)
        order = np.argsort(signed)
        _TABLES[key] = (torch.from_numpy(signed[order]).to(device),
                        torch.from_numpy(vals[order]).to(device))
    return _TABLES[key]


def exp2_f32(x):
    """``_fp.exp2_f32`` of a float32 tensor on its device, bit for bit (module docstring):
    ``float32(exp2(float64(x)))`` with the C library's ``exp2``, for every ``x <= 0``, ``-inf``
    and NaN (NaN stays NaN)."""
    import torch

    r = torch.exp2(x.double())
    f = r.to(torch.float32)
    keys, vals = _near_table(x.device)
    k = x.contiguous().view(torch.int32).to(torch.int64)
    pos = torch.searchsorted(keys, k).clamp_(max=keys.numel() - 1)
    hit = near_boundary_t(r, EXP2_GUARD) & (keys[pos] == k)
    return torch.where(hit, vals[pos], f)


__all__ = ["exp2_f32", "near_boundary", "near_boundary_t", "EXP2_GUARD", "NEAR_ULPS"]
