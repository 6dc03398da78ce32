"""Studies on real pretrained models (issue 5): MiniLM embeddings, SmolLM2 perplexity, BAPS
restart rates and HCCS calibration on real attention logits.

The models are loaded offline by :func:`lowprec.torch.models.load_model` (kept per process);
the texts are :func:`lowprec.torch.models.eval_text` (*Alice's Adventures in Wonderland*, public
domain, about 39,000 SmolLM2 tokens: perplexity and restarts) and
:func:`lowprec.torch.models.sample_text` (original prose, CC0: MiniLM sentences).  Every
emulated run goes through :func:`lowprec.torch.emulate`, which answers the models' torch SDPA
calls (``attn_implementation="sdpa"``) with the chosen scheme; all other operations stay float32.

* :func:`minilm_cosine`: all-MiniLM-L6-v2 sentence embeddings (mean pooling) under each scheme
  against float32: cosine similarity per sentence, plus the per-module statistics of the 6
  attention modules (``encoder.layer.<i>.attention.self``).  The sentences are padded to one
  batch, so the masked (padding) path of every scheme is exercised.  With the default BAPS tiles
  of 128 x 128 a sentence (< 128 tokens) is one key tile, the critical one, so BAPS never
  restarts there; the configuration with 16 x 16 tiles shows restarts on the same model.
* :func:`smollm2_perplexity`: perplexity over several windows of ``max_tokens`` tokens (512 to
  8192) for float32 and each scheme, the ratio to float32 with a paired bootstrap interval over
  windows, and which runs are within noise (the interval contains 1).
* :func:`smollm2_restart_rates`: BAPS ``e2e_hif8`` restart rates of SmolLM2 per layer and per
  head for several ``tau``: ARR, PRR and the restarted share of all tiles beside the paper's
  Table 4, plus the per-call and per-(call, head) rate lists (for a histogram).  Defaults:
  2048 tokens, 128 x 128 tiles, critical set ``first+diagonal`` (136 causal tiles per head, of
  which 105 are non-critical).
* :func:`hccs_minilm_kl`: HCCS parameters calibrated per (layer, head) on MiniLM's real attention
  logits (captured from its SDPA calls: ``q k^T * scale`` plus the padding mask), KL before
  retraining on held-out sentences, next to the int8-logit floor (HCCS paper section V-C).

torch and transformers are imported inside the functions; ``import lowprec.studies.models``
stays light.  ``format_*`` functions turn each result into a printable table.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import time

import numpy as np

#: Study configurations: label -> (scheme, options).  BAPS variants first, then one entry per
#: attention scheme of ``lp.schemes()`` with its default options (see :func:`default_schemes`).
BAPS_CONFIGS = {
    "baps e2e_hif8 tau=1": ("baps", {"config": "e2e_hif8", "tau": 1}),
    "baps e2e_hif8 tau=0": ("baps", {"config": "e2e_hif8", "tau": 0}),
    "baps e2e_hif8 tau=2": ("baps", {"config": "e2e_hif8", "tau": 2}),
    "baps e2e_hif8 tau=1 16x16": ("baps", {"config": "e2e_hif8", "tau": 1, "block_q": 16,
                                           "block_k": 16}),
    "baps exp2_hif8": ("baps", {"config": "exp2_hif8"}),
    "baps exp2_e4m3": ("baps", {"config": "exp2_e4m3"}),
    "baps exp2_e5m2": ("baps", {"config": "exp2_e5m2"}),
    "baps naive_e2e": ("baps", {"config": "naive_e2e"}),
}
EXTRA_CONFIGS = {"hccs dequant=rowsum": ("hccs", {"dequant": "rowsum"})}
QUICK_SCHEMES = ("baps e2e_hif8 tau=1", "intattention", "flash")
# left out of the default perplexity run to keep it short: the restart study covers tau, and
# float64 ``reference`` attention gives float32's perplexity at the cost of the slowest scheme
SMOLLM2_SKIP = ("baps e2e_hif8 tau=0", "baps e2e_hif8 tau=2", "baps e2e_hif8 tau=1 16x16",
                "baps naive_e2e", "reference")
MINILM_SENTENCES = 16
SMOLLM2_TOKENS = 512  # perplexity window (tokens)
PPL_WINDOWS = 8  # perplexity windows (the text holds 76 of 512 tokens)
PPL_LENGTHS = (512, 2048, 4096, 8192)  # the full perplexity study (issue 16 item 1)
BOOTSTRAP = 2000  # bootstrap draws of the perplexity-ratio interval
MIN_WINDOWS = 8  # fewer windows than this: resample="auto" bootstraps over segments
AUTO_UNITS = 16  # resample="auto" with few windows: about this many segments in all
CONFIDENCE = 0.95
RESTART_TOKENS = 2048
RESTART_BLOCK = 128
RESTART_CRITICAL = "first+diagonal"  # see smollm2_restart_rates
HCCS_SENTENCES = (8, 8)  # calibration, evaluation
KL_EPS = 1e-6  # probability floor of the KL (as lowprec.studies.hccs)


def default_schemes() -> dict:
    """``{label: (scheme, options)}``: the BAPS variants of :data:`BAPS_CONFIGS`, then every
    attention scheme of :func:`lowprec.schemes` (except ``baps``) with default options, then
    :data:`EXTRA_CONFIGS`."""
    from .. import schemes

    out = dict(BAPS_CONFIGS)
    for name in schemes():
        if name != "baps":
            out[name] = (name, {})
    out.update(EXTRA_CONFIGS)
    return out


def _resolve(schemes) -> dict:
    """Normalise ``schemes`` (None, a label/scheme name, a list of them, or a dict
    label -> (scheme, options)) to ``{label: (scheme, options)}``."""
    known = default_schemes()
    if schemes is None:
        return known
    if isinstance(schemes, dict):
        out = {}
        for label, val in schemes.items():
            if not (isinstance(val, tuple) and len(val) == 2 and isinstance(val[0], str)
                    and isinstance(val[1], dict)):
                raise TypeError(f"schemes[{label!r}] must be a (scheme, options dict) tuple")
            out[str(label)] = val
        return out
    if isinstance(schemes, str):
        schemes = [schemes]
    out = {}
    for s in schemes:
        if s not in known:
            raise ValueError(f"scheme {s!r} is not one of {', '.join(known)} (or pass a dict "
                             "label -> (scheme, options))")
        out[s] = known[s]
    return out


def sentences_of(text: str | None = None, count: int | None = None) -> list[str]:
    """Sentences of ``text`` (default: the shipped sample text), at most ``count``."""
    from ..torch.models import sample_text

    text = sample_text() if text is None else text
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+", " ".join(text.split()))]
    parts = [p for p in parts if len(p) > 1]
    return parts if count is None else parts[:count]


def _module_table(run) -> dict:
    """``{module: {calls, restart_rate, peak_restart_rate, sqnr_db_mean, sqnr_db_min}}`` for
    the modules that made attention calls."""
    out = {}
    for name, m in run.stats.modules.items():
        if m.calls:
            out[name] = {"calls": m.calls, "restart_rate": m.restart_rate,
                         "peak_restart_rate": m.peak_restart_rate,
                         "sqnr_db_mean": m.sqnr_db_mean, "sqnr_db_min": m.sqnr_db_min,
                         "seconds": m.seconds}
    return out


def _error(e: Exception) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}"[:300]


# ------------------------------------------------------------------------------------------
# MiniLM embeddings


def minilm_cosine(schemes=None, *, sentences=None, quick: bool = False,
                  reference: bool = True) -> dict:
    """Cosine similarity of MiniLM sentence embeddings under each scheme against float32.

    Args:
        schemes: None (every configuration of :func:`default_schemes`), labels of it, or a
            dict ``{label: (scheme, options)}``.
        sentences: list of strings (default: the first 16 sentences of the sample text, 4
            with ``quick``); they are padded to one batch.
        quick: 4 sentences and only :data:`QUICK_SCHEMES` (when ``schemes`` is None).
        reference: record each attention call's SQNR against float32 SDPA (``emulate``'s
            ``reference=True``).

    Returns:
        ``{"model", "sentences", "tokens", "schemes": {label: {"scheme", "options",
        "cos_min", "cos_mean", "cos": [...], "restart_rate", "peak_restart_rate",
        "sqnr_db_mean", "modules": {module: {...}}, "seconds"} or {"error": str}}}``.
        A scheme that raises is recorded with its error, the others still run.

    Example::

        >>> res = minilm_cosine(["baps e2e_hif8 tau=1"], quick=True)
        >>> res["schemes"]["baps e2e_hif8 tau=1"]["cos_min"] > 0.98
        True
    """
    if schemes is None and quick:
        schemes = list(QUICK_SCHEMES)
    cfg = _resolve(schemes)
    sents = minilm_sentences(sentences, quick)
    return minilm_cosine_result(sents, {label: minilm_cosine_run(scheme, opts, sents,
                                                                 reference=reference)
                                        for label, (scheme, opts) in cfg.items()})


def minilm_sentences(sentences=None, quick: bool = False) -> list[str]:
    """The sentences of :func:`minilm_cosine`: ``sentences``, else the first 16 (``quick``: 4)
    of the sample text."""
    return list(sentences) if sentences is not None else \
        sentences_of(count=4 if quick else MINILM_SENTENCES)


@functools.lru_cache(maxsize=4)
def _minilm_setup(sentences: tuple):
    """``(model, batch, float32 embeddings, header)`` of one padded batch (once per process:
    every scheme of :func:`minilm_cosine` compares with the same float32 run)."""
    import torch

    from ..torch.models import load_model, mean_pool

    model, tok = load_model("minilm")
    batch = tok(list(sentences), return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    header = {"model": "minilm", "sentences": len(sentences),
              "tokens": int(batch["input_ids"].shape[1]),
              "real_tokens": int(batch["attention_mask"].sum())}
    return model, batch, ref, header


def minilm_cosine_run(scheme: str, opts: dict, sentences, *, reference: bool = True) -> dict:
    """One scheme of :func:`minilm_cosine` (a unit of ``lowprec study``): ``{"header": the
    result's batch description, "row": the scheme's row}``."""
    import torch

    from ..torch import emulate
    from ..torch.models import mean_pool

    model, batch, ref, header = _minilm_setup(tuple(sentences))
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), emulate(scheme, model=model, reference=reference,
                                      **opts) as run:
            emb = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"header": header, "row": {"scheme": scheme, "options": opts,
                                          "error": _error(e)}}
    cos = torch.nn.functional.cosine_similarity(emb.double(), ref.double(), dim=-1)
    tot = run.stats.total()
    return {"header": header, "row": {
        "scheme": scheme, "options": opts, "cos": cos.tolist(),
        "cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
        "restart_rate": tot.restart_rate, "peak_restart_rate": tot.peak_restart_rate,
        "sqnr_db_mean": tot.sqnr_db_mean, "modules": _module_table(run),
        "emulation_seconds": tot.seconds, "seconds": time.perf_counter() - t0}}


def minilm_cosine_result(sentences, runs: dict) -> dict:
    """:func:`minilm_cosine`'s result from ``{label: minilm_cosine_run(...)}``."""
    header = next(iter(runs.values()))["header"] if runs else \
        _minilm_setup(tuple(sentences))[3]
    return {**header, "schemes": {label: r["row"] for label, r in runs.items()}}


