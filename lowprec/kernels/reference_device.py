"""Device path of :mod:`.reference`'s scheme ``reference`` ("float64 on the GPU"): exact softmax
attention in float64 on the tensors' device, the steps of :func:`.reference.reference_core`
(docs/design.md "Row-wise schemes on the device").

Per row chunk (memory O(chunk x Lk)): ``s = fp64(q k^T) * scale`` (+ the float32 mask widened;
``-inf`` beyond the causal limit), the row maximum, ``e = exp(s - max)``, ``O = (e v) / sum(e)``,
all in float64; float64 inputs stay float64 (the CPU's ``keep_float64``), the others are widened
from float32.  Rows that see no key are NaN (``-inf - -inf``), as on the CPU.

Not pinned bit for bit: the two float64 GEMMs (cuBLAS's summation order against BLAS's), the
float64 ``exp`` (CUDA's, within one ulp, against NumPy's) and the row sum (torch's order against
NumPy's pairwise one) differ between the devices in the last bits of float64.  That reaches a
float32 output only when it lies within a few float64 ulps of a float32 rounding boundary (about
2**-28 of outputs); float64 outputs (float64 inputs) agree to a few ulps.  Measured agreement in
docs/design.md.
"""

from __future__ import annotations

import math

from .device_rows import DeviceProblem, chunks


def reference(dp: DeviceProblem, return_stats: bool):
    """Scheme ``reference`` on the device: float64 ``(B, Lq, dv)`` (no statistics)."""
    import torch

    f64 = torch.float64
    q = dp.q.to(f64)
    out = torch.empty((dp.B, dp.Lq, dp.dv), dtype=f64, device=dp.device)
    for g0, g1, r0, r1 in chunks(dp):
        idx = dp.kv[g0:g1]
        s = torch.matmul(q[g0:g1, r0:r1], dp.k[idx].to(f64).transpose(1, 2)) * dp.scale
        if dp.mask is not None:
            s = s + dp.mask[dp.mask_map[g0:g1]][:, r0:r1].to(f64)
        if dp.causal:
            lim = dp.row_limits(r0, r1)
            cols = torch.arange(dp.Lk, device=dp.device)
            s = torch.where(cols[None, None, :] <= lim[None, :, None], s, -math.inf)
        mx = s.amax(dim=2, keepdim=True)
        e = torch.exp(s - mx)
        out[g0:g1, r0:r1] = torch.matmul(e, dp.v[idx].to(f64)) / e.sum(dim=2, keepdim=True)
    return out, None


__all__ = ["reference"]
