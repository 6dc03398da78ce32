"""Qualified module names for :func:`lowprec.torch.emulate` contexts without ``model=``.

A context given ``model=`` names each attention call after the innermost running module of the
watched models (per-module hooks, :mod:`lowprec.torch.context`).  Without ``model=`` the
context installs torch's *global* module hooks for its lifetime
(``torch.nn.modules.module.register_module_forward_pre_hook`` and
``register_module_forward_hook(always_call=True)``, acting only in the thread that entered)
and names modules with :class:`AutoNames`:

* The outermost module called (no module of the context's thread running) is a *top-level
  model*; its submodules get their qualified names from its ``named_modules()`` (computed once
  per model and cached for the context's lifetime), the model itself is ``"<root>"``.  So
  ``with lp.emulate("flash"): model(x)`` names calls exactly as ``model=model`` does.
* A module already named (a submodule of a model met before, e.g. ``model.encoder`` called on
  its own) keeps its name.
* A later top-level model that contains an earlier one (``model.generate`` calling an
  embedding before the whole model, say) takes its place: the earlier names become the larger
  model's qualified names, and statistics already recorded under them are renamed
  (:meth:`AutoNames.meet` returns the renames).
* Any other later top-level model is prefixed with its class name (``"Decoder.layers.0"``;
  ``"Decoder#2"`` for a second one of the same class), so two models never share a name.
* A module not named yet is first looked up again in the models met (it may have been added
  to one since its names were computed); a module that is still not found (one held in a
  plain list, say, and not registered) counts as a top-level model of its own, prefixed as
  above, even when it runs inside another model.

Shared modules keep the first name ``named_modules()`` gives them, as with ``model=``.
"""

from __future__ import annotations

ROOT_MODULE = "<root>"  # the name of a top-level model itself (torch's qualified name "")


def _join(prefix: str, name: str) -> str:
    return ".".join(x for x in (prefix, name) if x) or ROOT_MODULE


class AutoNames:
    """Module -> qualified name for the modules one context meets (see the module docstring).

    Attributes:
        roots: the top-level models met, as ``[module, prefix]`` in order (the first one,
            prefix ``""``, is the primary model).

    Example::

        >>> names = AutoNames()
        >>> names.meet(model)
        ('<root>', {})
        >>> names.meet(model.encoder.layer[0])
        ('encoder.layer.0', {})
    """

    def __init__(self):
        self.roots: list[list] = []
        self._index: dict[int, tuple[str, object]] = {}  # id(module) -> (name, root module)
        self._keep: list = []  # every module indexed (ids stay valid while the context lives)

    def meet(self, module) -> tuple[str, dict]:
        """The qualified name of ``module``, about to run (see the module docstring).

        Returns:
            ``(name, renames)``: ``renames`` maps names given before to the names that replace
            them (non-empty only when a new top-level model contains earlier ones).
        """
        hit = self._index.get(id(module))
        if hit is not None:
            return hit[0], {}
        for root, prefix in self.roots:  # added to a model since its names were computed?
            self._add_tree(root, prefix)
        hit = self._index.get(id(module))
        if hit is not None:
            return hit[0], {}
        return self._new_root(module)

    def root_of(self, module):
        """The top-level model ``module`` was named under (None if never met)."""
        hit = self._index.get(id(module))
        return None if hit is None else hit[1]

    def clear(self) -> None:
        """Forget every module (at the context's exit)."""
        self.roots.clear()
        self._index.clear()
        self._keep.clear()

    # ---- internals -----------------------------------------------------------------------
    def _new_root(self, module) -> tuple[str, dict]:
        tree = {id(m): (n, m) for n, m in module.named_modules()}
        absorbed = [r for r in self.roots if id(r[0]) in tree]
        primary = not self.roots or bool(absorbed and absorbed[0] is self.roots[0])
        self.roots = [r for r in self.roots if not any(r is a for a in absorbed)]
        if primary:
            prefix = ""
            self.roots.insert(0, [module, prefix])
        else:
            prefix = self._class_prefix(module)
            self.roots.append([module, prefix])
        absorbed_ids = {id(a[0]) for a in absorbed}
        renames = {}
        for key, (name, m) in tree.items():
            new = _join(prefix, name)
            old = self._index.get(key)
            if old is not None and id(old[1]) in absorbed_ids and old[0] != new:
                renames[old[0]] = new
            if old is None or id(old[1]) in absorbed_ids:
                self._index[key] = (new, module)
                self._keep.append(m)
        return self._index[id(module)][0], renames

    def _add_tree(self, root, prefix: str) -> None:
        for name, m in root.named_modules():
            if id(m) not in self._index:
                self._index[id(m)] = (_join(prefix, name), root)
                self._keep.append(m)

    def _class_prefix(self, module) -> str:
        base = type(module).__name__
        used = {p for _, p in self.roots}
        if base not in used:
            return base
        n = 2
        while f"{base}#{n}" in used:
            n += 1
        return f"{base}#{n}"


__all__ = ["AutoNames", "ROOT_MODULE"]