def _f(v, spec: str, width: int) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-".rjust(width)
    return format(v, spec).rjust(width)


def format_minilm_cosine(res: dict) -> str:
    """Table of :func:`minilm_cosine`: cosine min/mean, ARR/PRR, mean SQNR, modules, time."""
    rows = res["schemes"]
    w = max([len(k) for k in rows] + [6])
    lines = [f"MiniLM (all-MiniLM-L6-v2) mean-pooled embeddings vs float32: {res['sentences']} "
             f"sentences, padded to {res['tokens']} tokens ({res['real_tokens']} real)",
             f"{'scheme':{w}}  {'cos min':>9} {'cos mean':>9} {'ARR':>7} {'PRR':>7} "
             f"{'SQNR dB':>8} {'modules':>7} {'time s':>7}"]
    for label, r in rows.items():
        if "error" in r:
            lines.append(f"{label:{w}}  FAILED: {r['error']}")
            continue
        lines.append(f"{label:{w}}  {r['cos_min']:9.6f} {r['cos_mean']:9.6f} "
                     f"{_f(r['restart_rate'], '.4f', 7)} {_f(r['peak_restart_rate'], '.4f', 7)} "
                     f"{_f(r['sqnr_db_mean'], '.1f', 8)} {len(r['modules']):7d} "
                     f"{r['seconds']:7.2f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# SmolLM2 perplexity


def _token_ids(tok, text: str | None, max_tokens: int):
    """The first ``max_tokens`` token ids ``(1, n)`` of ``text`` (default: the evaluation text,
    :func:`lowprec.torch.models.eval_text`)."""
    from ..torch.models import eval_text

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f"max_tokens must be an int >= 2, got {max_tokens!r}")
    text = eval_text() if text is None else text
    ids = tok(text, return_tensors="pt")["input_ids"][:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError("the text gives fewer than 2 tokens")
    return ids


def token_windows(tok, text: str | None = None, length: int = SMOLLM2_TOKENS,
                  windows: int | None = PPL_WINDOWS) -> list:
    """Consecutive non-overlapping windows of ``length`` tokens from the start of ``text``.

    Args:
        tok: the model's tokenizer.
        text: the text (default :func:`lowprec.torch.models.eval_text`, about 39,000 SmolLM2
            tokens).
        length: tokens per window (>= 2).
        windows: how many (None: every full window of the text).

    Returns:
        A list of ``(1, length)`` int64 tensors.

    Raises:
        ValueError: ``length`` < 2, or the text holds fewer than ``windows`` full windows (the
            message says how many it holds).
    """
    from ..torch.models import eval_text

    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int >= 2, got {length!r}")
    text = eval_text() if text is None else text
    ids = tok(text, return_tensors="pt")["input_ids"]
    have = int(ids.shape[1]) // length
    want = have if windows is None else windows
    if isinstance(want, bool) or not isinstance(want, int) or want < 1 or want > have:
        raise ValueError(f"windows must be an int in [1, {have}] for windows of {length} tokens "
                         f"of this text ({int(ids.shape[1])} tokens), got {windows!r}")
    return [ids[:, i * length:(i + 1) * length] for i in range(want)]


LONG_CONTEXT = ("interpolate", "extrapolate")
TRAINED = 8192  # SmolLM2-135M's max_position_embeddings (only for the tables' notes)


def _smollm2(device=None):
    """SmolLM2-135M and its tokenizer (:func:`lowprec.torch.models.load_model`'s cached copy),
    moved to ``device`` (None: where it is; the cached copy moves, so one process uses one
    device)."""
    from ..torch.models import load_model

    model, tok = load_model("smollm2")
    if device is not None:
        model.to(device)
    return model, tok


def _check_long_context(long_context: str) -> None:
    if long_context not in LONG_CONTEXT:
        raise ValueError(f"long_context must be one of {LONG_CONTEXT}, got {long_context!r}")


def rope_factor(model, tokens: int, long_context: str = "interpolate") -> float:
    """The factor :func:`long_context_rope` divides the rotary frequencies by:
    ``tokens / max_position_embeddings`` beyond the trained length with ``"interpolate"``,
    otherwise 1.0.  Raises ValueError for an unknown ``long_context``."""
    _check_long_context(long_context)
    trained = int(model.config.max_position_embeddings)
    if long_context == "extrapolate" or tokens <= trained:
        return 1.0
    return tokens / trained


@contextlib.contextmanager
def long_context_rope(model, tokens: int, long_context: str = "interpolate"):
    """Within the context, a Llama-type ``model`` reads windows of ``tokens`` tokens beyond its
    trained length (``config.max_position_embeddings``, 8192 for SmolLM2) as ``long_context``
    says.

    * ``"interpolate"`` (default): linear RoPE position interpolation (Chen et al., 2023,
      "Extending context window of large language models via positional interpolation"),
      without fine-tuning: the rotary inverse frequencies are divided by ``tokens /
      max_position_embeddings``, so every position of the window falls inside the trained
      range (transformers' ``rope_type="linear"`` does the same division).  Relative distances
      shrink by that factor: the model sees a compressed text, not one it was trained on.
    * ``"extrapolate"``: positions as they are (beyond the trained range).

    Windows within the trained length are left alone either way.  The frequencies are restored
    on exit.

    Args:
        model: a transformers causal LM whose decoder holds ``rotary_emb.inv_freq``.
        tokens: the window length.
        long_context: ``"interpolate"`` or ``"extrapolate"``.

    Yields:
        The factor applied (1.0 when nothing changed).

    Raises:
        ValueError: unknown ``long_context``.
    """
    factor = rope_factor(model, tokens, long_context)
    if factor == 1.0:
        yield 1.0
        return
    rot = model.model.rotary_emb
    saved = rot.inv_freq.clone()
    rot.inv_freq.div_(factor)
    try:
        yield factor
    finally:
        rot.inv_freq.copy_(saved)


@contextlib.contextmanager
def _sdpa_without_gqa(device):
    """On a CUDA device, torch's SDPA calls with ``enable_gqa=True`` run with the key/value heads
    repeated instead (the same attention; transformers' own ``repeat_kv`` route): in float32,
    torch serves ``enable_gqa`` with its math backend only, whose ``(heads, L, L)`` scores need
    36 GiB for SmolLM2 at 32k tokens, while the memory-efficient kernel takes the repeated
    heads in O(L).  Elsewhere nothing changes."""
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class RepeatKV(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is F.scaled_dot_product_attention and kwargs.get("enable_gqa"):
                q, k, v, *rest = args
                rep = q.shape[-3] // k.shape[-3]
                k, v = (t.repeat_interleave(rep, dim=-3) for t in (k, v))
                kwargs["enable_gqa"] = False
                return func(q, k, v, *rest, **kwargs)
            return func(*args, **kwargs)

    with RepeatKV():
        yield


def _token_nll(model, ids, chunk: int = 512) -> np.ndarray:
    """Next-token negative log-likelihoods ``(n - 1,)`` (float64) of one causal window, computed
    on the model's device.

    The decoder runs once; the LM head and the cross-entropy run on ``chunk`` positions at a
    time, so an 8k-token window never holds its full ``(n, vocabulary)`` logits."""
    import torch
    import torch.nn.functional as F

    ids = ids.to(model.lm_head.weight.device)
    h = model.model(input_ids=ids).last_hidden_state[0]
    target = ids[0, 1:]
    out = []
    for a in range(0, target.shape[0], chunk):
        logits = model.lm_head(h[a:a + chunk][: target.shape[0] - a]).float()
        out.append(F.cross_entropy(logits, target[a:a + chunk], reduction="none"))
    return torch.cat(out).double().cpu().numpy()


def resample_unit(windows: int, scored: int, resample="auto"):
    """The bootstrap unit that ``resample`` means for ``windows`` windows of ``scored`` scored
    tokens each: ``"window"`` stays, an int stays, and ``"auto"`` is ``"window"`` from
    :data:`MIN_WINDOWS` windows on, else segments of ``ceil(windows * scored / 16)`` tokens
    (about :data:`AUTO_UNITS` units; at least 8 tokens each).

    Example:
        >>> resample_unit(8, 511), resample_unit(2, 63), resample_unit(4, 8191)
        ('window', 8, 2048)
    """
    if resample != "auto":
        return resample
    if windows >= MIN_WINDOWS:
        return "window"
    return max(8, math.ceil(windows * scored / AUTO_UNITS))


def _units(nll: list, resample) -> np.ndarray:
    """Per resampling unit ``[nll sum, tokens]``: one unit per window (``resample="window"``)
    or per consecutive segment of ``resample`` scored tokens within each window."""
    rows = []
    for w in nll:
        if resample == "window":
            rows.append((w.sum(), w.size))
        else:
            rows += [(w[a:a + resample].sum(), w[a:a + resample].size)
                     for a in range(0, w.size, resample)]
    return np.asarray(rows, dtype=np.float64)


def bootstrap_ratio(nll, nll_ref, *, resample="window", samples: int = BOOTSTRAP,
                    confidence: float = CONFIDENCE, seed: int = 0) -> dict:
    """Perplexity ratio ``ppl / ppl_ref`` with a paired percentile bootstrap interval.

    Perplexity is ``exp(sum nll / tokens)``.  The resampling unit is a window (or a segment of
    ``resample`` tokens); the same units are drawn for both runs (paired), so the interval
    measures how much the ratio depends on which text was read, not the text's difficulty.

    Args:
        nll, nll_ref: per-window arrays of per-token negative log-likelihoods (same shapes).
        resample: ``"window"`` or a segment length in tokens (int >= 1).
        samples: bootstrap draws (fixed ``seed``).
        confidence: interval coverage (two-sided, percentile).
        seed: random seed of the draws.

    Returns:
        ``{"ratio", "lo", "hi", "units", "ppl", "ppl_ref", "ref_lo", "ref_hi"}``; with one
        unit the interval is ``[ratio, ratio]`` (nothing to resample).

    Raises:
        ValueError: mismatched windows or a bad ``resample``.

    Example:
        >>> a = [np.full(10, 1.0), np.full(10, 1.2)]
        >>> r = bootstrap_ratio(a, a)
        >>> r["ratio"], r["lo"], r["hi"]
        (1.0, 1.0, 1.0)
    """
    if resample != "window" and (isinstance(resample, bool) or not isinstance(resample, int)
                                 or resample < 1):
        raise ValueError(f"resample must be 'window' or a segment length >= 1, got {resample!r}")
    if len(nll) != len(nll_ref) or any(np.shape(a) != np.shape(b)
                                       for a, b in zip(nll, nll_ref, strict=True)):
        raise ValueError("nll and nll_ref must have the same windows")
    u, ur = _units([np.asarray(a, np.float64) for a in nll], resample), \
        _units([np.asarray(a, np.float64) for a in nll_ref], resample)
    n = u.shape[0]
    tokens = u[:, 1].sum()
    ratio = math.exp((u[:, 0].sum() - ur[:, 0].sum()) / tokens)
    ppl, ppl_ref = math.exp(u[:, 0].sum() / tokens), math.exp(ur[:, 0].sum() / tokens)
    if n < 2:
        return {"ratio": ratio, "lo": ratio, "hi": ratio, "units": n, "ppl": ppl,
                "ppl_ref": ppl_ref, "ref_lo": ppl_ref, "ref_hi": ppl_ref}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    tok = u[idx, 1].sum(1)
    diff = (u[idx, 0] - ur[idx, 0]).sum(1) / tok
    ref = ur[idx, 0].sum(1) / tok
    q = (1 - confidence) / 2
    lo, hi = np.exp(np.quantile(diff, [q, 1 - q]))
    rlo, rhi = np.exp(np.quantile(ref, [q, 1 - q]))
    return {"ratio": ratio, "lo": float(lo), "hi": float(hi), "units": n, "ppl": ppl,
            "ppl_ref": ppl_ref, "ref_lo": float(rlo), "ref_hi": float(rhi)}


def noise_verdict(lo: float, hi: float) -> str:
    """``"within noise"`` when the interval ``[lo, hi]`` of a ratio to float32 contains 1, else
    ``"worse"`` (above 1) or ``"better"`` (below 1)."""
    if lo <= 1.0 <= hi:
        return "within noise"
    return "worse" if lo > 1.0 else "better"


def smollm2_perplexity(schemes=None, *, text: str | None = None,
                       max_tokens: int = SMOLLM2_TOKENS, windows: int | None = PPL_WINDOWS,
                       resample="auto", bootstrap: int = BOOTSTRAP,
                       confidence: float = CONFIDENCE, seed: int = 0,
                       quick: bool = False, device=None,
                       long_context: str = "interpolate") -> dict:
    """Perplexity of SmolLM2-135M on the evaluation text, float32 and under each scheme, with a
    bootstrap interval of each ratio to float32.

    The text (default :func:`lowprec.torch.models.eval_text`, *Alice's Adventures in
    Wonderland*) is cut into ``windows`` consecutive windows of ``max_tokens`` tokens; each is
    one causal forward pass scored on next-token cross-entropy.  Perplexity is ``exp`` of the
    mean over all scored tokens; the ratio's interval is a paired bootstrap over windows
    (:func:`bootstrap_ratio`), and a run whose interval contains 1 is marked
    ``"within noise"`` (:func:`noise_verdict`).

    Args:
        schemes: None (:func:`default_schemes` without the entries of :data:`SMOLLM2_SKIP`),
            labels of :func:`default_schemes`, or a dict ``{label: (scheme, options)}``.
        text: evaluation text.
        max_tokens: window length in tokens (default 512; SmolLM2 reaches 8192).
        windows: number of windows (default 8; None: all that fit, 76 of 512 tokens, 19 of
            2048, 9 of 4096, 4 of 8192).
        resample: bootstrap unit: ``"auto"`` (windows when there are at least 8, else about
            16 segments, :func:`resample_unit`), ``"window"`` or a segment length in tokens.
        bootstrap: bootstrap draws.
        confidence: interval coverage.
        seed: bootstrap seed.
        quick: 2 windows of 64 tokens and only :data:`QUICK_SCHEMES` (when ``schemes`` is
            None).
        device: torch device of the model and of every attention call (None: the CPU, or
            wherever the cached model already is); on a GPU every scheme with a device path
            computes there.
        long_context: windows beyond SmolLM2's trained 8192 tokens (:func:`long_context_rope`):
            ``"interpolate"`` (linear RoPE position interpolation, no fine-tuning) or
            ``"extrapolate"``.

    Returns:
        ``{"model", "tokens" (window length), "windows", "device", "long_context",
        "rope_factor", "scored_tokens", "float32": ppl, "float32_ci": [lo, hi], "resample",
        "confidence", "bootstrap", "schemes": {label:
        {"scheme", "options", "ppl", "ratio" (ppl / float32 ppl), "ratio_ci": [lo, hi],
        "verdict", "restart_rate", "peak_restart_rate", "emulation_seconds", "seconds"} or
        {"error"}}}``.

    Example::

        >>> res = smollm2_perplexity(quick=True)
        >>> res["schemes"]["intattention"]["ratio_ci"]
    """
    if quick:
        max_tokens, windows = min(max_tokens, 64), 2
        if schemes is None:
            schemes = list(QUICK_SCHEMES)
    if schemes is None:
        cfg = {k: v for k, v in default_schemes().items() if k not in SMOLLM2_SKIP}
    else:
        cfg = _resolve(schemes)
    where = {"text": text, "max_tokens": max_tokens, "windows": windows, "device": device,
             "long_context": long_context}
    base = perplexity_float32(**where)
    runs = {label: perplexity_run(scheme, opts, **where) for label, (scheme, opts) in cfg.items()}
    res = perplexity_result(cfg, base, runs, max_tokens=max_tokens, resample=resample,
                            bootstrap=bootstrap, confidence=confidence, seed=seed)
    res.update(device=str(base.get("device", "cpu")), long_context=long_context,
               rope_factor=base.get("rope_factor", 1.0))
    return res


@functools.lru_cache(maxsize=8)
def _windows(text: str | None, max_tokens: int, windows: int | None) -> list:
    """:func:`token_windows` of SmolLM2's tokenizer (once per process and setting)."""
    from ..torch.models import load_model

    return token_windows(load_model("smollm2")[1], text, max_tokens, windows)


def perplexity_float32(*, text: str | None = None, max_tokens: int = SMOLLM2_TOKENS,
                       windows: int | None = PPL_WINDOWS, device=None,
                       long_context: str = "interpolate") -> dict:
    """The float32 run of :func:`smollm2_perplexity` (a unit of ``lowprec study``):
    ``{"nll": [per-token NLL array per window], "seconds", "device", "rope_factor"}``.  On a
    GPU, torch's SDPA gets the key/value heads repeated rather than ``enable_gqa``
    (:func:`_sdpa_without_gqa`: its memory-efficient kernel instead of an L x L float32
    matrix)."""
    import torch

    _check_long_context(long_context)
    model = _smollm2(device)[0]
    wins = _windows(text, max_tokens, windows)
    t0 = time.perf_counter()
    dev = model.lm_head.weight.device
    with torch.no_grad(), long_context_rope(model, max_tokens, long_context) as factor, \
            _sdpa_without_gqa(dev):
        base = [_token_nll(model, w) for w in wins]
    return {"nll": base, "seconds": time.perf_counter() - t0,
            "device": str(dev), "rope_factor": factor}


def perplexity_run(scheme: str, opts: dict, *, text: str | None = None,
                   max_tokens: int = SMOLLM2_TOKENS, windows: int | None = PPL_WINDOWS,
                   device=None, long_context: str = "interpolate") -> dict:
    """One scheme of :func:`smollm2_perplexity` (a unit of ``lowprec study``): ``{"nll",
    "restart_rate", "peak_restart_rate", "calls", "emulation_seconds", "seconds"}`` or
    ``{"error"}``."""
    import torch

    from ..torch import emulate

    _check_long_context(long_context)
    model = _smollm2(device)[0]
    wins = _windows(text, max_tokens, windows)
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), long_context_rope(model, max_tokens, long_context), \
                emulate(scheme, model=model, **opts) as run:
            nll = [_token_nll(model, w) for w in wins]
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"error": _error(e)}
    tot = run.stats.total()
    return {"nll": nll, "restart_rate": tot.restart_rate,
            "peak_restart_rate": tot.peak_restart_rate, "calls": tot.calls,
            "emulation_seconds": tot.seconds, "seconds": time.perf_counter() - t0}


