"""``lp.attention`` on a CUDA tensor's own device: ``flash`` and ``baps`` through the GPU engine
(:func:`lowprec.gpu.engine.run_engine_gpu`; docs/design.md "Attention on the device"), the
row-wise schemes through their device functions (:mod:`lowprec.kernels.device_rows`).

:func:`lowprec.attention` calls :func:`attention_device` when q is a torch tensor on a non-CPU
device and the scheme has an ``engine`` setup or a ``device`` function
(:class:`lowprec.kernels.Scheme`); so does ``lp.emulate`` for a model on the GPU.  The call
keeps the CPU path's contract, step by step (for the engine schemes; the row-wise ones:
:func:`_attention_rows`, the same contract with the read-backs their checks need in the call,
and their statistics in one copy after them, which ``defer`` leaves on its way):

* validation: the same checks and messages (:func:`~lowprec.kernels.problem.check_shapes`
  and :func:`~lowprec.kernels.problem.plane_map` on the tensors' shapes, the dtype rules of
  ``prepare``, the scheme's own option checks through its ``engine`` setup, which the CPU
  scheme runs too; an empty call validates its options with the CPU's one-element run).
  k and v must be on q's device (ValueError); a mask given as a NumPy array or a tensor on
  another device is copied to q's device (it is the one input that may come from the host).
* inputs are never copied to the host: leading dims broadcast as views, float64 is rounded to
  float32 on the device (as the CPU's ``astype``), GQA key/value heads are read by index
  (``gqa=True``, or a key/value head dim of 1 broadcast over the query heads);
* masks become the engine's additive float32 planes ``(M, Lq, Lk)`` with the CPU's plane map
  (booleans 0 / -inf, broadcast dims shared);
* rows that see no key are NaN (a kernel's own NaN kept), as ``lp.attention`` writes them;
* statistics are built by the CPU's own code (``online.tile_stats`` from the engine's flags
  and restarted rows; ``nonfinite_rows``, ``noisy_rows`` counted on the device).

**Synchronisation.**  The call launches asynchronously and reads back, at its end, one small
int64 tensor holding the flags, restarted rows and the counters (``return_stats=True``) and
the additive mask's NaN / +inf test (a float mask): one device-to-host copy, hence one
synchronisation, per call that needs either; none otherwise.  A float mask with NaN or +inf
therefore raises after the engine ran (same message as the CPU); when the options are bad too,
the option's error is raised first (the CPU raises the mask's).

``noisy_rows`` (baps with bfloat16 inputs) is the CPU's float64 estimate
(:func:`~lowprec.kernels.problem.logit_noise`, model ``"bfloat16"``) computed with torch on the
device; its sums run in another order than NumPy's, so a row whose estimate lies within a few
float64 ulps of the 0.5-nat threshold could count differently (never seen in the tests).

Test hook: :func:`force_engine` makes both entry points take this path for CPU tensors, where
the engine runs in Triton's interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py on
machines without CUDA): the CI tests compare it bit for bit with the CPU path.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np

from ..formats._arrays import _ALLOWED, BF16, is_torch
from .problem import _BF16_STEP2, _IN_ALLOWED, _IN_DTYPES, NOISE_NATS, check_shapes, plane_map

_FORCE = [False]


@contextlib.contextmanager
def force_engine():
    """Test hook: within the context, :func:`lowprec.attention` and ``lp.emulate`` run every
    scheme with a device path on CPU tensors through it (the GPU engine and the Triton kernels
    in Triton's interpreter when ``TRITON_INTERPRET=1``, the torch steps on the CPU) instead of
    the CPU path."""
    old = _FORCE[0]
    _FORCE[0] = True
    try:
        yield
    finally:
        _FORCE[0] = old


def wants_device(scheme, q) -> bool:
    """Whether a call of ``scheme`` (a registered :class:`~lowprec.kernels.Scheme`) with query
    ``q`` runs on q's device: a torch tensor not on the CPU (or any torch tensor under
    :func:`force_engine`) and a scheme with a GPU engine or a device function."""
    if (scheme.engine is None and scheme.device is None) or not is_torch(q):
        return False
    return q.device.type != "cpu" or _FORCE[0]


def _np_dtype(t, what: str, allow_bool: bool = False):
    """The NumPy dtype ``to_numpy`` would give tensor ``t`` (its TypeError for complex and,
    unless allowed, bool tensors)."""
    import torch

    if t.dtype == torch.bfloat16:
        return BF16
    if t.is_complex() or (t.dtype == torch.bool and not allow_bool):
        raise TypeError(f"{what} has dtype {t.dtype}; allowed: {_ALLOWED}")
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def _standin(t, what: str, min_ndim: int = 2):
    """A zero-memory NumPy array of ``t``'s shape and dtype for the CPU's shape checks; the
    dtype and rank checks of ``problem._as_float``."""
    dt = _np_dtype(t, what)
    if dt not in _IN_DTYPES:
        raise TypeError(f"{what} has dtype {dt}; allowed: {_IN_ALLOWED}")
    arr = np.broadcast_to(np.zeros((), dtype=dt), tuple(t.shape))
    if arr.ndim < min_ndim:
        raise ValueError(f"{what} must have shape (..., L, d), got {arr.shape}")
    return arr


def _to_engine_dtype(t):
    """float64 rounded to float32 on the device (RNE, as the CPU's ``astype``); the engine
    widens float32/float16/bfloat16 itself."""
    import torch

    return t.to(torch.float32) if t.dtype == torch.float64 else t


def _as4(t, lead: tuple, heads: int, L: int, D: int):
    """``t`` broadcast to ``lead[:-1] + (heads, L, D)`` as ``(Z, heads, L, D)`` (a view where
    the strides allow it, else one copy on the device)."""
    n = len(lead)
    t = t.reshape((1,) * (n + 2 - t.dim()) + tuple(t.shape))
    Z = int(np.prod(lead[:-1], dtype=np.int64)) if n else 1
    return t.expand(tuple(lead[:-1]) + (heads, L, D)).reshape(Z, heads, L, D)


def _mask_planes(attn_mask, lead: tuple, Lq: int, Lk: int, dev):
    """``(planes float32 (M, Lq, Lk) on dev, map (B,) int64 numpy, bad)``: the additive planes
    of ``problem._prepare_mask`` built on the device; ``bad`` a device tensor ``[nan, +inf]``
    of the float mask's forbidden values (None for a boolean mask)."""
    import torch

    if attn_mask is None:
        return None, None, None
    if is_torch(attn_mask):
        m = attn_mask.detach()
        dt = _np_dtype(m, "attn_mask", allow_bool=True)
    else:
        from ..formats._arrays import to_numpy

        arr, _ = to_numpy(attn_mask, "attn_mask")
        dt = arr.dtype
        if dt.kind == "f" and not dt.isnative:
            arr = arr.astype(dt.newbyteorder("="))
        m = torch.from_numpy(np.ascontiguousarray(arr.view(np.int16) if dt == BF16 else arr))
        if dt == BF16:
            m = m.view(torch.bfloat16)
    mshape, mmap = plane_map(tuple(m.shape), lead, Lq, Lk, "attn_mask")
    if dt != np.bool_ and not (dt.kind == "f" or dt == BF16):
        raise TypeError(
            f"attn_mask has dtype {dt}; allowed: bool (True = attend) or a float dtype "
            "(added to the scaled scores)"
        )
    m = m.to(dev).reshape(mshape)
    M = int(np.prod(mshape[:-2], dtype=np.int64))
    planes = m.expand(mshape[:-2] + (Lq, Lk)).reshape(M, Lq, Lk)
    if dt == np.bool_:
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        return torch.where(planes, zero, zero - math.inf), mmap, None
    add = planes.to(torch.float32)
    bad = torch.stack([torch.isnan(add).any(), (add == math.inf).any()])
    return add, mmap, bad


def _visibility(planes, mmap_t, Lq: int, Lk: int, causal: bool, dev):
    """Boolean ``(M, Lq, Lk)`` keys visible per plane (mask and causal), or None without a
    mask."""
    import torch

    if planes is None:
        return None
    vis = planes != -math.inf
    if causal:
        i = torch.arange(Lq, device=dev)[:, None]
        j = torch.arange(Lk, device=dev)[None, :]
        vis = vis & (j <= i + (Lk - Lq))[None]
    return vis


def _no_key_rows(vis, mmap_t, B: int, Lq: int, Lk: int, causal: bool, dev):
    """Boolean ``(B, Lq)`` rows that see no key (``problem._no_key_rows`` on the device; a
    tensor even when it holds no True, so that no value is read)."""
    import torch

    if vis is None:
        if Lk == 0:
            return torch.ones((B, Lq), dtype=torch.bool, device=dev)
        if not causal or Lq <= Lk:
            return None
        return (torch.arange(Lq, device=dev) + (Lk - Lq) < 0).expand(B, Lq)
    return (~vis.any(dim=2))[mmap_t]


def _taking_part(vis, mmap_t, B: int, Lq: int, Lk: int, causal: bool, dev):
    """``Problem.taking_part`` on the device: ``(rows (B, Lq), keys (B, Lk))`` boolean."""
    import torch

    if vis is None:
        keys = torch.ones((B, Lk), dtype=torch.bool, device=dev)
        lim = torch.arange(Lq, device=dev) + (Lk - Lq) if causal else \
            torch.full((Lq,), Lk - 1, device=dev)
        rows = (lim >= 0).expand(B, Lq) if Lk else \
            torch.zeros((B, Lq), dtype=torch.bool, device=dev)
        return rows, keys
    rows_p = vis.any(dim=2)
    keys_p = vis.any(dim=1)
    if Lq == Lk:
        rows_p = rows_p & keys_p
    return rows_p[mmap_t], keys_p[mmap_t]


def _noisy_rows(q4, k4, scale: float, parts, none):
    """``noisy_rows`` of the ``"bfloat16"`` noise model (``attention._noisy_rows`` with
    ``problem.logit_noise``) on the device, as a 0-d int64 tensor; k/v heads by index."""
    import torch

    Z, H, Lq, d = q4.shape
    Hkv, Lk = k4.shape[1], k4.shape[2]
    g = H // Hkv
    q = q4.to(torch.float32).to(torch.float64)
    ksq = k4.to(torch.float32).to(torch.float64) ** 2  # (Z, Hkv, Lk, d)
    if parts is not None:
        q = torch.where(parts[0].reshape(Z, H, Lq, 1), q, 0.0)
        pk = parts[1].reshape(Z, Hkv, g, Lk).to(torch.float64)
        nk = torch.clamp(parts[1].reshape(Z, Hkv, g, Lk).sum(dim=3), min=1)
        k2 = torch.einsum("zkgj,zkjd->zkgd", pk, ksq) / nk[..., None]
    else:
        k2 = ksq.mean(dim=2)[:, :, None].expand(Z, Hkv, g, d)
    k2 = k2.reshape(Z, H, d)
    var = _BF16_STEP2 * 2.0 * torch.einsum("zhid,zhd->zhi", q * q, k2)
    est = torch.sqrt(var) * abs(scale)
    noisy = ~(est <= NOISE_NATS)
    B = Z * H
    noisy = noisy.reshape(B, Lq)
    if parts is not None:
        noisy = noisy & parts[0]
    elif none is not None:
        noisy = noisy & ~none
    return noisy.sum(dtype=torch.int64)


def _check_noise_model(model) -> None:
    """The engine schemes' one noise model (``"bfloat16"``) or None."""
    if model is not None and model != "bfloat16":  # pragma: no cover - none other exists
        raise NotImplementedError(f"noise model {model!r} on the device")


def _stats_kernels(t) -> bool:
    """Whether the statistics kernels (:mod:`lowprec.gpu.callstats`) take a call whose output
    is ``t``: the rule of the other one-pass kernels (``device_rows._kernels_run``: CUDA, or
    CPU tensors under Triton's interpreter)."""
    from .device_rows import _kernels_run

    return _kernels_run(t)


class Pending:
    """Statistics of a device call on their way to the host (:func:`attention_device` with
    ``defer=True``): the call's one packed int64 tensor is copied to pinned host memory without
    blocking, behind an event on the tensor's stream, so the host goes on launching work.
    :meth:`resolve` waits for that event (the only synchronisation) and builds the statistics
    with the CPU's code, once."""

    def __init__(self, packed, build):
        import torch

        if packed.is_cuda:
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(packed.device))
        else:  # CPU tensors (the interpreter): nothing to wait for
            self._host, self._event = packed, None
        self._build, self._value = build, None

    def resolve(self):
        """``(stats, n_none)`` of the call (waits for the copy the first time)."""
        if self._build is not None:
            if self._event is not None:
                self._event.synchronize()
            self._value = self._build(self._host.numpy())
            self._build = self._host = self._event = None
        return self._value


