"""Device plumbing of the row-wise schemes, written once (docs/design.md "Attention on the
device"): the twin of :mod:`.problem` (the Problem, row masks, chunks, the mask floor) and of
:mod:`._int8` (symmetric int8 of q, k, v with the CPU's scale rules, exact integer products)
for torch tensors on one device.

A scheme's device function (the ``device`` field of its :class:`~lowprec.kernels.Scheme`) takes
a :class:`DeviceProblem` and returns ``(out float32 (B, Lq, dv) tensor, stats | None)`` as its
CPU ``run`` does; :func:`lowprec.kernels.device.attention_device` builds the problem and adds
what every scheme shares (rows that see no key, ``nonfinite_rows``, ``noisy_rows``,
``mask_floored``).

Exactness (specs/gpu.md sections 2-3):

* int8 codes ``clamp(RNE(fl64(x) / s), -127, 127)`` and scales ``fl32(amax / 127)``: float64
  division and the float64 -> float32 rounding are IEEE in torch on both devices, ``round`` is
  half to even; amax is a max (order-free);
* integer products (``q8 k8^T``, ``P v8``) are float64 GEMMs of integer-valued operands whose
  sums stay below 2**53: exact in any order (and no TF32: float64 GEMMs never use it); the
  CPU's float32 GEMMs hold the same integers;
* a float sum whose rounding matters is taken in the CPU's sequential order by
  :func:`lowprec.gpu.rowsum.seq_rowsum`.

Memory: a chunk of rows ``(rows, Lk)`` at a time (:func:`chunks`), q's codes ``(B, Lq, d)`` and
the key/value codes of the chunk's entries: O(L x d) per head beside a chunk, never an
``L x L`` plane per head.  Key/value heads are read by index (``kv``): entry ``b`` reads
``k[kv[b]]``, GQA groups share one stored head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._int8 import FINITE_WHY, INT8_QMAX, ROUND_LIMIT
from .problem import CHUNK_ELEMS, ProblemShape, row_chunks

F32_TINY = 2.0**-149  # the integer codec's lower clamp of computed scales
F32_MAX = float(np.finfo(np.float32).max)
_F32_MIN_NORMAL = 2.0**-126
#: logits per chunk on a GPU (the CPU's :data:`~.problem.CHUNK_ELEMS` on CPU tensors): the
#: chunking changes no result (every row is computed alone)
DEVICE_CHUNK_ELEMS = 1 << 24


@dataclass
class DeviceRows:
    """Visibility of a chunk of rows (the twin of :class:`~.problem.RowMask`).

    Attributes:
        lim: int64 ``(n,)`` tensor, the last key each row may see (causal; may be < 0).
        vis: None or boolean ``(n, Lk)``: keys the mask leaves visible (a mask's chunk is
            always given, even when it hides nothing).
        add: None or float32 ``(entries, rows, Lk)``: the additive mask, 0 where masked.
    """

    lim: Any
    vis: Any
    add: Any

    def visible(self, Lk: int, causal: bool):
        """Boolean ``(n, Lk)``: keys each row sees, or None when every row sees every key."""
        import torch

        if self.vis is None and not causal:
            return None
        cols = torch.arange(Lk, device=self.lim.device)[None, :] <= self.lim[:, None]
        return cols if self.vis is None else cols & self.vis


@dataclass
class DeviceProblem(ProblemShape):
    """An attention call on a device (the twin of :class:`~.problem.Problem`).

    Attributes:
        q: float32 ``(B, Lq, d)``; k, v: float32 ``(Bk, Lk, d)``, ``(Bk, Lk, dv)``.
        kv: int64 ``(B,)``: the key/value entry of each query entry.
        scale, causal, lead, in_dtype: as the Problem's.
        mask: None or float32 additive planes ``(M, Lq, Lk)`` (0, finite, -inf);
            mask_map: int64 ``(B,)`` tensor (None without a mask).
    """

    q: Any
    k: Any
    v: Any
    kv: Any
    scale: float
    causal: bool
    mask: Any
    mask_map: Any
    lead: tuple
    in_dtype: Any

    @property
    def device(self):
        """The tensors' device."""
        return self.q.device

    def row_limits(self, r0: int, r1: int):
        """int64 ``(r1 - r0,)``: the last key rows ``r0 .. r1 - 1`` may see."""
        import torch

        r = torch.arange(r0, r1, dtype=torch.int64, device=self.device)
        return r + (self.Lk - self.Lq) if self.causal else torch.full_like(r, self.Lk - 1)

    def rows(self, g0: int, g1: int, r0: int, r1: int) -> DeviceRows:
        """The :class:`DeviceRows` of entries ``g0 .. g1 - 1``, query rows ``r0 .. r1 - 1``."""
        import torch

        lim = self.row_limits(r0, r1).repeat(g1 - g0)
        if self.mask is None:
            return DeviceRows(lim, None, None)
        planes = self.mask[self.mask_map[g0:g1]][:, r0:r1]
        vis = planes != -math.inf
        add = torch.where(vis, planes, torch.zeros((), dtype=planes.dtype, device=self.device))
        return DeviceRows(lim, vis.reshape(-1, self.Lk), add)

    def _vis_planes(self):
        """Boolean ``(M, Lq, Lk)`` visible keys per mask plane (causal included), or None."""
        import torch

        if self.mask is None:
            return None
        vis = self.mask != -math.inf
        if self.causal:
            i = torch.arange(self.Lq, device=self.device)[:, None]
            j = torch.arange(self.Lk, device=self.device)[None, :]
            vis = vis & (j <= i + (self.Lk - self.Lq))[None]
        return vis

    def taking_part(self):
        """``(rows (B, Lq), keys (B, Lk))`` boolean tensors (:meth:`Problem.taking_part`)."""
        import torch

        B, Lq, Lk = self.B, self.Lq, self.Lk
        dev = self.device
        vis = self._vis_planes()
        if vis is None:
            keys = torch.ones((B, Lk), dtype=torch.bool, device=dev)
            rows = (self.row_limits(0, Lq) >= 0).expand(B, Lq) if Lk else \
                torch.zeros((B, Lq), dtype=torch.bool, device=dev)
            return rows.contiguous(), keys
        rows_p = vis.any(dim=2)
        keys_p = vis.any(dim=1)
        if Lq == Lk:
            rows_p = rows_p & keys_p
        return rows_p[self.mask_map], keys_p[self.mask_map]

    def sequences(self):
        """int64 ``(B,)`` tensor: the sequence of each entry (:meth:`Problem.sequences`)."""
        import torch

        per = self.B // self.lead[0] if self.lead and self.lead[0] else max(self.B, 1)
        return torch.arange(self.B, dtype=torch.int64, device=self.device) // max(per, 1)

    def floored(self, floor: float):
        """``(problem, n)``: :meth:`Problem.floored` on the device (``n`` read back)."""
        import torch

        mask = self.mask
        if mask is None or mask.numel() == 0:
            return self, 0
        vis = mask
        if self.causal:
            i = torch.arange(self.Lq, device=self.device)[:, None]
            j = torch.arange(self.Lk, device=self.device)[None, :]
            vis = torch.where((j <= i + (self.Lk - self.Lq))[None], mask, -math.inf)
        top = vis.amax(dim=2, keepdim=True)
        f = float(np.float32(floor))
        sunk = (top <= f) & torch.isfinite(top)
        a = torch.where(sunk, (mask.double() - top.double()).float(), mask)
        low = (a <= f) & torch.isfinite(a)
        n = int(low.sum())
        if n:
            a = torch.where(low, -math.inf, a)
        elif not bool(sunk.any()):
            return self, 0
        return replace(self, mask=a), n