def perplexity_result(cfg: dict, base: dict, runs: dict, *, max_tokens: int, resample="auto",
                      bootstrap: int = BOOTSTRAP, confidence: float = CONFIDENCE,
                      seed: int = 0) -> dict:
    """:func:`smollm2_perplexity`'s result from :func:`perplexity_float32` and
    ``{label: perplexity_run(...)}`` of the runs ``cfg`` (``{label: (scheme, options)}``):
    the bootstrap intervals and verdicts."""
    nll0 = base["nll"]
    resample = resample_unit(len(nll0), max_tokens - 1, resample)
    b0 = bootstrap_ratio(nll0, nll0, resample=resample, samples=bootstrap,
                         confidence=confidence, seed=seed)
    res = {"model": "smollm2", "tokens": max_tokens, "windows": len(nll0),
           "scored_tokens": int(sum(b.size for b in nll0)), "float32": b0["ppl_ref"],
           "float32_ci": [b0["ref_lo"], b0["ref_hi"]], "resample": resample,
           "confidence": confidence, "bootstrap": bootstrap,
           "float32_seconds": base["seconds"], "schemes": {}}
    for label, (scheme, opts) in cfg.items():
        r = runs[label]
        if "error" in r:
            res["schemes"][label] = {"scheme": scheme, "options": opts, "error": r["error"]}
            continue
        nll = r["nll"]
        if not all(np.all(np.isfinite(a)) for a in nll):
            res["schemes"][label] = {"scheme": scheme, "options": opts,
                                     "error": "non-finite loss"}
            continue
        b = bootstrap_ratio(nll, nll0, resample=resample, samples=bootstrap,
                            confidence=confidence, seed=seed)
        res["schemes"][label] = {
            "scheme": scheme, "options": opts, "ppl": b["ppl"], "ratio": b["ratio"],
            "ratio_ci": [b["lo"], b["hi"]], "verdict": noise_verdict(b["lo"], b["hi"]),
            **{k: r[k] for k in ("restart_rate", "peak_restart_rate", "calls",
                                 "emulation_seconds", "seconds")}}
    return res


