"""The ``emulate(...)`` context: run PyTorch models with emulated low-precision attention.

design.md "PyTorch integration"; specs/attention.md sections 0 and 8::

    from lowprec.torch import emulate          # or lowprec.emulate
    with torch.no_grad(), emulate("baps", config="e2e_hif8", tau=1, model=model) as run:
        out = model(x)
    print(run.stats.summary())          # per module: calls, ARR/PRR, SQNR, saturation...
    run.stats.to_dict()                 # {module: {stat: value}}, JSON-ready
    run.stats.restart_rate              # ARR over every call

How it works
------------
* A ``torch.overrides.TorchFunctionMode`` is pushed on entry and popped on exit (normally or by
  exception).  Inside it every ``torch.nn.functional.scaled_dot_product_attention`` call is
  answered by :func:`lowprec.attention` with the chosen scheme; every other torch call passes
  through unchanged.  Nothing global is patched: torch keeps its mode stack per thread, so a
  context affects only the thread that entered it, and code that computes attention by hand
  (matmul + softmax) is not touched.
* Contexts nest; the innermost active context of the thread alone is in effect (its scheme, its
  Linear hooks, its statistics); the outer one resumes when the inner one exits.
* Models passed as ``model=`` (a module, a list of modules or ``{prefix: module}``) or later
  with ``run.watch(m)`` get a forward pre-hook and a forward hook (``always_call=True``) on
  every submodule for the context's lifetime; they keep a per-thread stack of running modules,
  and each intercepted call is attributed to the innermost running module's qualified name
  (``"<root>"`` for the model itself, ``"<unknown>"`` outside every watched module; an inner
  context that watches nothing uses its enclosing contexts' modules).  The hooks do nothing in
  other threads and are removed on exit.
* ``activations=`` / ``weights=`` fake-quantize ``nn.Linear`` inputs and weights of the watched
  models (:mod:`lowprec.torch.hooks`); parameters are never written.
* HuggingFace transformers models loaded with ``attn_implementation="eager"`` compute attention
  by hand and would escape the interception.  With ``hf_eager=True`` (default) each such model
  among the watched ones (``model=`` / ``run.watch``) has its config's ``_attn_implementation``
  switched from ``"eager"`` to ``"lowprec"`` for the context's lifetime and restored on exit
  (normally or by exception): the one reversible edit made to a model.  ``"lowprec"`` is an
  attention function registered with transformers' ``AttentionInterface`` (and its mask with
  ``AttentionMaskInterface``) that makes the model's SDPA call, so eager and ``"sdpa"`` models
  are emulated alike; in a thread with no active context it computes the eager result.  The
  switch is per model, not per thread; models not watched are not switched (this cannot be
  detected).  Details and limits: :mod:`lowprec.torch.hf`.  ``run.hf_switched`` lists them.

SDPA semantics reproduced: :mod:`lowprec.torch.sdpa`; the report model (records, per-module
statistics, summary, JSON): :mod:`lowprec.torch.report`.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from functools import partial

import numpy as np

from ..kernels.problem import one_blas_thread
from ..stats import sqnr_db
from .hooks import (
    QuantStats,
    check_patterns,
    check_quant_format,
    check_quantize_options,
    fake_quant,
    selected,
)
from .report import CallRecord, EmulationStats, ModuleStats
from .sdpa import bind_sdpa, combine, empty_rows, materialize_mask, powers, repeat_kv

SHORTHANDS = {  # design.md "PyTorch integration": scheme shorthands -> (scheme, options)
    "hif8": ("baps", {"config": "e2e_hif8"}),
    "e4m3": ("baps", {"config": "exp2_e4m3"}),
    "e5m2": ("baps", {"config": "exp2_e5m2"}),
}
UNKNOWN_MODULE = "<unknown>"  # calls made outside every watched module
ROOT_MODULE = "<root>"  # the name of a watched model itself (torch's qualified name "")
EMPTY_ROWS = ("zero", "nan")
_TLS = threading.local()  # .stack: active Emulation objects of this thread, innermost last


def _active_stack() -> list:
    st = getattr(_TLS, "stack", None)
    if st is None:
        st = _TLS.stack = []
    return st


# --------------------------------------------------------------------------------------------
# the context


def _resolve_scheme(scheme, options: dict) -> tuple[str, dict]:
    """Shorthands -> (scheme name, options); validate the name and the option names."""
    from ..kernels import get_scheme, schemes
    from ..kernels.problem import check_options

    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a string, got {type(scheme).__name__}")
    if scheme in SHORTHANDS:
        name, preset = SHORTHANDS[scheme]
        clash = sorted(set(preset) & set(options))
        if clash:
            raise ValueError(f"scheme shorthand {scheme!r} sets {', '.join(clash)} itself; use "
                             f"emulate({name!r}, ...) to choose it")
        options = {**preset, **options}
        scheme = name
    valid = list(schemes())
    if scheme not in valid:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(valid + list(SHORTHANDS))}")
    check_options(options, scheme, get_scheme(scheme).options)
    return scheme, options


def _trial_call(scheme: str, options: dict) -> None:
    """Validate option values with one tiny call (skipped for shape-dependent options)."""
    from ..kernels import attention, get_scheme

    if any(o in options for o in get_scheme(scheme).shape_dependent):
        return

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    attention(q, q, q, scheme, causal=True, **options)


def _models(model) -> list:
    """``model=`` -> list of (prefix, module)."""
    import torch

    if model is None:
        return []
    if isinstance(model, torch.nn.Module):
        return [("", model)]
    if isinstance(model, dict):
        items = list(model.items())
    elif isinstance(model, (list, tuple)):
        items = [(str(i) if len(model) > 1 else "", m) for i, m in enumerate(model)]
    else:
        raise TypeError("model must be an nn.Module, a list of them or {prefix: module}, got "
                        f"{type(model).__name__}")
    for p, m in items:
        if not isinstance(p, str) or not isinstance(m, torch.nn.Module):
            raise TypeError("model must be an nn.Module, a list of them or {prefix: module}")
    return items


class Emulation:
    """An :func:`emulate` context (``with emulate(...) as run``); see the module docstring.

    Attributes:
        scheme, options: the lowprec scheme and its options (shorthands resolved).
        stats: :class:`EmulationStats` (filled while the context is active; kept after).
        reference: whether each call also computes float32 SDPA for the SQNR.
        hf_eager: whether eager-attention HF models among the watched ones are switched.
        hf_switched: qualified names of the HF models whose config this context switched
            (set while active; see :mod:`lowprec.torch.hf`).
    """

    def __init__(self, scheme, *, model=None, reference=False, activations=None, weights=None,
                 include=None, exclude=None, quantize_options=None, empty_rows="zero",
                 hf_eager=True, **options):
        self.scheme, self.options = _resolve_scheme(scheme, options)
        if not isinstance(reference, (bool, np.bool_)):
            raise TypeError(f"reference must be a bool, got {type(reference).__name__}")
        if empty_rows not in EMPTY_ROWS:
            raise ValueError(f"empty_rows {empty_rows!r} is not one of {', '.join(EMPTY_ROWS)}")
        if not isinstance(hf_eager, (bool, np.bool_)):
            raise TypeError(f"hf_eager must be a bool, got {type(hf_eager).__name__}")
        self.reference = bool(reference)
        self.hf_eager = bool(hf_eager)
        self.hf_switched: list[str] = []
        self._hf_held: list = []            # (name, config) switched by lowprec.torch.hf
        self.empty_rows = empty_rows
        self.activations = check_quant_format(activations, "activations")
        self.weights = check_quant_format(weights, "weights")
        self.include = check_patterns(include, "include", ("*",))
        self.exclude = check_patterns(exclude, "exclude", ())
        self.quantize_options = check_quantize_options(quantize_options)
        _trial_call(self.scheme, self.options)
        self._quant = self.activations is not None or self.weights is not None
        self._pending = _models(model)
        if self._quant and not self._pending:
            raise ValueError("activations= / weights= quantize the nn.Linear modules of the "
                             "watched models: pass model=...")
        self.stats = EmulationStats(self.scheme, self.options)
        self._names: dict[int, str] = {}     # id(module) -> qualified name
        self._qsel: set[int] = set()        # ids of the selected nn.Linear modules
        self._wcache: dict[int, tuple] = {}  # id(module) -> (param, version, quantized weight)
        self._handles: list = []
        self._mstack: list = []             # (name, module) of running watched modules
        self._mode = None
        self._thread = None
        self._active = False
        self._warned_device = False

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Emulation:
        if self._active:
            raise RuntimeError("this emulate context is already active; create a new one")
        self._thread = threading.get_ident()
        self._mstack = []
        self._mode = _mode_class()(self)
        try:
            for prefix, m in self._pending:
                self._install(m, prefix)
                self._hf_switch(m, prefix)
            self._mode.__enter__()
        except BaseException:
            self._remove_hooks()
            self._hf_restore()
            raise
        _active_stack().append(self)
        self._active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._active = False
        st = _active_stack()
        if self in st:
            st.remove(self)
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._mode = None
            self._remove_hooks()
            self._hf_restore()
            self._mstack = []
            self._wcache.clear()
        return False

    @property
    def active(self) -> bool:
        """Whether the context is entered (and not yet left)."""
        return self._active

    def watch(self, model, prefix: str = "") -> Emulation:
        """Attribute calls made inside ``model`` (and quantize its selected Linear modules).

        ``prefix`` is prepended to the qualified names (``prefix.name``).  Before entry the
        model is remembered; while active, hooks are installed (and an eager HF model
        switched, see ``hf_eager``) at once.  Returns ``self``.
        """
        items = _models({prefix: model} if prefix else model)
        if self._active:
            if threading.get_ident() != self._thread:
                raise RuntimeError("watch() must be called from the thread that entered")
            for p, m in items:
                self._install(m, p)
                self._hf_switch(m, p)
        self._pending.extend(items)
        return self

    def _hf_switch(self, model, prefix: str) -> None:
        if not self.hf_eager or "transformers" not in sys.modules:
            return  # no transformers imported: no HF model can exist
        from .hf import switch_eager

        held = switch_eager(model, prefix)
        self._hf_held.extend(held)
        self.hf_switched.extend(name for name, _ in held)

    def _hf_restore(self) -> None:
        if self._hf_held:
            from .hf import restore

            held, self._hf_held = self._hf_held, []
            restore(held)
        self.hf_switched = []

    def _install(self, model, prefix: str) -> None:
        import torch

        for name, mod in model.named_modules():
            qual = ".".join(x for x in (prefix, name) if x) or ROOT_MODULE
            if id(mod) in self._names:
                continue
            self._names[id(mod)] = qual
            if self._quant and isinstance(mod, torch.nn.Linear) and \
                    selected(qual, self.include, self.exclude):
                self._qsel.add(id(mod))
            self._handles.append(mod.register_forward_pre_hook(partial(self._pre, qual)))
            self._handles.append(
                mod.register_forward_hook(partial(self._post, qual), always_call=True))

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._names.clear()
        self._qsel.clear()

    # ---- hooks ------------------------------------------------------------------------------
    def _mine(self) -> bool:
        return self._active and threading.get_ident() == self._thread

    def _innermost(self) -> bool:
        st = _active_stack()
        return bool(st) and st[-1] is self

    def _pre(self, qual, module, args):
        if not self._mine():
            return None
        self._mstack.append((qual, module))
        if self.activations is None or id(module) not in self._qsel or not self._innermost():
            return None
        if not args or not hasattr(args[0], "is_floating_point") or \
                not args[0].is_floating_point():
            return None
        x = args[0]
        _no_grad_check((x,), "nn.Linear input")
        xq, n, sat, under = fake_quant(x, self.activations, self.quantize_options)
        qs = self._qstats(qual)
        qs.act_calls += 1
        qs.act_elements += n
        qs.act_saturated += sat
        qs.act_underflow += under
        return (xq,) + tuple(args[1:])

    def _post(self, qual, module, args, output):
        if not self._mine():
            return None
        for i in range(len(self._mstack) - 1, -1, -1):
            if self._mstack[i][1] is module:
                del self._mstack[i:]
                break
        return None

    def _qstats(self, qual: str) -> QuantStats:
        m = self.stats.module(qual)
        if m.quant is None:
            m.quant = QuantStats()
        return m.quant

    def _module_name(self) -> str:
        for ctx in reversed(_active_stack()):
            if ctx._mstack:
                return ctx._mstack[-1][0]
        return UNKNOWN_MODULE

    # ---- F.linear weights ---------------------------------------------------------------------
    def _linear(self, func, args, kwargs):
        """Called by the mode for F.linear: swap in the quantized weight of the running module."""
        if not (self._mstack and self._innermost()):
            return func(*args, **kwargs)
        qual, module = self._mstack[-1]
        if id(module) not in self._qsel:
            return func(*args, **kwargs)
        args = list(args)
        if len(args) >= 2:
            w = args[1]
        else:
            w = kwargs.get("weight")
        if w is None or w is not getattr(module, "weight", None):
            return func(*args, **kwargs)
        _no_grad_check((w,), f"weight of {qual}")
        cached = self._wcache.get(id(module))
        if cached is None or cached[0] is not w or cached[1] != w._version:
            wq, n, sat, under = fake_quant(w, self.weights, self.quantize_options)
            qs = self._qstats(qual)
            qs.w_quantizations += 1
            qs.w_elements += n
            qs.w_saturated += sat
            qs.w_underflow += under
            cached = (w, w._version, wq)
            self._wcache[id(module)] = cached
        if len(args) >= 2:
            args[1] = cached[2]
        else:
            kwargs = {**kwargs, "weight": cached[2]}
        return func(*args, **kwargs)

    # ---- SDPA -------------------------------------------------------------------------------
    def _sdpa(self, func, args, kwargs):
        import torch

        from ..kernels import attention

        q, k, v, mask, dropout_p, is_causal, scale, gqa = bind_sdpa(args, kwargs)
        for name, t in (("query", q), ("key", k), ("value", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"scaled_dot_product_attention: {name} must be a tensor")
        if dropout_p:
            raise ValueError(f"lowprec.emulate: dropout_p={dropout_p} is not supported (forward "
                             "emulation only); call the model in eval mode (dropout_p=0)")
        float_mask = isinstance(mask, torch.Tensor) and mask.is_floating_point()
        _no_grad_check((q, k, v) + ((mask,) if float_mask else ()), "scaled_dot_product_attention"
                       " inputs")
        device = q.device
        if any(t.device.type != "cpu" for t in (q, k, v)) or \
                (isinstance(mask, torch.Tensor) and mask.device.type != "cpu"):
            if not self._warned_device:
                warnings.warn(f"lowprec.emulate: attention inputs on {device} are moved to the "
                              "CPU for emulation and the result moved back (slow)",
                              UserWarning, stacklevel=3)
                self._warned_device = True
        mask = materialize_mask(mask, q, k)
        qc, kc, vc = (t.detach().cpu() for t in (q, k, v))
        mc = mask.detach().cpu() if isinstance(mask, torch.Tensor) else mask
        if gqa:
            kc, vc = repeat_kv(qc, kc, vc)
        Lq, Lk = qc.shape[-2], kc.shape[-2]
        causal = bool(is_causal)
        lp_mask = mc
        need_tril = causal and (Lq != Lk or mc is not None)
        tril = torch.ones(Lq, Lk, dtype=torch.bool).tril() if need_tril else None
        if causal and Lq != Lk:  # torch's is_causal is top-left aligned: fold it into the mask
            lp_mask = combine(mc, tril)
            causal = False
        t0 = time.perf_counter()
        with one_blas_thread():  # beside torch's threads, always (problem.one_blas_thread)
            out, st = attention(qc, kc, vc, self.scheme, scale=scale, causal=causal,
                                attn_mask=lp_mask, return_stats=True, **self.options)
        seconds = time.perf_counter() - t0
        empty = empty_rows(lp_mask, tuple(out.shape[:-2]), Lq, Lk, causal)
        n_empty = 0
        if empty is not None:
            empty = torch.broadcast_to(empty, out.shape[:-1])
            n_empty = int(empty.sum())
            if n_empty and self.empty_rows == "zero":
                out = out.masked_fill(empty[..., None], 0)
        sq = None
        signal = noise = 0.0
        if self.reference:
            ref = func(qc.float(), kc.float(), vc.float(),
                       attn_mask=mc.float() if float_mask else mc, dropout_p=0.0,
                       is_causal=bool(is_causal), scale=scale)
            signal, noise = powers(out, ref, empty)
            sq = sqnr_db(signal, noise)
        rec = CallRecord(len(self.stats.calls), self._module_name(), tuple(q.shape),
                         tuple(k.shape), tuple(v.shape), str(q.dtype), bool(is_causal),
                         mask is not None, bool(gqa), seconds, sq, n_empty, st)
        self.stats.record(rec, signal, noise)
        if out.device != device:
            out = out.to(device)
        return out


def _no_grad_check(tensors, what: str) -> None:
    import torch

    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise RuntimeError(f"lowprec.emulate: {what} require grad; emulation is forward only: "
                           "run the model under torch.no_grad() or torch.inference_mode()")


_MODE_CLS = None


def _mode_class():
    """The ``TorchFunctionMode`` subclass (built on first use, so torch loads lazily)."""
    global _MODE_CLS
    if _MODE_CLS is not None:
        return _MODE_CLS
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    sdpa = F.scaled_dot_product_attention
    linear = F.linear

    class EmulationMode(TorchFunctionMode):
        """Routes SDPA (and F.linear for weight hooks) of one :class:`Emulation`."""

        def __init__(self, run: Emulation):
            super().__init__()
            self.run = run

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if kwargs is None:
                kwargs = {}
            run = self.run
            if func is sdpa:
                if run._innermost():
                    return run._sdpa(func, args, kwargs)
            elif func is linear and run.weights is not None:
                return run._linear(func, args, kwargs)
            return func(*args, **kwargs)

    _MODE_CLS = EmulationMode
    return _MODE_CLS


def emulate(scheme: str, *, model=None, reference: bool = False, activations: str | None = None,
            weights: str | None = None, include=None, exclude=None, quantize_options=None,
            empty_rows: str = "zero", hf_eager: bool = True, **options) -> Emulation:
    """Context manager: inside it, torch SDPA calls run lowprec's emulated attention.

    Args:
        scheme: a name from :func:`lowprec.schemes` (``"baps"``, ``"intattention"``,
            ``"reference"``, ...) or a shorthand: ``"hif8"`` = ``("baps", config="e2e_hif8")``,
            ``"e4m3"`` / ``"e5m2"`` = BAPS ``exp2_e4m3`` / ``exp2_e5m2`` (design.md).
        model: module(s) whose submodules get attribution hooks: an ``nn.Module``, a list of
            them (prefixed ``"0."``, ``"1."``... when more than one) or ``{prefix: module}``;
            more can be added with ``run.watch(m)``.  Needed for ``activations``/``weights``.
        reference: also compute float32 SDPA for each call and record the SQNR (dB) of the
            emulated output against it (costs one extra attention per call).
        activations, weights: fake-quantize inputs / weights of the selected ``nn.Linear``
            modules to ``"hif8"``, ``"e4m3"`` or ``"e5m2"`` (:mod:`lowprec.torch.hooks`).
        include, exclude: fnmatch patterns on qualified names selecting those Linear modules
            (default: all, none excluded).
        quantize_options: keywords of :func:`lowprec.quantize` for the hooks (rounding,
            saturate (default True), seed, sr_bits).
        empty_rows: ``"zero"`` (like torch SDPA) or ``"nan"`` for query rows seeing no key.
        hf_eager: switch HuggingFace transformers models among ``model=`` that use
            ``attn_implementation="eager"`` to the registered ``"lowprec"`` implementation for
            the context's lifetime, so their attention is emulated too (restored on exit; see
            :mod:`lowprec.torch.hf`).  ``False`` leaves them alone (their attention then runs
            unemulated).  An eager HF model that is not watched is never switched.
        **options: options of the scheme (``config``, ``tau``, ``block_q``, ...).

    Returns:
        An :class:`Emulation`; ``with emulate(...) as run`` gives it back, ``run.stats`` is an
        :class:`EmulationStats`.

    Raises:
        ValueError: unknown scheme or option (listing the valid ones), bad option values
            (checked with a tiny trial call at construction), bad formats; inside the context,
            ``dropout_p > 0``.
        RuntimeError: inside the context, inputs that require grad while grad is enabled.

    Example::

        >>> with torch.no_grad(), emulate("hif8", tau=1, model=model) as run:
        ...     y = model(x)
        >>> run.stats.restart_rate
    """
    return Emulation(scheme, model=model, reference=reference, activations=activations,
                     weights=weights, include=include, exclude=exclude,
                     quantize_options=quantize_options, empty_rows=empty_rows,
                     hf_eager=hf_eager, **options)


__all__ = ["emulate", "Emulation", "EmulationStats", "ModuleStats", "CallRecord",
           "SHORTHANDS", "UNKNOWN_MODULE", "ROOT_MODULE", "EMPTY_ROWS"]