def chunks(dp: DeviceProblem, align: int = 1, width: int = 0):
    """The ``(g0, g1, r0, r1)`` row chunks of a device call (:func:`~.problem.row_chunks`);
    ``width``: elements a scheme holds per row when that exceeds ``Lk`` (fewer rows per
    chunk)."""
    elems = DEVICE_CHUNK_ELEMS if dp.device.type != "cpu" else CHUNK_ELEMS
    if width > dp.Lk:
        elems = max(1, elems * max(dp.Lk, 1) // width)
    return row_chunks(dp.B, dp.Lq, dp.Lk, elems=elems, align=align)


def none_visible(vis, lim, Lk: int):
    """Boolean ``(n,)``: rows that see no key (:meth:`RowMask.none_visible`)."""
    import torch

    if Lk == 0:
        return torch.ones(lim.shape, dtype=torch.bool, device=lim.device)
    if vis is None:
        return lim < 0
    cols = torch.arange(Lk, device=lim.device)[None, :]
    return ~torch.any(vis & (cols <= lim[:, None]), dim=1)


# --------------------------------------------------------------------------------------------
# int8 of q, k, v (the twin of _int8.quantize_visible / quantize_qkv)


def row_amax(x):
    """float64 ``max |x|`` of every row of ``x (N, L, D)`` (0 for ``D == 0``; NaN/Inf kept)."""
    import torch

    if x.shape[-1] == 0 or x.numel() == 0:
        return torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    return x.abs().amax(dim=-1).double()


def entry_scales(amax):
    """float32 scales ``clamp(fl32(amax / 127))``, 1.0 for 0 (``_int8._entry_scales``)."""
    import torch

    s = (amax / INT8_QMAX).float().clamp(F32_TINY, F32_MAX)
    return torch.where(amax == 0, torch.ones_like(s), s)


def scoped_amax(a, seen, group):
    """``_int8.scoped_amax`` of row maxima ``a (B, L)`` over the rows ``seen``, maximised over
    the entries of one ``group`` (int64 ``(B,)`` tensor or None)."""
    import torch

    B, L = a.shape
    if not L:
        e = torch.zeros(B, dtype=torch.float64, device=a.device)
    else:
        e = torch.where(seen, a, torch.zeros((), dtype=a.dtype, device=a.device)).amax(dim=1) \
            if B else torch.zeros(0, dtype=torch.float64, device=a.device)
    if group is None or B == 0:
        return e
    g = torch.zeros(int(group.max()) + 1, dtype=torch.float64, device=a.device)
    g = g.scatter_reduce(0, group, e, reduce="amax", include_self=True)
    return g[group]


def codes(x, s_rows, qmin: int = -INT8_QMAX):
    """int8 codes (float64 tensor) ``clamp(RNE(fl64(x) / s), qmin, 127)`` of ``x (..., D)``
    with one float64 scale per row ``s_rows (...)``."""
    return (x.double() / s_rows.double()[..., None]).round().clamp(qmin, INT8_QMAX)


def _count_sat(x, s_rows, seen):
    """:func:`_int8._saturated_visible`: values of the rows ``seen`` beyond ``127.5 s``."""
    sr = s_rows[seen]
    if sr.numel() == 0 or float(sr.min()) >= _F32_MIN_NORMAL:
        return 0
    thr = ROUND_LIMIT * s_rows.double()
    big = (x.double().abs() > thr[..., None]) & seen[..., None]
    return int(big.sum())


@dataclass
class DeviceQKV:
    """int8 q, k, v of a :class:`DeviceProblem` (the twin of :class:`_int8.QKV8`).

    Attributes:
        q8i: int8 ``(B, Lq, d)`` codes of q.
        sq_row: float32 ``(B, Lq)``; sk, sv: float32 ``(B,)``; host: their float32 host
            copies ``{"sq_row", "sk", "sv"}`` (NumPy, read back with the finiteness check:
            the call's one synchronisation).
        groups, block, quantized: as ``QKV8``'s; saturated: int (``QKV8.saturated``).
        dp: the problem (the key/value codes of a chunk are made on demand: :meth:`k8t`).
    """

    q8i: Any
    sq_row: Any
    sk: Any
    sv: Any
    groups: int
    block: int
    quantized: int
    saturated: int
    dp: Any
    host: dict | None = None
    _cache: dict | None = None

    def _kv(self, g0: int, g1: int):
        key = (g0, g1)
        if self._cache is None or self._cache.get("key") != key:
            dp = self.dp
            idx = dp.kv[g0:g1]
            k8 = codes(dp.k[idx], self.sk[g0:g1, None].expand(g1 - g0, dp.Lk))
            v8 = codes(dp.v[idx], self.sv[g0:g1, None].expand(g1 - g0, dp.Lk))
            self._cache = {"key": key, "k8t": k8.transpose(1, 2), "v8": v8}
        return self._cache

    def int8_kv(self):
        """int8 ``(B, Lk, d)`` and ``(B, Lk, dv)``: k's and v's codes of every query entry
        (its key/value head's codes under its own scale; :mod:`lowprec.gpu.int8codes`)."""
        dp = self.dp
        return int8_codes(dp.k, self.sk, dp.kv), int8_codes(dp.v, self.sv, dp.kv)

    def k8t(self, g0: int, g1: int):
        """float64 ``(g1 - g0, d, Lk)``: k's codes of entries ``g0 .. g1 - 1``, transposed."""
        return self._kv(g0, g1)["k8t"]

    def v8(self, g0: int, g1: int):
        """float64 ``(g1 - g0, Lk, dv)``: v's codes of entries ``g0 .. g1 - 1``."""
        return self._kv(g0, g1)["v8"]

    def scores(self, g0: int, g1: int, r0: int, r1: int):
        """The exact integer scores ``q8 k8^T`` of a chunk, float64 ``(g1-g0, r1-r0, Lk)``."""
        import torch

        return torch.matmul(self.q8i[g0:g1, r0:r1].double(), self.k8t(g0, g1))


def _check_finite(dp: DeviceProblem) -> None:
    """ValueError for NaN/Inf in q, k or v (``_int8.check_finite_inputs``'s message)."""
    import torch

    for name, t in (("q", dp.q), ("k", dp.k), ("v", dp.v)):
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")


def quantize_problem(dp: DeviceProblem, granularity: str = "per_tensor", block: int = 128,
                     scope: str = "visible") -> DeviceQKV:
    """int8 q, k, v of a device problem: ``_int8.quantize_problem`` (``scope`` ``"visible"``:
    ``quantize_visible``; ``"tensor"``: ``quantize_qkv``), the same codes, scales and
    counters."""
    import torch

    B, Lq, d = dp.q.shape
    Lk = dp.Lk
    dev = dp.device
    if scope == "tensor":
        rows_q = torch.ones((B, Lq), dtype=torch.bool, device=dev)
        keys = torch.ones((B, Lk), dtype=torch.bool, device=dev)
        group = torch.zeros(B, dtype=torch.int64, device=dev) \
            if granularity == "per_tensor" else None
    else:
        rows_q, keys = dp.taking_part()
        group = dp.sequences() if granularity == "per_tensor" else None
    aq = row_amax(dp.q)
    ak_kv, av_kv = row_amax(dp.k), row_amax(dp.v)
    ak, av = ak_kv[dp.kv], av_kv[dp.kv]
    sk = entry_scales(scoped_amax(ak, keys, group))
    sv = entry_scales(scoped_amax(av, keys, group))
    blocks, nblk = 1, max(Lq, 1)
    if granularity == "per_block" and Lq:
        nblk = block
        blocks = -(-Lq // block)
        pad = blocks * block - Lq
        ap = torch.cat([aq, torch.zeros((B, pad), dtype=aq.dtype, device=dev)], 1) \
            if pad else aq
        rp = torch.cat([rows_q, torch.zeros((B, pad), dtype=torch.bool, device=dev)], 1) \
            if pad else rows_q
        amax = scoped_amax(ap.reshape(B * blocks, block), rp.reshape(B * blocks, block), None)
        sq_row = entry_scales(amax).reshape(B, blocks).repeat_interleave(block, dim=1)[:, :Lq]
    else:
        sq_row = entry_scales(scoped_amax(aq, rows_q, group))[:, None].expand(B, Lq)
    sq_row = sq_row.contiguous()
    # the one read-back: q, k, v finite (an amax is NaN / Inf iff its rows hold one), the
    # smallest scale of the rows and keys taking part (subnormal: count saturations), the
    # scales themselves (host copies for the schemes' host-side steps)
    inf = torch.full((1,), math.inf, dtype=torch.float64, device=dev)
    fin = [torch.isfinite(a).all().reshape(1).double() if a.numel() else inf.new_ones(1)
           for a in (aq, ak_kv, av_kv)]
    kseen = keys.any(dim=1)
    low = [torch.where(seen, sc.double(), inf).amin().reshape(1) if seen.numel() else inf
           for seen, sc in ((rows_q, sq_row), (kseen, sk), (kseen, sv))]
    host = torch.cat(fin + low + [sq_row.reshape(-1).double(), sk.double(), sv.double()])
    host = host.cpu().numpy()
    for i, name in enumerate(("q", "k", "v")):
        if host[i] != 1.0:
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")
    sat = _count_sat(dp.q, sq_row, rows_q) if host[3] < _F32_MIN_NORMAL else 0
    for x, s, lo in ((dp.k, sk, host[4]), (dp.v, sv, host[5])):  # rare: a subnormal scale
        if lo < _F32_MIN_NORMAL:
            sr = s[:, None].expand(B, Lk)
            sat += sum(_count_sat(x[dp.kv[b]][None], sr[b:b + 1], keys[b:b + 1])
                       for b in range(B))
    n = B * Lq
    hs = {"sq_row": host[6:6 + n].astype(np.float32).reshape(B, Lq),
          "sk": host[6 + n:6 + n + B].astype(np.float32),
          "sv": host[6 + n + B:6 + n + 2 * B].astype(np.float32)}
    return DeviceQKV(q8i=int8_codes(dp.q, sq_row), sq_row=sq_row, sk=sk, sv=sv,
                     groups=blocks, block=nblk, quantized=B * (Lq * d + Lk * d + Lk * dp.dv),
                     saturated=sat, dp=dp, host=hs)


#: run the fused Triton kernels on CPU tensors under ``TRITON_INTERPRET=1`` (tests switch it
#: off to compare the kernels with the torch-operations paths)
FUSED_ON_INTERPRETER = True


def fused_kernels(dp: DeviceProblem) -> bool:
    """Whether a scheme's fused Triton kernel may run the call: CUDA tensors, or CPU tensors
    under Triton's interpreter (:data:`FUSED_ON_INTERPRETER`)."""
    if dp.device.type == "cuda":
        return True
    from ..gpu._launch import interpreting

    return interpreting() and FUSED_ON_INTERPRETER


def int8_codes(x, scales, src=None, qmin: int = -INT8_QMAX):
    """int8 codes of float32 ``x`` (:func:`lowprec.gpu.int8codes.int8_codes`: CUDA tensors,
    or CPU tensors under Triton's interpreter; otherwise :func:`codes` in torch operations)."""
    import torch

    from ..gpu._launch import interpreting

    if x.is_cuda or interpreting():
        from ..gpu.int8codes import int8_codes as kernel

        return kernel(x, scales, src, qmin)
    xs = x if src is None else x[src]
    s = scales if scales.dim() == 2 else scales[:, None].expand(xs.shape[0], xs.shape[1])
    return codes(xs, s, qmin).to(torch.int8)


def float_scores(dp: DeviceProblem, g0: int, g1: int, r0: int, r1: int, rm: DeviceRows, q64):
    """float32 scores ``fp32(fp32(fp64(q . k) scale) + mask)`` of a chunk, ``(n, Lk)`` (the twin
    of :func:`._scores.float_scores`; ``q64`` = ``dp.q`` in float64, ``rm`` the chunk's
    :meth:`DeviceProblem.rows`).  The float64 GEMM of float32 operands sums in cuBLAS's order
    (BLAS's on the CPU): the one step of the float-score schemes not pinned bit for bit."""
    import torch

    n = (g1 - g0) * (r1 - r0)
    G = torch.matmul(q64[g0:g1, r0:r1], dp.k[dp.kv[g0:g1]].double().transpose(1, 2))
    x = (G * dp.scale).to(torch.float32).reshape(n, dp.Lk)
    return x if rm.add is None else x + rm.add.reshape(n, dp.Lk)


def float_output(P, dp: DeviceProblem, g0: int, g1: int):
    """``fp32(P v)`` of a chunk's probabilities ``P (n, Lk)`` (float32 values) in float64 (the
    twin of :func:`._scores.float_rows_output` and the float32 output array), ``(entries,
    rows, dv)``; the GEMM's order is not pinned (:func:`float_scores`)."""
    import torch

    gh = g1 - g0
    O = torch.matmul(P.double().reshape(gh, -1, dp.Lk), dp.v[dp.kv[g0:g1]].double())
    return O.to(torch.float32)


def out_rows(acc, sv, pmax: float):
    """``(acc * s_v) / pmax`` in float64 rounded once to float32 (``intattention._out_rows``
    followed by the float32 output array).  The divisor is a device tensor: torch's CUDA
    division by a host scalar multiplies by its rounded reciprocal (not IEEE division)."""
    import torch

    den = torch.full((), float(pmax), dtype=torch.float64, device=acc.device)
    return ((acc.double() * sv.double()[:, None, None]) / den).float()


__all__ = ["DeviceProblem", "DeviceRows", "DeviceQKV", "quantize_problem", "chunks", "codes",
           "row_amax", "entry_scales", "scoped_amax", "none_visible", "out_rows",
           "fused_kernels", "int8_codes", "float_scores", "float_output",
           "DEVICE_CHUNK_ELEMS"]