def _rope_note(res: dict) -> str:
    """How a result's windows were read beyond SmolLM2's trained length (:data:`TRAINED`):
    ``"; RoPE positions interpolated by 4 ..."``, ``"; RoPE positions extrapolated ..."``, or
    nothing within it."""
    f = res.get("rope_factor", 1.0)
    if f != 1.0:
        return f"; RoPE positions interpolated by {f:g} (beyond the model's trained length)"
    if res.get("long_context") == "extrapolate" and res.get("tokens", 0) > TRAINED:
        return f"; RoPE positions extrapolated (beyond the model's trained {TRAINED} tokens)"
    return ""


def format_smollm2_perplexity(res: dict) -> str:
    """Table of :func:`smollm2_perplexity`: perplexity, ratio to float32 with its bootstrap
    interval and verdict (``within noise`` when the interval contains 1), ARR/PRR, time."""
    rows = res["schemes"]
    w = max([len(k) for k in rows] + [8])
    unit = "windows" if res.get("resample", "window") == "window" else \
        f"{res['resample']}-token segments"
    conf = 100 * res.get("confidence", CONFIDENCE)
    lines = [f"SmolLM2-135M perplexity on the evaluation text: {res['windows']} windows of "
             f"{res['tokens']} tokens ({res['scored_tokens']} scored); {conf:.0f} % paired "
             f"bootstrap interval over {unit}{_rope_note(res)}",
             f"{'scheme':{w}}  {'ppl':>9} {'/ fp32':>8} {'interval':>19} {'verdict':>13} "
             f"{'ARR':>7} {'PRR':>7} {'time s':>7}",
             f"{'float32':{w}}  {res['float32']:9.4f} {1.0:8.5f} "
             f"{'[' + format(res['float32_ci'][0], '.3f') + ', ' + format(res['float32_ci'][1], '.3f') + ']':>19} "  # noqa: E501
             f"{'(ppl interval)':>13} {'-':>7} {'-':>7} {res['float32_seconds']:7.1f}"]
    for label, r in rows.items():
        if "error" in r:
            lines.append(f"{label:{w}}  FAILED: {r['error']}")
            continue
        lo, hi = r["ratio_ci"]
        lines.append(f"{label:{w}}  {r['ppl']:9.4f} {r['ratio']:8.5f} "
                     f"{'[' + format(lo, '.5f') + ', ' + format(hi, '.5f') + ']':>19} "
                     f"{r['verdict']:>13} "
                     f"{_f(r['restart_rate'], '.4f', 7)} {_f(r['peak_restart_rate'], '.4f', 7)} "
                     f"{r['seconds']:7.1f}")
    below = [k for k, r in rows.items() if "ratio" in r and r["ratio"] < 1]
    if below:
        marked = [k for k in below if rows[k]["verdict"] == "within noise"]
        lines.append(f"below float32: {len(below)} run(s), {len(marked)} of them within noise"
                     + ("" if len(marked) == len(below) else
                        "; the others are below float32 beyond the interval"))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# SmolLM2 restart rates


