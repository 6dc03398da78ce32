"""The semantics of ``torch.nn.functional.scaled_dot_product_attention`` arguments, for
:func:`lowprec.torch.emulate` (torch 2.x):


* ``is_causal=True`` is torch's *top-left* aligned mask (query ``i`` sees keys ``j <= i``).
  When ``Lq == Lk`` this equals lowprec's (bottom-right) ``causal=True`` and is passed as such;
  otherwise it is folded into the mask given to :func:`lowprec.attention`.
* ``attn_mask``: boolean (True = attend) or additive float, broadcast as torch does; both may
  be combined with ``is_causal``.  ``torch.nn.attention.bias.CausalBias`` masks are materialized.
* ``scale`` as torch (default ``1/sqrt(d)``); ``enable_gqa=True`` repeats each k/v head
  ``Hq / Hkv`` times (``repeat_interleave`` on dim -3, as torch).
* Output: q's dtype and device, shape ``q.shape[:-1] + (dv,)`` (leading dims broadcast).
* A query row with no visible key: torch SDPA returns 0 there and lowprec's schemes NaN;
  ``empty_rows="zero"`` (default) writes 0 like torch (so padded rows do not spread NaN through
  the model), ``empty_rows="nan"`` keeps lowprec's NaN.
* ``dropout_p > 0`` raises ``ValueError``; q, k, v or a float mask requiring grad while grad mode
  is enabled raises ``RuntimeError`` (forward emulation only: use ``torch.no_grad()``).
* CUDA (or any non-CPU) tensors: ``flash`` and ``baps`` run on their device
  (:mod:`lowprec.kernels.device`, GQA by index, no host transfer); the other schemes move them
  to the CPU, compute there and move the result back, with one ``UserWarning`` per context.
"""

from __future__ import annotations

import numpy as np

from ..kernels.problem import no_key_rows


def bind_sdpa(args, kwargs):
    """``(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` of an SDPA
    call's positional and keyword arguments, with torch's defaults; TypeError as torch."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                "enable_gqa": False}
    if len(args) > len(names):
        raise TypeError("scaled_dot_product_attention: too many positional arguments")
    vals = dict(zip(names, args, strict=False))
    for k, val in kwargs.items():
        if k not in names:
            raise TypeError(f"scaled_dot_product_attention got an unexpected keyword {k!r}")
        if k in vals:
            raise TypeError(f"scaled_dot_product_attention got multiple values for {k!r}")
        vals[k] = val
    for k in names[:3]:
        if k not in vals:
            raise TypeError(f"scaled_dot_product_attention missing argument {k!r}")
    return tuple(vals.get(n, defaults.get(n)) for n in names)


def materialize_mask(mask, q, k):
    """A ``torch.nn.attention.bias.CausalBias`` mask as the dense tensor it stands for; any
    other mask unchanged."""
    try:
        from torch.nn.attention.bias import CausalBias
    except ImportError:  # pragma: no cover - old torch
        return mask
    if isinstance(mask, CausalBias):
        return mask._materialize(device=q.device)
    return mask


def repeat_kv(q, k, v):
    """``enable_gqa=True``: each key/value head repeated ``Hq / Hkv`` times on dim -3
    (``repeat_interleave``, as torch); ValueError when the head counts do not divide."""
    hq, hk = q.shape[-3] if q.dim() >= 3 else 1, k.shape[-3] if k.dim() >= 3 else 1
    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:
        raise ValueError("enable_gqa=True needs (..., heads, L, d) inputs")
    if v.shape[-3] != hk or hq % hk:
        raise ValueError(f"enable_gqa=True: query heads {hq} must be a multiple of key/value "
                         f"heads {hk} (= {v.shape[-3]})")
    if hq != hk:
        r = hq // hk
        k = k.repeat_interleave(r, dim=-3)
        v = v.repeat_interleave(r, dim=-3)
    return k, v


def combine(mask, tril):
    """Mask ``mask`` (None, bool or additive) restricted further to ``tril`` (bool)."""
    if mask is None:
        return tril
    if mask.dtype == tril.dtype:
        return mask & tril
    return mask.masked_fill(~tril, float("-inf"))


def empty_rows(mask, lead: tuple, Lq: int, Lk: int, causal: bool):
    """Boolean tensor ``lead + (Lq,)``: query rows that see no key under the mask and causal
    flag given to :func:`lowprec.attention` (the rule of ``Problem.no_key_rows``, applied to
    the call's mask), or None when every row sees one (and when there is no mask at all)."""
    import torch

    if mask is None and not causal:
        return None  # also for Lk = 0: no mask, nothing to zero (as before)
    none = no_key_rows(mask, lead, Lq, Lk, causal)
    return None if none is None else torch.from_numpy(np.ascontiguousarray(none))


def powers(out, ref, empty) -> tuple[float, float]:
    """``sum(ref**2)`` and ``sum((out - ref)**2)`` in float64 over rows that see a key."""
    o = out.detach().double()
    r = ref.double()
    if empty is not None:
        drop = empty[..., None]
        o = o.masked_fill(drop, 0)
        r = r.masked_fill(drop, 0)
    return float((r * r).sum()), float(((o - r) ** 2).sum())


__all__ = ["bind_sdpa", "materialize_mask", "repeat_kv", "combine", "empty_rows", "powers"]
