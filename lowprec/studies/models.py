"""Studies on real pretrained models (issue 5): MiniLM embeddings, SmolLM2 perplexity, BAPS
restart rates and HCCS calibration on real attention logits.

The models are loaded offline by :func:`lowprec.torch.models.load_model` (kept per process);
the evaluation text is :func:`lowprec.torch.models.sample_text` (original prose, CC0).  Every
emulated run goes through :func:`lowprec.torch.emulate`, which answers the models' torch SDPA
calls (``attn_implementation="sdpa"``) with the chosen scheme; all other operations stay float32.

* :func:`minilm_cosine`: all-MiniLM-L6-v2 sentence embeddings (mean pooling) under each scheme
  against float32: cosine similarity per sentence, plus the per-module statistics of the 6
  attention modules (``encoder.layer.<i>.attention.self``).  The sentences are padded to one
  batch, so the masked (padding) path of every scheme is exercised.  With the default BAPS tiles
  of 128 x 128 a sentence (< 128 tokens) is one key tile, the critical one, so BAPS never
  restarts there; the configuration with 16 x 16 tiles shows restarts on the same model.
* :func:`smollm2_perplexity`: perplexity of the first ``max_tokens`` tokens of the sample text
  (one causal window, next-token loss) for float32 and each scheme.
* :func:`smollm2_restart_rates`: BAPS ``e2e_hif8`` restart rates of SmolLM2 per layer and per
  head for several ``tau``, from the per-call :class:`lowprec.stats.BapsStats`, with ARR, PRR and
  the per-call and per-(call, head) rate lists (for a histogram).  Defaults: 512 tokens and
  64 x 64 tiles (one window of the sample text gives 28 non-critical causal tiles per head;
  with 128 x 128 tiles it would be 6).
* :func:`hccs_minilm_kl`: HCCS parameters calibrated per (layer, head) on MiniLM's real attention
  logits (captured from its SDPA calls: ``q k^T * scale`` plus the padding mask), KL before
  retraining on held-out sentences, next to the int8-logit floor (HCCS paper section V-C).

torch and transformers are imported inside the functions; ``import lowprec.studies.models``
stays light.  ``format_*`` functions turn each result into a printable table.
"""

from __future__ import annotations

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
SMOLLM2_TOKENS = 128
RESTART_TOKENS = 512
RESTART_BLOCK = 64
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
    import torch

    from ..torch import emulate
    from ..torch.models import load_model, mean_pool

    if schemes is None and quick:
        schemes = list(QUICK_SCHEMES)
    cfg = _resolve(schemes)
    sents = list(sentences) if sentences is not None else \
        sentences_of(count=4 if quick else MINILM_SENTENCES)
    model, tok = load_model("minilm")
    batch = tok(sents, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    res = {"model": "minilm", "sentences": len(sents), "tokens": int(batch["input_ids"].shape[1]),
           "real_tokens": int(batch["attention_mask"].sum()), "schemes": {}}
    for label, (scheme, opts) in cfg.items():
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), emulate(scheme, model=model, reference=reference,
                                          **opts) as run:
                emb = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
        except Exception as e:  # noqa: BLE001 - reported in the table
            res["schemes"][label] = {"scheme": scheme, "options": opts, "error": _error(e)}
            continue
        cos = torch.nn.functional.cosine_similarity(emb.double(), ref.double(), dim=-1)
        tot = run.stats.total()
        res["schemes"][label] = {
            "scheme": scheme, "options": opts, "cos": cos.tolist(),
            "cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
            "restart_rate": tot.restart_rate, "peak_restart_rate": tot.peak_restart_rate,
            "sqnr_db_mean": tot.sqnr_db_mean, "modules": _module_table(run),
            "emulation_seconds": tot.seconds, "seconds": time.perf_counter() - t0}
    return res


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
    from ..torch.models import sample_text

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f"max_tokens must be an int >= 2, got {max_tokens!r}")
    text = sample_text() if text is None else text
    ids = tok(text, return_tensors="pt")["input_ids"][:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError("the text gives fewer than 2 tokens")
    return ids


def smollm2_perplexity(schemes=None, *, text: str | None = None,
                       max_tokens: int = SMOLLM2_TOKENS, quick: bool = False) -> dict:
    """Perplexity of SmolLM2-135M on the sample text, float32 and under each scheme.

    One causal window of the first ``max_tokens`` tokens; perplexity = ``exp`` of the mean
    next-token cross-entropy (transformers' ``labels=`` loss).

    Args:
        schemes: None (:func:`default_schemes` without the entries of :data:`SMOLLM2_SKIP`),
            labels of :func:`default_schemes`, or a dict ``{label: (scheme, options)}``.
        text: evaluation text (default :func:`lowprec.torch.models.sample_text`).
        max_tokens: window length in tokens (default 128; the sample text has about 1130).
        quick: 64 tokens and only :data:`QUICK_SCHEMES` (when ``schemes`` is None).

    Returns:
        ``{"model", "tokens", "float32": ppl, "schemes": {label: {"scheme", "options",
        "ppl", "ratio" (ppl / float32 ppl), "restart_rate", "peak_restart_rate",
        "emulation_seconds", "seconds"} or {"error"}}}``.

    Example::

        >>> res = smollm2_perplexity(quick=True)
        >>> res["float32"], res["schemes"]["intattention"]["ppl"]
    """
    import torch

    from ..torch import emulate
    from ..torch.models import load_model

    if quick:
        max_tokens = min(max_tokens, 64)
        if schemes is None:
            schemes = list(QUICK_SCHEMES)
    if schemes is None:
        cfg = {k: v for k, v in default_schemes().items() if k not in SMOLLM2_SKIP}
    else:
        cfg = _resolve(schemes)
    model, tok = load_model("smollm2")
    ids = _token_ids(tok, text, max_tokens)
    t0 = time.perf_counter()
    with torch.no_grad():
        base = math.exp(float(model(input_ids=ids, labels=ids).loss))
    res = {"model": "smollm2", "tokens": int(ids.shape[1]), "float32": base,
           "float32_seconds": time.perf_counter() - t0, "schemes": {}}
    for label, (scheme, opts) in cfg.items():
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), emulate(scheme, model=model, **opts) as run:
                loss = float(model(input_ids=ids, labels=ids).loss)
        except Exception as e:  # noqa: BLE001 - reported in the table
            res["schemes"][label] = {"scheme": scheme, "options": opts, "error": _error(e)}
            continue
        ppl = math.exp(loss) if math.isfinite(loss) else float("nan")
        tot = run.stats.total()
        res["schemes"][label] = {
            "scheme": scheme, "options": opts, "ppl": ppl, "ratio": ppl / base,
            "restart_rate": tot.restart_rate, "peak_restart_rate": tot.peak_restart_rate,
            "calls": tot.calls, "emulation_seconds": tot.seconds,
            "seconds": time.perf_counter() - t0}
    return res


