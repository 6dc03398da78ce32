"""Device twin of :mod:`lowprec.formats.nvfp4`: NVFP4 blocks on the tensor's own device.

The recipes' float32 steps are not written a second time: the device runs the CPU's own
functions (``nvfp4.recipe_scales``, ``multiplier``, ``scaled_elements``, ``block_values``) with
:class:`TorchOps`, the same operations on tensors, so both devices perform the same IEEE float32
operations in the same order.  Around them:

=============================  ===============================================================
device                         CPU (``formats/nvfp4.py``)
=============================  ===============================================================
``x.to(float32)``              ``np.asarray(x, np.float32)`` (float64 rounds to nearest even;
                               float16/bfloat16 widen exactly)
``xb.abs().amax(-1)``          ``np.max(np.abs(xb), -1)``: block amax, NaN if the block holds
                               NaN (max is exact in any order)
finite ``|x|`` ``amax()``      the tensor amax of the two-level recipes
``minifloat.run_kernel``       ``api.encode`` -> ``minifloat.run_kernel``: the E4M3 block scales
                               (nearest even, saturating) and the E2M1 elements (every mode,
                               counter ``offset + r * n + i`` in the axis-last layout), by the
                               Triton twins of the Numba codecs -- never torch's float8 casts
``minifloat.lookup``           the value tables
=============================  ===============================================================

Exactness of the torch steps (gpu.md section 2): each is one IEEE float32 operation on both
devices; eager torch runs one kernel per operation, so nothing is contracted into an FMA.  A
division takes its divisor as a tensor on the device (:meth:`TorchOps.div` refuses a Python
number): torch's CUDA division by a CPU scalar multiplies by the scalar's reciprocal
(``BinaryDivTrueKernel.cu``), which can differ from the quotient in the last bit.

Nothing in encode and quantize reads a device value on the host: the two-level tensor scale
stays a 0-dim device tensor.  Decode of user-supplied codes checks them as the CPU does
(``codecs.nvfp4_decode`` -> ``_arrays.check_codes``: ValueError for an element code above 15,
one reduction read back); the lookup kernel reads only the 16 E2M1 values whatever the codes
(a code above 15 that reached it would give NaN).
"""

from __future__ import annotations

import numpy as np
import torch

from ..formats import nvfp4 as _nv
from ..formats.core import Rounding, get_format
from .minifloat import lookup, run_kernel

_E2M1 = get_format("e2m1")
_E4M3 = get_format("e4m3")
_RNE = int(Rounding.NEAREST_EVEN)


class TorchOps:
    """The operations of :class:`lowprec.formats.nvfp4.NumpyOps` on float32 tensors of one
    device (constants are 0-dim tensors there)."""

    clip = staticmethod(lambda a, lo, hi: torch.clamp(a, float(lo), float(hi)))  # NaN stays
    mul = staticmethod(torch.mul)
    where = staticmethod(torch.where)
    isfinite = staticmethod(torch.isfinite)

    def __init__(self, device: torch.device):
        self.device = device

    def const(self, v) -> torch.Tensor:
        """The float32 ``v`` (rounded as ``np.float32``) as a 0-dim tensor on the device."""
        with np.errstate(all="ignore"):
            return torch.full((), float(np.float32(v)), dtype=torch.float32, device=self.device)

    @staticmethod
    def div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not isinstance(b, torch.Tensor):  # module docstring: never a Python divisor
            raise TypeError("TorchOps.div needs a tensor divisor (pass xp.const(v))")
        return torch.div(a, b)

    def minimum(self, a: torch.Tensor, b) -> torch.Tensor:
        return torch.minimum(a, b if isinstance(b, torch.Tensor) else self.const(b))

    @staticmethod
    def repeat(a: torch.Tensor, k: int) -> torch.Tensor:
        """``np.repeat(a, k, axis=-1)`` as a broadcast view, copied (no host synchronisation)."""
        return a.unsqueeze(-1).expand(*a.shape, k).reshape(*a.shape[:-1], a.shape[-1] * k)


def _values(codes: torch.Tensor, table: np.ndarray) -> torch.Tensor:
    """float32 ``table[codes]`` on the codes' device, same shape (a code past the table's end:
    NaN, ``minifloat.lookup``)."""
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    lookup(codes.contiguous().reshape(-1), table, out.view(-1))
    return out


def encode_rows(x2: torch.Tensor, kk: int, recipe: str, ts, mode: int, seed: int, sr_bits: int,
                offset: int, want_value: bool):
    """NVFP4 of a contiguous ``(rows, n)`` float tensor blocked along its rows, ``kk`` elements
    per block (``ts`` as ``nvfp4.options`` returns it): ``(codes (rows, n), scales (rows, nb),
    t)`` with ``t`` a 0-dim float32 tensor, or the decoded float32 values ``(rows, n)``."""
    xp = TorchOps(x2.device)
    rows, n = x2.shape
    nb = -(-n // kk)
    x2 = x2.to(torch.float32)
    xb = torch.nn.functional.pad(x2, (0, nb * kk - n)).reshape(rows, nb, kk)
    finite = torch.isfinite(xb).all(dim=-1)
    amax_b = xb.abs().amax(dim=-1)
    fin_abs = x2.abs().masked_fill(~torch.isfinite(x2), 0.0)
    amax_t = fin_abs.amax() if x2.numel() else xp.const(0.0)
    t, s = _nv.recipe_scales(amax_b, amax_t, ts, recipe, xp)
    scodes = torch.empty((rows, nb), dtype=torch.uint8, device=x2.device)
    run_kernel(_E4M3.spec, s.contiguous().reshape(-1), scodes.view(-1), _RNE, True)
    sval = _values(scodes, _E4M3.values())
    y = _nv.scaled_elements(xb, _nv.multiplier(t, sval, ts, recipe, xp), xp)
    y = y.reshape(rows, nb * kk)[:, :n].contiguous()
    codes = torch.empty((rows, n), dtype=torch.uint8, device=x2.device)
    run_kernel(_E2M1.spec, y.view(-1), codes.view(-1), mode, False, seed, sr_bits, offset)
    scodes = torch.where(finite, scodes, _nv.E4M3_NAN).to(torch.uint8)
    if want_value:
        return decode_rows(codes, scodes, t, kk)
    return codes, scodes, t


def decode_rows(codes2: torch.Tensor, scales2: torch.Tensor, t: torch.Tensor,
                kk: int) -> torch.Tensor:
    """float32 values of contiguous codes ``(rows, n)`` and E4M3 scale codes ``(rows, nb)``
    with the 0-dim float32 tensor scale ``t`` on their device (``nvfp4.decode``; the codes are
    checked by the caller where they come from the user)."""
    ev = _values(codes2, _E2M1.values())
    sval = _values(scales2, _E4M3.values())
    return _nv.block_values(ev, sval, t, kk, TorchOps(codes2.device)).contiguous()
