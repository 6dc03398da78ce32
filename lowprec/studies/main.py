"""The main study behind ``lowprec study``: every scheme on one workload, a table, plots, a report.

:func:`run_study` is the job.  It

1. builds the attention workloads (:func:`synthetic_workloads`): ``decoder`` (causal heads with
   an attention sink and a competing recency bump, as in language models), ``encoder``
   (non-causal peaked heads with a sink) and ``uniform`` (the integer papers' U(-4, 4) float16
   inputs at ViT-B shape);
2. runs every attention scheme (:func:`scheme_runs`: ``flash``, the seven BAPS configurations,
   the integer schemes and their baselines) on each workload and compares it with float64
   attention (:func:`compare_schemes`: relative L2 error, cosine similarity, SQNR; restart
   rates for BAPS);
3. sweeps the BAPS restart threshold tau on the decoder workload (restart rate against tau,
   the BAPS Table 4 / Figure 4 analogue);
4. when a real model is installed (``lowprec.torch.models``), runs the schemes on it too
   (SmolLM2 perplexity and restart rates per layer and head, MiniLM embedding cosine);
5. runs the synthetic studies behind the claims table (:mod:`lowprec.studies.claims`: QFlash
   Table 4 over five seeds, INT-FlashAttention Tables 1-2, IntAttention Table 9, HCCS KL, BAPS
   Figure 2 and Table 1 ordering);
6. prints the tables (:func:`format_report`), then the summary (BAPS Table 4 on SmolLM2 beside
   the paper, perplexity ratios with intervals grouped by worse / within noise / better) and
   the claims table; writes ``report.json``, ``summary.txt`` and the plots
   (:func:`write_plots`, matplotlib with the Agg backend) to the output folder.

Every part is a :class:`~lowprec.studies.distributed.Plan` of independent units (one scheme
on one workload, one tau, one scheme's perplexity run, ...); ``run_study(group=...)``
(``lowprec study --distributed`` under ``torchrun``) spreads them over processes and rank 0
assembles the same report (:mod:`lowprec.studies.distributed`).

The SmolLM2 part reads *Alice's Adventures in Wonderland* (:func:`lowprec.torch.models.eval_text`):
perplexity over 8 windows of 512 tokens with a bootstrap interval, the BAPS restart table at
2048 tokens with 128 x 128 tiles and the critical set ``first+diagonal`` (tau 0, 1, 2) and its
16 x 16-tile variant (tau 1).  ``lengths=(512, 2048, 4096, 8192)`` runs the full perplexity
study (hours on two cores).  ``quick=True`` shrinks every size (about a minute on two cores
once Numba's cache is warm).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

from ..kernels import attention, scheme_records
from ..stats import inner, norm, sqnr, to_jsonable
from . import baps as _baps
from . import intattention as _ia
from .distributed import SINGLE, Group, Plan, Unit, run_units

DEFAULT_OUT = "lowprec-study"
#: ``--model`` choices: auto = the real models that are installed, else synthetic only.
MODEL_CHOICES = ("auto", "synthetic", "minilm", "smollm2", "all")
_SKIP = ("reference",)  # the oracle every scheme is compared with
#: sizes: name -> (quick, default)
SIZES = {
    "decoder": ({"L": 256, "heads": 8}, {"L": 1024, "heads": 8}),
    "encoder": ({"L": 128, "heads": 6}, {"L": 384, "heads": 12}),
    "restart": ({"L": 512, "heads": 8, "seeds": (0,)}, {"L": 1024, "heads": 16,
                                                         "seeds": (0, 1)}),
}
TAUS = (0, 1, 2, 3)
#: the QFlash Table 1 workload A2 (ViT-S/16 attention: 6 heads, 197 tokens, d = 64)
UNIFORM_SHAPE = (1, 6, 197, 64)
UNIFORM_AMPLITUDE = 4.0


# ----------------------------------------------------------------------------------------
# schemes


def scheme_runs(selected=None) -> dict[str, tuple[str, dict]]:
    """The attention runs of the study: ``{label: (scheme, options)}``.

    Every registered attention scheme except ``reference`` (the oracle) is run with its
    defaults, in the display order of the scheme records; a scheme with ``variants`` once per
    variant: ``baps`` once per configuration (label ``baps/<config>``) and ``intflash`` once
    per variant (``intflash/full``, ``intflash/half``).

    Args:
        selected: None for all, or an iterable of labels and scheme names (a scheme name
            selects all its labels), e.g. ``["flash", "baps/e2e_hif8", "intflash"]``.

    Returns:
        The runs in a stable order.

    Raises:
        ValueError: an unknown name (the message lists the valid ones).

    Example:
        >>> list(scheme_runs(["baps/e2e_hif8", "qflash"]))
        ['baps/e2e_hif8', 'qflash']
    """
    runs: dict[str, tuple[str, dict]] = {}
    for rec in scheme_records():
        name = rec.name
        if name in _SKIP:
            continue
        if rec.variants is not None:
            option, values = rec.variants
            for v in values:
                runs[f"{name}/{v}"] = (name, {option: v})
        else:
            runs[name] = (name, {})
    if selected is None:
        return runs
    if isinstance(selected, str):
        selected = [s for s in selected.split(",") if s.strip()]
    chosen: dict[str, tuple[str, dict]] = {}
    for item in selected:
        item = item.strip()
        hits = [k for k in runs if k == item or runs[k][0] == item]
        if not hits:
            names = sorted(set(runs) | {r[0] for r in runs.values()})
            raise ValueError(f"scheme {item!r} is not one of {', '.join(names)}")
        for k in hits:
            chosen[k] = runs[k]
    if not chosen:
        raise ValueError("no scheme selected")
    return {k: chosen[k] for k in runs if k in chosen}


# ----------------------------------------------------------------------------------------
# workloads


def synthetic_workloads(quick: bool = False, *, seed: int = 0) -> dict:
    """The synthetic attention workloads of the study.

    Args:
        quick: small sizes (see :data:`SIZES`).
        seed: input seed.

    Returns:
        ``{name: {"q", "k", "v": float32 arrays (heads, L, d) or (B, H, L, d), "causal": bool,
        "description": str}}`` for ``decoder``, ``encoder`` and ``uniform``.
    """
    i = 0 if quick else 1
    dec, enc = SIZES["decoder"][i], SIZES["encoder"][i]
    q, k, v, _ = _baps.sink_recency_inputs(dec["L"], heads=dec["heads"], d=64, seed=seed)
    out = {"decoder": {"q": q, "k": k, "v": v, "causal": True,
                       "description": f"causal LM-like heads (sink + recency), "
                                      f"{dec['heads']} heads x {dec['L']} tokens, d = 64"}}
    q, k, v = _ia.workload("structured", enc["heads"], enc["L"], 64, seed=seed)
    out["encoder"] = {"q": q, "k": k, "v": v, "causal": False,
                      "description": f"encoder heads (score std 3, sink), {enc['heads']} heads "
                                     f"x {enc['L']} tokens, d = 64"}
    rng = np.random.default_rng(seed + 1)
    q, k, v = (rng.uniform(-UNIFORM_AMPLITUDE, UNIFORM_AMPLITUDE, UNIFORM_SHAPE)
               .astype(np.float16).astype(np.float32) for _ in range(3))
    out["uniform"] = {"q": q, "k": k, "v": v, "causal": False,
                      "description": f"U(-4, 4) float16 inputs, shape {UNIFORM_SHAPE} "
                                     "(QFlash workload A2)"}
    return out


def accuracy_metrics(out, ref) -> dict:
    """Relative L2 error, cosine similarity, SQNR (dB) and max abs error of ``out`` against
    ``ref`` (float64; non-finite outputs count as infinite error).

    Example:
        >>> m = accuracy_metrics(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
        >>> m["rel_l2"], m["sqnr_db"]
        (0.0, inf)
    """
    a = np.asarray(out, dtype=np.float64).reshape(-1)
    b = np.asarray(ref, dtype=np.float64).reshape(-1)
    finite = bool(np.all(np.isfinite(a)))
    if not finite:
        return {"rel_l2": math.inf, "cos": math.nan, "sqnr_db": -math.inf,
                "max_abs": math.inf, "nonfinite": int(np.count_nonzero(~np.isfinite(a)))}
    d = a - b
    nd, nb = norm(d), norm(b)
    rel = nd / nb
    return {"rel_l2": rel,
            "cos": inner(a, b) / (norm(a) * nb),
            "sqnr_db": sqnr(a, b),
            "max_abs": float(np.max(np.abs(d))) if d.size else 0.0,
            "nonfinite": 0}


def _bar(total: int, desc: str, enabled: bool):
    """A tqdm bar (stderr) or a silent stand-in when tqdm is missing or ``enabled`` is False."""
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc=desc, unit="run", leave=False, file=sys.stderr)
        except ImportError:
            pass

    class _Null:
        def update(self, n=1):
            pass

        def set_postfix_str(self, s):
            pass

        def close(self):
            pass

    return _Null()


def compare_schemes(workloads: dict, runs: dict | None = None, *, progress: bool = False) -> dict:
    """Run every scheme on every workload and compare with float64 attention.

    Args:
        workloads: as :func:`synthetic_workloads`.
        runs: as :func:`scheme_runs` (default: all).
        progress: show a tqdm progress bar.

    Returns:
        ``{"workloads": {name: description}, "rows": {label: {workload: metrics}}}`` where
        metrics are :func:`accuracy_metrics` plus ``seconds`` and, for BAPS, ``restart_rate``
        and ``peak_restart_rate`` (None for the configurations without a restart test); a run
        that raised has ``{"error": message}`` instead.

    Example:
        >>> res = compare_schemes(synthetic_workloads(quick=True), scheme_runs(["flash"]))
        >>> res["rows"]["flash"]["decoder"]["rel_l2"] < 1e-5
        True
    """
    return comparison_plan(workloads, runs).run(progress=progress, desc="schemes")


def comparison_plan(workloads: dict, runs: dict | None = None) -> Plan:
    """:func:`compare_schemes` as a :class:`~lowprec.studies.distributed.Plan`: one unit per
    (workload, run), key ``("synthetic", workload, label)``, workloads outer.  A process
    computes a workload's float64 attention once, at its first unit of that workload."""
    runs = scheme_runs() if runs is None else runs
    refs: dict = {}

    def one(wname: str, scheme: str, opts: dict) -> dict:
        w = workloads[wname]
        q, k, v, causal = w["q"], w["k"], w["v"], w["causal"]
        if wname not in refs:
            refs[wname] = attention(*(a.astype(np.float64) for a in (q, k, v)), "reference",
                                    causal=causal)
        t0 = time.perf_counter()
        try:
            out, st = attention(q, k, v, scheme, causal=causal, return_stats=True, **opts)
        except (ValueError, FloatingPointError, OverflowError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        m = accuracy_metrics(out, refs[wname])
        m["seconds"] = time.perf_counter() - t0
        if scheme == "baps" and hasattr(st, "restart_rate"):
            # None (null in report.json, "-" in the table) where no restart test ran
            m["restart_rate"] = st.restart_rate
            m["peak_restart_rate"] = st.peak_restart_rate
        return m

    def assemble(res: dict) -> dict:
        rows: dict = {label: {} for label in runs}
        for wname in workloads:
            for label in runs:
                rows[label][wname] = res[("synthetic", wname, label)]
        return {"workloads": {n: w["description"] for n, w in workloads.items()},
                "rows": rows}

    units = [Unit(("synthetic", wname, label), partial(one, wname, scheme, opts))
             for wname in workloads for label, (scheme, opts) in runs.items()]
    return Plan(units, assemble)


def restart_sweep(taus=TAUS, *, quick: bool = False, progress: bool = False) -> dict:
    """BAPS ``e2e_hif8`` restart rate against tau on the decoder workload
    (:func:`lowprec.studies.baps.restart_vs_tau` at the study's sizes).

    Returns:
        :func:`~lowprec.studies.baps.restart_vs_tau`'s result, ``per_head`` as lists.
    """
    return restart_plan(taus, quick=quick).run(progress=progress, desc="restart vs tau")


def restart_plan(taus=TAUS, *, quick: bool = False) -> Plan:
    """:func:`restart_sweep` as a :class:`~lowprec.studies.distributed.Plan`: one unit per tau
    (key ``("restart", tau)``) and one for ``naive_e2e`` (``("restart", "naive")``); a process
    builds the inputs and their float64 attention once, at its first unit."""
    sz = SIZES["restart"][0 if quick else 1]
    data: list = []

    def inputs():
        if not data:
            data.extend(_baps.restart_inputs(sz["L"], heads=sz["heads"], seeds=sz["seeds"]))
        return data

    def assemble(res: dict) -> dict:
        out = _baps.restart_result(taus, [res[("restart", t)] for t in taus],
                                   res[("restart", "naive")], L=sz["L"], heads=sz["heads"],
                                   seeds=sz["seeds"], block_k=_baps.RESTART_TILE)
        out["per_head"] = {t: np.asarray(r).tolist() for t, r in out["per_head"].items()}
        return out

    units = [Unit(("restart", t), lambda t=t: _baps.restart_at_tau(t, *inputs()))
             for t in taus]
    units.append(Unit(("restart", "naive"), lambda: _baps.naive_restart_error(*inputs())))
    return Plan(units, assemble)


# ----------------------------------------------------------------------------------------
# real models


def resolve_models(model: str = "auto", *, quick: bool = False) -> list[str]:
    """The real models a study on ``model`` runs.

    Args:
        model: ``auto`` (every installed model; with ``quick`` only the cheapest installed
            one, MiniLM before SmolLM2), ``synthetic`` (none), ``minilm``, ``smollm2`` or
            ``all`` (both; an error if one is missing).
        quick: the study's quick mode.

    Returns:
        Model names (possibly empty).

    Raises:
        ValueError: unknown ``model``.
        ImportError: (``ModelNotInstalledError``) a named model is not installed; the
            message says what to install.
    """
    if model not in MODEL_CHOICES:
        raise ValueError(f"model {model!r} is not one of {', '.join(MODEL_CHOICES)}")
    if model == "synthetic":
        return []
    try:
        from ..torch.models import ModelNotInstalledError, available_models
    except ImportError:  # pragma: no cover - the module is part of lowprec
        if model == "auto":
            return []
        raise
    avail = available_models()
    if model == "auto":
        if quick:
            return [m for m in ("minilm", "smollm2") if avail.get(m)][:1]
        return [m for m in ("smollm2", "minilm") if avail.get(m)]
    wanted = ["smollm2", "minilm"] if model == "all" else [model]
    for m in wanted:
        if not avail.get(m):
            from ..torch.models import MODELS

            raise ModelNotInstalledError(
                f"model {m!r} is not installed (needs {MODELS[m].package}, transformers and "
                f"torch): {MODELS[m].install}; or run `lowprec study --model synthetic`")
    return wanted


#: the perplexity runs of the default study (when no --schemes is given): one run of each
#: pipeline family (10 to 35 s each for 8 windows of 512 tokens on two busy cores); HCCS
#: (three times slower; perplexity 7.9 times float32's) runs with ``--schemes hccs``
PPL_DEFAULT_RUNS = ("baps/e2e_hif8", "baps/naive_e2e", "intflash/full", "qflash",
                    "intattention", "quant_only")
#: the key of each part's time in ``report["seconds"]``, where it is not the part's own key
_TIMING = {"claims_synthetic": "claims"}
#: with the default runs the perplexity also runs IntAttention's Table 5 ablation (EXAQ at 2,
#: 3 and 4 bits, IndexSoftmax alone: :data:`lowprec.studies.intattention.TABLE5_RUNS`), for
#: the claims table
#: model study sizes: (quick, default)
MODEL_SIZES = {
    "perplexity": ({"lengths": (64,), "windows": 2}, {"lengths": (512,), "windows": 8}),
    "restart": ({"tokens": 128, "block": 32}, {"tokens": 2048, "block": 128}),
    # the 16 x 16-tile variant of lowprec.torch.models' docstring, at tau = 1
    "restart_16x16": ({"tokens": 128, "block": 16}, {"tokens": 1024, "block": 16}),
}


def model_study(names: list[str], runs: dict, *, quick: bool = False, taus=(0, 1, 2),
                progress: bool = False, lengths=None, windows=None, all_runs: bool = False,
                critical=None, resample="auto", restart_tokens: int | None = None) -> dict:
    """Run the schemes on real models (:mod:`lowprec.studies.models`).

    SmolLM2: perplexity over windows of the evaluation text under every run, with the ratio to
    float32 and its bootstrap interval (:func:`~lowprec.studies.models.smollm2_perplexity`;
    one result per window length), and the BAPS Table 4 analogue: ``e2e_hif8`` restart rates
    per tau at 2048 tokens with 128 x 128 tiles and the critical set ``first+diagonal``, then
    the 16 x 16-tile variant at tau = 1 (:func:`~lowprec.studies.models.smollm2_restart_rates`),
    and (not quick, ``intattention`` among the runs) IntAttention's quantisation options on
    the model's own attention inputs (:func:`~lowprec.studies.intattention.options_smollm2`).
    MiniLM: cosine similarity of the sentence embeddings under every run
    (:func:`~lowprec.studies.models.minilm_cosine`) and the HCCS KL of heads calibrated on
    MiniLM's own logits (:func:`~lowprec.studies.models.hccs_minilm_kl`, the HCCS paper's
    section V-C on real heads).  A run that fails on a model is recorded with its error; the
    others go on.

    Args:
        names: from :func:`resolve_models`.
        runs: as :func:`scheme_runs`.
        quick: the model studies' small sizes.
        taus: restart thresholds of the SmolLM2 restart study.
        progress: a tqdm bar over the model studies (and transformers' own loading bars);
            False silences both.
        lengths: perplexity window lengths (default 512; quick 64); e.g. ``(512, 2048, 4096,
            8192)`` for the full study.
        windows: perplexity windows per length (default 8; None with ``lengths``: 8).
        all_runs: SmolLM2 perplexity under every run of ``runs``; otherwise only those of
            :data:`PPL_DEFAULT_RUNS` among them (when that leaves none, all of ``runs``) and,
            not quick, the Table 5 runs (``lowprec.studies.intattention.TABLE5_RUNS``) whose
            scheme is among ``runs``.
        critical: the restart study's critical set (default
            :data:`lowprec.studies.models.RESTART_CRITICAL`).
        resample: the perplexity bootstrap unit (``"auto"``, ``"window"`` or a segment length,
            :func:`lowprec.studies.models.resample_unit`).
        restart_tokens: window of the restart study (default 2048; quick 128).

    Returns:
        ``{"smollm2": {"perplexity": ..., "perplexity_<L>": ... (further lengths),
        "restart_rates": ..., "restart_16x16": ..., "intattention_options": ...}, "minilm":
        {"cosine": ..., "hccs_kl": ...}}`` (the models present), each value the model study
        function's result.
    """
    return model_plan(names, runs, quick=quick, taus=taus, progress=progress, lengths=lengths,
                      windows=windows, all_runs=all_runs, critical=critical,
                      resample=resample, restart_tokens=restart_tokens).run(
        progress=progress, desc="models")


def model_plan(names: list[str], runs: dict, *, quick: bool = False, taus=(0, 1, 2),
               progress: bool = False, lengths=None, windows=None, all_runs: bool = False,
               critical=None, resample="auto", restart_tokens: int | None = None) -> Plan:
    """:func:`model_study` as a :class:`~lowprec.studies.distributed.Plan` (same arguments).

    Units (keys): per SmolLM2 window length the float32 run (``("models", "smollm2", key,
    "float32")``) and one per scheme run (``(..., key, label)``; ``key`` is ``perplexity`` or
    ``perplexity_<L>``), the bootstrap intervals being computed when the result is assembled;
    one per tau of the restart study (``("models", "smollm2", "restart_rates", tau)``) and of
    its 16 x 16 variant; per MiniLM scheme run (``("models", "minilm", "cosine", label)``);
    the HCCS calibration (``("models", "minilm", "hccs_kl")``).  A process loads each model
    once (``load_model`` keeps it) and computes the float32 MiniLM embeddings once."""
    from . import models as _models

    if not progress:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
    i = 0 if quick else 1
    pz = MODEL_SIZES["perplexity"][i]
    lengths = tuple(lengths) if lengths else pz["lengths"]
    windows = windows or pz["windows"]
    critical = critical or _models.RESTART_CRITICAL
    ppl_runs = dict(runs)
    have = {s for s, _ in runs.values()}
    if not all_runs:
        ppl_runs = {k: v for k, v in runs.items() if k in PPL_DEFAULT_RUNS} or dict(runs)
        if not quick:
            ppl_runs.update({k: v for k, v in _ia.TABLE5_RUNS.items() if v[0] in have})
    with_baps = any(s == "baps" and o.get("config") == "e2e_hif8" for s, o in runs.values())
    units: list[Unit] = []
    parts: list = []  # (name, key, assemble(results))
    for n in names:
        if n == "smollm2":
            for j, L in enumerate(lengths):
                key = "perplexity" if j == 0 else f"perplexity_{L}"
                where = {"max_tokens": L, "windows": windows}
                pre = ("models", n, key)
                units.append(Unit(pre + ("float32",),
                                  partial(_models.perplexity_float32, **where)))
                units += [Unit(pre + (label,), partial(_models.perplexity_run, scheme, opts,
                                                       **where))
                          for label, (scheme, opts) in ppl_runs.items()]
                parts.append((n, key, lambda res, pre=pre, L=L: _models.perplexity_result(
                    ppl_runs, res[pre + ("float32",)],
                    {label: res[pre + (label,)] for label in ppl_runs}, max_tokens=L,
                    resample=resample)))
            if with_baps:
                for key, ts, size in (("restart_rates", tuple(taus), "restart"),
                                      ("restart_16x16", (1,), "restart_16x16")):
                    rz = MODEL_SIZES[size][i]
                    where = {"max_tokens": restart_tokens or rz["tokens"], "block": rz["block"],
                             "critical": critical}
                    pre = ("models", n, key)
                    units += [Unit(pre + (t,), partial(_models.restart_rates_at, t, **where))
                              for t in ts]
                    parts.append((n, key, lambda res, pre=pre, ts=ts, where=where:
                                  _models.restart_rates_result({t: res[pre + (t,)] for t in ts},
                                                               where)))
            if not quick and "intattention" in have:
                units.append(Unit(("models", n, "intattention_options"),
                                  _ia.options_smollm2))
                parts.append((n, "intattention_options",
                              lambda res, n=n: res[("models", n, "intattention_options")]))
        else:
            sents = _models.minilm_sentences(quick=quick)
            pre = ("models", n, "cosine")
            units += [Unit(pre + (label,), partial(_models.minilm_cosine_run, scheme, opts,
                                                   sents))
                      for label, (scheme, opts) in runs.items()]
            parts.append((n, "cosine", lambda res, pre=pre, sents=sents:
                          _models.minilm_cosine_result(sents, {label: res[pre + (label,)]
                                                               for label in runs})))
            units.append(Unit(("models", n, "hccs_kl"),
                              partial(_models.hccs_minilm_kl, quick=quick)))
            parts.append((n, "hccs_kl", lambda res, n=n: res[("models", n, "hccs_kl")]))

    def assemble(res: dict) -> dict:
        out: dict = {}
        for name, key, build in parts:
            out.setdefault(name, {})[key] = build(res)
        return out

    return Plan(units, assemble)


# ----------------------------------------------------------------------------------------
# the job


def run_study(model: str = "auto", schemes=None, *, quick: bool = False,
              out: str | os.PathLike | None = DEFAULT_OUT, progress: bool = True,
              plots: bool = True, seed: int = 0, echo=print, lengths=None,
              windows: int | None = None, critical=None, resample="auto",
              claims: bool | None = None, restart_tokens: int | None = None,
              group: Group | None = None) -> dict | None:
    """The main job: every scheme on the study's workloads, tables, plots and a JSON report.

    Args:
        model: ``auto`` (installed real models, plus the synthetic workloads; with ``quick``
            only the cheapest one), ``synthetic``, ``minilm``, ``smollm2`` or ``all`` (see
            :func:`resolve_models`).
        schemes: None (all) or labels / scheme names (:func:`scheme_runs`).
        quick: small sizes.
        out: output folder (created); None writes nothing.
        progress: tqdm progress bars on stderr.
        plots: write PNG plots (needs matplotlib; skipped with a note when missing).
        seed: input seed.
        echo: where the tables go (``print``; None for silence).
        lengths: SmolLM2 perplexity window lengths (default 512 tokens; the full study is
            ``(512, 2048, 4096, 8192)``, about an hour per length on two cores).
        windows: perplexity windows per length (default 8).
        critical: the BAPS restart study's critical set (default ``"first+diagonal"``).
        resample: the perplexity bootstrap unit (``"auto"``: windows from 8 on, else segments;
            ``"window"``; or a segment length in tokens).
        restart_tokens: window of the SmolLM2 restart study (default 2048).
        claims: run the synthetic studies of the claims table
            (:func:`lowprec.studies.claims.synthetic_results`, a minute or two); default: not
            with ``quick`` (the table then lists those claims as "not run").
        group: the processes to spread the study over
            (:func:`lowprec.studies.distributed.init`, under ``torchrun``); None: this one.
            The study's independent units (one scheme on one workload, one tau, one scheme's
            perplexity run, ...) are split round-robin over the ranks and their results
            gathered to rank 0, which builds the same report as one process would (only the
            times and ``machine`` differ), prints it and writes the files.

    With ``schemes=None`` the SmolLM2 perplexity runs only :data:`PPL_DEFAULT_RUNS` (one run of
    each pipeline family); naming schemes runs those.

    Returns:
        The report dict (what ``report.json`` holds, with a ``"files"`` list); None on the
        ranks other than 0.  ``report["seconds"]``: ``compile`` and ``total`` are wall times,
        ``synthetic``, ``restart``, ``models`` and ``claims`` the sums of their units' times
        (over every rank).

    Before any work the output folder is checked (created, and a file written in it) and the
    selected schemes' Numba kernels are compiled or loaded from the disk cache
    (:func:`lowprec.compile.compile_kernels`, with a progress bar; seconds when cached).

    Raises:
        ValueError: unknown model or scheme name; ``out`` not a writable folder.
        ModelNotInstalledError: a named real model is not installed.

    Example:
        >>> rep = run_study("synthetic", ["flash"], quick=True, out=None, progress=False,
        ...                 echo=None)
        >>> sorted(rep["synthetic"]["rows"]["flash"])
        ['decoder', 'encoder', 'uniform']
    """
    from ..cli import check_output_dir
    from ..compile import compile_kernels

    group = SINGLE if group is None else group
    t_start = time.perf_counter()
    runs = scheme_runs(schemes)
    models = resolve_models(model, quick=quick)
    if out is not None and group.main:
        check_output_dir(out, "out")
    say = (echo or (lambda *a, **k: None)) if group.main else (lambda *a, **k: None)
    progress = progress and group.main
    with_claims = (not quick) if claims is None else claims
    report: dict = {
        "lowprec_study": 1,
        "settings": {"model": model, "models": models, "schemes": list(runs), "quick": quick,
                     "seed": seed, "lengths": list(lengths) if lengths else None,
                     "windows": windows, "critical": critical, "resample": resample,
                     "restart_tokens": restart_tokens},
        "machine": {**_machine(), "processes": group.size},
        "runs": {k: {"scheme": s, "options": o} for k, (s, o) in runs.items()},
    }
    parts = {"synthetic": comparison_plan(synthetic_workloads(quick, seed=seed), runs)}
    if any(s == "baps" and o.get("config") == "e2e_hif8" for s, o in runs.values()):
        parts["restart"] = restart_plan(TAUS, quick=quick)
    if models:
        parts["models"] = model_plan(models, runs, quick=quick, progress=progress,
                                     lengths=lengths, windows=windows,
                                     all_runs=schemes is not None, critical=critical,
                                     resample=resample, restart_tokens=restart_tokens)
    if with_claims:
        from . import claims as _claims

        parts["claims_synthetic"] = _claims.synthetic_plan(quick=quick)
    units = [u for plan in parts.values() for u in plan.units]
    say(f"lowprec study: {len(runs)} scheme runs, workloads decoder/encoder/uniform"
        f"{', models ' + ', '.join(models) if models else ' (synthetic only)'}"
        f"{', the claims studies' if with_claims else ''}{', quick' if quick else ''}: "
        f"{len(units)} units" + (f" over {group.size} processes" if group.size > 1 else ""))
    timings = {}
    t0 = time.perf_counter()
    if not group.main:  # rank 0 compiles; the others then load its kernels from the disk cache
        group.barrier()
    compiled = compile_kernels(list(runs), [], progress=progress)
    if group.main:
        group.barrier()
    timings["compile"] = time.perf_counter() - t0
    if compiled["compiled"]:
        say(f"compiled {compiled['compiled']} Numba kernels in {timings['compile']:.0f} s "
            "(cached for later runs)")
    if models:
        say(f"running the schemes on {', '.join(models)} (loading the models may take a "
            "minute)")
    unit_seconds: dict = {}
    results = run_units(units, group, progress=progress, desc="study", seconds=unit_seconds)
    if results is None:
        return None
    for name, plan in parts.items():
        report[name] = plan.assemble(results)
        timings[_TIMING.get(name, name)] = sum(unit_seconds[u.key] for u in plan.units)
    timings["total"] = time.perf_counter() - t_start
    report["seconds"] = timings
    text = format_report(report)
    say(text)
    files: list[str] = []
    if out is not None:
        outdir = Path(out)
        outdir.mkdir(parents=True, exist_ok=True)
        if plots:
            try:
                files += write_plots(report, outdir)
            except ImportError as e:
                say(f"plots skipped: {e} (pip install matplotlib)")
        (outdir / "summary.txt").write_text(text + "\n", encoding="utf-8")
        files.append(str(outdir / "summary.txt"))
        report["files"] = files + [str(outdir / "report.json")]
        (outdir / "report.json").write_text(json.dumps(to_jsonable(report), indent=1),
                                            encoding="utf-8")
        say(f"\nwrote {len(report['files'])} files to {outdir}/: "
            + ", ".join(Path(f).name for f in report["files"]))
    say(f"study took {timings['total']:.0f} s")
    return report


def _machine() -> dict:
    import numba

    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "numpy": np.__version__, "numba": numba.__version__,
            "numba_threads": numba.get_num_threads()}


# ----------------------------------------------------------------------------------------
# tables


def _cell(m: dict, key: str, spec: str, width: int) -> str:
    if "error" in m:
        return f"{'failed':>{width}}"
    v = m.get(key)
    if v is None:
        return f"{'-':>{width}}"
    return f"{format(v, spec):>{width}}"


def format_accuracy(res: dict) -> str:
    """The accuracy table of :func:`compare_schemes`: one row per scheme run, per workload the
    relative L2 error (%) and SQNR (dB); BAPS restart rates (ARR) on the decoder workload
    (``-`` where the run has no restart test: the other schemes, BAPS configurations other
    than ``e2e_hif8``)."""
    wls = list(res["workloads"])
    head = f"{'scheme':<24}" + "".join(f"{w + ' err%':>14}{'dB':>7}" for w in wls) + \
        f"{'ARR':>7}"
    lines = ["accuracy vs float64 attention (rel. L2 error in %, SQNR in dB; ARR = BAPS "
             "restart rate on the decoder workload)"]
    lines += [f"  {w}: {d}" for w, d in res["workloads"].items()]
    lines += [head, "-" * len(head)]
    for label, per in res["rows"].items():
        cells = ""
        for w in wls:
            m = per.get(w, {})
            pct = dict(m)
            if "rel_l2" in m:
                pct["rel_l2"] = 100 * m["rel_l2"]
            cells += _cell(pct, "rel_l2", ".3f", 14) + _cell(m, "sqnr_db", ".1f", 7)
        arr = _cell(per.get("decoder", {}), "restart_rate", ".3f", 7)
        lines.append(f"{label:<24}{cells}{arr}")
    errs = [f"  {label} on {w}: {m['error']}" for label, per in res["rows"].items()
            for w, m in per.items() if "error" in m]
    if errs:
        lines += ["failed runs:"] + errs
    return "\n".join(lines)


def format_report(report: dict) -> str:
    """Every table of a :func:`run_study` report, as printed by ``lowprec study``, then the
    summary (:func:`format_summary`) and the claims table
    (:func:`lowprec.studies.claims.format_claims`)."""
    from . import claims as _claims

    parts = [format_accuracy(report["synthetic"])]
    if "restart" in report:
        parts.append(_baps.format_restart_vs_tau(report["restart"]))
    for name, r in report.get("models", {}).items():
        parts.append(_format_model(name, r))
    parts.append(format_summary(report))
    parts.append(_claims.format_claims(_claims.claims_from_report(report)))
    return "\n\n".join(parts)


def _model_key(key: str) -> str:
    """The result kind of a model-study key: ``perplexity_2048`` -> ``perplexity``,
    ``restart_16x16`` -> ``restart_rates``."""
    if key.startswith("perplexity"):
        return "perplexity"
    if key.startswith("restart"):
        return "restart_rates"
    return key


def _format_model(name: str, r: dict) -> str:
    from . import models as _models

    out = []
    for key, val in r.items():
        special = {("minilm", "hccs_kl"): _models.format_hccs_minilm_kl,
                   ("smollm2", "intattention_options"): _ia.format_options_smollm2}
        fn = special.get((name, key)) or getattr(_models, f"format_{name}_{_model_key(key)}",
                                                 None)
        out.append(fn(val) if fn else f"{name} {key}: {json.dumps(to_jsonable(val))[:2000]}")
    return "\n\n".join(out)


def format_summary(report: dict) -> str:
    """The study's summary: the BAPS Table 4 analogue on SmolLM2 (ARR and PRR per tau beside
    the paper's) and, per perplexity window length, every run's ratio to float32 with its
    interval, grouped as worse than float32, within noise (the interval contains 1) and better
    than float32 beyond the interval.  Without SmolLM2 results: the synthetic restart sweep."""
    from . import models as _models

    lines = ["SUMMARY"]
    sm = report.get("models", {}).get("smollm2", {})
    if "restart_rates" in sm:
        lines.append(_models.format_restart_table(sm["restart_rates"]))
        if "restart_16x16" in sm:
            r16 = sm["restart_16x16"]
            t = next(iter(r16["taus"]))
            v = r16["taus"][t]
            lines.append(f"16x16 tiles ({r16['tokens']} tokens, tau = {t}): ARR "
                         f"{_models._pct(v['arr'])} %, PRR {_models._pct(v['prr'])} %, "
                         f"restarted share of all tiles {_models._pct(v['tile_share'])} %")
    elif "restart" in report:
        r = report["restart"]
        lines.append("BAPS restarts on synthetic sink + recency heads: ARR "
                     + ", ".join(f"tau={t}: {100 * a:.2f} %" for t, a in
                                 zip(r["taus"], r["arr"], strict=True) if a is not None))
    for key, res in sm.items():
        if not key.startswith("perplexity"):
            continue
        rows = {k: v for k, v in res["schemes"].items() if "ratio" in v}
        lines.append(f"SmolLM2 perplexity ratio to float32 ({res['windows']} x {res['tokens']} "
                     f"tokens, {100 * res['confidence']:.0f} % interval):")
        for verdict in ("worse", "within noise", "better"):
            grp = [k for k, v in rows.items() if v["verdict"] == verdict]
            if grp:
                lines.append(f"  {verdict}: " + ", ".join(
                    f"{k} {rows[k]['ratio']:.4f} [{rows[k]['ratio_ci'][0]:.4f}, "
                    f"{rows[k]['ratio_ci'][1]:.4f}]" for k in grp))
        failed = [k for k, v in res["schemes"].items() if "error" in v]
        if failed:
            lines.append("  failed: " + ", ".join(failed))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# plots


def write_plots(report: dict, outdir: str | os.PathLike) -> list[str]:
    """Write the study's plots (PNG, matplotlib Agg backend) to ``outdir``.

    Plots: ``accuracy.png`` (relative error of every scheme per workload, log scale),
    ``restart_vs_tau.png`` (ARR and PRR against tau next to the paper's Table 4 ARR),
    ``restart_per_head.png`` (per-head restart rates per tau, the Figure 4 analogue) and, with
    real models, one plot per model metric.

    Returns:
        The paths written.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline."
                                                "backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    files = []
    fig = plot_accuracy(report["synthetic"])
    files.append(_save(fig, outdir / "accuracy.png", plt))
    if "restart" in report:
        fig = plot_restart_vs_tau(report["restart"])
        files.append(_save(fig, outdir / "restart_vs_tau.png", plt))
        fig = plot_rate_histograms(report["restart"]["per_head"])
        files.append(_save(fig, outdir / "restart_per_head.png", plt))
    for name, r in report.get("models", {}).items():
        for key, val in r.items():
            fig = _plot_model(name, key, val)
            if fig is not None:
                files.append(_save(fig, outdir / f"{name}_{key}.png", plt))
    return files


def _save(fig, path: Path, plt) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def _axes(ax, figsize):
    """``(figure, axes)``: the given Axes and its figure, or a new figure of ``figsize``."""
    import matplotlib.pyplot as plt

    if ax is None:
        return plt.subplots(figsize=figsize)
    return ax.figure, ax


def plot_accuracy(res: dict, ax=None):
    """Horizontal bars: relative L2 error (log scale) of each scheme run on each workload.

    Args:
        res: :func:`compare_schemes` result.
        ax: a matplotlib Axes (default: a new figure).

    Returns:
        The matplotlib Figure.
    """

    labels = list(res["rows"])
    wls = list(res["workloads"])
    fig, ax = _axes(ax, (8, 0.32 * len(labels) * len(wls) / 2 + 1.5))
    h = 0.8 / len(wls)
    y = np.arange(len(labels))
    for i, w in enumerate(wls):
        vals = [res["rows"][lab].get(w, {}).get("rel_l2", np.nan) for lab in labels]
        vals = [v if (v is not None and math.isfinite(v) and v > 0) else np.nan for v in vals]
        ax.barh(y + (i - (len(wls) - 1) / 2) * h, vals, height=h, label=w)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("relative L2 error vs float64 attention")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(title="workload", fontsize=8)
    ax.set_title("Attention schemes: output error")
    return fig


def plot_restart_vs_tau(res: dict, ax=None):
    """ARR and PRR of ``e2e_hif8`` against tau, with the paper's Table 4 (NLP) ARR.

    Args:
        res: :func:`restart_sweep` (or :func:`lowprec.studies.baps.restart_vs_tau`) result.
        ax: a matplotlib Axes (default: a new figure).

    Returns:
        The matplotlib Figure.
    """

    fig, ax = _axes(ax, (5, 3.5))
    taus = res["taus"]
    ax.plot(taus, res["arr"], "o-", label="ARR (ours)")
    ax.plot(taus, res["prr"], "s--", label="PRR (ours)")
    pt = [t for t in taus if t in _baps.PAPER_ARR_NLP]
    ax.plot(pt, [_baps.PAPER_ARR_NLP[t] for t in pt], "k^", label="ARR, paper Table 4 (NLP)")
    ax.set_yscale("log")
    ax.set_xlabel("tau")
    ax.set_ylabel("restart rate")
    ax.set_xticks(taus)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("BAPS e2e_hif8 restarts")
    return fig


def plot_rate_histograms(per_head: dict, ax=None):
    """Per-head (or per-call) restart-rate histograms on [0, 1], one line per tau (the BAPS
    Figure 4 analogue).

    Args:
        per_head: ``{tau: rates}``.
        ax: a matplotlib Axes (default: a new figure).

    Returns:
        The matplotlib Figure.
    """

    fig, ax = _axes(ax, (5, 3.5))
    edges = np.linspace(0, 1, 21)
    for tau, rates in per_head.items():
        r = np.asarray(rates, np.float64)
        if r.size:
            ax.hist(r, bins=edges, weights=np.full(r.size, 1.0 / r.size), histtype="step",
                    linewidth=1.5, label=f"tau = {tau}")
    ax.set_xlabel("restart rate of one head")
    ax.set_ylabel("fraction of heads")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("Distribution of per-head restart rates")
    return fig


def _plot_model(name: str, key: str, val):
    """The plot of one real-model result (None when there is none for it)."""
    fn = {("smollm2", "perplexity"): plot_perplexity, ("minilm", "cosine"): plot_cosine,
          ("smollm2", "restart_rates"): plot_model_restarts}.get((name, _model_key(key)))
    return fn(val) if fn else None


def plot_perplexity(res: dict, ax=None):
    """Perplexity ratio (scheme / float32) of each run on SmolLM2, log scale, with the
    bootstrap interval as error bars (grey bars: within noise).

    Args:
        res: :func:`lowprec.studies.models.smollm2_perplexity` result.
        ax: a matplotlib Axes (default: a new figure).

    Returns:
        The matplotlib Figure.
    """

    rows = {k: r for k, r in res["schemes"].items() if "ppl" in r and math.isfinite(r["ppl"])}
    fig, ax = _axes(ax, (7, 0.3 * len(rows) + 1.2))
    labels = list(rows)
    y = np.arange(len(labels))
    mid = np.array([rows[k]["ratio"] - 1 for k in labels])
    ci = np.array([rows[k].get("ratio_ci", [rows[k]["ratio"]] * 2) for k in labels]) - 1
    noise = [rows[k].get("verdict") == "within noise" for k in labels]
    ax.barh(y, mid, color=["0.7" if n else "C0" for n in noise])
    ax.errorbar(mid, y, xerr=np.abs(ci.T - mid), fmt="none", ecolor="k", capsize=2, lw=1)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel(f"perplexity / float32 perplexity - 1 (float32: {res['float32']:.3f}); "
                  "grey: within noise")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"SmolLM2-135M, {res.get('windows', 1)} x {res['tokens']} tokens")
    return fig


def plot_cosine(res: dict, ax=None):
    """``1 - cosine`` (worst sentence) of MiniLM embeddings under each run, log scale.

    Args:
        res: :func:`lowprec.studies.models.minilm_cosine` result.
        ax: a matplotlib Axes (default: a new figure).

    Returns:
        The matplotlib Figure.
    """

    rows = {k: r for k, r in res["schemes"].items() if "cos_min" in r}
    fig, ax = _axes(ax, (7, 0.3 * len(rows) + 1.2))
    labels = list(rows)
    vals = [max(1.0 - rows[k]["cos_min"], 1e-12) for k in labels]
    ax.barh(np.arange(len(labels)), vals)
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("1 - cosine similarity to float32 (worst sentence)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"MiniLM embeddings, {res['sentences']} sentences")
    return fig


def plot_model_restarts(res: dict):
    """SmolLM2 restart study in three panels: ARR and PRR against tau (with the paper's Table
    4), the restart rate per layer and head for one tau (heatmap), and the distribution of
    per-call rates for each tau (the BAPS Figure 4 analogue).

    Args:
        res: :func:`lowprec.studies.models.smollm2_restart_rates` result.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    taus = list(res["taus"])
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    a.plot(taus, [res["taus"][t]["arr"] for t in taus], "o-", label="ARR (ours)")
    a.plot(taus, [res["taus"][t]["prr"] for t in taus], "s--", label="PRR (ours)")
    pt = [t for t in taus if t in _baps.PAPER_ARR_NLP]
    a.plot(pt, [_baps.PAPER_ARR_NLP[t] for t in pt], "k^", label="ARR, paper Table 4 (NLP)")
    a.set_yscale("log")
    a.set_xticks(taus)
    a.set_xlabel("tau")
    a.set_ylabel("restart rate")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    a.set_title(f"SmolLM2, {res['tokens']} tokens, {res['block']}x{res['block']} tiles")
    t_map = 1 if 1 in res["taus"] else taus[0]
    ph = np.asarray(res["taus"][t_map]["per_head"], dtype=float)
    im = b.imshow(ph.T, aspect="auto", origin="lower", cmap="magma", vmin=0,
                  vmax=max(1e-9, float(np.nanmax(ph)) if np.isfinite(ph).any() else 1.0))
    b.set_xlabel("layer")
    b.set_ylabel("head")
    b.set_title(f"restart rate per layer and head, tau = {t_map}")
    fig.colorbar(im, ax=b)
    edges = np.linspace(0, 1, 21)
    for t in taus:
        r = np.asarray(res["taus"][t]["per_call"], dtype=float)
        r = r[np.isfinite(r)]
        if r.size:
            c.hist(r, bins=edges, weights=np.full(r.size, 1.0 / r.size), histtype="step",
                   linewidth=1.5, label=f"tau = {t}")
    c.set_xlabel("restart rate of one call (one layer)")
    c.set_ylabel("fraction of calls")
    c.grid(alpha=0.3)
    c.legend(fontsize=8)
    c.set_title("per-call distribution (Figure 4 analogue)")
    fig.tight_layout()
    return fig


__all__ = ["run_study", "scheme_runs", "synthetic_workloads", "compare_schemes",
           "comparison_plan", "restart_sweep", "restart_plan", "resolve_models", "model_study",
           "model_plan", "accuracy_metrics",
           "format_accuracy", "format_report", "format_summary", "write_plots", "plot_accuracy",
           "plot_restart_vs_tau", "plot_rate_histograms", "plot_perplexity", "plot_cosine",
           "plot_model_restarts", "to_jsonable", "DEFAULT_OUT",
           "MODEL_CHOICES", "TAUS", "PPL_DEFAULT_RUNS", "MODEL_SIZES"]
