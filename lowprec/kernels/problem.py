"""The attention problem: input conventions, masks and visibility shared by every scheme
(specs/attention.md section 0).

The public entry point :func:`lowprec.attention` turns user inputs into a :class:`Problem`:
float32 (or float64 for ``reference``) C-contiguous arrays ``q (B, Lq, d)``, ``k (B, Lk, d)``,
``v (B, Lk, dv)`` with every leading (batch, head) dim flattened into ``B``, the scale, the causal
flag and the mask as an additive float32 array shared between batch entries.  Scheme kernels
take a Problem and return ``(out (B, Lq, dv) float32, stats or None)``.

Masking rules (the same for every scheme):

* ``causal=True``: key ``j`` is visible from query ``i`` iff ``j <= i + (Lk - Lq)`` (aligned at
  the end, as specs/attention.md 0 asks: torch's ``causal_lower_right`` bias; torch 2.13's
  ``is_causal=True`` is top-left aligned, which ``lp.emulate`` converts to a mask when
  ``Lq != Lk``); for ``Lq > Lk`` the first ``Lq - Lk`` rows see no key.
* ``attn_mask`` boolean: True = take part (torch convention); additive float: added to the scaled
  scores ``q k^T * scale`` (natural-log units), ``-inf`` = masked.  It broadcasts against
  ``(..., Lq, Lk)``.  NaN and ``+inf`` in an additive mask raise ``ValueError``.
* A query row with no visible key gives NaN in every scheme (documented; softmax of nothing):
  :func:`lowprec.attention` computes those rows once (:meth:`Problem.no_key_rows`) and writes NaN
  there after the scheme ran.

Visibility vocabulary (one for every scheme): ``lim[r]``, the last key a row may see
(:meth:`Problem.row_limits`; causal), ``vis``, a boolean ``(rows, Lk)`` array of the keys an
additive mask leaves visible (None when it hides none), and ``add``, the finite additive values
(None when all zero); :meth:`Problem.rows` gives the three for a chunk of heads and query rows
(:func:`row_chunks`), so no scheme materialises an ``L x L`` plane per head.  Masks given in
another form (an int32 bias, a per-call boolean or float mask of a core) share their planes
between batch entries through :func:`mask_planes`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..formats._arrays import BF16, is_torch, to_numpy
from ..formats._jit import for_size
from ._check import check_bool, check_int, check_real

_IN_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.float64))
_IN_ALLOWED = "float32, float16, bfloat16 (float64 is accepted and rounded to float32 by every " \
    "scheme except 'reference')"
LOG2E = 1.4426950408889634  # log2(e)
#: Additive mask values at or below this are "minus infinity" for the integer schemes (the
#: Scheme record's ``mask_floor``): float16's lowest finite value, and below it the
#: ``torch.finfo(dtype).min`` that transformers and torch put on padded keys for every float
#: dtype.  A real additive bias never comes near it (exp(-65504) is 0 in every float format),
#: but a finite stand-in for -inf would otherwise enter the integer schemes' logit scales and
#: clipping statistics (issue 12 item 6).  reference, flash and baps add the value as it is.
MASK_FLOOR = -65504.0


class ProblemShape:
    """The sizes of a problem with ``q (B, Lq, d)``, ``k (., Lk, d)``, ``v (., Lk, dv)``
    (shared by :class:`Problem` and its device twin
    :class:`~lowprec.kernels.device_rows.DeviceProblem`)."""

    @property
    def B(self) -> int:
        """Batch entries (every leading dim flattened)."""
        return self.q.shape[0]

    @property
    def Lq(self) -> int:
        """Query length."""
        return self.q.shape[1]

    @property
    def Lk(self) -> int:
        """Key length."""
        return self.k.shape[1]

    @property
    def d(self) -> int:
        """Head dim of q and k."""
        return self.q.shape[2]

    @property
    def dv(self) -> int:
        """Head dim of v (and of the output)."""
        return self.v.shape[2]


@dataclass
class Problem(ProblemShape):
    """A normalized attention call (see the module docstring).

    Attributes:
        q, k, v: ``(B, Lq, d)``, ``(B, Lk, d)``, ``(B, Lk, dv)`` C-contiguous; float32 unless
            the scheme asked for float64 and the input was float64.
        scale: the softmax scale (float).
        causal: bottom-right aligned causal mask.
        mask: None or float32 ``(M, Lq, Lk)`` additive mask (0, finite, or -inf).
        mask_map: int64 ``(B,)``: batch entry ``b`` uses ``mask[mask_map[b]]`` (all zeros when
            there is no mask).
        lead: the leading (batch, head) shape ``B`` was flattened from.
        in_dtype: numpy dtype of ``q`` as given (the output is returned in it).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    causal: bool
    mask: np.ndarray | None
    mask_map: np.ndarray
    lead: tuple
    in_dtype: np.dtype

    def row_limits(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """int64 ``(r1 - r0,)``: the last key index each query row ``r0 .. r1 - 1`` may see
        (``i + Lk - Lq`` under the causal rule, may be < 0; ``Lk - 1`` otherwise)."""
        r1 = self.Lq if r1 is None else r1
        if self.causal:
            return np.arange(r0, r1, dtype=np.int64) + (self.Lk - self.Lq)
        return np.full(r1 - r0, self.Lk - 1, dtype=np.int64)

    def rows(self, g0: int, g1: int, r0: int, r1: int) -> RowMask:
        """The :class:`RowMask` of entries ``g0 .. g1 - 1`` and query rows ``r0 .. r1 - 1``
        (``n = (g1 - g0) * (r1 - r0)`` rows, entry-major)."""
        lim = np.tile(self.row_limits(r0, r1), g1 - g0)
        if self.mask is None:
            return RowMask(lim, None, None)
        planes = self.mask[self.mask_map[g0:g1][:, None], np.arange(r0, r1)[None, :]]
        vis = planes != -np.inf
        add = np.where(vis, planes, np.float32(0.0))
        vis2 = None if vis.all() else np.ascontiguousarray(vis.reshape((-1, self.Lk)))
        return RowMask(lim, vis2, add if np.any(add) else None)

    def floored(self, floor: float) -> tuple[Problem, int]:
        """``(problem, n)``: this problem with every finite additive mask value ``<= floor``
        made ``-inf`` (a masked key), and how many (plane) entries changed; the problem itself
        when none does (:data:`MASK_FLOOR`).

        A row whose every visible finite value lies at or below the floor (all its keys
        masked with ``finfo.min``, as transformers pads) is first shifted by its largest
        visible value, which leaves the softmax unchanged (shift invariance): its keys with
        that value take part with 0, as the float64 reference lets them, instead of the row
        seeing no key."""
        mask = self.mask
        if mask is None or mask.size == 0:
            return self, 0
        vis = mask if not self.causal else \
            np.where(causal_visible(self.Lq, self.Lk)[None], mask, np.float32(-np.inf))
        out, n = floor_rows(mask, vis.max(axis=2, keepdims=True), floor)
        return (self, 0) if out is mask else (replace(self, mask=out), n)

    def taking_part(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows (B, Lq), keys (B, Lk))`` boolean: the query rows and keys that take part in
        the attention (the entries the integer schemes' default ``scale_scope="visible"``
        takes their int8 scales from).

        A key takes part when some row sees it (causal and mask combined); a query row when it
        sees a key and, in self-attention (``Lq == Lk``), its own position is a key that takes
        part: a position masked as a key for every row is padding, and its query row (which
        a key-padding mask, as transformers builds it, lets see the real keys) is padding too.
        (With cross-attention of equal lengths that rule can leave out a real query row; its
        q values then may clamp, counted as ``saturated``; use ``scale_scope="tensor"``.)
        """
        B, Lq, Lk = self.B, self.Lq, self.Lk
        if self.mask is None:
            keys = np.ones((B, Lk), dtype=bool)
            rows = np.broadcast_to(self.row_limits() >= 0, (B, Lq)).copy() if Lk else \
                np.zeros((B, Lq), dtype=bool)
            return rows, keys
        vis = self.mask != -np.inf
        if self.causal:
            vis = vis & causal_visible(Lq, Lk)[None]
        rows_p = vis.any(axis=2)
        keys_p = vis.any(axis=1)
        if Lq == Lk:
            rows_p &= keys_p
        return rows_p[self.mask_map], keys_p[self.mask_map]

    def sequences(self) -> np.ndarray:
        """int64 ``(B,)``: the sequence (index along the first leading dim, torch SDPA's batch
        dim ``N``) of each flattened entry; every entry of one sequence (its heads) shares the
        ``scale_scope="visible"`` per-tensor scales."""
        per = self.B // self.lead[0] if self.lead and self.lead[0] else max(self.B, 1)
        return np.arange(self.B, dtype=np.int64) // max(per, 1)

    def no_key_rows(self) -> np.ndarray | None:
        """Boolean ``(B, Lq)``: query rows that see no key (causal and mask combined), or None
        when every row sees one (computed once per call by :func:`lowprec.attention`)."""
        return _no_key_rows(self.mask, self.mask_map, self.B, self.Lq, self.Lk, self.causal)


def _no_key_rows(mask, mask_map, B: int, Lq: int, Lk: int, causal: bool):
    if mask is None:
        if Lk == 0:
            return np.ones((B, Lq), dtype=bool)
        if not causal or Lq <= Lk:
            return None
        return np.broadcast_to(np.arange(Lq) + (Lk - Lq) < 0, (B, Lq))
    vis = mask != -np.inf
    if causal:
        vis = vis & causal_visible(Lq, Lk)[None]
    none = ~vis.any(axis=2)
    return none[mask_map] if none.any() else None


def no_key_rows(attn_mask, lead: tuple, Lq: int, Lk: int, causal: bool = False):
    """Boolean ``lead + (Lq,)``: query rows that see no key under ``attn_mask`` (boolean or
    additive, as :func:`lowprec.attention` takes it) and the bottom-right causal rule, or None
    when every row sees one (the rule of :meth:`Problem.no_key_rows`, for callers that hold a
    mask but no Problem, e.g. ``lp.emulate``)."""
    mask, mask_map = _prepare_mask(attn_mask, tuple(lead), Lq, Lk)
    B = int(np.prod(lead, dtype=np.int64))
    none = _no_key_rows(mask, mask_map, B, Lq, Lk, causal)
    return None if none is None else np.asarray(none).reshape(tuple(lead) + (Lq,))


class RowMask(NamedTuple):
    """Visibility of a chunk of rows (:meth:`Problem.rows`).

    Attributes:
        lim: int64 ``(n,)``: the last key each row may see (causal; may be < 0).
        vis: None, or boolean ``(n, Lk)``: keys the additive mask leaves visible.
        add: None, or float32 ``(entries, rows, Lk)``: the finite additive mask values (0 where
            masked).
    """

    lim: np.ndarray
    vis: np.ndarray | None
    add: np.ndarray | None

    def visible(self, Lk: int) -> np.ndarray | None:
        """Boolean ``(n, Lk)``: keys each row sees (causal limit and mask combined), or None
        when every row sees every key."""
        if self.vis is None and not (self.lim < Lk - 1).any():
            return None
        cols = np.arange(Lk)[None, :] <= self.lim[:, None]
        return cols if self.vis is None else cols & self.vis

    def none_visible(self, Lk: int) -> np.ndarray:
        """Boolean ``(n,)``: rows of the chunk that see no key."""
        if Lk == 0:
            return np.ones(self.lim.shape, dtype=bool)
        if self.vis is None:
            return self.lim < 0
        cols = np.arange(Lk)[None, :]
        return ~np.any(self.vis & (cols <= self.lim[:, None]), axis=1)


CHUNK_ELEMS = 1 << 22  # logits per chunk of the row-wise schemes (bounds their memory)
#: logits of a call from which its chunks run on several threads (:func:`run_chunks`): below
#: it one chunk's kernels run in parallel instead, as waking a pool costs more than it saves
CHUNK_PARALLEL_MIN = 1 << 21


def row_chunks(B: int, Lq: int, Lk: int, elems: int = CHUNK_ELEMS, align: int = 1,
               parts: int = 1):
    """``(g0, g1, r0, r1)`` steps over (entries, query rows) with about ``elems`` logits each:
    whole entries while they fit (at least ``parts`` chunks when there are that many entries),
    else row ranges of one entry starting at multiples of ``align`` (a query tile size, so that
    chunks hold whole tiles).  ``parts`` only splits whole-entry chunks further, so the row
    ranges, and with them every result, do not depend on it."""
    per = max(1, elems // max(Lk, 1))
    per = max(align, per // align * align)
    if per >= Lq:
        gh = max(1, per // max(Lq, 1))
        gh = max(1, min(gh, -(-B // max(parts, 1))))
        for g0 in range(0, B, gh):
            yield g0, min(B, g0 + gh), 0, Lq
    else:
        for g in range(B):
            for r0 in range(0, Lq, per):
                yield g, g + 1, r0, min(Lq, r0 + per)


_POOL: list = []  # [ThreadPoolExecutor], created on first use
_LOCAL = threading.local()  # .worker: this thread runs chunks of run_chunks


def chunk_threads(logits: int) -> int:
    """Threads that :func:`run_chunks` uses for a call of ``logits`` logits: Numba's thread
    count (``numba.set_num_threads``), 1 below :data:`CHUNK_PARALLEL_MIN` or inside a worker."""
    if logits < CHUNK_PARALLEL_MIN or getattr(_LOCAL, "worker", False):
        return 1
    import numba

    return max(1, int(numba.get_num_threads()))


def sized(kernel, n: int):
    """``kernel`` (a ``@jit(parallel=True)`` dispatcher) for ``n`` elements: its serial
    compilation inside a :func:`run_chunks` worker (the chunks are the parallel loop there),
    else :func:`~lowprec.formats._jit.for_size`'s choice."""
    if getattr(_LOCAL, "worker", False):
        return kernel.serial
    return for_size(kernel, n)


def scratch(key: str, shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array for work inside one chunk of :func:`run_chunks`, whose memory the
    next chunk that this thread runs in the same call gets again (``key`` names the use; a
    scratch array must not outlive its chunk).  Freshly mapped memory costs about 0.1 ms per MB
    to fault in, which for a chunk's float64 score matrix is a third of its GEMM; outside
    :func:`run_chunks` this is ``np.empty``."""
    bufs = getattr(_LOCAL, "scratch", None)
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if bufs is None:
        return np.empty(shape, dtype=dt)
    buf = bufs.get(key)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1), dtype=np.uint8)
        bufs[key] = buf
    return buf[:n].view(dt).reshape(shape)


def run_chunks(chunks: list, work, then=None, threads: int = 1) -> None:
    """``work(*chunk)`` for every chunk; ``then(result)`` (when given) in chunk order on the
    calling thread.  With ``threads > 1`` the chunks run on that many pool threads, each with
    one BLAS thread (:func:`one_blas_thread`) and the serial compilation of every Numba kernel
    (:func:`sized`): a chunk is computed as it would be alone, so the results are the same
    bits; ``then`` overlaps with the chunks still running (e.g. a sum that must be taken in
    row order).  An exception in a chunk stops the others and is raised here."""
    n = len(chunks)
    threads = min(threads, n)
    if threads <= 1:
        own = getattr(_LOCAL, "scratch", None) is None
        if own:
            _LOCAL.scratch = {}
        try:
            for c in chunks:
                r = work(*c)
                if then is not None:
                    then(r)
        finally:
            if own:
                _LOCAL.scratch = None
        return
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(thread_name_prefix="lowprec-chunk"))
    results: list = [None] * n
    done = [threading.Event() for _ in range(n)]
    state = {"next": 0, "stop": False}
    lock = threading.Lock()

    def worker():
        _LOCAL.worker = True
        _LOCAL.scratch = {}
        try:
            while True:
                with lock:
                    i = state["next"]
                    if i >= n or state["stop"]:
                        return
                    state["next"] = i + 1
                try:
                    results[i] = (True, work(*chunks[i]))
                except BaseException as exc:  # noqa: B036 - re-raised by the caller
                    results[i] = (False, exc)
                    state["stop"] = True
                done[i].set()
        finally:
            _LOCAL.worker = False
            _LOCAL.scratch = None

    futures = [_POOL[0].submit(worker) for _ in range(threads)]
    try:
        for i in range(n):
            while not done[i].wait(0.05):
                if state["stop"] or all(f.done() for f in futures):
                    break
            if not done[i].is_set():
                break
            ok, r = results[i]
            results[i] = None
            if not ok:
                raise r
            if then is not None:
                then(r)
    finally:
        state["stop"] = True
        for f in futures:
            f.result()
    for i in range(n):
        if results[i] is not None and not results[i][0]:
            raise results[i][1]


def each_chunk(prob: Problem, step, then=None) -> np.ndarray:
    """The one chunk loop of the row-wise schemes: ``step(g0, g1, r0, r1, rowmask)`` returns
    the float output rows ``(g1 - g0, r1 - r0, dv)`` of each chunk (:func:`row_chunks`), or,
    with ``then``, a pair ``(rows, extra)`` and ``then(extra)`` is called in chunk order on the
    calling thread (counters, ordered sums).  Large calls run their chunks in parallel
    (:func:`run_chunks`): a step then calls its parallel kernels through :func:`sized`."""
    out = np.empty((prob.B, prob.Lq, prob.dv), dtype=np.float32)
    threads = chunk_threads(prob.B * prob.Lq * prob.Lk)

    def work(g0, g1, r0, r1):
        res = step(g0, g1, r0, r1, prob.rows(g0, g1, r0, r1))
        rows, extra = res if then is not None else (res, None)
        out[g0:g1, r0:r1] = rows
        return extra

    run_chunks(list(row_chunks(prob.B, prob.Lq, prob.Lk, parts=threads)), work, then, threads)
    return out


def mask_planes(arr: np.ndarray, lead: tuple, Lq: int, Lk: int, what: str, dtype):
    """``(planes (M, Lq, Lk) of dtype (None: arr's), map (B,) int64)`` of a mask array
    broadcastable to ``lead + (Lq, Lk)``: the mask's own leading dims broadcast against
    ``lead`` and its ``(Lq, Lk)`` planes are shared between batch entries (never copied per
    head).  ValueError when it does not broadcast."""
    mshape, mmap = plane_map(arr.shape, lead, Lq, Lk, what)
    arr = arr.reshape(mshape)
    planes = np.broadcast_to(arr, mshape[:-2] + (Lq, Lk)).reshape(
        (int(np.prod(mshape[:-2], dtype=np.int64)), Lq, Lk))
    return np.ascontiguousarray(planes, dtype=dtype), mmap


def plane_map(shape: tuple, lead: tuple, Lq: int, Lk: int, what: str):
    """``(mshape, map)`` of a mask of ``shape`` broadcastable to ``lead + (Lq, Lk)``: the
    shape padded with leading 1s to the full rank (its own leading dims ``mshape[:-2]`` give
    the planes, in C order) and the int64 ``(B,)`` plane index of every batch entry; the
    shape logic of :func:`mask_planes`, without the data (the device path shares it).
    ValueError when it does not broadcast."""
    full = tuple(lead) + (Lq, Lk)
    shape = tuple(shape)
    try:
        ok = np.broadcast_shapes(shape, full) == full
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{what} of shape {shape} does not broadcast to {full} (leading dims, Lq, Lk)"
        )
    mshape = (1,) * (len(full) - len(shape)) + shape
    mlead = mshape[:-2]
    idx = np.arange(int(np.prod(mlead, dtype=np.int64)), dtype=np.int64).reshape(mlead)
    mmap = np.ascontiguousarray(np.broadcast_to(idx, lead)).reshape(-1)
    return mshape, mmap


#: where the integer schemes take their int8 scales from (option ``scale_scope``)
SCALE_SCOPES = ("visible", "tensor")

#: RMS logit noise (nats) above which a row counts as noisy (``Stats.noisy_rows``)
NOISE_NATS = 0.5
#: input rounding models of :func:`logit_noise`
NOISE_MODELS = ("bfloat16", "int8_tensor", "int8_entry", "int8_token")
_BF16_STEP2 = 2.0 ** -16 / 12.0  # variance of bf16 rounding per |x|**2: ulp 2**-7, uniform


def logit_noise(prob: Problem, model: str | None, parts=None) -> np.ndarray | None:
    """Estimated RMS noise (nats) of each row's logits ``q_i . k_j * scale`` caused by rounding
    q and k to a scheme's input format, float64 ``(B, Lq)``; None for ``model=None``.

    Rounding errors are modelled as independent and uniform over half a step on each side, so
    ``var_i = scale**2 * sum_d (q_id**2 var(dk_d) + E_j[k_jd**2] var(dq_id))`` with ``E_j`` the
    mean over keys:

    * ``"int8_tensor"`` / ``"int8_entry"``: step ``max|x| / 127`` over the whole tensor / over
      each (batch, head) entry (``var = step**2 / 12`` for every element);
    * ``"int8_token"``: q's step per query row, k's per key (INT-FlashAttention);
    * ``"bfloat16"``: a relative step of ``2**-7`` (``var = x**2 * 2**-14 / 12``).

    ``parts``, the ``(rows, keys)`` of :meth:`Problem.taking_part`, leaves the rows and keys
    that do not take part out of the maxima and means (padding content is not noise of the real
    rows; the int8 scales of ``scale_scope="visible"`` ignore it too).

    Exactly representable inputs still get the estimate (it is a bound on the grid, not a
    measurement).  A row whose estimate exceeds :data:`NOISE_NATS` is where the input format is
    too coarse for the softmax's sharpness: the schemes' documented error bounds do not cover
    it (``Stats.noisy_rows``).
    """
    if model is None or prob.B == 0 or prob.Lq == 0 or prob.Lk == 0:
        return None
    q = prob.q.astype(np.float64)
    k = prob.k.astype(np.float64)
    if parts is not None:
        q = np.where(parts[0][:, :, None], q, 0.0)
        k = np.where(parts[1][:, :, None], k, 0.0)
        nk = np.maximum(np.count_nonzero(parts[1], axis=1), 1)[:, None]
        k2 = np.sum(k * k, axis=1) / nk  # (B, d): E_j[k_jd^2] over the keys taking part
    else:
        k2 = np.mean(k * k, axis=1)  # (B, d): E_j[k_jd^2]
    if model == "bfloat16":
        var = _BF16_STEP2 * 2.0 * np.einsum("bid,bd->bi", q * q, k2)
    elif model in ("int8_tensor", "int8_entry"):
        ax = None if model == "int8_tensor" else (1, 2)
        sq = np.max(np.abs(q), axis=ax, keepdims=model != "int8_tensor") / 127.0
        sk = np.max(np.abs(k), axis=ax, keepdims=model != "int8_tensor") / 127.0
        sq = np.broadcast_to(sq, (prob.B, 1, 1)).reshape(prob.B, 1)
        sk = np.broadcast_to(sk, (prob.B, 1, 1)).reshape(prob.B, 1)
        var = (np.sum(q * q, axis=2) * sk * sk + np.sum(k2, axis=1)[:, None] * sq * sq) / 12.0
    elif model == "int8_token":
        sq = np.max(np.abs(q), axis=2) / 127.0                      # (B, Lq)
        sk2 = (np.max(np.abs(k), axis=2) / 127.0) ** 2              # (B, Lk)
        var = (np.sum(q * q, axis=2) * np.mean(sk2, axis=1)[:, None]
               + np.sum(k2, axis=1)[:, None] * sq * sq) / 12.0
    else:
        raise ValueError(f"noise model {model!r} is not one of {', '.join(NOISE_MODELS)}")
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(var) * abs(prob.scale)


def floor_rows(a: np.ndarray, top: np.ndarray, floor: float) -> tuple[np.ndarray, int]:
    """``(a', n)``: the floor of :attr:`Scheme.mask_floor <lowprec.kernels.Scheme>` applied to
    the rows of ``a`` (the last axis or the one ``top`` was reduced over): a row whose largest
    value ``top`` (keepdims) is finite and at or below ``floor`` is first shifted by it (exact
    for a softmax), then every finite value at or below ``floor`` becomes ``-inf``; ``n``
    counts those.  ``a`` itself when nothing changes.  Used for attention masks
    (:meth:`Problem.floored`) and softmax scores alike."""
    f = a.dtype.type(floor)
    sunk = (top <= f) & np.isfinite(top)
    if sunk.any():
        with np.errstate(invalid="ignore"):  # -inf - -inf in rows left as they are
            a = np.where(sunk, (a.astype(np.float64) - top).astype(a.dtype), a)
    low = (a <= f) & np.isfinite(a)
    n = int(np.count_nonzero(low))
    if n:
        a = np.where(low, a.dtype.type(-np.inf), a).astype(a.dtype)
    return a, n


def flat_lead(a: np.ndarray, lead: tuple, L: int, D: int, dtype=None) -> np.ndarray:
    """``a`` broadcast to ``lead + (L, D)`` as a C-contiguous ``(prod(lead), L, D)`` array of
    ``dtype`` (default: a's); every size may be 0 (the sizes are explicit, never ``-1``)."""
    nb = int(np.prod(lead, dtype=np.int64))
    a = np.broadcast_to(a, tuple(lead) + (L, D))
    return np.ascontiguousarray(a, dtype=dtype).reshape((nb, L, D))


def rows2d(a: np.ndarray) -> np.ndarray:
    """``a (..., n)`` as ``(prod(...), n)`` (a view where possible; empty shapes included)."""
    n = a.shape[-1] if a.ndim else 1
    return a.reshape((int(np.prod(a.shape[:-1], dtype=np.int64)), n))


def causal_visible(Lq: int, Lk: int) -> np.ndarray:
    """Boolean ``(Lq, Lk)``: key j visible from query i under the bottom-right causal rule."""
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    return j <= i + (Lk - Lq)


def _as_float(x, what: str, min_ndim: int = 2, shape_hint: str = "(..., L, d)"):
    """A float input (numpy or CPU torch) in native byte order, with at least ``min_ndim`` dims."""
    arr, was_torch = to_numpy(x, what)
    if arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype not in _IN_DTYPES:
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: {_IN_ALLOWED}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{what} must have shape {shape_hint}, got {arr.shape}")
    return arr, was_torch


def _check_scale(scale, d: int) -> float:
    if scale is None:
        if d == 0:
            raise ValueError("head dimension d is 0: give an explicit scale")
        return 1.0 / math.sqrt(d)
    return check_real(scale, "scale")


def _prepare_mask(attn_mask, lead: tuple, Lq: int, Lk: int):
    """Additive float32 mask ``(M, Lq, Lk)`` and the per-batch-entry map, from a boolean or
    additive mask broadcastable to ``lead + (Lq, Lk)``."""
    B = int(np.prod(lead, dtype=np.int64))
    if attn_mask is None:
        return None, np.zeros(B, dtype=np.int64)
    if is_torch(attn_mask) and str(attn_mask.dtype) == "torch.bool":
        if attn_mask.device.type != "cpu":
            raise ValueError(f"attn_mask is a torch tensor on {attn_mask.device}; pass .cpu()")
        m = attn_mask.detach().contiguous().numpy()
    else:
        m, _ = to_numpy(attn_mask, "attn_mask")
    planes, mask_map = mask_planes(m, lead, Lq, Lk, "attn_mask", None)
    if planes.dtype == np.bool_:
        add = np.where(planes, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
    elif planes.dtype.kind == "f" or planes.dtype == BF16:
        add = np.asarray(planes, dtype=np.float32)
        if np.isnan(add).any():
            raise ValueError("attn_mask contains NaN; use -inf (or False) to mask a key")
        if (add == np.inf).any():
            raise ValueError("attn_mask contains +inf; use -inf (or False) to mask a key")
    else:
        raise TypeError(
            f"attn_mask has dtype {m.dtype}; allowed: bool (True = attend) or a float dtype "
            "(added to the scaled scores)"
        )
    return np.ascontiguousarray(add), mask_map


def prepare(q, k, v, *, scale=None, causal=False, attn_mask=None, keep_float64=False):
    """Validate and normalize an attention call; returns ``(Problem, was_torch)``.

    Raises TypeError for non-float inputs, ValueError for shape mismatches, bad scales and
    bad masks, each naming what is allowed.
    """
    qa, q_torch = _as_float(q, "q")
    ka, _ = _as_float(k, "k")
    va, _ = _as_float(v, "v")
    lead, s = check_shapes(qa, ka, va, scale=scale, causal=causal)
    Lq, d = qa.shape[-2:]
    Lk, dv = va.shape[-2:]
    in_dtype = qa.dtype
    want64 = keep_float64 and all(a.dtype == np.float64 for a in (qa, ka, va))
    dt = np.float64 if want64 else np.float32

    mask, mask_map = _prepare_mask(attn_mask, lead, Lq, Lk)
    prob = Problem(
        q=flat_lead(qa, lead, Lq, d, dt), k=flat_lead(ka, lead, Lk, d, dt),
        v=flat_lead(va, lead, Lk, dv, dt), scale=s, causal=bool(causal),
        mask=mask, mask_map=mask_map, lead=lead, in_dtype=in_dtype,
    )
    return prob, q_torch


def check_shapes(qa, ka, va, *, scale=None, causal=False) -> tuple[tuple, float]:
    """``(lead, scale)`` of validated inputs (anything with ``.shape``): q and k share d, k
    and v share Lk, the leading dims broadcast, ``causal`` is a bool and ``scale`` a real
    (default ``1 / sqrt(d)``); ValueError otherwise (the checks of :func:`prepare`, shared
    with the device path of :func:`lowprec.attention`)."""
    if qa.shape[-1] != ka.shape[-1]:
        raise ValueError(f"q and k must have the same last dim d, got {qa.shape} and {ka.shape}")
    if ka.shape[-2] != va.shape[-2]:
        raise ValueError(
            f"k and v must have the same sequence length Lk, got {ka.shape} and {va.shape}"
        )
    try:
        lead = tuple(np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2], va.shape[:-2]))
    except ValueError:
        raise ValueError(
            f"leading (batch, head) dims of q {qa.shape}, k {ka.shape}, v {va.shape} do not "
            "broadcast"
        ) from None
    check_bool(causal, "causal")
    return lead, _check_scale(scale, qa.shape[-1])


def finish(out: np.ndarray, prob: Problem, as_torch: bool):
    """Reshape a ``(B, Lq, dv)`` result to ``lead + (Lq, dv)`` in the input dtype and kind."""
    res = out.reshape(prob.lead + (prob.Lq, prob.dv))
    if res.dtype != prob.in_dtype:
        res = res.astype(prob.in_dtype)
    if not as_torch:
        return res
    import torch

    if res.dtype == BF16:
        return torch.from_numpy(res.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(res))


_BLAS: list = []  # [threadpoolctl controller or None], created on first use


def one_blas_thread():
    """A context limiting NumPy's BLAS to one thread while a scheme runs (a no-op without
    threadpoolctl); :func:`lowprec.attention` enters it around every scheme (and ``lp.emulate``
    around every call, beside torch's threads).

    The schemes alternate NumPy GEMMs with parallel Numba row kernels.  OpenBLAS worker threads
    busy-wait for a while after each call and then compete with Numba's (and torch's) threads
    for the same cores: measured on 2 cores at (1, 8, 2048, 64), ``ivit`` 12.0x -> 7.3x of torch
    SDPA, ``qflash`` 5.8x -> 3.4x, ``intattention`` 4.4x -> 2.9x; and in ``lp.emulate``,
    MiniLM at 256 tokens under ``intattention`` 6-12x -> about 2x of its float32 forward.  The
    results are the same bits with one thread or several (OpenBLAS splits a GEMM by rows and
    columns, never along the reduction).  Two BLAS threads are faster at (1, 12, 197, 64) on
    an idle machine (the GEMMs are 15-30 % of the time), but on a busy one the GEMM followed by
    a parallel kernel then took up to 10x longer; one thread is the robust choice.
    """
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS.append(ThreadpoolController())
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            _BLAS.append(None)
    ctl = _BLAS[0]
    if ctl is None:  # pragma: no cover
        from contextlib import nullcontext

        return nullcontext()
    return ctl.limit(limits=1, user_api="blas")


def kernel_array(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as a writable C-contiguous array of ``dtype`` (a read-only view, e.g. from
    ``np.broadcast_to``, would give a Numba kernel a second signature to compile)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a if a.flags.writeable else a.copy()


def check_block(value, name: str, cap: int | None = None) -> int:
    """Validate a tile size (a positive int, any size) and cap it at ``cap`` (the sequence
    length it tiles, when given): a tile longer than the sequence holds the same rows or keys
    as one of exactly its length (the padding rows are ignored, the padding keys masked), so
    the result is the same and memory and time follow the sequence, not the block size.
    ``block_k=2**64`` is therefore one tile of the whole sequence, not a Numba overflow."""
    b = check_int(value, name, 1, what="a positive int")
    return b if cap is None else max(1, min(b, int(cap)))


def check_options(options: dict, scheme: str, allowed: tuple) -> None:
    """Raise ValueError naming the allowed options when ``options`` has an unknown key."""
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(
            f"unknown option(s) {', '.join(bad)} for scheme {scheme!r}; allowed: "
            f"{', '.join(sorted(allowed)) or '(none)'}"
        )


def softmax_rows(scores, axis: int = -1, what: str = "scores"):
    """Validate softmax-surrogate input and return ``(rows, restore)``.

    ``rows`` is a float32 C-contiguous ``(N, L)`` array with ``axis`` moved last (every other
    dim flattened into ``N``); ``restore(res)`` turns an ``(N, L)`` result (any dtype) back into
    the input layout and kind (numpy or torch).  float32/float16/bfloat16/float64 inputs are
    accepted (float64 is rounded to float32); integer or complex input raises TypeError, a bad
    axis ValueError.  NaN is left to the surrogate (each documents what it does with it).
    """
    arr, as_torch = _as_float(scores, what, 1, "(..., L) with at least one dim")
    check_int(axis, "axis", -arr.ndim, arr.ndim - 1, type_error=True,
              what=f"in range for {what} with {arr.ndim} dims ([{-arr.ndim}, {arr.ndim - 1}])")
    moved = np.moveaxis(arr, axis, -1)
    shape = moved.shape
    n = int(np.prod(shape[:-1], dtype=np.int64))
    rows = np.ascontiguousarray(moved, dtype=np.float32).reshape((n, shape[-1]))

    def restore(res: np.ndarray):
        res = np.moveaxis(np.asarray(res).reshape(shape), -1, axis)
        if not as_torch:
            return res
        import torch

        return torch.from_numpy(np.ascontiguousarray(res))

    return rows, restore


INT8_D_MAX = (1 << 31) // (128 * 128) - 1  # largest d whose int8 dot products cannot wrap int32


def int8_input(x, what: str) -> np.ndarray:
    """An int8 core input (numpy or CPU torch) of shape ``(..., L, d)``; TypeError/ValueError
    otherwise."""
    arr, _ = to_numpy(x, what)
    if arr.dtype != np.int8:
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: int8")
    if arr.ndim < 2:
        raise ValueError(f"{what} must have shape (..., L, d), got {arr.shape}")
    return arr


def core_lead(qa: np.ndarray, ka: np.ndarray, va: np.ndarray) -> tuple:
    """Check the shapes of int8 core inputs ``q8 (..., Lq, d)``, ``k8 (..., Lk, d)``,
    ``v8 (..., Lk, dv)`` (d at most :data:`INT8_D_MAX`) and return the broadcast leading dims."""
    if qa.shape[-1] != ka.shape[-1]:
        raise ValueError(f"q8 and k8 must have the same last dim d, got {qa.shape} and "
                         f"{ka.shape}")
    if ka.shape[-2] != va.shape[-2]:
        raise ValueError(f"k8 and v8 must have the same length Lk, got {ka.shape} and "
                         f"{va.shape}")
    if qa.shape[-1] > INT8_D_MAX:
        raise ValueError(f"d = {qa.shape[-1]} > {INT8_D_MAX}: int8 dot products could wrap "
                         "int32")
    try:
        return tuple(np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2], va.shape[:-2]))
    except ValueError:
        raise ValueError(f"leading dims of q8 {qa.shape}, k8 {ka.shape}, v8 {va.shape} do not "
                         "broadcast") from None


__all__ = ["Problem", "RowMask", "prepare", "check_shapes", "plane_map", "finish",
           "causal_visible", "check_block",
           "no_key_rows", "kernel_array", "one_blas_thread",
           "row_chunks", "each_chunk", "run_chunks", "chunk_threads", "sized", "scratch",
           "mask_planes", "flat_lead", "rows2d",
           "check_options", "softmax_rows", "int8_input", "core_lead", "INT8_D_MAX", "LOG2E",
           "MASK_FLOOR", "floor_rows", "logit_noise", "NOISE_NATS", "NOISE_MODELS", "SCALE_SCOPES",
           "is_torch"]
