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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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


def _kernels_run(x) -> bool:
    """Whether the one-pass Triton kernels (row maxima, int8 codes) take tensor ``x``: a CUDA
    tensor, or a CPU tensor under Triton's interpreter."""
    from ..gpu._launch import interpreting

    return x.is_cuda or interpreting()


_INDEX: dict = {}


def index_tensor(key: tuple, build, dev):
    """A constant tensor on ``dev`` (``build()``: its NumPy values), made once per
    ``key`` and device and kept (at most 256): the index vectors a call of one shape needs,
    without a launch or a synchronising copy on later calls.  Read only."""
    import torch

    from ..gpu._launch import host_to_device

    k = key + (str(dev),)
    t = _INDEX.get(k)
    if t is None:
        t = host_to_device(torch.from_numpy(build()), dev)
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return t  # (not kept: a graph's memory pool owns it)
        if len(_INDEX) >= 256:
            _INDEX.clear()
        _INDEX[k] = t
    return t


def to_device(arrays, dev) -> list:
    """Host NumPy arrays of 8-byte dtypes (int64, float64) on ``dev`` in one non-blocking
    copy (:func:`lowprec.gpu._launch.host_to_device`; no synchronisation): views of one
    buffer, each C-contiguous, of its array's shape and dtype, 16-byte aligned."""
    import torch

    from ..gpu._launch import host_to_device

    arrays = [np.ascontiguousarray(a) for a in arrays]
    offs, n = [], 0
    for a in arrays:
        offs.append(n)
        n += -(-a.size // 2) * 2
    buf = np.zeros(n, dtype=np.int64)
    for a, o in zip(arrays, offs, strict=True):
        buf[o:o + a.size] = a.reshape(-1).view(np.int64)
    t = host_to_device(torch.from_numpy(buf), dev)
    tdt = {np.dtype(np.int64): torch.int64, np.dtype(np.float64): torch.float64}
    return [t[o:o + a.size].view(tdt[a.dtype]).reshape(a.shape)
            for a, o in zip(arrays, offs, strict=True)]


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
class DeviceStats:
    """The statistics of a device function (a scheme's ``device`` field) still on the device,
    returned in place of a stats object so that the caller reads them back with its own
    counters in one copy, or defers that copy
    (:func:`~.device.attention_device` with ``defer``).

    Attributes:
        counts: list of int64 1-D tensors on the device.
        build: ``build(host)``: the stats object from ``host``, a NumPy int64 array that
            begins with the values of ``counts``, concatenated (it may be longer).
    """

    counts: Any
    build: Callable


@dataclass
class DeviceProblem(ProblemShape):
    """An attention call on a device (the twin of :class:`~.problem.Problem`).

    Attributes:
        q_in: ``(B, Lq, d)``; k_in, v_in: ``(Bk, Lk, d)``, ``(Bk, Lk, dv)``: the problem's
            values, C-contiguous, in the inputs' own dtype where it holds them exactly
            (bfloat16, float16, float32; float64 when the scheme keeps it), float64 inputs
            otherwise rounded to float32.  The Triton kernels read these
            (:func:`row_amax`, :func:`int8_codes`); :attr:`q`, :attr:`k`, :attr:`v` are the
            same values in the float dtype ``ft``, made on first use.
        kv: int64 ``(B,)``: the key/value entry of each query entry.
        scale, causal, lead, in_dtype: as the Problem's.
        mask: None or float32 additive planes ``(M, Lq, Lk)`` (0, finite, -inf);
            mask_map: int64 ``(B,)`` tensor (None without a mask).
        ft: the float dtype of :attr:`q`, :attr:`k`, :attr:`v` (float32, or float64 kept).
    """

    q_in: Any
    k_in: Any
    v_in: Any
    kv: Any
    scale: float
    causal: bool
    mask: Any
    mask_map: Any
    lead: tuple
    in_dtype: Any
    ft: Any
    _float: dict = field(default_factory=dict, repr=False, compare=False)

    def _as_float(self, name: str):
        t = self._float.get(name)
        if t is None:
            x = getattr(self, name + "_in")
            t = self._float[name] = x if x.dtype == self.ft else x.to(self.ft)
        return t

    def row_max(self, name: str):
        """float64 ``max |x|`` of every row of ``q_in``, ``k_in`` or ``v_in`` (``name`` "q",
        "k" or "v"; :func:`row_amax`), computed once per problem (the scheme's quantization
        and the noise estimate share it)."""
        t = self._float.get("amax_" + name)
        if t is None:
            t = self._float["amax_" + name] = row_amax(getattr(self, name + "_in"))
        return t

    def tensor_max(self):
        """float64 ``(3,)``: the largest ``|x|`` of q, k and v (NaN / Inf kept; every row
        non-empty), made once per problem from :meth:`row_max`."""
        import torch

        t = self._float.get("amax_all")
        if t is None:
            t = self._float["amax_all"] = torch.stack([self.row_max(n).amax() for n in "qkv"])
        return t

    @property
    def q(self):
        """``q_in`` in ``ft`` (a copy made once, for the torch-operations paths)."""
        return self._as_float("q")

    @property
    def k(self):
        """``k_in`` in ``ft`` (made once)."""
        return self._as_float("k")

    @property
    def v(self):
        """``v_in`` in ``ft`` (made once)."""
        return self._as_float("v")

    # ProblemShape's sizes, read from the stored tensors (no float copy made for them)
    B = property(lambda self: self.q_in.shape[0], doc="Batch entries (leading dims).")
    Lq = property(lambda self: self.q_in.shape[1], doc="Query length.")
    Lk = property(lambda self: self.k_in.shape[1], doc="Key length.")
    d = property(lambda self: self.q_in.shape[2], doc="Head dim of q and k.")
    dv = property(lambda self: self.v_in.shape[2], doc="Head dim of v (and the output).")

    @property
    def all_take_part(self) -> bool:
        """Whether every query row and every key takes part (:meth:`taking_part` all True:
        no mask, and no causal row before the first key)."""
        return self.mask is None and self.Lk > 0 and (not self.causal or self.Lq <= self.Lk)

    @property
    def device(self):
        """The tensors' device."""
        return self.q_in.device

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

    def seq_ids(self) -> np.ndarray:
        """Host int64 ``(B,)``: the sequence of each entry (:meth:`Problem.sequences`)."""
        per = self.B // self.lead[0] if self.lead and self.lead[0] else max(self.B, 1)
        return np.arange(self.B, dtype=np.int64) // max(per, 1)

    def sequences(self):
        """int64 ``(B,)`` tensor: :meth:`seq_ids` on the device (made once per shape)."""
        key = ("sequences", self.B, self.lead[:1])
        return index_tensor(key, self.seq_ids, self.device)

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
    """float64 ``max |x|`` of every row of ``x (N, L, D)`` (0 for ``D == 0``; NaN/Inf kept):
    one pass of :func:`lowprec.gpu.rowstats.row_amax` over ``x`` in its own dtype (CUDA
    tensors, or CPU tensors under Triton's interpreter; bfloat16, float16, float32), otherwise
    torch's ``x.abs().amax(dim=-1)`` (the same values)."""
    import torch

    if x.shape[-1] == 0 or x.numel() == 0:
        return torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    from ..gpu import rowstats

    if _kernels_run(x) and rowstats.kernel_takes(x):
        return rowstats.row_amax(x)
    return x.abs().amax(dim=-1).double()


def entry_scales(amax):
    """float32 scales ``clamp(fl32(amax / 127))``, 1.0 for 0 (``_int8._entry_scales``).  The
    divisor is a device tensor: torch's CUDA division by a host scalar multiplies by its
    rounded reciprocal, which can differ in the last float64 bit (harmless for float32 maxima,
    not for float64 ones)."""
    den = index_tensor(("int8_qmax",), lambda: np.array(float(INT8_QMAX)), amax.device)
    s = (amax / den).float().clamp(F32_TINY, F32_MAX)
    return s.masked_fill(amax == 0, 1.0)


def seen_amax(a, seen):
    """float64 ``(B,)``: the largest of the row maxima ``a (B, L)`` over the rows ``seen``
    (boolean ``(B, L)``; None: every row), 0 for ``L == 0``."""
    import torch

    B, L = a.shape
    if not L or not B:
        return torch.zeros(B, dtype=torch.float64, device=a.device)
    if seen is not None:
        a = torch.where(seen, a, torch.zeros((), dtype=a.dtype, device=a.device))
    return a.amax(dim=1)


def group_amax(e, group, ngroups: int | None = None):
    """``e (B,)`` maximised over the entries of one ``group`` (int64 ``(B,)`` tensor or None)
    of the ``ngroups`` groups (None: read back from ``group``), and 0."""
    import torch

    if group is None or e.shape[0] == 0:
        return e
    n = int(group.max()) + 1 if ngroups is None else ngroups
    g = torch.zeros(n, dtype=torch.float64, device=e.device)
    return g.scatter_reduce(0, group, e, reduce="amax", include_self=True)[group]


def scoped_amax(a, seen, group, ngroups: int | None = None):
    """``_int8.scoped_amax`` of row maxima ``a (B, L)`` over the rows ``seen`` (None: every
    row), maximised over the entries of one ``group`` (:func:`group_amax`)."""
    return group_amax(seen_amax(a, seen), group, ngroups)


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
        sq_row: float32 ``(B, Lq)``; sk, sv: float32 ``(B,)``; host: float32 host copies
            ``{"sq", "sk", "sv"}`` (NumPy, read back with the finiteness check: the call's
            one synchronisation), ``sq`` q's scales ``(B, groups)``, one per block of
            ``block`` rows (``sq_row`` repeats them).
        groups, block, quantized: as ``QKV8``'s; saturated: int (``QKV8.saturated``).
        dp: the problem (the key/value codes of a chunk are made on demand: :meth:`k8t`).
        kv8: ``(k8, v8)`` made by :func:`quantize_problem` with ``codes_kv``, else None
            (:meth:`int8_kv` makes them).
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
    kv8: tuple | None = None
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
        (its key/value head's codes under its own scale; :mod:`lowprec.gpu.int8codes`), or
        the codes :func:`quantize_problem` launched before its read-back (``codes_kv``)."""
        if self.kv8 is not None:
            return self.kv8
        dp = self.dp
        return int8_codes(dp.k_in, self.sk, dp.kv), int8_codes(dp.v_in, self.sv, dp.kv)

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


def quantize_problem(dp: DeviceProblem, granularity: str = "per_tensor", block: int = 128,
                     scope: str = "visible", codes_kv: bool = False) -> DeviceQKV:
    """int8 q, k, v of a device problem: ``_int8.quantize_problem`` (``scope`` ``"visible"``:
    ``quantize_visible``; ``"tensor"``: ``quantize_qkv``), the same codes, scales and
    counters.  One pass over each of q, k, v for the row maxima, one for the codes (k's and
    v's by :meth:`DeviceQKV.int8_kv` or per chunk), one read-back.  With ``codes_kv`` (a
    caller that will take :meth:`DeviceQKV.int8_kv`) and one scale per tensor on a CUDA
    device, the codes of q, k and v are launched before the read-back, so that the host's
    launches overlap the device's work instead of following the synchronisation (the values
    are the same; a non-finite input still raises, its codes unused)."""
    import torch

    B, Lq, Lk, d = dp.B, dp.Lq, dp.Lk, dp.d
    dev = dp.device
    rows_q = keys = None  # None: every row / key takes part
    if scope != "tensor" and not dp.all_take_part:
        rows_q, keys = dp.taking_part()
    group = ng = None
    if granularity == "per_tensor":
        if scope == "tensor":
            group, ng = index_tensor(("zeros", B), lambda: np.zeros(B, np.int64), dev), 1
        else:
            group, ng = dp.sequences(), int(dp.seq_ids().max()) + 1
    aq, ak_kv, av_kv = dp.row_max("q"), dp.row_max("k"), dp.row_max("v")
    if ng == 1 and rows_q is None and B and Lq and Lk:
        return _quantize_one_group(dp, codes_kv)
    sk, sv = (entry_scales(group_amax(seen_amax(a[dp.kv], keys) if keys is not None else
                                      seen_amax(a, None)[dp.kv], group, ng))
              for a in (ak_kv, av_kv))
    blocks, nblk = 1, max(Lq, 1)
    if granularity == "per_block" and Lq:
        nblk = block
        blocks = -(-Lq // block)
        pad = blocks * block - Lq
        ap = torch.cat([aq, torch.zeros((B, pad), dtype=aq.dtype, device=dev)], 1) \
            if pad else aq
        rp = rows_q if rows_q is None or not pad else \
            torch.cat([rows_q, torch.zeros((B, pad), dtype=torch.bool, device=dev)], 1)
        sq = entry_scales(seen_amax(ap.reshape(B * blocks, block),
                                    None if rp is None else rp.reshape(B * blocks, block)))
        sq = sq.reshape(B, blocks)
        sq_row = sq.repeat_interleave(block, dim=1)[:, :Lq]
    else:
        sq = entry_scales(scoped_amax(aq, rows_q, group, ng))[:, None]
        sq_row = sq.expand(B, Lq)
    sq_row = sq_row.contiguous()
    # the one read-back: the largest |x| of q, k, v (NaN / Inf iff the tensor holds one), the
    # smallest scale of the rows and keys taking part (subnormal: count saturations), the
    # scales themselves (host copies for the schemes' host-side steps; q's per block)
    inf = torch.full((1,), math.inf, dtype=torch.float64, device=dev)
    top = [a.amax().reshape(1) if a.numel() else inf.new_zeros(1) for a in (aq, ak_kv, av_kv)]
    if rows_q is None:
        low = [sc.amin().reshape(1).double() for sc in (sq, sk, sv)]
    else:
        kseen = keys.any(dim=1)
        low = [torch.where(seen, sc.double(), inf).amin().reshape(1) if seen.numel() else inf
               for seen, sc in ((rows_q, sq_row), (kseen, sk), (kseen, sv))]
    host = torch.cat(top + low + [sq.reshape(-1).double(), sk.double(), sv.double()])
    host = host.cpu().numpy()
    check_finite(host[:3])
    n = B * blocks
    hs = {"sq": host[6:6 + n].astype(np.float32).reshape(B, blocks),
          "sk": host[6 + n:6 + n + B].astype(np.float32),
          "sv": host[6 + n + B:6 + n + 2 * B].astype(np.float32)}
    return DeviceQKV(q8i=int8_codes(dp.q_in, sq_row), sq_row=sq_row, sk=sk, sv=sv,
                     groups=blocks, block=nblk, quantized=B * (Lq * d + Lk * d + Lk * dp.dv),
                     saturated=_saturated(dp, sq_row, sk, sv, host[3:6], rows_q, keys),
                     dp=dp, host=hs)


def _quantize_one_group(dp: DeviceProblem, codes_kv: bool = False) -> DeviceQKV:
    """:func:`quantize_problem` when one scale serves each of q, k and v (``per_tensor`` of a
    single group: one sequence, or ``scope="tensor"``) and every row and key takes part: the
    scales of the largest ``|x|`` of each tensor, in a few operations on 3 values.  The
    same values as the general path's (a maximum is exact in any order): ``kv`` maps onto
    every key/value entry (:func:`~.device.attention_device` builds it so), so the largest
    ``|k|`` the query entries see is the largest of ``k``."""
    import torch

    B, Lq, Lk, d = dp.B, dp.Lq, dp.Lk, dp.d
    top = dp.tensor_max()
    s3 = entry_scales(top)
    s = s3[:, None].expand(3, B).contiguous()  # q's, k's, v's scale per entry
    sq, sk, sv = s[0], s[1], s[2]
    # on CUDA the codes go first (under the interpreter NaN scales would warn in NumPy's casts
    # before the finiteness check raises)
    early = dp.device.type == "cuda"
    q8i = int8_codes(dp.q_in, sq) if early else None
    kv8 = (int8_codes(dp.k_in, sk, dp.kv), int8_codes(dp.v_in, sv, dp.kv)) \
        if early and codes_kv else None
    # the one read-back: the largest |x| of q, k, v (NaN / Inf iff the tensor holds one) and
    # the three scales
    host = torch.cat([top, s3.double()]).cpu().numpy()
    check_finite(host[:3])
    sq_row = sq[:, None].expand(B, Lq)
    hs = {"sq": np.full((B, 1), host[3], dtype=np.float32),
          "sk": np.full(B, host[4], dtype=np.float32),
          "sv": np.full(B, host[5], dtype=np.float32)}
    return DeviceQKV(q8i=int8_codes(dp.q_in, sq) if q8i is None else q8i, sq_row=sq_row,
                     sk=sk, sv=sv, groups=1, block=Lq,
                     quantized=B * (Lq * d + Lk * d + Lk * dp.dv),
                     saturated=_saturated(dp, sq_row, sk, sv, host[3:6], None, None),
                     dp=dp, host=hs, kv8=kv8)


def check_finite(tops) -> None:
    """ValueError (the CPU's ``_int8.check_finite_inputs`` message) for the first of q, k, v
    whose largest ``|x|`` is NaN or Inf: ``tops`` three host values or arrays of maxima (a
    maximum is NaN / Inf iff its values hold one), read back by the caller."""
    for name, top in zip("qkv", tops, strict=True):
        if not np.all(np.isfinite(top)):
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")


def _saturated(dp: DeviceProblem, sq_row, sk, sv, low, rows_q, keys) -> int:
    """``QKV8.saturated``: values beyond ``127.5 s`` among the rows and keys taking part
    (``rows_q``, ``keys``; None: every one), counted only when a smallest scale ``low``
    (host ``(q, k, v)``) is subnormal (rare: reads back again)."""
    if min(low) >= _F32_MIN_NORMAL:
        return 0
    B, Lk = dp.B, dp.Lk
    if rows_q is None:
        rows_q, keys = dp.taking_part()
    sat = _count_sat(dp.q, sq_row, rows_q) if low[0] < _F32_MIN_NORMAL else 0
    for x, s, lo in ((dp.k, sk, low[1]), (dp.v, sv, low[2])):
        if lo < _F32_MIN_NORMAL:
            sr = s[:, None].expand(B, Lk)
            sat += sum(_count_sat(x[dp.kv[b]][None], sr[b:b + 1], keys[b:b + 1])
                       for b in range(B))
    return sat


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
    """int8 codes of ``x`` (:func:`lowprec.gpu.int8codes.int8_codes`, bfloat16, float16 or
    float32 read as stored: CUDA tensors, or CPU tensors under Triton's interpreter;
    otherwise :func:`codes` in torch operations)."""
    import torch

    if _kernels_run(x) and x.dtype in (torch.bfloat16, torch.float16, torch.float32):
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


__all__ = ["DeviceProblem", "DeviceRows", "DeviceStats", "DeviceQKV", "quantize_problem",
           "chunks", "codes",
           "row_amax", "entry_scales", "scoped_amax", "seen_amax", "group_amax",
           "none_visible", "out_rows", "index_tensor", "to_device", "check_finite",
           "fused_kernels", "int8_codes", "float_scores", "float_output",
           "DEVICE_CHUNK_ELEMS"]
