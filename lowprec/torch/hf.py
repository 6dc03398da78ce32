"""HuggingFace ``transformers`` models with *eager* attention inside :func:`lowprec.emulate`.

A transformers model loaded with ``attn_implementation="sdpa"`` computes attention through
``torch.nn.functional.scaled_dot_product_attention``, which :func:`~lowprec.torch.emulate`
intercepts.  One loaded with ``attn_implementation="eager"`` computes it by hand (matmul +
softmax in its ``eager_attention_forward``) and would silently escape emulation.  This module
closes that gap with transformers' own extension points (transformers >= 5, whose models look
the attention function up per call with
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``
and build the mask with ``ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation]``):

* :func:`register` adds the implementation :data:`ATTN_NAME` (``"lowprec"``) to
  ``transformers.AttentionInterface`` (:func:`attention_forward`) and to
  ``transformers.AttentionMaskInterface`` (:func:`attention_mask`).  Registration is global
  and idempotent; it only adds a name.
* :func:`attention_forward`, when an emulation context is active in the calling thread, runs
  transformers' own SDPA integration (``sdpa_attention_forward``): the model then makes exactly
  the ``scaled_dot_product_attention`` call its ``"sdpa"`` version makes, and the context
  intercepts it (same scheme, masks, ``scale``, GQA, statistics and module attribution).  With
  no active context in the thread it runs the model's own ``eager_attention_forward`` (the
  function defined next to the attention module's class) on the eager mask, so it computes
  exactly what the eager model computes.
* :func:`attention_mask` builds the mask the chosen path expects: SDPA's boolean mask (True =
  attend; ``None`` where SDPA's ``is_causal`` or no mask suffices) inside an active context,
  the eager additive mask (0 / dtype minimum) outside.  Without this registration transformers
  would build *no* mask for an unknown implementation and padding would silently be attended.
* :func:`switch_eager` / :func:`restore` (used by ``emulate(..., model=m, hf_eager=True)``,
  the default, and without ``model=`` for each top-level model the context meets): for every
  ``PreTrainedModel`` inside ``m`` whose class dispatches through the AttentionInterface
  (``_supports_attention_backend``) and supports SDPA (``_supports_sdpa``), a config whose
  ``_attn_implementation`` is ``"eager"`` is set to ``"lowprec"`` when the context is entered
  (or the model watched, or, without ``model=``, when the model's outermost module is first
  called, before its forward runs) and set back to ``"eager"`` when it exits, normally or by
  exception.  This is the one (reversible) edit :func:`~lowprec.torch.emulate`
  makes to a model; weights, modules and other config fields are never touched, and configs
  with any other implementation (``"sdpa"`` needs nothing) are left alone.

Limits (documented, not hidden):

* With ``model=`` only the models given (or ``run.watch(m)``) are switched; without it, the
  models the context meets through torch's global module hooks (:mod:`lowprec.torch.naming`).
  An eager model run in a way no module hook sees (its attention function called directly)
  is not emulated; the context then warns on exit that softmax ran but no attention call was
  emulated.  ``hf_eager=False`` leaves eager models alone.
* The switch is per *config object*, not per thread: while a context is active, other threads
  running the same model also go through :func:`attention_forward`.  There it finds no active
  context and computes the eager result, so their outputs are unchanged (or, if that thread
  has its own active context, it emulates under that context).  Switches are reference
  counted under a lock: nested or concurrent contexts watching one model restore it when the
  last of them exits.  A config changed by someone else meanwhile (no longer ``"lowprec"`` on
  exit) is not overwritten.
* Entering or leaving a context *during* one forward pass of a switched model is not supported
  (the mask and the attention function may then disagree; see :func:`attention_forward`).
* Under emulation the attention weights are not returned (``None``, as with ``"sdpa"``;
  ``output_attentions=True`` gives an empty tuple and transformers' warning about ``"sdpa"``), and
  features the SDPA integration rejects (``softcap``, attention sinks ``s_aux``) raise
  ``ValueError``: such models are not switched silently into something else.
* A model whose class does not dispatch through the AttentionInterface (older hand-written
  attention) is not switched; :func:`switch_eager` warns about each such eager model.
"""

from __future__ import annotations

import sys
import threading
import warnings

