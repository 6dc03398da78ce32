"""``torch.compile`` inside :func:`lowprec.torch.emulate`: the custom ops and call sites.

Dynamo traces through the context's ``TorchFunctionMode``; traced as eager, the emulation
(NumPy, Numba) cannot be compiled (Dynamo died with a ``RecursionError`` inside llvmlite).
While Dynamo traces, the mode therefore answers attention (and, in a context that quantizes
``nn.Linear``, ``F.linear``'s operands) with the custom ops below, which Dynamo puts in the
graph as one opaque node each (their fake implementations give shapes and dtypes):

* ``lowprec::sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
  site) -> Tensor``: SDPA's arguments and a call *site* (below).  At run time it looks up the
  innermost active context of the calling thread and runs that context's eager SDPA path
  (:meth:`lowprec.torch.context.Emulation._sdpa`): same scheme, options, masks, empty rows,
  statistics, hazard warning, so the bits are those of the eager emulated model.  With no
  active context it computes torch's SDPA.
* ``lowprec::linear_input(x, site)`` / ``lowprec::linear_weight(w, site)``: the input and the
  weight of an ``F.linear`` call, fake-quantized when the innermost active context selects
  the ``nn.Linear`` of the site (``activations=`` / ``weights=``), else copied.

Nothing of a context is baked into a compiled graph: the scheme, its options, the statistics
object and the module names are looked up when the op runs, so a model compiled inside one
context reports to any later one.  The graph only depends on the *type* of the modes on
torch's function-mode stack, which Dynamo guards: outside every context the compiled model
is retraced into plain torch (SDPA and Linear ops untouched), and a context that quantizes
Linear modules uses a mode class of its own, so a graph traced with (or without) the Linear
ops is never reused by a context of the other kind.

Call sites.  Module hooks do not run inside a compiled graph (Dynamo traces them; the
context's hooks do nothing while tracing), so the module that makes a call is found while
tracing: :func:`trace_site` (run by Dynamo at trace time, ``torch.compiler.
assume_constant_result``) reads Dynamo's stack of the modules being traced
(``nn_module_stack``: source names such as ``L['self'].blocks.0.attn``), resolves each
name to its module from the traced frame's locals and globals, and records them (weak
references, and each one's path from the frame's own module) under a small integer that
is baked into the graph.  At run time :meth:`Emulation._site_name` turns a site into the
context's name for it.  This reads a private Dynamo structure; if it is not there (another
torch version) the site holds no module and calls are named after the innermost module
running outside the graph (the compiled model itself, ``"<root>"``), as documented in
docs/design.md ("torch.compile").
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Optional

import torch

_LOCK = threading.Lock()
_SITES: list = []  # site index -> Site
_SITE_INDEX: dict = {}  # Site.key -> index (a site met again by a retrace keeps its number)
NO_SITE = -1  # a call traced where no module could be resolved

_BASE = re.compile(r"([LG])\[(['\"])(.*?)\2\]")
_STEP = re.compile(r"\.(\w+)|\[(['\"])(.*?)\2\]|\[(-?\d+)\]")


class Site:
    """The modules around one traced call.

    Attributes:
        root: weak reference to the traced frame's own module (its ``self``), or None when the
            frame is not a module's method.
        root_type: ``type`` of that module (None without one).
        entries: ``(weakref to module, path from root or None)`` for the modules Dynamo was
            inside at the call, outermost first (path ``""`` for the root itself, None for a
            module not reached from the root, e.g. a global model called by a function).
    """

    __slots__ = ("root", "root_type", "entries", "key")

    def __init__(self, root, entries):
        self.root = None if root is None else weakref.ref(root)
        self.root_type = None if root is None else type(root)
        self.entries = tuple((weakref.ref(m), rel) for m, rel in entries)
        self.key = (id(root), tuple((id(m), rel) for m, rel in entries))

    def alive(self) -> bool:
        return (self.root is None or self.root() is not None) and \
            all(r() is not None for r, _ in self.entries)

    def modules(self) -> list:
        """``(module, path)`` of the live entries, innermost first."""
        out = []
        for ref, rel in reversed(self.entries):
            m = ref()
            if m is not None:
                out.append((m, rel))
        return out


def site(index: int) -> Site | None:
    """The :class:`Site` of a baked site number (None for :data:`NO_SITE` or unknown)."""
    if 0 <= index < len(_SITES):
        return _SITES[index]
    return None


def _walk(obj, path: str):
    """Follow ``.name`` / ``['key']`` / ``[i]`` steps from ``obj``; returns (object, qualified
    path of the module names crossed) or raises LookupError."""
    names = []
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            raise LookupError(path)
        pos = m.end()
        if m.group(1) is not None:
            name = m.group(1)
            if name == "_modules":  # Dynamo's ._modules['x'] when not normalized
                obj = obj._modules
                continue
            obj = getattr(obj, name)
            names.append(name)
        elif m.group(3) is not None:
            obj = obj[m.group(3)]
            names.append(m.group(3))
        else:
            i = int(m.group(4))
            n = len(obj)
            obj = obj[i]
            names.append(str(i % n if n else i))
    return obj, ".".join(names)


def _frame_root(tx):
    """The traced frame's module: its first argument (or ``self``) when it is an nn.Module."""
    code = getattr(tx, "f_code", None)
    f_locals = getattr(tx, "f_locals", None) or {}
    cands = []
    if code is not None and code.co_argcount:
        cands.append(code.co_varnames[0])
    cands.append("self")
    for name in cands:
        obj = f_locals.get(name)
        if isinstance(obj, torch.nn.Module):
            return name, obj
    return None, None


