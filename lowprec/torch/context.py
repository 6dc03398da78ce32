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
  exception).  Inside it every ``torch.nn.functional.scaled_dot_product_attention`` call (also
  made as ``torch.ops.aten.scaled_dot_product_attention``) is answered by
  :func:`lowprec.attention` with the chosen scheme; every other torch call passes through
  unchanged.  Nothing global is patched: torch keeps its mode stack per thread, so a context
  affects only the thread that entered it (and must be left there).
* ``nn.MultiheadAttention`` and through it ``nn.TransformerEncoderLayer`` /
  ``TransformerDecoderLayer`` / ``nn.Transformer``: under a function mode torch skips their
  fused fast paths and calls ``F.multi_head_attention_forward``, which the mode receives as one
  call; it answers it with :func:`lowprec.torch.mha.mha_forward`, whose attention core goes
  through the same emulated SDPA path (attribution, statistics, masks, empty rows).  With
  ``need_weights=True`` (``nn.MultiheadAttention``'s default) the output is emulated and the
  returned weights are torch's float ``softmax(q k^T / sqrt(d) + mask)``.  MHA's projections
  are parameters used inside that function, not ``nn.Linear`` calls: ``activations=`` /
  ``weights=`` do not quantize them.  torch's private fused attention functions
  (``torch._native_multi_head_attention``, ``torch._transformer_encoder_layer_fwd``,
  ``torch._scaled_dot_product_*``, ...) are never called by torch's modules under a mode; a
  direct call runs unemulated and is reported by a warning on exit.
* Contexts nest; the innermost active context of the thread alone is in effect (its scheme, its
  Linear hooks, its statistics); the outer one resumes when the inner one exits.
* Module names.  Models passed as ``model=`` (a module, a list of modules or
  ``{prefix: module}``) or later with ``run.watch(m)`` get a forward pre-hook and a forward
  hook on every submodule for the context's lifetime; each intercepted
  call is attributed to the innermost running watched module's qualified name (``"<root>"`` for
  the model itself, ``"<unknown>"`` outside every watched module; an inner context that watches
  nothing uses its enclosing contexts' modules).  Without ``model=`` the context installs
  torch's global module hooks for its lifetime and names modules from the outermost module
  called (:mod:`lowprec.torch.naming`): ``with emulate("flash"): model(x)`` gives the names
  ``model=model`` gives.  Either way the hooks do nothing in other threads and are removed on
  exit; ``"<unknown>"`` remains for SDPA called outside every module.
* ``activations=`` / ``weights=`` fake-quantize ``nn.Linear`` inputs and weights of the watched
  models (:mod:`lowprec.torch.hooks`); parameters are never written.
* HuggingFace transformers models loaded with ``attn_implementation="eager"`` compute attention
  by hand and would escape the interception.  With ``hf_eager=True`` (default) each such model
  among the watched ones (``model=`` / ``run.watch``), or, without ``model=``, inside each
  top-level model the context meets (switched in the outermost module's forward pre-hook,
  before its forward runs), has its config's ``_attn_implementation`` switched from
  ``"eager"`` to ``"lowprec"`` until the context exits (normally or by exception): the one
  reversible edit made to a model.  ``"lowprec"`` is an attention function registered with
  transformers' ``AttentionInterface`` (and its mask with ``AttentionMaskInterface``) that
  makes the model's SDPA call, so eager and ``"sdpa"`` models are emulated alike; in a thread
  with no active context it computes the eager result.  The switch is per model, not per
  thread.  Details and limits: :mod:`lowprec.torch.hf`.  ``run.hf_switched`` lists them.
* Warnings (``UserWarning``, each at most once per context): on the first call whose scheme
  statistics report a hazard (``Stats.hazards``: a wrap, an overflow, a non-finite row...),
  naming the counter, the module and what it counts; on a normal exit, when no attention call
  was emulated although softmax was computed (attention by hand) or modules ran (a model
  without SDPA), and when torch's fused attention functions were called directly.
* The first use of a scheme may compile Numba kernels for seconds; that is logged once per
  process (INFO, logger ``"lowprec"``; :mod:`lowprec.compile`, ``lowprec compile``).
* Models split over devices (transformers' ``device_map``, accelerate): each call runs where
  its query lives (its GPU, or the CPU); the deferred statistics of GPU calls wait each for
  its own device's event and are recorded in call order, so one report merges every device
  (docs/design.md "Several devices and processes").
* ``torch.compile``: while Dynamo traces, the mode answers attention (and, with
  ``activations=`` / ``weights=``, ``F.linear``'s operands) with the custom ops of
  :mod:`lowprec.torch.ops` (``lowprec::sdpa``, ...), one opaque graph node each
  (``fullgraph=True`` works); at run time they look up the innermost active context and run
  its eager path, so compiled and eager calls give the same bits and statistics, and a model
  compiled inside one context reports to any later one.  Calls are named from the modules
  Dynamo was inside when it traced them.  What is lost for code inside a compiled graph
  (softmax counting for the exit warning, ...): docs/design.md "torch.compile inside emulate".

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

from ..kernels.device import Pending
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
from .naming import ROOT_MODULE, AutoNames
from .report import CallRecord, EmulationStats, ModuleStats, counter_meaning
from .sdpa import bind_sdpa, combine, empty_rows, materialize_mask, powers, repeat_kv

SHORTHANDS = {  # design.md "PyTorch integration": scheme shorthands -> (scheme, options)
    "hif8": ("baps", {"config": "e2e_hif8"}),
    "e4m3": ("baps", {"config": "exp2_e4m3"}),
    "e5m2": ("baps", {"config": "exp2_e5m2"}),
}
UNKNOWN_MODULE = "<unknown>"  # calls made outside every named module
EMPTY_ROWS = ("zero", "nan")
_TLS = threading.local()  # .stack: active Emulation objects of this thread, innermost last
#: causal-mask answers a context keeps (:meth:`Emulation._causal_mask`; cleared when full)
_MASK_VERDICTS = 32


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
        return [("", _optimized(model) or model)]  # torch.compile(m): m's names
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
    return [(p, _optimized(m) or m) for p, m in items]


class Emulation:
    """An :func:`emulate` context (``with emulate(...) as run``); see the module docstring.

    Attributes:
        scheme, options: the lowprec scheme and its options (shorthands resolved).
        stats: :class:`EmulationStats` (filled while the context is active; kept after).
        reference: whether each call also computes float32 SDPA for the SQNR.
        hf_eager: whether eager-attention HF models (watched, or met without ``model=``) are
            switched.
        hf_switched: qualified names of the HF models whose config this context switched
            (set while active; see :mod:`lowprec.torch.hf`).
        mask_cache: whether a causal mask's verdict is reused for the same tensor
            (:func:`emulate`).
    """

    def __init__(self, scheme, *, model=None, reference=False, activations=None, weights=None,
                 include=None, exclude=None, quantize_options=None, empty_rows="zero",
                 hf_eager=True, mask_cache=True, **options):
        self.scheme, self.options = _resolve_scheme(scheme, options)
        if not isinstance(mask_cache, (bool, np.bool_)):
            raise TypeError(f"mask_cache must be a bool, got {type(mask_cache).__name__}")
        self.mask_cache = bool(mask_cache)
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
        self._stats = EmulationStats(self.scheme, self.options)
        self._deferred: list = []           # device calls whose statistics are on their way
        self._mask_verdicts: dict = {}     # (storage key, version) -> is causal (_causal_mask)
        self._mask_checks: list = []        # (device bool, call index): reused verdicts' checks
        self._names: dict[int, str] = {}     # id(module) -> qualified name
        self._qsel: set[int] = set()        # ids of the selected nn.Linear modules
        self._wcache: dict[int, tuple] = {}  # id(module) -> (param, version, quantized weight)
        self._handles: list = []
        self._mstack: list = []             # (name, module, frame) of running watched modules
        self._auto: AutoNames | None = None  # names without model= (lowprec.torch.naming)
        self._astack: list = []             # (name, module, frame), auto-named modules
        self._hf_roots: set[int] = set()    # ids of auto-named models given to _hf_switch
        self._mode = None
        self._thread = None
        self._active = False
        self._warned_device = False
        self._warned_hazard = False
        self._modules_run = 0               # module calls seen by this context's hooks
        self._softmax_calls = 0             # softmax calls seen by the mode (item 18)
        self._attention_seen = 0            # attention calls intercepted while active (any ctx)
        self._escaped: dict[str, int] = {}  # fused torch attention functions met, not emulated

    @property
    def stats(self) -> EmulationStats:
        """:class:`EmulationStats` of the context (filled while it is active; kept after).
        Reading it waits for the statistics of device calls still on their way to the host
        (the only synchronisation those calls make; see :meth:`_sdpa_device`)."""
        self._flush()
        return self._stats

    def _flush(self) -> None:
        """Record the device calls whose statistics were deferred, in call order; check the
        causal-mask verdicts reused from the cache (:meth:`_causal_mask`)."""
        checks, self._mask_checks = self._mask_checks, []
        if checks:
            import torch

            ok = torch.stack([c for c, _ in checks]).cpu().numpy()
            stale = [i for (_, i), good in zip(checks, ok, strict=True) if not good]
            if stale:
                self._deferred = []
                raise RuntimeError(
                    f"lowprec.emulate({self.scheme!r}): SDPA call(s) {stale} were given a "
                    "boolean mask tensor that had been found causal in an earlier call, but "
                    "its contents changed without a version bump (a buffer that "
                    "torch.compile's generated code reuses and rewrites in place); those "
                    "calls ran as causal, so their outputs and statistics are wrong. "
                    "Emulate this model without torch.compile, or with "
                    "lowprec.emulate(..., mask_cache=False)")
        pending, self._deferred = self._deferred, []
        for rec, pend, seconds, signal, noise in pending:
            rec.stats, rec.empty_rows = pend.resolve()
            rec.seconds = seconds()
            self._record(rec, signal, noise)

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Emulation:
        if self._active:
            raise RuntimeError("this emulate context is already active; create a new one")
        from ..compile import watch_compilation

        watch_compilation()
        self._thread = threading.get_ident()
        self._mstack, self._astack = [], []
        self._modules_run = self._softmax_calls = self._attention_seen = 0
        self._escaped = {}
        self._mode = _mode_class(self._quant)(self)
        try:
            for prefix, m in self._pending:
                self._install(m, prefix)
                self._hf_switch(m, prefix)
            if not self._pending:
                self._install_auto()
            self._mode.__enter__()
        except BaseException:
            self._remove_hooks()
            self._hf_restore()
            raise
        _active_stack().append(self)
        self._active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._active and threading.get_ident() != self._thread:
            raise RuntimeError("an emulate context must be left in the thread that entered it "
                               "(torch keeps its function modes per thread)")
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
            self._mstack, self._astack = [], []
            self._wcache.clear()
        if exc_type is None:
            self._flush()  # the deferred statistics: their hazards warn here
            self._warn_nothing_emulated()
        return False

    def _warn_nothing_emulated(self) -> None:
        """Item 18: modules ran or softmax was computed, but no attention call was emulated;
        and fused torch attention functions met (never emulated)."""
        where = f"lowprec.emulate({self.scheme!r})"
        if self._escaped:
            names = ", ".join(f"{k} ({n}x)" for k, n in self._escaped.items())
            warnings.warn(f"{where}: {names} computed attention in one of torch's fused kernels, "
                          "which lowprec does not emulate (called directly, not through "
                          "F.scaled_dot_product_attention or nn.MultiheadAttention): those "
                          "results are torch's float attention", UserWarning, stacklevel=3)
        if self._attention_seen or not (self._modules_run or self._softmax_calls):
            return  # attention was emulated, or nothing ran at all
        quantized = any(m.quant is not None for m in self._stats.modules.values())
        if self._softmax_calls:
            why = (f"{self._softmax_calls} softmax call(s) ran: attention written by hand "
                   "(matmul + softmax) is not emulated")
        elif quantized:
            return  # a Linear-quantization context on a model without attention
        else:
            why = (f"{self._modules_run} module call(s) ran, none of them calling "
                   "F.scaled_dot_product_attention or nn.MultiheadAttention")
        warnings.warn(f"{where}: no attention call was emulated; {why}. lowprec emulates "
                      "F.scaled_dot_product_attention, nn.MultiheadAttention (and the "
                      "nn.Transformer layers) and transformers models with attention "
                      "'sdpa' or 'eager' (hf_eager=True)", UserWarning, stacklevel=3)

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
                mod.register_forward_hook(partial(self._post, qual)))

    def _install_auto(self) -> None:
        """No ``model=``: name modules with torch's global module hooks (item 9;
        :mod:`lowprec.torch.naming`)."""
        from torch.nn.modules import module as nn_module

        self._auto = AutoNames()
        self._hf_roots = set()
        self._handles.append(nn_module.register_module_forward_pre_hook(self._auto_pre))
        self._handles.append(nn_module.register_module_forward_hook(self._auto_post))

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._names.clear()
        self._qsel.clear()
        if self._auto is not None:
            self._auto.clear()
            self._auto = None
        self._hf_roots = set()

    # ---- hooks ------------------------------------------------------------------------------
    def _mine(self) -> bool:
        return self._active and threading.get_ident() == self._thread

    def _innermost(self) -> bool:
        st = _active_stack()
        return bool(st) and st[-1] is self

    def _pre(self, qual, module, args):
        if _compiling() or not self._mine():  # traced by Dynamo: nothing (lowprec.torch.ops)
            return None
        self._modules_run += 1
        if not _live(self._mstack):
            self._mask_verdicts.clear()  # a new outermost forward (_causal_mask)
        self._mstack.append((qual, module, sys._getframe(1)))
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
        if not _compiling() and self._mine():
            _pop(self._mstack, module)
        return None

    def _auto_pre(self, module, args):
        if _compiling() or not self._mine() or _optimized(module) is not None:
            return None  # torch.compile's wrapper: its model's own hooks follow
        self._modules_run += 1
        outermost = not _live(self._astack)
        name, renames = self._auto.meet(module)
        if renames:
            self.stats.rename(renames)
        if outermost:
            self._mask_verdicts.clear()  # a new outermost forward (_causal_mask)
            root = self._auto.root_of(module)
            if id(root) not in self._hf_roots:  # a new top-level model: eager HF models in it
                self._hf_roots.add(id(root))
                prefix = name if root is module and name != ROOT_MODULE else ""
                self._hf_switch(root, prefix)
        self._astack.append((name, module, sys._getframe(1)))
        return None

    def _auto_post(self, module, args, output):
        if not _compiling() and self._mine():
            _pop(self._astack, module)
        return None

    def _qstats(self, qual: str) -> QuantStats:
        m = self._stats.module(qual)
        if m.quant is None:
            m.quant = QuantStats()
        return m.quant

    def _module_name(self) -> str:
        """The innermost running module of the watched models (``model=``, ``watch``) of the
        thread's active contexts, else the innermost auto-named one, else ``"<unknown>"``."""
        top = _running_top()
        return UNKNOWN_MODULE if top is None else top[0]

    # ---- torch.compile: call sites of the custom ops (lowprec.torch.ops) --------------------
    def _site_modules(self, index: int) -> list:
        """The modules around a traced call site, innermost first.  Dynamo shares a frame's
        compiled code between instances of a module class: when another instance of the
        class of the frame's module than the one traced is running (its hooks ran outside
        the graph), its submodules at the same paths."""
        from .ops import site

        s = site(index)
        if s is None:
            return []
        mods = s.modules()
        if s.root_type is None:
            return [m for m, _ in mods]
        root = s.root()
        for _, running in _running():
            if type(running) is not s.root_type:
                continue
            if running is root:
                break
            out = []
            for _, rel in mods:
                if rel is None:
                    continue
                try:
                    out.append(running.get_submodule(rel) if rel else running)
                except AttributeError:
                    continue
            return out
        return [m for m, _ in mods]

    def _site_name(self, index: int) -> str:
        """The name eager hooks would give a call made at a traced site: the innermost of
        its modules watched by a context (``model=``), else the innermost running watched
        module, else the auto names (met outermost first, as the pre-hooks meet them), else
        the innermost module running outside the graph, else ``"<unknown>"``."""
        mods = self._site_modules(index)
        stack = _active_stack()
        watched = [ctx for ctx in reversed(stack) if ctx._names]
        for m in mods:
            for ctx in watched:
                name = ctx._names.get(id(m))
                if name is not None:
                    return name
        if mods and not any(_live(ctx._mstack) for ctx in stack):
            name = None
            for ctx in stack:
                if ctx._auto is None:
                    continue
                for m in reversed(mods):
                    name, renames = ctx._auto.meet(m)
                    if renames:
                        ctx.stats.rename(renames)
            if name is not None:
                return name
        return self._module_name()

    def _site_linear(self, index: int):
        """The selected ``nn.Linear`` of a traced ``F.linear`` site (None if not selected)."""
        mods = self._site_modules(index)
        if mods and id(mods[0]) in self._qsel:
            return mods[0]
        return None

    def _site_linear_input(self, x, index: int):
        """``lowprec::linear_input``: the pre-hook's activation quantization (None: keep x)."""
        if self.activations is None or not x.is_floating_point():
            return None
        module = self._site_linear(index)
        top = _running_top()
        if module is None or (top is not None and top[1] is module):
            return None  # not selected, or its pre-hook ran outside the graph: done there
        xq, n, sat, under = fake_quant(x, self.activations, self.quantize_options)
        qs = self._qstats(self._names[id(module)])
        qs.act_calls += 1
        qs.act_elements += n
        qs.act_saturated += sat
        qs.act_underflow += under
        return xq

    def _site_linear_weight(self, w, index: int):
        """``lowprec::linear_weight``: the quantized weight :meth:`_linear` would hand
        ``F.linear`` (None: keep w)."""
        if self.weights is None:
            return None
        module = self._site_linear(index)
        param = None if module is None else getattr(module, "weight", None)
        if param is None or w.data_ptr() != param.data_ptr() or w.shape != param.shape:
            return None
        return self._quantized_weight(module, self._names[id(module)], param)

    # ---- F.linear weights ---------------------------------------------------------------------
    def _linear(self, func, args, kwargs):
        """Called by the mode for F.linear: swap in the quantized weight of the running module."""
        if not (_live(self._mstack) and self._innermost()):
            return func(*args, **kwargs)
        qual, module, _ = self._mstack[-1]
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
        wq = self._quantized_weight(module, qual, w)
        if len(args) >= 2:
            args[1] = wq
        else:
            kwargs = {**kwargs, "weight": wq}
        return func(*args, **kwargs)

    def _quantized_weight(self, module, qual: str, w):
        """The quantized copy of ``module``'s weight ``w`` (cached; re-quantized when the
        parameter's version changes)."""
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
        return cached[2]

    # ---- SDPA -------------------------------------------------------------------------------
    def _causal_mask(self, mask, q, k) -> bool:
        """Whether ``mask`` is a boolean causal mask: ``Lq == Lk``, leading dims of size 1, the
        lower triangle (diagonal included) True and the rest False.  transformers passes
        ``is_causal=True`` to SDPA in eager mode but materializes this mask while Dynamo traces
        (it cannot decide at trace time that the mask may be dropped); treating it as
        ``is_causal=True`` gives compiled and eager runs the same bits and statistics and lets
        the GPU engine skip reading a mask plane.  The answers are kept, keyed on the
        tensor's memory (device, address, shape, strides) and its version counter: the
        layers of one forward share the mask, and torch.compile's generated code hands the
        same buffer to later graph segments and later forwards as new tensor objects (six of
        the 16 calls of a compiled Llama forward met a new object on the H100, each a
        comparison and a read-back when the answers were keyed on the object).  A reused True
        answer is checked again on the device, read with the deferred statistics
        (:meth:`_flush` raises a RuntimeError naming the calls): that catches a buffer
        rewritten without a version bump, or freed and reallocated with other contents (a
        False answer is never a shortcut: such a call reads its mask).  The answers last one
        forward: the outermost module call of a watched model (or, without ``model=``, of
        any model) starts with none, since a compiled model's next forward may write another
        mask (a padded batch) into the same buffer; calls outside every module share them
        for the context.  ``mask_cache=False`` turns the reuse off (one comparison and
        read-back per call)."""
        import torch

        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return False
        Lq, Lk = q.shape[-2], k.shape[-2]
        if Lq != Lk or Lq < 2 or tuple(mask.shape[-2:]) != (Lq, Lk) or \
                any(n != 1 for n in mask.shape[:-2]):
            return False
        try:
            version = mask._version
        except RuntimeError:  # an inference tensor keeps no version counter: no caching
            version = None
        from ..kernels.device_rows import index_tensor

        tril = index_tensor(("tril", Lq), lambda: np.tri(Lq, dtype=np.bool_), mask.device)
        key = None if version is None or not self.mask_cache else (
            str(mask.device), mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), version)
        verdict = self._mask_verdicts.get(key) if key is not None else None
        if verdict is not None:
            if verdict:  # checked on the device, read with the deferred statistics (_flush)
                index = len(self._stats.calls) + len(self._deferred)
                self._mask_checks.append(((mask.reshape(Lq, Lk) == tril).all(), index))
            return verdict
        verdict = bool(torch.equal(mask.reshape(Lq, Lk), tril))
        if key is not None:
            if len(self._mask_verdicts) >= _MASK_VERDICTS:
                self._mask_verdicts.clear()
            self._mask_verdicts[key] = verdict
        return verdict

    def _sdpa(self, func, args, kwargs, module: str | None = None):
        """One SDPA call, emulated; ``module`` names the caller (default: the running
        module; given by ``lowprec::sdpa`` under torch.compile)."""
        import torch

        from ..kernels import attention

        for ctx in _active_stack():  # intercepted (even if it raises below): no exit warning
            ctx._attention_seen += 1
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
        if not is_causal and self._causal_mask(mask, q, k):
            mask, is_causal = None, True  # what the model means (eager transformers says so)
        device = q.device
        from ..kernels import get_scheme
        from ..kernels.device import wants_device

        if wants_device(get_scheme(self.scheme), q):
            return self._sdpa_device(func, q, k, v, mask, is_causal, scale, gqa, float_mask,
                                     module)
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
        out = self._close_call(
            func, out, st, seconds, empty, n_empty,
            lambda: (qc.float(), kc.float(), vc.float(), mc.float() if float_mask else mc),
            (q, k, v, mask, is_causal, scale, gqa), module)
        if out.device != device:
            out = out.to(device)
        return out

    def _sdpa_device(self, func, q, k, v, mask, is_causal, scale, gqa, float_mask, module):
        """One SDPA call of a scheme of the GPU engine (``flash``, ``baps``) on q's device
        (:mod:`lowprec.kernels.device`): no host transfer of the tensors, GQA heads read by
        index; the steps of :meth:`_sdpa`.  A scheme of the GPU engine does not synchronise:
        its statistics (and the call's device time, from two CUDA events) travel to the host
        asynchronously and the call is recorded when :attr:`stats` is read or the context
        exits (where its hazards warn).  Row-wise schemes read back in the call what their
        checks need (the inputs' finiteness, the scales of their thresholds) and defer their
        statistics the same way."""
        import torch

        from ..kernels import get_scheme
        from ..kernels.device import attention_device

        mask = materialize_mask(mask, q, k)
        dev = q.device
        Lq, Lk = q.shape[-2], k.shape[-2]
        causal = bool(is_causal)
        lp_mask = mask.detach() if isinstance(mask, torch.Tensor) else mask
        if causal and (Lq != Lk):  # torch's is_causal is top-left aligned: fold it into the mask
            tril = torch.ones(Lq, Lk, dtype=torch.bool, device=dev).tril()
            lp_mask = combine(lp_mask, tril)
            causal = False
        if dev.type == "cuda":  # the call's device time, read when its statistics are
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record(torch.cuda.current_stream(dev))
        t0 = time.perf_counter()
        out, st, empty, n_empty = attention_device(
            get_scheme(self.scheme), q, k, v, scale=scale, causal=causal, attn_mask=lp_mask,
            return_stats=True, options=self.options, gqa=bool(gqa), with_empty=True,
            defer=True)
        if dev.type == "cuda":
            ev1.record(torch.cuda.current_stream(dev))

            def seconds():  # (elapsed_time raises unless both events have completed)
                ev1.synchronize()
                return ev0.elapsed_time(ev1) / 1e3
        else:
            wall = time.perf_counter() - t0

            def seconds():
                return wall
        if empty is not None:
            empty = torch.broadcast_to(empty, out.shape[:-1])

        def ref_inputs():  # float32 SDPA on the device (GQA repeated for it only)
            kr, vr = repeat_kv(q, k, v) if gqa else (k, v)
            return (q.detach().float(), kr.detach().float(), vr.detach().float(),
                    mask.detach().float() if float_mask else mask)

        return self._close_call(func, out, st, seconds, empty, n_empty, ref_inputs,
                                (q, k, v, mask, is_causal, scale, gqa), module)

    def _close_call(self, func, out, st, seconds, empty, n_empty, ref_inputs, call, module):
        """The end of an emulated SDPA call (CPU and device paths): rows that see no key
        zeroed (``empty_rows="zero"``), the ``reference=`` SQNR (``ref_inputs()`` gives q, k,
        v and the mask for torch's float32 SDPA ``func``), the call recorded."""
        q, k, v, mask, is_causal, scale, gqa = call
        deferred = isinstance(st, Pending)
        if not deferred and callable(seconds):
            seconds = seconds()
        if empty is not None and self.empty_rows == "zero" and (deferred or n_empty):
            out = out.masked_fill(empty[..., None], 0)
        sq = None
        signal = noise = 0.0
        if self.reference:
            qr, kr, vr, mr = ref_inputs()
            ref = func(qr, kr, vr, attn_mask=mr, dropout_p=0.0, is_causal=bool(is_causal),
                       scale=scale)
            signal, noise = powers(out, ref, empty)
            sq = sqnr_db(signal, noise)
        name = self._module_name() if module is None else module
        index = len(self._stats.calls) + len(self._deferred)
        rec = CallRecord(index, name, tuple(q.shape),
                         tuple(k.shape), tuple(v.shape), str(q.dtype), bool(is_causal),
                         mask is not None, bool(gqa), 0.0 if deferred else seconds, sq,
                         0 if deferred else n_empty, None if deferred else st)
        if deferred:  # recorded when read (run.stats, the context's exit)
            self._stats.module(name)  # (modules stay in order of first appearance)
            self._deferred.append((rec, st, seconds, signal, noise))
        else:
            self._flush()
            self._record(rec, signal, noise)
        return out

    def _record(self, rec: CallRecord, signal: float, noise: float) -> None:
        self._stats.record(rec, signal, noise)
        if self._warned_hazard or rec.stats is None:
            return
        hit = {k: n for k, n in rec.stats.hazards.items() if n}
        if not hit:
            return
        self._warned_hazard = True
        what = "; ".join(f"{k} = {n} ({counter_meaning(type(rec.stats), k)})"
                         for k, n in hit.items())
        warnings.warn(f"lowprec.emulate({self.scheme!r}): hazard in {rec.module} (call "
                      f"{rec.index}): {what}. Outputs of such calls may be wrong or degraded "
                      "beyond the scheme's documented behaviour; run.stats.summary() shows the "
                      "counters per module (warned once per context)", UserWarning,
                      stacklevel=_user_stacklevel())

    # ---- nn.MultiheadAttention ------------------------------------------------------------------
    def _mha(self, sdpa, args, kwargs):
        """``F.multi_head_attention_forward`` (nn.MultiheadAttention, nn.Transformer*Layer) with
        its attention core answered by :meth:`_sdpa` (:mod:`lowprec.torch.mha`)."""
        from .mha import mha_forward

        def attend(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
            return self._sdpa(sdpa, (q, k, v), {"attn_mask": attn_mask, "dropout_p": dropout_p,
                                                "is_causal": is_causal})

        return mha_forward(attend, *args, **kwargs)


def _running():
    """``(name, module)`` of the running modules of the thread's active contexts, innermost
    first: the watched ones (``model=``), then the auto-named ones."""
    stack = _active_stack()
    for attr in ("_mstack", "_astack"):
        for ctx in reversed(stack):
            for entry in reversed(_live(getattr(ctx, attr))):
                yield entry[:2]


def _running_top():
    """``(name, module)`` of the innermost running module of the watched models of the
    thread's active contexts, else of the innermost auto-named one; None if none runs."""
    return next(_running(), None)


def _live(stack: list) -> list:
    """A module stack without the entries of modules whose forward raised: a module's entry
    holds the frame that called its pre-hook (torch's ``_call_impl``), which runs until its
    forward hook pops the entry; an entry whose frame is no longer an ancestor of the current
    one is stale and dropped (from the top).  Returns ``stack`` (pruned in place).

    The forward hooks are registered without ``always_call``: Dynamo guards a traced module
    call on its always-called hook ids, so every new context would recompile a compiled model
    (docs/design.md "torch.compile")."""
    while stack:
        frame = stack[-1][2]
        f = sys._getframe(1)
        while f is not None and f is not frame:
            f = f.f_back
        if f is not None:
            return stack
        stack.pop()
    return stack


def _compiling() -> bool:
    """Whether Dynamo is tracing (``torch.compiler.is_compiling()``)."""
    import torch

    return torch.compiler.is_compiling()


def _optimized(module):
    """The model wrapped by ``torch.compile(model)`` (an ``OptimizedModule``), else None."""
    ev = sys.modules.get("torch._dynamo.eval_frame")
    if ev is not None and isinstance(module, ev.OptimizedModule):
        return module._orig_mod
    return None


def _pop(stack: list, module) -> None:
    """Remove ``module``'s entry (and any left above it by an exception) from a module stack."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][1] is module:
            del stack[i:]
            return


def _user_stacklevel() -> int:
    """The ``stacklevel`` of a warning that points at the first frame outside torch and
    lowprec (the user's line running the model)."""
    torch_dir = _torch_dir()
    f = sys._getframe(1)
    level = 1
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        file = f.f_code.co_filename
        if not (mod.startswith(("lowprec.", "torch", "transformers")) or mod == "lowprec"
                or file.startswith(torch_dir) or "torchinductor" in file):
            return level  # (code torch.compile generates: under torch/ or inductor's cache)
        f = f.f_back
        level += 1
    return 2


def _torch_dir() -> str:
    import os

    import torch

    return os.path.dirname(torch.__file__) + os.sep


def _no_grad_check(tensors, what: str) -> None:
    import torch

    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise RuntimeError(f"lowprec.emulate: {what} require grad; emulation is forward only: "
                           "run the model under torch.no_grad() or torch.inference_mode()")


_MODE_CLS: dict = {}


def _mode_class(quant: bool = False):
    """The ``TorchFunctionMode`` subclass (built on first use, so torch loads lazily); one
    class for contexts that quantize ``nn.Linear`` (``quant``) and one for the others, so a
    graph compiled under one kind is never reused under the other (Dynamo guards the types
    of the modes on torch's stack; :mod:`lowprec.torch.ops`)."""
    if quant in _MODE_CLS:
        return _MODE_CLS[quant]
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    from . import ops

    sdpa = F.scaled_dot_product_attention
    aten = torch.ops.aten
    aten_sdpa, aten_sdpa_default = (aten.scaled_dot_product_attention,
                                    aten.scaled_dot_product_attention.default)
    sdpas = {sdpa, aten_sdpa, aten_sdpa_default}
    mha = F.multi_head_attention_forward
    linear = F.linear
    softmaxes = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax,
                 torch._softmax, aten.softmax.int, aten._softmax.default}
    fused = _fused_attention_functions()

    def traced_sdpa(args, kwargs):
        """SDPA while Dynamo traces: one ``lowprec::sdpa`` node (lowprec.torch.ops)."""
        q, k, v, mask, dropout_p, is_causal, scale, gqa = bind_sdpa(args, kwargs)
        mask = materialize_mask(mask, q, k)
        float_mask = isinstance(mask, torch.Tensor) and mask.is_floating_point()
        _no_grad_check((q, k, v) + ((mask,) if float_mask else ()),
                       "scaled_dot_product_attention inputs")
        return torch.ops.lowprec.sdpa(q, k, v, mask, float(dropout_p), bool(is_causal),
                                      None if scale is None else float(scale), bool(gqa),
                                      ops.trace_site())

    def traced_attend(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
        return traced_sdpa((q, k, v), {"attn_mask": attn_mask, "dropout_p": dropout_p,
                                       "is_causal": is_causal})

    def traced(func, args, kwargs):
        """The mode while Dynamo traces: nothing of the context is read (the ops look it up
        when they run), so the graph holds for every context of this mode class."""
        if func is sdpa or func is aten_sdpa or func is aten_sdpa_default:
            return traced_sdpa(args, kwargs)
        if func is mha:
            from .mha import mha_forward

            return mha_forward(traced_attend, *args, **kwargs)
        if quant and func is linear:
            x, w, b = _bind_linear(args, kwargs)
            site = ops.trace_site()
            return linear(torch.ops.lowprec.linear_input(x, site),
                          torch.ops.lowprec.linear_weight(w, site), b)
        return func(*args, **kwargs)

    class EmulationMode(TorchFunctionMode):
        """Routes the attention calls of one :class:`Emulation`: SDPA (also as the aten op),
        ``F.multi_head_attention_forward``; F.linear for the weight hooks; counts softmax
        calls and fused torch attention functions (never emulated) for the exit warnings.
        While Dynamo traces: the custom ops of :mod:`lowprec.torch.ops` instead."""

        def __init__(self, run: Emulation):
            super().__init__()
            self.run = run

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if kwargs is None:
                kwargs = {}
            if torch.compiler.is_compiling():
                return traced(func, args, kwargs)
            run = self.run
            if func in sdpas:
                if run._innermost():
                    return run._sdpa(func, args, kwargs)
            elif func is mha:
                if run._innermost():
                    return run._mha(sdpa, args, kwargs)
            elif func is linear:
                if run.weights is not None:
                    return run._linear(func, args, kwargs)
            elif func in softmaxes:
                if run._innermost():
                    run._softmax_calls += 1
            elif func in fused and run._innermost():
                name = fused[func]
                run._escaped[name] = run._escaped.get(name, 0) + 1
            return func(*args, **kwargs)

    if quant:
        EmulationMode.__name__ = EmulationMode.__qualname__ = "EmulationQuantMode"
    ops.keep_eager(EmulationMode.__torch_function__, Emulation._pre, Emulation._post,
                   Emulation._auto_pre, Emulation._auto_post)
    _MODE_CLS[quant] = EmulationMode
    return EmulationMode


def _bind_linear(args, kwargs):
    """``(input, weight, bias)`` of an ``F.linear`` call."""
    vals = dict(zip(("input", "weight", "bias"), args, strict=False))
    vals.update(kwargs)
    return vals["input"], vals["weight"], vals.get("bias")


#: torch's private fused attention functions: under a TorchFunctionMode torch's own modules
#: never call them (their fast paths check for one), so only a direct call reaches them
FUSED_ATTENTION = (
    "_native_multi_head_attention", "_transformer_encoder_layer_fwd",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
    "_efficient_attention_forward", "_triton_multi_head_attention", "_triton_scaled_dot_attention",
)


def _fused_attention_functions() -> dict:
    """``{function: "torch.<name>"}`` of :data:`FUSED_ATTENTION` as the mode receives them:
    the ``torch.<name>`` builtins, the ``torch.ops.aten.<name>`` packets and their overloads."""
    import torch

    out = {}
    for name in FUSED_ATTENTION:
        fn = getattr(torch, name, None)
        if fn is not None:
            out[fn] = f"torch.{name}"
        try:
            packet = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):
            continue
        out[packet] = f"torch.ops.aten.{name}"
        for o in packet.overloads():
            out[getattr(packet, o)] = f"torch.ops.aten.{name}"
    return out


def emulate(scheme: str, *, model=None, reference: bool = False, activations: str | None = None,
            weights: str | None = None, include=None, exclude=None, quantize_options=None,
            empty_rows: str = "zero", hf_eager: bool = True, mask_cache: bool = True,
            **options) -> Emulation:
    """Context manager: inside it, torch SDPA calls (and ``nn.MultiheadAttention``, the
    ``nn.Transformer`` layers) run lowprec's emulated attention.

    Args:
        scheme: a name from :func:`lowprec.schemes` (``"baps"``, ``"intattention"``,
            ``"reference"``, ...) or a shorthand: ``"hif8"`` = ``("baps", config="e2e_hif8")``,
            ``"e4m3"`` / ``"e5m2"`` = BAPS ``exp2_e4m3`` / ``exp2_e5m2`` (design.md).
        model: module(s) whose submodules get attribution hooks: an ``nn.Module`` (a
            ``torch.compile`` wrapper stands for its model), a list of
            them (prefixed ``"0."``, ``"1."``... when more than one) or ``{prefix: module}``;
            more can be added with ``run.watch(m)``.  Needed for ``activations``/``weights``.
            Without it, calls are named from the outermost module called (torch's global
            module hooks, :mod:`lowprec.torch.naming`), which gives the same names for one
            model.  With ``torch.compile`` pass ``model=``: Dynamo guards the global hooks,
            so without it a compiled model recompiles in every new context.
        reference: also compute float32 SDPA for each call and record the SQNR (dB) of the
            emulated output against it (costs one extra attention per call).
        activations, weights: fake-quantize inputs / weights of the selected ``nn.Linear``
            modules to ``"hif8"``, ``"e4m3"`` or ``"e5m2"`` (:mod:`lowprec.torch.hooks`).
        include, exclude: fnmatch patterns on qualified names selecting those Linear modules
            (default: all, none excluded).
        quantize_options: keywords of :func:`lowprec.quantize` for the hooks (rounding,
            saturate (default True), seed, sr_bits).
        empty_rows: ``"zero"`` (like torch SDPA) or ``"nan"`` for query rows seeing no key.
        hf_eager: switch HuggingFace transformers models that use
            ``attn_implementation="eager"`` (among ``model=``, or without ``model=`` inside the
            top-level models the context meets) to the registered ``"lowprec"``
            implementation for the context's lifetime, so their attention is emulated too
            (restored on exit; see :mod:`lowprec.torch.hf`).  ``False`` leaves them alone
            (their attention then runs unemulated, and the exit warning says so).
        mask_cache: a boolean mask that equals the causal lower triangle runs as
            ``is_causal=True`` (the same bits and statistics, faster); the answer is read
            from the device once per mask buffer and reused while the tensor's memory
            (address, shape, strides) and version counter are unchanged, whichever tensor
            object holds it (``torch.compile`` hands one buffer to its graph segments as new
            objects).  A reused answer is checked again on the device without waiting, and
            the check is read with the deferred statistics: a buffer rewritten in place
            without a version bump (``torch.compile``'s generated code reuses buffers), or
            freed and reallocated with other contents, raises a RuntimeError there instead
            of passing unnoticed.  The answers last one forward: each outermost module call
            starts without them (a compiled model may write the next batch's padded mask
            into the same buffer).
            ``False`` reads the answer back in every call (one synchronisation per call).
        **options: options of the scheme (``config``, ``tau``, ``block_q``, ...).  The
            integer schemes take their int8 scales from the rows and keys a call's mask lets
            take part, per sequence (``scale_scope="visible"``, the default: a padded batch
            gives each sentence the bits it gets alone); ``scale_scope="tensor"`` gives the
            papers' whole-tensor scales, which padding content changes.

    Returns:
        An :class:`Emulation`; ``with emulate(...) as run`` gives it back, ``run.stats`` is an
        :class:`EmulationStats`.

    Raises:
        ValueError: unknown scheme or option (listing the valid ones), bad option values
            (checked with a tiny trial call at construction), bad formats; inside the context,
            ``dropout_p > 0``.
        RuntimeError: inside the context, inputs that require grad while grad is enabled;
            leaving the context from another thread than the one that entered it.

    Warns:
        UserWarning: once per context at the first hazard (``Stats.hazards``) of a call; on
            exit when no attention call was emulated although modules or softmax ran.

    Example::

        >>> with torch.no_grad(), emulate("hif8", tau=1) as run:
        ...     y = model(x)
        >>> print(run.stats.summary())   # per module of model: calls, ARR, PRR, counters
        >>> run.stats.restart_rate
    """
    return Emulation(scheme, model=model, reference=reference, activations=activations,
                     weights=weights, include=include, exclude=exclude,
                     quantize_options=quantize_options, empty_rows=empty_rows,
                     hf_eager=hf_eager, mask_cache=mask_cache, **options)


__all__ = ["emulate", "Emulation", "EmulationStats", "ModuleStats", "CallRecord",
           "SHORTHANDS", "UNKNOWN_MODULE", "ROOT_MODULE", "EMPTY_ROWS"]