def attention_device(s, q, k, v, *, scale=None, causal=False, attn_mask=None,
                     return_stats=False, options=None, gqa=False, with_empty=False,
                     defer=False):
    """:func:`lowprec.attention` of scheme record ``s`` (one with an ``engine``) on q's device.

    Args:
        s: the :class:`~lowprec.kernels.Scheme` (options already checked against its names).
        q, k, v: torch tensors on one device, shapes as :func:`lowprec.attention` takes them;
            with ``gqa=True`` the key/value head dim (-3) may divide the query's (query head
            ``h`` reads key/value head ``h // (Hq // Hkv)``, as SDPA's ``enable_gqa``).
        scale, causal, attn_mask, return_stats: as :func:`lowprec.attention`.
        options: the scheme's options.
        with_empty: also return ``(none, n_none)``: the boolean ``lead + (Lq,)`` device
            tensor of rows that see no key (or None when none can be) and their count (an
            int, read in the call's one synchronisation; 0 unless ``return_stats``).
        defer: with ``return_stats``, do not wait for the statistics: they travel to the host
            asynchronously and the call returns a :class:`Pending` in their place (and None
            for ``n_none``); ``Pending.resolve()`` gives ``(stats, n_none)``.  A scheme of
            the GPU engine defers unless its mask needs a check (a float mask, whose NaN /
            +inf must raise in the call: the call then reads back as usual); a row-wise
            scheme always defers the read-back of its statistics, after the read-backs its
            checks need in the call (the mask's, the inputs' finiteness, the scales).

    Returns:
        ``out`` (q's dtype and device, ``lead + (Lq, dv)``), ``(out, stats)`` with
        ``return_stats``, and ``(..., none, n_none)`` with ``with_empty``.
    """
    from . import _validate_options

    options = {} if options is None else options
    if s.engine is not None and s.mask_floor is not None:  # pragma: no cover
        raise NotImplementedError(f"scheme {s.name!r} floors masks: no engine path")
    dev = q.device
    for name, t in (("k", k), ("v", v)):
        if not is_torch(t):
            raise ValueError(f"{name} is a {type(t).__name__}, q a torch tensor on {dev}: "
                             "attention runs on q's device; pass a tensor there")
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q on {dev}: attention runs on q's "
                             "device")
    key = _setup_key(s, q, k, v, scale, causal, gqa, options) if s.engine is not None \
        else None
    hit = _SETUPS.get(key) if key is not None else None
    if hit is not None:  # the checks below passed for this call signature before
        lead, sc, setup = hit
        masks = _mask_planes(attn_mask, lead, q.shape[-2], k.shape[-2], dev)
        return _attention_engine(s, q, k, v, lead, sc, setup, causal, masks, return_stats,
                                 options, gqa, with_empty, defer)
    qa, ka, va = _standin(q, "q"), _standin(k, "k"), _standin(v, "v")
    if gqa:  # validate as SDPA's repeat would leave them: key/value heads = query heads
        if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:  # the messages of sdpa.repeat_kv
            raise ValueError("enable_gqa=True needs (..., heads, L, d) inputs")
        hq, hk = q.shape[-3], k.shape[-3]
        if v.shape[-3] != hk or hq % hk:
            raise ValueError(f"enable_gqa=True: query heads {hq} must be a multiple of "
                             f"key/value heads {hk} (= {v.shape[-3]})")
        ka = np.broadcast_to(ka[..., :1, :, :], ka.shape[:-3] + (hq,) + ka.shape[-2:])
        va = np.broadcast_to(va[..., :1, :, :], va.shape[:-3] + (hq,) + va.shape[-2:])
    lead, sc = check_shapes(qa, ka, va, scale=scale, causal=causal)
    Lq, d = q.shape[-2:]
    Lk, dv = v.shape[-2:]
    B = int(np.prod(lead, dtype=np.int64))
    masks = _mask_planes(attn_mask, lead, Lq, Lk, dev)  # (its errors before the options')
    if s.engine is None:  # (its checks read back in the call; its statistics may be deferred)
        return _attention_rows(s, q, k, v, lead, sc, bool(causal), *masks, return_stats,
                               options, gqa, with_empty, defer)
    if B == 0 or Lq == 0 or Lk == 0 or dv == 0:
        _validate_options(s, SimpleNamespace(d=d, q=np.zeros(0, np.float32), scale=sc,
                                             in_dtype=np.float32), options)
        setup = None
    else:
        setup = s.engine(Lq, Lk, **options)
        if key is not None:
            if len(_SETUPS) >= _SETUPS_MAX:
                _SETUPS.clear()
            _SETUPS[key] = (lead, sc, setup)
    return _attention_engine(s, q, k, v, lead, sc, setup, causal, masks, return_stats,
                             options, gqa, with_empty, defer)