def _current_site() -> int:
    from torch._dynamo.symbolic_convert import InstructionTranslator

    root_tx = InstructionTranslator.current_tx()
    tx = root_tx.output.current_tx  # the innermost inlining translator
    stack = list(getattr(tx, "nn_module_stack", {}).values())
    local_name, root = _frame_root(root_tx)
    scopes = {"L": root_tx.f_locals, "G": root_tx.f_globals}
    entries = [] if root is None else [(root, "")]
    for name, _cls in stack:
        base = _BASE.match(name)
        if base is None:
            continue
        try:
            obj = scopes[base.group(1)][base.group(3)]
            mod, rel = _walk(obj, name[base.end():])
        except (LookupError, AttributeError, TypeError, ValueError):
            continue
        if not isinstance(mod, torch.nn.Module):
            continue
        under_root = base.group(1) == "L" and base.group(3) == local_name
        if entries and entries[-1][0] is mod:
            continue
        entries.append((mod, rel if under_root else None))
    new = Site(root, entries)
    with _LOCK:
        index = _SITE_INDEX.get(new.key)
        if index is not None and _SITES[index].alive():
            return index
        _SITES.append(new)
        _SITE_INDEX[new.key] = len(_SITES) - 1
        return len(_SITES) - 1


@torch.compiler.assume_constant_result
def trace_site() -> int:
    """The site number of the call being traced (run by Dynamo while tracing; the number is a
    constant of the graph).  :data:`NO_SITE` when Dynamo's module stack cannot be read."""
    try:
        return _current_site()
    except Exception:  # noqa: BLE001 - a private Dynamo structure: never break the trace
        return NO_SITE


def keep_eager(*functions) -> bool:
    """Tell Dynamo to run the frames of ``functions`` (and everything they call) uncompiled
    when they are called *outside* a traced graph (module hooks called by eager code inside a
    ``torch.compile`` region: the compiled model's own hooks, a module Dynamo falls back to
    eager for).  Inlined into a graph they are still traced (where they see
    ``torch.compiler.is_compiling()`` and do nothing).  Private Dynamo API
    (``set_code_exec_strategy``); returns False when it is missing (the frames are then
    compiled, so their hooks do nothing there; docs/design.md "torch.compile").
    """
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # pragma: no cover - another torch version
        return False
    for fn in functions:
        set_code_exec_strategy(getattr(fn, "__func__", fn).__code__,
                               FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    return True


def _innermost():
    from .context import _active_stack

    st = _active_stack()
    return st[-1] if st else None


# --------------------------------------------------------------------------------------------
# lowprec::sdpa


def _sdpa_shape(query, key, value, enable_gqa):
    qs, ks, vs = list(query.shape[:-2]), list(key.shape[:-2]), list(value.shape[:-2])
    if enable_gqa and qs and ks and vs:
        ks[-1] = vs[-1] = qs[-1]
    lead = torch.broadcast_shapes(tuple(qs), tuple(ks), tuple(vs))
    return tuple(lead) + (query.shape[-2], value.shape[-1])


@torch.library.custom_op("lowprec::sdpa", mutates_args=())
def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attn_mask: Optional[torch.Tensor], dropout_p: float, is_causal: bool,  # noqa: UP045
         scale: Optional[float], enable_gqa: bool, site: int) -> torch.Tensor:  # noqa: UP045
    """``F.scaled_dot_product_attention`` emulated by the innermost active
    :func:`~lowprec.torch.emulate` context of the calling thread (torch's SDPA when there is
    none); ``site`` names the calling module (:func:`trace_site`).  Output contiguous, a new
    tensor."""
    import torch.nn.functional as F

    kwargs = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal,
              "scale": scale, "enable_gqa": enable_gqa}
    ctx = _innermost()
    with torch._C.DisableTorchFunction():  # no mode may see the calls made here
        if ctx is None:
            out = F.scaled_dot_product_attention(query, key, value, **kwargs)
        else:
            out = ctx._sdpa(F.scaled_dot_product_attention, (query, key, value), kwargs,
                            module=ctx._site_name(site))
        shape = _sdpa_shape(query, key, value, enable_gqa)
        if tuple(out.shape) != shape:  # the fake implementation promised this shape
            out = out.expand(shape)
        return out.contiguous()


@sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, site):
    return query.new_empty(_sdpa_shape(query, key, value, enable_gqa))


# --------------------------------------------------------------------------------------------
# lowprec::linear_input, lowprec::linear_weight


@torch.library.custom_op("lowprec::linear_input", mutates_args=())
def linear_input(x: torch.Tensor, site: int) -> torch.Tensor:
    """The input of ``F.linear`` at ``site``: fake-quantized when the innermost active context
    quantizes the activations of that ``nn.Linear`` (a copy otherwise)."""
    ctx = _innermost()
    with torch._C.DisableTorchFunction():
        out = None if ctx is None else ctx._site_linear_input(x, site)
        return x.clone(memory_format=torch.contiguous_format) if out is None else \
            out.contiguous()


@linear_input.register_fake
def _linear_input_fake(x, site):
    return x.new_empty(x.shape)


@torch.library.custom_op("lowprec::linear_weight", mutates_args=())
def linear_weight(w: torch.Tensor, site: int) -> torch.Tensor:
    """The weight of ``F.linear`` at ``site``: the quantized copy of the ``nn.Linear``'s
    weight when the innermost active context quantizes it (a copy of ``w`` otherwise)."""
    ctx = _innermost()
    with torch._C.DisableTorchFunction():
        out = None if ctx is None else ctx._site_linear_weight(w, site)
        return (w if out is None else out).clone(memory_format=torch.contiguous_format)


@linear_weight.register_fake
def _linear_weight_fake(w, site):
    return w.new_empty(w.shape)


__all__ = ["sdpa", "linear_input", "linear_weight", "trace_site", "site", "Site", "NO_SITE",
           "keep_eager"]
