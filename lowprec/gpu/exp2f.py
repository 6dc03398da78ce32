"""The CPU kernels' float32 ``exp2`` inside Triton kernels, bit for bit: the in-kernel twin of
:func:`lowprec.kernels._fp_device.exp2_f32` (read the two side by side; same steps, same
names).

The CPU computes ``float32(exp2(float64(x)))`` with the C library's ``exp2``.  A kernel computes
:func:`exp2_f32`:

1. ``r = exp2(float64(x))``: ``tl.exp2`` of a float64 is libdevice's double ``exp2`` on the GPU
   (at most one ulp; no ``ex2.approx``, which Triton uses only for float32) and NumPy's
   ``exp2`` in the interpreter; ``f = float32(r)`` (``cvt.rn.f32.f64``: nearest even,
   subnormals kept);
2. :func:`near_boundary`: whether ``r`` lies within :data:`EXP2_GUARD` float64 ulps of a
   float32 rounding boundary (integer tests on ``r``'s bits: the distance of its low 29 bits
   from ``2**28`` where ``float32(r)`` is normal; every ``r`` of the float32 subnormal range
   is flagged);
3. where some lane of the tile is near a boundary (rare: one branch per tile), a branchless
   binary search of ``x``'s bits in the sorted table of the 238 inputs of
   ``kernels._exp2_near`` (padded to 256 entries with ``INT32_MAX``) and, for a flagged lane
   whose ``x`` is there, the CPU's own value from the table.

Exact for every ``x <= 0``, ``-inf`` and NaN, by the argument of ``_fp_device`` (an unflagged
value is more than 64 ulps from every boundary while the CPU's lies within two ulps of it; a
flagged input has the CPU's value within 66 < 256 ulps of a boundary, so it is in the
table), for any float64 ``exp2`` within a few ulps: libdevice's on the GPU, NumPy's in the
interpreter.  :func:`exp2_rows` runs it elementwise on a tensor (the tests compare it with
``_fp.exp2_f32`` on every table input, their neighbours and random inputs).
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from ..kernels._fp_device import EXP2_GUARD as _GUARD
from ._launch import LAUNCH_OPTS, device_guard, interpreting

EXP2_GUARD = tl.constexpr(_GUARD)
#: entries of the in-kernel table (the 238 inputs padded with INT32_MAX keys): 2**8, so that
#: the binary search is 8 fixed steps
TABLE_SIZE = 256
_STEPS = tl.constexpr(8)
_HALF_TABLE = tl.constexpr(TABLE_SIZE // 2)
_INT32_MAX = (1 << 31) - 1


#: high words of the float64 2**-126 (the smallest normal float32) and 2**-150 (below it,
#: 2**x rounds to 0 or to a subnormal far from every boundary)
_HI_NORMAL = tl.constexpr(0x38100000)
_HI_SUBNORMAL = tl.constexpr(0x36900000)
_HI_INF = tl.constexpr(0x7FF00000)
_LOW29 = tl.constexpr((1 << 29) - 1)
_HALF29 = tl.constexpr(1 << 28)


@triton.jit
def near_boundary(r, ULPS: tl.constexpr):
    """Whether the float64 ``r`` may lie within ``ULPS`` float64 ulps of a float32 rounding
    boundary, on its bits (integer operations only; False for float32 values, ``r <= 0``,
    inf and NaN).

    Where ``float32(r)`` is normal (``2**-126 <= r``), the float32 values of ``r``'s float64
    binade are every ``2**29``-th float64 and their midpoints have the low 29 bits
    ``2**28``; a midpoint between two float32 values lies in the binade of the values around
    it, so ``|low29(r) - 2**28|`` is the exact distance in ``r``'s ulps, the test of
    ``_fp_device.near_boundary`` (exact float64 arithmetic) without its conversions.  Where
    ``float32(r)`` is subnormal (``2**-150 <= r < 2**-126``) every ``r`` is flagged: a flagged
    input outside the table keeps ``float32(r)``, which is then the CPU's value (the table
    holds every input within 256 ulps, see the module docstring), so flagging more is exact
    and only costs the table search of those tiles."""
    b = r.to(tl.int64, bitcast=True)
    hi = (b >> 32).to(tl.int32)
    dist = (b.to(tl.int32) & _LOW29) - _HALF29
    dist = tl.where(dist < 0, -dist, dist)
    normal = (hi >= _HI_NORMAL) & (hi < _HI_INF) & (dist <= ULPS)
    return normal | ((hi >= _HI_SUBNORMAL) & (hi < _HI_NORMAL))


@triton.jit
def exp2_f32(x, KEYS, VALS):
    """``_fp.exp2_f32`` of a float32 tile: ``float32(exp2(float64(x)))`` with the C library's
    ``exp2`` (module docstring).  ``KEYS``: int32 ``(256,)`` ascending signed bit patterns of
    the table's inputs (``INT32_MAX`` padding); ``VALS``: float32 ``(256,)`` the CPU's values."""
    r = tl.exp2(x.to(tl.float64))
    f = r.to(tl.float32)
    near = near_boundary(r, EXP2_GUARD)
    if tl.max(near.to(tl.int32)) != 0:
        k = x.to(tl.int32, bitcast=True)
        pos = tl.zeros_like(k)
        for s in tl.static_range(_STEPS):  # lower bound: entries < k
            step = _HALF_TABLE >> s
            probe = tl.load(KEYS + pos + (step - 1))
            pos = tl.where(probe < k, pos + step, pos)
        hit = near & (tl.load(KEYS + pos) == k)
        f = tl.where(hit, tl.load(VALS + pos), f)
    return f


_TABLES: dict = {}


def near_table(device):
    """``(keys int32 (256,), values float32 (256,))`` on ``device`` for :func:`exp2_f32`: the
    table of :func:`lowprec.kernels._fp_device._near_table` (the CPU's own values), padded
    (built once per device)."""
    import torch

    key = str(device)
    if key not in _TABLES:
        from ..kernels._fp_device import _near_table

        keys, vals = (t.cpu().numpy() for t in _near_table("cpu"))
        n = keys.size
        assert n <= TABLE_SIZE and np.all(np.diff(keys) > 0)
        kp = np.full(TABLE_SIZE, _INT32_MAX, dtype=np.int32)
        vp = np.zeros(TABLE_SIZE, dtype=np.float32)
        kp[:n] = keys.astype(np.int32)
        vp[:n] = vals
        _TABLES[key] = (torch.from_numpy(kp).to(device), torch.from_numpy(vp).to(device))
    return _TABLES[key]


@triton.jit
def _exp2_kernel(X, OUT, KEYS, VALS, n, BLOCK: tl.constexpr):
    """``OUT[i] = exp2_f32(X[i])`` for ``i < n`` (float32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0)
    tl.store(OUT + offs, exp2_f32(x, KEYS, VALS), mask=ok)


def exp2_rows(x, table=None):
    """:func:`exp2_f32` of every element of a float32 tensor (CUDA, or CPU under Triton's
    interpreter): the kernels' exp2 on its own, for tests and checks.  ``table``: ``(keys,
    values)`` in place of :func:`near_table`'s (a test marks the values to see which lanes
    read them)."""
    import torch

    xc = x.contiguous()
    out = torch.empty_like(xc)
    n = xc.numel()
    if n:
        keys, vals = near_table(x.device) if table is None else table
        block = (1 << 16) if interpreting() else 1024
        with device_guard(xc):
            _exp2_kernel[(triton.cdiv(n, block),)](xc, out, keys, vals, n, BLOCK=block,
                                                   **LAUNCH_OPTS)
    return out


__all__ = ["exp2_f32", "near_boundary", "near_table", "exp2_rows", "EXP2_GUARD", "TABLE_SIZE"]