def _layer_of(module: str) -> int | None:
    m = re.search(r"layers\.(\d+)\.", module + ".")
    return int(m.group(1)) if m else None


def smollm2_restart_rates(taus=(0, 1, 2), *, text: str | None = None,
                          max_tokens: int = RESTART_TOKENS, block: int | None = RESTART_BLOCK,
                          critical=RESTART_CRITICAL, granularity: str = "tile",
                          quick: bool = False, device=None,
                          long_context: str = "interpolate") -> dict:
    """BAPS ``e2e_hif8`` restart rates of SmolLM2 per layer and per head, for each ``tau``,
    next to the paper's Table 4 (NLP).

    One causal window of the evaluation text through the decoder (``model.model``: the LM head
    is not needed) under ``emulate("baps", config="e2e_hif8", tau=tau, ...)``.  Each layer makes
    one SDPA call of 9 query heads (the 3 key-value heads repeated, GQA); its
    :class:`~lowprec.stats.BapsStats` gives non-critical tiles and restarts per head.

    Defaults (docs/design.md "BAPS Table 4 as the paper measured it"): 2048 tokens, 128 x 128
    tiles, ``critical="first+diagonal"``.  The paper names the first and the last tile as the
    ones that hold the row maximum in auto-regressive models (its section 3.2); for a causal
    query tile the last visible key tile is the diagonal one.  Its section 4.1 assigns "the
    first tile" alone, which a kernel that walks the key tiles from the diagonal down (as
    FlashAttention-2's causal kernels do) also reads as the diagonal; ``critical="first"`` is the
    literal reading and stays an option.  The paper does not give its tile size.

    Args:
        taus: restart thresholds (integers; the paper sweeps 0, 1, 2).
        text: evaluation text (default :func:`lowprec.torch.models.eval_text`).
        max_tokens: window length (default 2048; ``quick``: 128).
        block: tile size used for ``block_q`` and ``block_k`` (default 128; ``quick``: 32).
        critical, granularity: BAPS options (default ``"first+diagonal"``, ``"tile"``).
        quick: 128 tokens, 32 x 32 tiles.
        device: torch device of the model and the BAPS calls (None: the CPU, or wherever the
            cached model already is).
        long_context: windows beyond SmolLM2's trained 8192 tokens (:func:`long_context_rope`):
            ``"interpolate"`` or ``"extrapolate"``.

    Returns:
        ``{"tokens", "block", "critical", "granularity", "layers", "heads", "device",
        "long_context", "rope_factor", "taus": {tau:
        {"arr" (restarts / non-critical tiles), "prr" (largest rate of one (layer, head)),
        "tile_share" (restarts / all visited tiles, critical ones included: the paper's
        "about 5 % of cases"), "tiles", "all_tiles", "restarts", "paper_arr", "paper_prr",
        "per_layer": [rate per layer], "per_head": [[rate per head] per layer], "per_call":
        [rate per call], "per_call_head": [rate per (call, head)], "seconds"}}}``.

    Example::

        >>> res = smollm2_restart_rates((0, 1), quick=True)
        >>> res["taus"][1]["arr"] <= res["taus"][0]["arr"]
        True
    """
    if quick:
        max_tokens = min(max_tokens, 128)
        block = 32 if block == RESTART_BLOCK else block
    where = {"text": text, "max_tokens": max_tokens, "block": block, "critical": critical,
             "granularity": granularity, "device": device, "long_context": long_context}
    return restart_rates_result({tau: restart_rates_at(tau, **where) for tau in taus},
                                where)