def format_smollm2_perplexity(res: dict) -> str:
    """Table of :func:`smollm2_perplexity`: perplexity, ratio to float32, ARR/PRR, time."""
    rows = res["schemes"]
    w = max([len(k) for k in rows] + [8])
    lines = [f"SmolLM2-135M perplexity on the sample text ({res['tokens']} tokens, one causal "
             "window)",
             f"{'scheme':{w}}  {'ppl':>9} {'/ fp32':>7} {'ARR':>7} {'PRR':>7} {'time s':>7}",
             f"{'float32':{w}}  {res['float32']:9.4f} {1.0:7.4f} {'-':>7} {'-':>7} "
             f"{res['float32_seconds']:7.2f}"]
    for label, r in rows.items():
        if "error" in r:
            lines.append(f"{label:{w}}  FAILED: {r['error']}")
            continue
        lines.append(f"{label:{w}}  {r['ppl']:9.4f} {r['ratio']:7.4f} "
                     f"{_f(r['restart_rate'], '.4f', 7)} {_f(r['peak_restart_rate'], '.4f', 7)} "
                     f"{r['seconds']:7.2f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# SmolLM2 restart rates


def _layer_of(module: str) -> int | None:
    m = re.search(r"layers\.(\d+)\.", module + ".")
    return int(m.group(1)) if m else None


def smollm2_restart_rates(taus=(0, 1, 2), *, text: str | None = None,
                          max_tokens: int = RESTART_TOKENS, block: int | None = RESTART_BLOCK,
                          critical="first", granularity: str = "tile",
                          quick: bool = False) -> dict:
    """BAPS ``e2e_hif8`` restart rates of SmolLM2 per layer and per head, for each ``tau``.

    One causal window of the sample text through the decoder (``model.model``: the LM head is
    not needed) under ``emulate("baps", config="e2e_hif8", tau=tau, ...)``.  Each layer makes
    one SDPA call of 9 query heads (the 3 key-value heads repeated, GQA); its
    :class:`~lowprec.stats.BapsStats` gives non-critical tiles and restarts per head.

    Args:
        taus: restart thresholds (integers; the paper sweeps 0, 1, 2).
        text: evaluation text (default: the sample text).
        max_tokens: window length (default 512; ``quick``: 128).
        block: tile size used for ``block_q`` and ``block_k`` (default 64; ``quick``: 32;
            None keeps BAPS's 128).
        critical, granularity: BAPS options (default ``"first"``, ``"tile"``).
        quick: 128 tokens, 32 x 32 tiles.

    Returns:
        ``{"tokens", "block", "critical", "granularity", "layers", "heads", "taus": {tau:
        {"arr", "prr", "tiles", "restarts", "per_layer": [rate per layer], "per_head":
        [[rate per head] per layer], "per_call": [rate per call], "per_call_head": [rate per
        (call, head)], "seconds"}}}``.

    Example::

        >>> res = smollm2_restart_rates((0, 1), quick=True)
        >>> res["taus"][1]["arr"] <= res["taus"][0]["arr"]
        True
    """
    import torch

    from ..torch import emulate
    from ..torch.models import load_model

    if quick:
        max_tokens = min(max_tokens, 128)
        block = 32 if block == RESTART_BLOCK else block
    model, tok = load_model("smollm2")
    ids = _token_ids(tok, text, max_tokens)
    opts = {"config": "e2e_hif8", "critical": critical, "granularity": granularity}
    if block is not None:
        opts.update(block_q=block, block_k=block)
    layers = int(model.config.num_hidden_layers)
    heads = int(model.config.num_attention_heads)
    res = {"tokens": int(ids.shape[1]), "block": block or 128, "critical": critical,
           "granularity": granularity, "layers": layers, "heads": heads, "taus": {}}
    for tau in taus:
        t0 = time.perf_counter()
        with torch.no_grad(), emulate("baps", model=model, tau=tau, **opts) as run:
            model.model(input_ids=ids)
        tiles = np.zeros((layers, heads), dtype=np.int64)
        restarts = np.zeros((layers, heads), dtype=np.int64)
        per_call = []
        for rec in run.stats.calls:
            st = rec.stats
            t = np.sum(st.tiles, axis=0).reshape(-1, heads).sum(axis=0)
            r = np.sum(st.restarts, axis=0).reshape(-1, heads).sum(axis=0)
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
        res["taus"][tau] = {
            "arr": tot.restart_rate, "prr": tot.peak_restart_rate,
            "tiles": int(tiles.sum()), "restarts": int(restarts.sum()),
            "per_layer": per_layer.tolist(), "per_head": per_head.tolist(),
            "per_call": per_call, "per_call_head": tot.scheme_stats.rates().tolist(),
            "seconds": time.perf_counter() - t0}
    return res


def format_smollm2_restart_rates(res: dict) -> str:
    """Per-layer restart-rate table of :func:`smollm2_restart_rates` (one column per tau),
    then ARR / PRR and the per-head range."""
    taus = list(res["taus"])
    lines = [f"SmolLM2-135M BAPS e2e_hif8 restart rates: {res['tokens']} tokens, "
             f"{res['block']}x{res['block']} tiles, critical={res['critical']}, "
             f"granularity={res['granularity']}",
             "layer " + " ".join(f"{'tau=' + str(t):>8}" for t in taus)]
    for i in range(res["layers"]):
        lines.append(f"{i:5d} " + " ".join(_f(res["taus"][t]["per_layer"][i], ".4f", 8)
                                           for t in taus))
    lines.append("ARR   " + " ".join(_f(res["taus"][t]["arr"], ".4f", 8) for t in taus))
    lines.append("PRR   " + " ".join(_f(res["taus"][t]["prr"], ".4f", 8) for t in taus))
    for t in taus:
        ph = np.asarray(res["taus"][t]["per_head"], dtype=float)
        lines.append(f"tau={t}: {res['taus'][t]['restarts']} / {res['taus'][t]['tiles']} "
                     f"non-critical tiles restarted; per (layer, head) rate min "
                     f"{np.nanmin(ph):.3f}, median {np.nanmedian(ph):.3f}, max "
                     f"{np.nanmax(ph):.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# HCCS on MiniLM logits


def _capture_minilm_logits(model, batch) -> list:
    """Run MiniLM once, returning per SDPA call (= layer) the float64 logits
    ``q k^T * scale + mask`` ``(B, H, L, L)`` with masked keys ``-inf``."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    sdpa = F.scaled_dot_product_attention
    captured = []

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
                a = dict(zip(names, args, strict=False)) | kwargs
                q, k = a["query"].double(), a["key"].double()
                scale = a.get("scale") or 1.0 / math.sqrt(q.shape[-1])
                s = (q @ k.transpose(-1, -2)) * scale
                m = a.get("attn_mask")
                if m is not None:
                    if m.dtype == torch.bool:
                        s = s.masked_fill(~m, float("-inf"))
                    else:
                        md = m.double()
                        s = (s + md).masked_fill(md <= torch.finfo(m.dtype).min / 2,
                                                 float("-inf"))
                if a.get("is_causal"):
                    raise ValueError("MiniLM is not causal: unexpected is_causal=True")
                captured.append(s.numpy())
            return func(*args, **kwargs)

    with torch.no_grad(), Capture():
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
        "float ref"}}], "summary": {kind: {method: (mean, min, max)}}, "paper"}``.

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


__all__ = ["minilm_cosine", "format_minilm_cosine", "smollm2_perplexity",
           "format_smollm2_perplexity", "smollm2_restart_rates", "format_smollm2_restart_rates",
           "hccs_minilm_kl", "format_hccs_minilm_kl", "default_schemes", "sentences_of",
           "BAPS_CONFIGS", "QUICK_SCHEMES"]