#: validated call signatures of the engine schemes (:func:`_setup_key`) -> ``(lead, scale,
#: the scheme's engine setup)``: a call like an earlier one skips the NumPy shape checks and
#: the option checks (about 0.2 ms of host time a call on the GPU machine); cleared when full
_SETUPS: dict = {}
_SETUPS_MAX = 256


def _frozen(x):
    """``x`` with its type, lists and tuples made tuples (hashable when the items are)."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_frozen(i) for i in x))
    return (type(x).__name__, x)


def _setup_key(s, q, k, v, scale, causal, gqa, options):
    """The key of a call's checks in :data:`_SETUPS`: everything they read (the scheme, the
    shapes and dtypes, ``scale``, ``causal`` and ``gqa`` with their types, the options), or
    None when something is not hashable (such a call is checked every time)."""
    try:
        key = (s.name, tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, k.dtype,
               v.dtype, _frozen(scale), _frozen(causal), _frozen(gqa),
               tuple(sorted((n, _frozen(o)) for n, o in options.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _attention_engine(s, q, k, v, lead, sc, setup, causal, masks, return_stats, options,
                      gqa, with_empty, defer):
    """:func:`attention_device` for a scheme of the GPU engine after its checks (``setup``:
    the engine setup, None for an empty call; ``masks``: :func:`_mask_planes`' result)."""
    import torch

    from . import _empty_stats
    from .online import E2E, tile_stats

    dev = q.device
    Lq, d = q.shape[-2:]
    Lk, dv = v.shape[-2:]
    B = int(np.prod(lead, dtype=np.int64))
    planes, mmap, bad = masks
    empty = setup is None
    if not empty:
        cfg, bq, bk, rnd = setup
    H = lead[-1] if lead else 1
    q4 = _as4(_to_engine_dtype(q.detach()), lead, H, Lq, d)
    kh = 1 if (k.dim() < 3 or k.shape[-3] == 1) else (k.shape[-3] if gqa else H)
    k4 = _as4(_to_engine_dtype(k.detach()), lead, kh, Lk, d)
    v4 = _as4(_to_engine_dtype(v.detach()), lead, kh, Lk, dv)
    mmap_t = None if mmap is None else torch.from_numpy(np.array(mmap)).to(dev)
    if empty:
        out = torch.zeros((B, Lq, dv), dtype=torch.float32, device=dev)
        flags = rr = None
    else:
        from ..gpu.engine import run_engine_gpu

        out, flags, rr = run_engine_gpu(q4, k4, v4, scale=sc, causal=bool(causal),
                                        mask=planes, mask_map=mmap_t, block_q=bq, block_k=bk,
                                        cfg=cfg, round_inputs_bf16=rnd, raw_restarts=True)
        out = out.reshape(B, Lq, dv)
    # the statistics of a call without a mask in one kernel (lowprec.gpu.callstats): its
    # counters come per entry (C = B values each), the torch operations' below as totals
    fused = return_stats and planes is None and not empty and dv > 0 and _stats_kernels(out)
    C = B if fused else 1
    vis = _visibility(planes, mmap_t, Lq, Lk, bool(causal), dev)
    none = _no_key_rows(vis, mmap_t, B, Lq, Lk, bool(causal), dev)
    if none is not None:  # the one place rows that see no key become NaN (a kernel's NaN kept)
        out = torch.where(none[..., None] & ~torch.isnan(out), math.nan, out)

    # ---- the one read-back: flags, restarted rows, counters, the mask's forbidden values
    parts = []
    if bad is not None:
        parts.append(bad.to(torch.int64))
    if fused:
        from ..gpu.callstats import call_stats

        model = s.noise(options) if s.noise is not None else None
        _check_noise_model(model)
        parts.append(call_stats(q4, k4, out, flags, rr, scale=sc, causal=bool(causal),
                                noise=model is not None, step2=_BF16_STEP2,
                                noise_nats=NOISE_NATS))
    elif return_stats:
        zero = torch.zeros((), dtype=torch.int64, device=dev)
        if not empty:
            parts += [flags.reshape(-1).to(torch.int64),
                      rr.sum(dim=1, dtype=torch.int64)]
        fin = torch.isfinite(out).all(dim=-1) if dv else \
            torch.ones((B, Lq), dtype=torch.bool, device=dev)
        nonfin = ~fin if none is None else (~fin & ~none)
        parts.append(nonfin.sum(dtype=torch.int64).reshape(1))
        model = s.noise(options) if s.noise is not None else None
        if model is not None and not empty:
            _check_noise_model(model)
            tp = _taking_part(vis, mmap_t, B, Lq, Lk, bool(causal), dev) \
                if planes is not None or causal else None
            parts.append(_noisy_rows(q4, k4, sc, tp, none).reshape(1))
        else:
            parts.append(zero.reshape(1))
        parts.append((none.sum(dtype=torch.int64) if none is not None else zero).reshape(1))
    fshape = None if (empty or not return_stats) else (flags.shape[1], flags.shape[2])
    flow_e2e = (not empty) and cfg.flow == E2E

    def read(host):  # the host side of the read-back: the mask's errors, the statistics
        pos = 0
        if bad is not None:
            pos = 2
            if host[0]:
                raise ValueError("attn_mask contains NaN; use -inf (or False) to mask a key")
            if host[1]:
                raise ValueError("attn_mask contains +inf; use -inf (or False) to mask a key")
        if not return_stats:
            return None, 0
        if empty:
            st = _empty_stats(s)
        else:
            nq, nk = fshape
            fl = host[pos:pos + B * nq * nk].astype(np.int8).reshape(B, nq, nk)
            pos += B * nq * nk
            rrh = host[pos:pos + B].astype(np.int64)
            pos += B
            st = tile_stats(fl, rrh, flow_e2e)
        st.nonfinite_rows = int(host[pos:pos + C].sum())
        st.mask_floored = 0
        if s.noise is not None:
            st.noisy_rows = int(host[pos + C:pos + 2 * C].sum())
        return st, int(host[pos + 2 * C:pos + 3 * C].sum())

    packed = (parts[0] if len(parts) == 1 else torch.cat(parts)) if parts else None
    if defer and return_stats and bad is None:
        stats = Pending(packed, read)
        n_none = None
    else:
        stats, n_none = read(None if packed is None else packed.cpu().numpy())

    res = out.reshape(tuple(lead) + (Lq, dv))
    if res.dtype != q.dtype:
        res = res.to(q.dtype)  # RNE, overflow to Inf: NumPy's astype of tiling.finish
    result = (res, stats) if return_stats else (res,)
    if with_empty:
        nr = None if none is None else none.reshape(tuple(lead) + (Lq,))
        result = result + (nr, n_none)
    return result if len(result) > 1 else result[0]


def _device_fn(s):
    """The device function of scheme ``s`` (its ``device`` field, imported on first use)."""
    import importlib

    mod, fn = s.device.split(":")
    return getattr(importlib.import_module(f"{__package__}.{mod}"), fn)


def _noise_int8(dp, model: str, parts):
    """``problem.logit_noise`` of the int8 models (``"int8_tensor"``, ``"int8_entry"``,
    ``"int8_token"``) on the device
    (float64 ``(B, Lq)``; key/value heads by index).  Its sums run in torch's order, so a row
    within a few float64 ulps of the threshold could count differently (never seen).
    ``parts``: ``(rows, keys)`` taking part (:meth:`~.device_rows.DeviceProblem.taking_part`),
    ``"all"`` when every row and key takes part (the same values as all-True parts, with the
    operations that would leave them unchanged skipped), or None (the whole tensors)."""
    import torch

    from .device_rows import index_tensor

    B, Lq, Lk, d = dp.B, dp.Lq, dp.Lk, dp.d
    dev = dp.device
    q = dp.q_in.double()  # (the stored values, widened exactly)
    ksq = dp.k_in.double() ** 2  # (Bk, Lk, d)
    tensor_scales = model == "int8_tensor" and not isinstance(parts, tuple)
    ak = None if tensor_scales else dp.row_max("k")[dp.kv]  # (B, Lk)
    if parts is not None:
        if isinstance(parts, str):  # "all" (a where on all-True parts is the identity)
            pk = index_tensor(("ones", B, Lk), lambda: np.ones((B, Lk)), dev)
            nk = index_tensor(("count", B, Lk), lambda: np.full((B, 1), float(Lk)), dev)
        else:
            q = torch.where(parts[0][:, :, None], q, 0.0)
            pk = parts[1].double()
            nk = torch.clamp(parts[1].sum(dim=1), min=1).double()[:, None]
            ak = torch.where(parts[1], ak, 0.0)
        k2 = torch.matmul(pk[:, None, :], ksq[dp.kv])[:, 0] / nk  # (B, d)
    else:
        k2 = ksq.mean(dim=1)[dp.kv]
    if tensor_scales:  # the largest |q|, |k| (kv maps onto every key/value entry)
        s2 = dp.tensor_max()[:2] / 127.0
        sq = s2[0].reshape(1, 1).expand(B, 1)
        sk = s2[1].reshape(1, 1).expand(B, 1)
    else:
        if not isinstance(parts, tuple):  # (the row maxima of q as they stand)
            aq = dp.row_max("q")
        else:
            aq = q.abs().amax(dim=2) if d else torch.zeros((B, Lq), dtype=torch.float64,
                                                           device=dev)
        if model == "int8_token":  # q's step per query row, k's per key
            sq = aq / 127.0
            sk2 = (ak / 127.0) ** 2
            var = ((q * q).sum(dim=2) * sk2.mean(dim=1)[:, None]
                   + k2.sum(dim=1)[:, None] * sq * sq) / 12.0
            return torch.sqrt(var) * abs(dp.scale)
        if model == "int8_tensor":
            sq = (aq.amax() / 127.0).reshape(1, 1).expand(B, 1)
            sk = (ak.amax() / 127.0).reshape(1, 1).expand(B, 1)
        else:
            sq = (aq.amax(dim=1) / 127.0)[:, None]
            sk = (ak.amax(dim=1) / 127.0)[:, None]
    var = ((q * q).sum(dim=2) * sk * sk + k2.sum(dim=1)[:, None] * sq * sq) / 12.0
    return torch.sqrt(var) * abs(dp.scale)


def _attention_rows(s, q, k, v, lead, sc, causal, planes, mmap, bad, return_stats, options,
                    gqa, with_empty, defer):
    """:func:`attention_device` of a row-wise scheme (one with a ``device`` function): the
    steps of :func:`lowprec.attention` around ``s.run``, on the device."""
    import torch

    from . import _empty_stats, _validate_options
    from .device_rows import DeviceProblem, index_tensor

    dev = q.device
    if bad is not None:  # the CPU's prepare raises these before anything else
        host = bad.cpu().numpy()
        if host[0]:
            raise ValueError("attn_mask contains NaN; use -inf (or False) to mask a key")
        if host[1]:
            raise ValueError("attn_mask contains +inf; use -inf (or False) to mask a key")
    Lq, d = q.shape[-2:]
    Lk, dv = v.shape[-2:]
    B = int(np.prod(lead, dtype=np.int64))
    H = lead[-1] if lead else 1
    q4 = _as4(q.detach(), lead, H, Lq, d)
    kh = 1 if (k.dim() < 3 or k.shape[-3] == 1) else (k.shape[-3] if gqa else H)
    k4 = _as4(k.detach(), lead, kh, Lk, d)
    v4 = _as4(v.detach(), lead, kh, Lk, dv)
    Z = q4.shape[0]
    ft = torch.float32  # float64 rounded to float32 (RNE, as the CPU's astype) unless kept
    if s.float64 and all(t.dtype == torch.float64 for t in (q, k, v)):
        ft = torch.float64  # (the CPU's prepare(keep_float64=True))
    kv = index_tensor(("kv", Z, H, kh), lambda: (
        np.arange(Z)[:, None] * kh + (np.arange(H) * kh // H)[None, :]).reshape(-1), dev)

    def stored(t, shape):  # the values in the input's dtype where it holds them exactly
        t = t.reshape(shape)
        return (t if t.dtype in (ft, torch.bfloat16, torch.float16) else t.to(ft)).contiguous()

    dp = DeviceProblem(
        q_in=stored(q4, (B, Lq, d)), k_in=stored(k4, (Z * kh, Lk, d)),
        v_in=stored(v4, (Z * kh, Lk, dv)), kv=kv, scale=sc, causal=causal, mask=planes,
        mask_map=None if mmap is None else torch.from_numpy(np.array(mmap)).to(dev),
        lead=tuple(lead), in_dtype=q.dtype, ft=ft)
    floored = 0
    if s.mask_floor is not None:
        dp, floored = dp.floored(s.mask_floor)
    if B == 0 or Lq == 0 or Lk == 0 or dv == 0:
        _validate_options(s, SimpleNamespace(d=d, q=np.zeros(0, np.float32), scale=sc,
                                             in_dtype=np.float32), options)
        out = torch.zeros((B, Lq, dv), dtype=torch.float32, device=dev)
        stats = _empty_stats(s) if return_stats else None
    else:
        out, stats = _device_fn(s)(dp, return_stats, **options)
    mmap_t = dp.mask_map
    vis = _visibility(dp.mask, mmap_t, Lq, Lk, causal, dev)
    none = _no_key_rows(vis, mmap_t, B, Lq, Lk, causal, dev)
    if none is not None:  # the one place rows that see no key become NaN (a kernel's NaN kept)
        out = torch.where(none[..., None] & ~torch.isnan(out), math.nan, out)
    n_none = 0
    if stats is not None:
        packed, read = _rows_counts(s, dp, stats, out, none, floored, options, causal)
        if defer:
            stats, n_none = Pending(packed, read), None
        else:  # the statistics' one read-back
            stats, n_none = read(packed.cpu().numpy())
    res = _as_dtype(out.reshape(tuple(lead) + (Lq, dv)), q.dtype)
    result = (res, stats) if return_stats else (res,)
    if with_empty:
        nr = None if none is None else none.reshape(tuple(lead) + (Lq,))
        result = result + (nr, n_none)
    return result if len(result) > 1 else result[0]


def _rows_counts(s, dp, stats, out, none, floored: int, options, causal: bool):
    """The counters every row-wise scheme shares (``nonfinite_rows``, ``noisy_rows``, rows
    that see no key) on the device, packed after the device function's own
    (:class:`~.device_rows.DeviceStats`): ``(packed int64 tensor, read)``, where
    ``read(host)`` gives ``(stats, n_none)`` from the packed tensor's host copy."""
    import torch

    from .device_rows import DeviceStats

    B, Lq, Lk, dv = dp.B, dp.Lq, dp.Lk, dp.dv
    later = isinstance(stats, DeviceStats)  # (built from the read-back)
    parts = list(stats.counts) if later else []
    base = sum(t.numel() for t in parts)
    model = s.noise(options) if s.noise is not None else None
    whole = options.get("scale_scope") == "tensor"
    if dp.mask is None and B and Lq and Lk and model in (None, "int8_tensor", "int8_entry") \
            and _stats_kernels(out):
        # one kernel (lowprec.gpu.callstats.rows_counts): per entry the non-finite, noisy and
        # no-key rows. Without a mask every key takes part; the rows that see no key (causal,
        # Lq > Lk) are left out of the estimate's scales unless they see the whole tensors
        from ..gpu.callstats import rows_counts
        from .device_rows import index_tensor

        part_rows = causal and not dp.all_take_part and not whole
        if model != "int8_tensor":
            top = index_tensor(("zeros3",), lambda: np.zeros(3), dp.device)  # (not read)
        elif part_rows:  # (the first Lq - Lk rows see no key)
            top = torch.stack([dp.row_max("q")[:, Lq - Lk:].amax(), dp.tensor_max()[1]])
        else:
            top = dp.tensor_max()
        parts.append(rows_counts(dp.q_in, dp.k_in, dp.kv, top, out.contiguous(),
                                 scale=dp.scale, causal=causal, model=model,
                                 part_rows=part_rows, noise_nats=NOISE_NATS))
        packed = torch.cat(parts) if len(parts) > 1 else parts[0]

        def read_fused(host):
            st = stats.build(host) if later else stats
            c = host[base:base + 3 * B].reshape(3, B).sum(axis=1)
            st.nonfinite_rows = int(c[0]) if dv else 0
            st.mask_floored = floored
            if s.noise is not None:
                st.noisy_rows = int(c[1])
            return st, int(c[2])

        return packed, read_fused
    if dv:  # finite rows: |x| <= the dtype's largest finite value (False for NaN, +-inf)
        fin = (out.abs() <= torch.finfo(out.dtype).max).all(dim=-1)
        if none is None:  # (nonfinite = rows - finite rows)
            parts.append(fin.sum(dtype=torch.int64).reshape(1))
        else:
            parts.append((~fin & ~none).sum(dtype=torch.int64).reshape(1))
    if none is not None:
        parts.append(none.sum(dtype=torch.int64).reshape(1))
    counted = False  # whether the noisy rows' count is packed
    if s.noise is not None:
        if model is not None and B and Lq and Lk:
            if model not in ("int8_tensor", "int8_entry", "int8_token"):  # pragma: no cover
                raise NotImplementedError(f"noise model {model!r} on the device")
            tp = None
            if dp.mask is not None or causal:  # ("all": every row sees a key, parts all True)
                tp = "all" if dp.all_take_part else dp.taking_part()
            est = _noise_int8(dp, model, None if whole else tp)
            noisy = ~(est <= NOISE_NATS)
            if isinstance(tp, tuple):
                noisy = noisy & tp[0]
            elif none is not None:
                noisy = noisy & ~none
            parts.append(noisy.sum(dtype=torch.int64).reshape(1))
            counted = True
    if not parts:
        parts.append(torch.zeros(1, dtype=torch.int64, device=dp.device))
    packed = torch.cat(parts) if len(parts) > 1 else parts[0]
    rows = B * Lq

    def read(host):
        st = stats.build(host) if later else stats
        pos = base
        st.nonfinite_rows = 0
        if dv:
            n = int(host[pos])
            st.nonfinite_rows, pos = (rows - n if none is None else n), pos + 1
        n_none = 0
        if none is not None:
            n_none, pos = int(host[pos]), pos + 1
        st.mask_floored = floored
        if s.noise is not None:
            st.noisy_rows = int(host[pos]) if counted else 0
        return st, n_none

    return packed, read


def _as_dtype(res, dtype):
    """``res`` in ``dtype`` as NumPy's ``astype`` of the CPU path gives it (RNE, overflow to
    Inf).  float64 -> float16 is rounded once: torch rounds through float32 (twice), so the
    float32 step rounds to odd (toward zero, the last bit set when inexact), which makes the
    float16 rounding exact (24 >= 11 + 2 bits).  float64 -> bfloat16 rounds through float32 in
    both (ml_dtypes too)."""
    import torch

    if res.dtype == dtype:
        return res
    if res.dtype != torch.float64 or dtype != torch.float16:
        return res.to(dtype)
    t = res.to(torch.float32)
    inexact = (t.double() != res) & ~torch.isnan(res)
    t = torch.where(inexact & (t.double().abs() > res.abs()),
                    torch.nextafter(t, torch.zeros_like(t)), t)
    return (t.view(torch.int32) | inexact.to(torch.int32)).view(torch.float32).to(dtype)


__all__ = ["Pending", "attention_device", "force_engine", "wants_device"]