def _restart_setup(text, max_tokens, block, critical, granularity, device=None,
                   long_context="interpolate"):
    """``(model, ids, emulate options, result header)`` of :func:`smollm2_restart_rates`."""
    _check_long_context(long_context)
    model, tok = _smollm2(device)
    ids = _token_ids(tok, text, max_tokens).to(model.lm_head.weight.device)
    opts = {"config": "e2e_hif8", "critical": critical, "granularity": granularity}
    if block is not None:
        opts.update(block_q=block, block_k=block)
    header = {"tokens": int(ids.shape[1]), "block": block or 128, "critical": critical,
              "granularity": granularity, "layers": int(model.config.num_hidden_layers),
              "heads": int(model.config.num_attention_heads),
              "device": str(ids.device), "long_context": long_context,
              "rope_factor": rope_factor(model, int(ids.shape[1]), long_context)}
    return model, ids, opts, header


def restart_rates_at(tau, *, text: str | None = None, max_tokens: int = RESTART_TOKENS,
                     block: int | None = RESTART_BLOCK, critical=RESTART_CRITICAL,
                     granularity: str = "tile", device=None,
                     long_context: str = "interpolate") -> dict:
    """One tau of :func:`smollm2_restart_rates` (a unit of ``lowprec study``; no ``quick``
    adjustment here): ``{"header": the result's setting, "row": the tau's entry}``."""
    import torch

    from ..torch import emulate
    from .baps import PAPER_ARR_NLP, PAPER_PRR_NLP

    model, ids, opts, header = _restart_setup(text, max_tokens, block, critical, granularity,
                                              device, long_context)
    layers, heads = header["layers"], header["heads"]
    t0 = time.perf_counter()
    with torch.no_grad(), long_context_rope(model, int(ids.shape[1]), long_context), \
            emulate("baps", model=model, tau=tau, **opts) as run:
        model.model(input_ids=ids)
    tiles = np.zeros((layers, heads), dtype=np.int64)
    restarts = np.zeros((layers, heads), dtype=np.int64)
    per_call = []
    visited = 0
    for rec in run.stats.calls:
        st = rec.stats
        t = np.sum(st.tiles, axis=0).reshape(-1, heads).sum(axis=0)
        r = np.sum(st.restarts, axis=0).reshape(-1, heads).sum(axis=0)
        visited += sum(int(np.count_nonzero(f >= -1)) for f in st.flags)
        layer = _layer_of(rec.module)
        if layer is not None:
            tiles[layer] += t
            restarts[layer] += r
        per_call.append(float(r.sum() / t.sum()) if t.sum() else float("nan"))
    tot = run.stats.total()
    with np.errstate(invalid="ignore", divide="ignore"):
        per_head = np.where(tiles > 0, restarts / np.maximum(tiles, 1), np.nan)
        per_layer = np.where(tiles.sum(1) > 0,
                             restarts.sum(1) / np.maximum(tiles.sum(1), 1), np.nan)
    return {"header": header, "row": {
        "arr": tot.restart_rate, "prr": tot.peak_restart_rate,
        "tile_share": int(restarts.sum()) / visited if visited else None,
        "tiles": int(tiles.sum()), "all_tiles": visited, "restarts": int(restarts.sum()),
        "paper_arr": PAPER_ARR_NLP.get(tau), "paper_prr": PAPER_PRR_NLP.get(tau),
        "per_layer": per_layer.tolist(), "per_head": per_head.tolist(),
        "per_call": per_call, "per_call_head": tot.scheme_stats.rates().tolist(),
        "seconds": time.perf_counter() - t0}}


def restart_rates_result(parts: dict, where: dict) -> dict:
    """:func:`smollm2_restart_rates`' result from ``{tau: restart_rates_at(tau, **where)}``."""
    header = next(iter(parts.values()))["header"] if parts else \
        _restart_setup(**where)[3]
    return {**header, "taus": {tau: p["row"] for tau, p in parts.items()}}


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def format_restart_table(res: dict) -> str:
    """The BAPS Table 4 analogue of :func:`smollm2_restart_rates`: per tau, ARR and PRR (%)
    beside the paper's (NLP), the restarted share of all tiles, and the factor by which ARR
    falls from the previous tau, ours and the paper's (the paper's text: tau = 1 halves it)."""
    from .baps import PAPER_ARR_NLP, PAPER_RESTART_SHARE_NLP

    taus = list(res["taus"])
    lines = [f"BAPS Table 4 on SmolLM2-135M: e2e_hif8, {res['tokens']} tokens, "
             f"{res['block']}x{res['block']} tiles, critical={res['critical']}, "
             f"granularity={res['granularity']}{_rope_note(res)} (rates in %)",
             f"{'tau':>4} {'ARR':>7} {'paper':>7} {'PRR':>7} {'paper':>7} {'tiles %':>8} "
             f"{'fall':>6} {'paper':>6}"]
    prev = None
    for t in taus:
        r = res["taus"][t]
        ti = int(t)  # a JSON round trip makes the keys strings
        fac = f"{prev / r['arr']:.2f}" if prev and r["arr"] else "-"
        pfac = (f"{PAPER_ARR_NLP[ti - 1] / PAPER_ARR_NLP[ti]:.2f}"
                if ti in PAPER_ARR_NLP and ti - 1 in PAPER_ARR_NLP else "-")
        lines.append(f"{t:>4} {_pct(r['arr']):>7} {_pct(r.get('paper_arr')):>7} "
                     f"{_pct(r['prr']):>7} {_pct(r.get('paper_prr')):>7} "
                     f"{_pct(r.get('tile_share')):>8} {fac:>6} {pfac:>6}")
        prev = r["arr"]
    lines.append(f"ARR = restarts / non-critical tiles; PRR = the largest rate of one (layer, "
                 f"head); tiles % = restarts / all tiles, critical ones included (paper: about "
                 f"{100 * PAPER_RESTART_SHARE_NLP:.0f} % in NLP); fall = ARR(tau - 1) / ARR(tau)")
    return "\n".join(lines)