ATTN_NAME = "lowprec"  # the registered attention implementation name
_LOCK = threading.Lock()
_SWITCHED: dict[int, list] = {}  # id(config) -> [config, original implementation, holders]
_UNSUPPORTED_KWARGS = ("softcap", "s_aux")


def register() -> str:
    """Register :data:`ATTN_NAME` with transformers' attention and mask interfaces.

    Idempotent and global (transformers' registries are process-wide).  A model can then also
    be built with ``attn_implementation="lowprec"`` directly: it computes eager attention
    outside :func:`~lowprec.torch.emulate` and emulated attention inside it.

    Returns:
        The registered name, ``"lowprec"``.

    Raises:
        ImportError: transformers is not installed.

    Example::

        >>> from lowprec.torch import hf
        >>> hf.register()
        'lowprec'
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, attention_mask)
    return ATTN_NAME


def _emulating() -> bool:
    from .context import _active_stack

    # len(), not bool(): Dynamo (torch 2.11) traces this inside transformers' mask creation
    # and cannot trace bool() of a list
    return len(_active_stack()) > 0


def attention_mask(**kwargs):
    """The mask function registered for ``"lowprec"`` (transformers' mask-interface keywords).

    Inside an active emulation context of the calling thread: transformers' ``sdpa_mask``
    (boolean, True = attend, or ``None`` where SDPA's ``is_causal`` / no mask suffices),
    exactly the mask the model's ``"sdpa"`` version gets.  Otherwise ``eager_mask`` (additive
    float: 0 or the dtype's minimum), exactly the mask of the ``"eager"`` version.

    Args:
        **kwargs: what transformers passes to a mask interface (``batch_size``, ``q_length``,
            ``kv_length``, ``mask_function``, ``attention_mask``, ``dtype``, ...).

    Returns:
        A ``(batch, 1, q_length, kv_length)`` tensor or None.

    Example::

        >>> attention_mask(batch_size=1, q_length=3, kv_length=3)  # outside a context
        tensor([[[[0., -3.4028e+38, -3.4028e+38], ...
    """
    from transformers.masking_utils import eager_mask, sdpa_mask

    return sdpa_mask(**kwargs) if _emulating() else eager_mask(**kwargs)


def attention_forward(module, query, key, value, attention_mask=None, **kwargs):
    """The attention function registered for ``"lowprec"``.

    Inside an active emulation context of the calling thread it calls transformers'
    ``sdpa_attention_forward``, whose ``scaled_dot_product_attention`` call the context
    intercepts (so scheme, masks, scale, GQA, statistics and attribution behave as for an
    ``"sdpa"`` model).  Otherwise it calls the model's own ``eager_attention_forward`` (the one
    in the attention module's source module; a generic eager implementation if there is none),
    so the result is the eager model's.

    Args:
        module: the attention module (``self`` of the caller).
        query, key, value: ``(batch, heads, L, head_dim)`` tensors (key/value may have fewer
            heads: ``module.num_key_value_groups``).
        attention_mask: the mask built by :func:`attention_mask` (None, boolean or additive).
        **kwargs: ``dropout``, ``scaling``, ``is_causal``, ... as transformers passes them
            (keywords only: positional extras raise ``TypeError``).

    Returns:
        ``(attn_output (batch, L, heads, head_dim), attn_weights or None)``.

    Raises:
        ValueError: inside a context, ``softcap`` or attention sinks (``s_aux``), which the
            SDPA path cannot express, or ``dropout > 0`` (training mode).

    Example::

        >>> register()  # then: BertModel(config) with config._attn_implementation = "lowprec"
        'lowprec'
    """
    import torch

    if _emulating():
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        bad = [k for k in _UNSUPPORTED_KWARGS if kwargs.get(k) is not None]
        if bad:
            raise ValueError(f"lowprec.emulate: {type(module).__name__} passes {', '.join(bad)} "
                             "to its attention, which scaled_dot_product_attention (and so the "
                             "emulation) cannot express; pass hf_eager=False to leave this "
                             "model's eager attention unemulated")
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        # built while a context was active (a context left mid-forward): eager's additive form
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(
            query.dtype)
    elif attention_mask is None and getattr(module, "is_causal", False) and \
            kwargs.get("is_causal", True) and query.shape[-2] > 1:
        # SDPA's skipped causal mask (Lq == Lk there): materialize it for the eager function
        lq, lk = query.shape[-2], key.shape[-2]
        tril = torch.ones(1, 1, lq, lk, dtype=torch.bool, device=query.device).tril()
        attention_mask = torch.where(tril, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if not callable(eager):
        eager = _generic_eager
    return eager(module, query, key, value, attention_mask, **kwargs)


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                   **kwargs):
    """transformers' usual eager attention (repeat k/v heads, float32 softmax)."""
    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    w = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask[:, :, :, : key.shape[-2]]
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    w = torch.nn.functional.dropout(w, p=dropout, training=module.training)
    out = torch.matmul(w, value).transpose(1, 2).contiguous()
    return out, w


def _get(config) -> str | None:
    return getattr(config, "_attn_implementation", None)


def _set(config, value: str) -> None:
    # this config only: the public setter would also overwrite its sub-configs
    if "_attn_implementation_internal" in vars(config):
        config._attn_implementation_internal = value
    else:  # pragma: no cover - other transformers versions
        config._attn_implementation = value


def switch_eager(model, prefix: str = "", *, warn: bool = True) -> list:
    """Switch the eager-attention HF configs inside ``model`` to ``"lowprec"``.

    Walks ``model.named_modules()``; for each distinct config of a transformers
    ``PreTrainedModel`` with ``_attn_implementation == "eager"`` whose class supports the
    AttentionInterface and SDPA, the implementation becomes ``"lowprec"`` (reference counted:
    a config already switched by another context is only counted).  Does nothing (and imports
    nothing) when transformers has not been imported.

    Args:
        model: an ``nn.Module`` (any; non-HF modules are skipped).
        prefix: prepended to the qualified names returned.
        warn: emit a ``UserWarning`` for each eager HF model that cannot be switched.

    Returns:
        A list of ``(qualified name of the config's first owner, config)`` held by the caller;
        give it to :func:`restore` exactly once.

    Example::

        >>> held = switch_eager(model)      # [('<root>', BertConfig...)]
        >>> try: y = model(x)
        ... finally: restore(held)
    """
    if "transformers" not in sys.modules:
        return []
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - broken installation
        return []
    owners: dict[int, list] = {}  # id(config) -> [config, first owner name, supported]
    for name, mod in model.named_modules():
        cfg = getattr(mod, "config", None)
        if not isinstance(mod, PreTrainedModel) or cfg is None:
            continue
        ok = bool(getattr(type(mod), "_supports_attention_backend", False)) and \
            bool(getattr(mod, "_supports_sdpa", False))
        qual = ".".join(x for x in (prefix, name) if x) or "<root>"
        entry = owners.setdefault(id(cfg), [cfg, qual, False])
        entry[2] = entry[2] or ok
    held = []
    with _LOCK:
        for cfg, qual, ok in owners.values():
            rec = _SWITCHED.get(id(cfg))
            if rec is not None and rec[0] is cfg:  # switched by another context: count it
                rec[2] += 1
            elif _get(cfg) != "eager":
                continue
            elif not ok:
                if warn:
                    warnings.warn(f"lowprec.emulate: {qual} ({type(cfg).__name__}) uses eager "
                                  "attention but its model class does not dispatch through "
                                  "transformers' AttentionInterface with SDPA support; its "
                                  "attention is NOT emulated", UserWarning, stacklevel=2)
                continue
            else:
                register()
                _SWITCHED[id(cfg)] = [cfg, _get(cfg), 1]
                _set(cfg, ATTN_NAME)
            held.append((qual, cfg))
    return held


def restore(held: list) -> None:
    """Release configs returned by :func:`switch_eager`; the last holder of a config sets its
    implementation back (unless someone else changed it from ``"lowprec"`` meanwhile).

    Args:
        held: the list :func:`switch_eager` returned.

    Example::

        >>> restore(held)
    """
    with _LOCK:
        for _, cfg in held:
            rec = _SWITCHED.get(id(cfg))
            if rec is None or rec[0] is not cfg:
                continue
            rec[2] -= 1
            if rec[2] <= 0:
                del _SWITCHED[id(cfg)]
                if _get(cfg) == ATTN_NAME:
                    _set(cfg, rec[1])


__all__ = ["ATTN_NAME", "register", "attention_forward", "attention_mask", "switch_eager",
           "restore"]