def format_smollm2_restart_rates(res: dict) -> str:
    """Per-layer restart-rate table of :func:`smollm2_restart_rates` (one column per tau),
    then the Table 4 analogue (:func:`format_restart_table`) and the per-head range."""
    taus = list(res["taus"])
    lines = [f"SmolLM2-135M BAPS e2e_hif8 restart rates per layer: {res['tokens']} tokens, "
             f"{res['block']}x{res['block']} tiles, critical={res['critical']}, "
             f"granularity={res['granularity']}",
             "layer " + " ".join(f"{'tau=' + str(t):>8}" for t in taus)]
    for i in range(res["layers"]):
        lines.append(f"{i:5d} " + " ".join(_f(res["taus"][t]["per_layer"][i], ".4f", 8)
                                           for t in taus))
    lines.append(format_restart_table(res))
    for t in taus:
        ph = np.asarray(res["taus"][t]["per_head"], dtype=float)
        lines.append(f"tau={t}: {res['taus'][t]['restarts']} / {res['taus'][t]['tiles']} "
                     f"non-critical tiles restarted; per (layer, head) rate min "
                     f"{np.nanmin(ph):.3f}, median {np.nanmedian(ph):.3f}, max "
                     f"{np.nanmax(ph):.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# HCCS on MiniLM logits


def capture_smollm2_attention(max_tokens: int = SMOLLM2_TOKENS, *, text: str | None = None,
                              window: int = 0) -> list[dict]:
    """The inputs of every attention call of SmolLM2-135M (float32) on one window of the text.

    Args:
        max_tokens: window length in tokens.
        text: the text (default :func:`lowprec.torch.models.eval_text`).
        window: which window of :func:`token_windows`.

    Returns:
        One dict per call (= layer): ``"q"`` ``(1, H, L, d)`` and ``"k"``, ``"v"`` with their
        heads repeated to q's (GQA), float32 numpy; ``"causal"``, ``"mask"`` (None or numpy),
        ``"scale"`` (float).

    Example::

        >>> calls = capture_smollm2_attention(64)
        >>> len(calls), calls[0]["q"].shape  # doctest: +SKIP
        (30, (1, 9, 64, 64))
    """
    import torch

    from ..torch.models import load_model

    model, tok = load_model("smollm2")
    ids = token_windows(tok, text, max_tokens, window + 1)[window]
    calls: list[dict] = []

    def keep(a):
        q, k, v = (a[n].detach().float() for n in ("query", "key", "value"))
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
        m = a.get("attn_mask")
        calls.append({"q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
                      "causal": bool(a.get("is_causal")),
                      "mask": None if m is None else m.detach().numpy(), "scale": a["scale"]})

    with torch.no_grad(), _sdpa_capture(keep):
        model.model(input_ids=ids)
    return calls


def _sdpa_capture(on_call):
    """A torch function mode that hands every ``F.scaled_dot_product_attention`` call's
    arguments to ``on_call`` as a dict by parameter name (``"scale"`` filled in with
    ``1 / sqrt(d)`` when not given); the call itself runs unchanged."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    sdpa = F.scaled_dot_product_attention
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                a = dict(zip(names, args, strict=False)) | kwargs
                a["scale"] = a.get("scale") or 1.0 / math.sqrt(a["query"].shape[-1])
                on_call(a)
            return func(*args, **kwargs)

    return Capture()


def _capture_minilm_logits(model, batch) -> list:
    """Run MiniLM once, returning per SDPA call (= layer) the float64 logits
    ``q k^T * scale + mask`` ``(B, H, L, L)`` with masked keys ``-inf``."""
    import torch

    captured = []

    def keep(a):
        q, k = a["query"].double(), a["key"].double()
        s = (q @ k.transpose(-1, -2)) * a["scale"]
        m = a.get("attn_mask")
        if m is not None:
            if m.dtype == torch.bool:
                s = s.masked_fill(~m, float("-inf"))
            else:
                md = m.double()
                s = (s + md).masked_fill(md <= torch.finfo(m.dtype).min / 2, float("-inf"))
        if a.get("is_causal"):
            raise ValueError("MiniLM is not causal: unexpected is_causal=True")
        captured.append(s.numpy())

    with torch.no_grad(), _sdpa_capture(keep):
        model(**batch)
    return captured


def _softmax_vis(x: np.ndarray, vis: np.ndarray) -> np.ndarray:
    z = np.where(vis, x, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _kl_rows(q: np.ndarray, p: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """Per row ``KL(q || p')``, p' = max(p, eps) over the visible entries, renormalised."""
    pp = np.where(vis, np.maximum(p, KL_EPS), 0.0)
    pp = pp / pp.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(q > 0, q * (np.log(q) - np.log(np.where(vis, pp, 1.0))), 0.0)
    return t.sum(axis=-1)


def hccs_minilm_kl(*, sentences=None, calib: int = HCCS_SENTENCES[0],
                   evaluate: int = HCCS_SENTENCES[1], quick: bool = False,
                   broad_threshold: float = 0.5) -> dict:
    """HCCS calibrated per (layer, head) on MiniLM's real attention logits; KL before
    retraining on held-out sentences (HCCS paper section V-C, our spec section 5).

    The logits ``q k^T / sqrt(d)`` of every layer are captured from MiniLM's SDPA calls on two
    padded batches of sentences (same padded length n): ``calib`` sentences calibrate
    :func:`lowprec.kernels.hccs.calibrate` per head (72 heads; real query rows only, padding
    keys masked), the next ``evaluate`` sentences measure the mean over real query rows of
    ``KL(softmax(x8 s_x) || p)`` for each output path (p normalised over the visible keys,
    floored at 1e-6), as in :func:`lowprec.studies.hccs.kl_study`.  ``int8 floor`` is
    ``KL(softmax(logits) || softmax(x8 s_x))``; ``float ref`` is HCCS (i16_div) against the
    float softmax.  A head is *broad* when its mean softmax entropy exceeds
    ``broad_threshold * log(visible keys)``, else *focused*.

    Args:
        sentences: list of strings (default: the sample text's sentences).
        calib, evaluate: sentences for calibration and for evaluation (default 8 and 8;
            ``quick``: 4 and 4).
        quick: smaller sets.
        broad_threshold: normalised-entropy threshold between broad and focused heads.

    Returns:
        ``{"n", "calib_sentences", "eval_sentences", "heads": [{"layer", "head", "B", "S",
        "Dmax", "x_scale", "calib_kl", "entropy", "kind", "kl": {path: KL, "int8 floor",
        "float ref", "i16_div per layer"}}], "summary": {kind: {method: (mean, min, max)}},
        "paper"}``; ``"i16_div per layer"`` calibrates one ``(B, S, Dmax)`` and one logit
        scale per layer (its heads' rows pooled) instead of per head.

    Example::

        >>> res = hccs_minilm_kl(quick=True)
        >>> res["summary"]["all"]["i16_div"]
    """
    from ..kernels.hccs import PATHS, calibrate, hccs_core, output_scale
    from ..torch.models import load_model
    from .hccs import PAPER_KL

    if quick:
        calib, evaluate = min(calib, 4), min(evaluate, 4)
    sents = list(sentences) if sentences is not None else sentences_of(count=calib + evaluate)
    if len(sents) < calib + evaluate or calib < 1 or evaluate < 1:
        raise ValueError(f"need calib + evaluate = {calib + evaluate} sentences (each >= 1), "
                         f"got {len(sents)}")
    model, tok = load_model("minilm")
    n = max(len(tok(s)["input_ids"]) for s in sents[:calib + evaluate])
    batches = [tok(sents[:calib], return_tensors="pt", padding="max_length", max_length=n),
               tok(sents[calib:calib + evaluate], return_tensors="pt", padding="max_length",
                   max_length=n)]
    logits = [_capture_minilm_logits(model, b) for b in batches]
    real = [b["attention_mask"].numpy().astype(bool) for b in batches]
    layers, H = len(logits[0]), logits[0][0].shape[1]

    def rows(which, layer, h):  # (R, n) logits of the real query rows of one head
        x = logits[which][layer][:, h]  # (B, L, L)
        return x[real[which]]

    heads = []
    for layer in range(layers):
        cal = [rows(0, layer, h) for h in range(H)]
        params = calibrate(cal, n=n)
        # one (B, S, Dmax) and one logit scale for the whole layer: its heads' rows pooled
        shared = calibrate([np.concatenate(cal, axis=0)], n=n)
        for h in range(H):
            ev = rows(1, layer, h)
            vis = np.isfinite(ev)
            s_x = float(params.x_scale[h])
            x8 = np.clip(np.rint(np.where(vis, ev, 0.0) / s_x), -127, 127).astype(np.int8)
            qx = _softmax_vis(x8.astype(np.float64) * s_x, vis)
            qf = _softmax_vis(ev, vis)
            kl = {}
            for path in PATHS:
                p = hccs_core(x8, params.B[h], params.S[h], params.Dmax[h], path, mask=vis)
                pf = p.astype(np.float64) * output_scale(path)
                kl[path] = float(_kl_rows(qx, pf, vis).mean())
                if path == "i16_div":
                    kl["float ref"] = float(_kl_rows(qf, pf, vis).mean())
            kl["int8 floor"] = float(_kl_rows(qf, qx, vis).mean())
            s_l = float(shared.x_scale[0])
            x8l = np.clip(np.rint(np.where(vis, ev, 0.0) / s_l), -127, 127).astype(np.int8)
            p = hccs_core(x8l, shared.B[0], shared.S[0], shared.Dmax[0], "i16_div", mask=vis)
            kl["i16_div per layer"] = float(_kl_rows(
                _softmax_vis(x8l.astype(np.float64) * s_l, vis),
                p.astype(np.float64) * output_scale("i16_div"), vis).mean())
            with np.errstate(divide="ignore", invalid="ignore"):
                ent = -np.where(qf > 0, qf * np.log(qf), 0.0).sum(-1)
            norm = float(np.mean(ent / np.log(np.maximum(vis.sum(-1), 2))))
            heads.append({"layer": layer, "head": h, "B": int(params.B[h]),
                          "S": int(params.S[h]), "Dmax": int(params.Dmax[h]), "x_scale": s_x,
                          "calib_kl": float(params.kl[h]), "entropy": float(ent.mean()),
                          "norm_entropy": norm,
                          "kind": "broad" if norm > broad_threshold else "focused", "kl": kl})
    methods = list(heads[0]["kl"])
    summary = {}
    for kind in ("all", "broad", "focused"):
        sel = [hd for hd in heads if kind == "all" or hd["kind"] == kind]
        if sel:
            summary[kind] = {"heads": len(sel), **{
                m: (float(np.mean([hd["kl"][m] for hd in sel])),
                    float(np.min([hd["kl"][m] for hd in sel])),
                    float(np.max([hd["kl"][m] for hd in sel]))) for m in methods}}
    return {"n": n, "calib_sentences": calib, "eval_sentences": evaluate, "layers": layers,
            "heads_per_layer": H, "heads": heads, "summary": summary, "paper": PAPER_KL,
            "broad_threshold": broad_threshold}


def format_hccs_minilm_kl(res: dict, per_head: bool = False) -> str:
    """Summary table of :func:`hccs_minilm_kl` (mean [min, max] KL over heads, per kind);
    ``per_head=True`` adds one line per head."""
    methods = [m for m in next(iter(res["summary"].values())) if m != "heads"]
    lines = [f"HCCS calibrated per head on MiniLM logits ({res['layers']} layers x "
             f"{res['heads_per_layer']} heads, n = {res['n']} keys; calibrated on "
             f"{res['calib_sentences']} sentences, KL on {res['eval_sentences']} others)",
             f"{'heads':16} " + " ".join(f"{m:>22}" for m in methods)]
    for kind, s in res["summary"].items():
        lines.append(f"{kind + ' (' + str(s['heads']) + ')':16} " + " ".join(
            f"{s[m][0]:7.4f} [{s[m][1]:.3f},{s[m][2]:.3f}]".rjust(22) for m in methods))
    if per_head:
        lines.append("layer head kind      B    S Dmax  " + " ".join(f"{m:>10}" for m in methods))
        for hd in res["heads"]:
            lines.append(f"{hd['layer']:5d} {hd['head']:4d} {hd['kind']:7} {hd['B']:5d} "
                         f"{hd['S']:4d} {hd['Dmax']:4d}  "
                         + " ".join(f"{hd['kl'][m]:10.4f}" for m in methods))
    pb, pf = res["paper"]["broad"], res["paper"]["focused"]
    lines.append(f"paper (BERT heads, before retraining): broad {pb[0]}-{pb[1]}, focused "
                 f"{pf[0]}-{pf[1]}; broad = normalised entropy > {res['broad_threshold']}")
    return "\n".join(lines)


__all__ = ["minilm_cosine", "minilm_cosine_run", "minilm_cosine_result", "minilm_sentences",
           "format_minilm_cosine", "smollm2_perplexity", "perplexity_float32",
           "perplexity_run", "perplexity_result", "long_context_rope", "rope_factor",
           "restart_rates_at",
           "restart_rates_result",
           "format_smollm2_perplexity", "smollm2_restart_rates", "format_smollm2_restart_rates",
           "format_restart_table", "token_windows", "bootstrap_ratio", "noise_verdict",
           "resample_unit", "capture_smollm2_attention",
           "hccs_minilm_kl", "format_hccs_minilm_kl", "default_schemes", "sentences_of",
           "BAPS_CONFIGS", "QUICK_SCHEMES"]
