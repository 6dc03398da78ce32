"""BAPS studies: error accumulation over sequence length and restart rate against tau.

Two experiments of the BAPS paper (``../shared/seeds/baps.txt``), on synthetic inputs built so
that the effect under study is present (specs/attention.md sections 2 and 10):

* :func:`error_accumulation` - the analogue of Figure 2.  Keys are arranged so that the running
  row maximum grows a little in *every* key tile.  With a non-integer running max
  (``exp2_hif8``) every rescale factor ``alpha = 2**(m_old - m_new)`` is rounded to HiF8 and the
  old contributions are mis-weighted tile after tile, so the error grows with the sequence
  length; with the integer max of ``e2e_hif8`` every ``alpha`` is an exact power of two and the
  error stays bounded; ``default`` (float32 softmax) is the floor.
* :func:`restart_vs_tau` - the analogue of Table 4 and Figure 4: causal heads with an attention
  sink at key 0 and a recency bump that competes with it; restart rate (ARR, PRR and the
  per-head rates) of ``e2e_hif8`` for tau = 0, 1, 2, 3.

Both return plain data (dicts of lists / numpy arrays); ``format_*`` turn them into the printed
tables the notebooks and the CLI show.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import attention
from ..kernels.problem import LOG2E
from ..stats import norm

#: What the paper reports (Table 4, NLP models, CWE-32K): ARR and PRR for tau = 0, 1, 2.
PAPER_ARR_NLP = {0: 0.1086, 1: 0.0497, 2: 0.0250}
PAPER_PRR_NLP = {0: 0.9667, 1: 0.9130, 2: 0.8750}
#: The paper's introduction: restarts are needed in "only 5 % of cases in NLP".
PAPER_RESTART_SHARE_NLP = 0.05
ERROR_CONFIGS = ("default", "exp2_hif8", "e2e_hif8")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: tile size (block_q = block_k) of the synthetic restart sweep (:func:`restart_vs_tau`)
RESTART_TILE = 64


def growing_max_inputs(L: int, *, Lq: int = 32, d: int = 64, heads: int = 2,
                       growth: float = 0.02, block_k: int = 128, noise: float = 0.05,
                       seed: int = 0):
    """Inputs whose attention row maximum grows in every key tile.

    The scores of every query (base-2 units, ``S2 = q.k * scale * log2(e)``) are a linear
    trend of ``growth`` per ``block_k`` keys plus Gaussian noise of standard deviation
    ``noise``; values are standard normal.  Non-causal: all ``Lq`` queries see all ``L`` keys.

    Returns:
        ``(q, k, v)`` float32 of shapes ``(heads, Lq, d)``, ``(heads, L, d)``, ``(heads, L, d)``.
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(d)
    # dim 0 carries the trend: q[., 0] = 1, k[j, 0] = slope * j (in natural-score units)
    slope = growth / block_k / (scale * LOG2E)
    q = np.zeros((heads, Lq, d), dtype=np.float64)
    k = np.zeros((heads, L, d), dtype=np.float64)
    q[:, :, 0] = 1.0
    k[:, :, 0] = slope * np.arange(L)
    # the other dims give per-(query, key) noise of std `noise` (base 2)
    sigma = _noise_sigma(noise, scale, d - 1)
    q[:, :, 1:] = rng.standard_normal((heads, Lq, d - 1)) * sigma
    k[:, :, 1:] = rng.standard_normal((heads, L, d - 1)) * sigma
    v = rng.standard_normal((heads, L, d))
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def _noise_sigma(noise: float, scale: float, n: int) -> float:
    """Entry std of ``n``-dim Gaussian q and k parts whose product has std ``noise`` in base-2
    score units (``std(q.k) = sigma**2 sqrt(n)``)."""
    return math.sqrt(noise / (scale * LOG2E * math.sqrt(max(n, 1))))


def relative_error(out, ref) -> float:
    """Frobenius relative error ``||out - ref|| / ||ref||`` in float64 (sums without BLAS:
    :func:`lowprec.stats.norm`)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return norm(out - ref) / norm(ref)


def error_accumulation(lengths=LENGTHS, configs=ERROR_CONFIGS, *, Lq: int = 32, d: int = 64,
                       heads: int = 2, growth: float = 0.02, noise: float = 0.05,
                       block_q: int = 64, block_k: int = 128, seeds=(0,),
                       progress=None) -> dict:
    """Relative error against float64 attention, per BAPS config and sequence length.

    Args:
        lengths: key sequence lengths (the paper's Figure 2 x-axis).
        configs: BAPS configurations to compare (inputs are rounded to bf16 in every one).
        Lq, d, heads, growth, noise, block_k: see :func:`growing_max_inputs`.
        block_q: query tile size.
        seeds: one input draw per seed; errors are averaged over seeds.
        progress: optional callable ``progress(done, total)``.

    Returns:
        ``{"lengths": [...], "errors": {config: [mean rel. error per length]}, ...}``; the
        reference is float64 attention on the bf16-rounded inputs, so the figure isolates the
        softmax pipeline.
    """
    import ml_dtypes

    errors = {c: [] for c in configs}
    total, done = len(lengths) * len(seeds), 0
    for L in lengths:
        acc = {c: 0.0 for c in configs}
        for seed in seeds:
            q, k, v = growing_max_inputs(L, Lq=Lq, d=d, heads=heads, growth=growth,
                                         noise=noise, block_k=block_k, seed=seed)
            q, k, v = (a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in (q, k, v))
            ref = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            "reference")
            for c in configs:
                out = attention(q, k, v, "baps", config=c, block_q=block_q, block_k=block_k)
                acc[c] += relative_error(out, ref)
            done += 1
            if progress is not None:
                progress(done, total)
        for c in configs:
            errors[c].append(acc[c] / len(seeds))
    return {"lengths": list(lengths), "errors": errors, "growth": growth, "noise": noise,
            "block_k": block_k,
            "Lq": Lq, "d": d, "heads": heads, "seeds": list(seeds)}


def format_error_accumulation(res: dict) -> str:
    """The table of :func:`error_accumulation` with the paper's qualitative claim."""
    cfgs = list(res["errors"])
    lines = ["relative error vs float64 attention (running max grows "
             f"{res['growth']} log2-units per {res['block_k']}-key tile)",
             f"{'L':>7} " + " ".join(f"{c:>12}" for c in cfgs)]
    for i, L in enumerate(res["lengths"]):
        lines.append(f"{L:>7} " + " ".join(f"{res['errors'][c][i]:>12.3e}" for c in cfgs))
    lines.append("paper (Figure 2): non-integer alpha in HiF8 accumulates error with length; "
                 "integer powers of two stay bounded")
    return "\n".join(lines)


def sink_recency_inputs(L: int = 1024, *, heads: int = 8, d: int = 64, sink=(3.0, 10.0),
                        recency=(2.0, 10.0), width: float = 16.0, noise: float = 1.0,
                        seed: int = 0):
    """Causal attention heads with an attention sink and a competing recency bump.

    In base-2 score units, head ``h`` has score ``sink_h`` on key 0 (for every query), a
    recency term ``rec_h * exp(-(i - j) / width)`` built from rotary-like features (so it is a
    real ``q.k`` product, not an additive mask) and Gaussian content noise of std ``noise``.
    ``sink_h`` and ``rec_h`` are drawn uniformly from the given ranges, so some heads are
    sink-dominated (few restarts with ``critical="first"``) and some recency-dominated.

    Returns:
        ``(q, k, v)`` float32 of shapes ``(heads, L, d)`` and the per-head ``(sink, rec)``.
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(d)
    unit = 1.0 / (scale * LOG2E)  # natural q.k per base-2 score unit
    nf = (d - 2) // 4  # rotary frequency pairs; the rest of the dims carry noise
    s_h = rng.uniform(*sink, size=heads)
    r_h = rng.uniform(*recency, size=heads)
    pos = np.arange(L, dtype=np.float64)
    q = np.zeros((heads, L, d))
    k = np.zeros((heads, L, d))
    # sink: dim 0 (q = 1, k[0] = sink); dim 1 stays zero
    q[:, :, 0] = 1.0
    k[:, 0, 0] = s_h * unit
    # recency: sum_f w_f cos(omega_f (i - j)) approximates a bump of the given width
    omegas = np.sort(rng.uniform(0.0, 4 * math.pi / width, nf))  # quasi-periodic, no repeats
    w = np.exp(-0.5 * (omegas * width / 2) ** 2)
    w = w / w.sum()
    for f, (om, wf) in enumerate(zip(omegas, w, strict=True)):
        a, b = 2 + 2 * f, 3 + 2 * f
        c = np.sqrt(wf * unit)
        q[:, :, a] = c * np.cos(om * pos)
        q[:, :, b] = c * np.sin(om * pos)
        k[:, :, a] = c * np.cos(om * pos)
        k[:, :, b] = c * np.sin(om * pos)
    k[:, :, 2:2 + 2 * nf] *= r_h[:, None, None]
    rest = 2 + 2 * nf
    sigma = _noise_sigma(noise, scale, d - rest)
    q[:, :, rest:] = rng.standard_normal((heads, L, d - rest)) * sigma
    k[:, :, rest:] = rng.standard_normal((heads, L, d - rest)) * sigma
    v = rng.standard_normal((heads, L, d))
    return (q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
            np.stack([s_h, r_h], axis=1))


def restart_vs_tau(taus=(0, 1, 2, 3), *, L: int = 1024, heads: int = 16, d: int = 64,
                   block_q: int = RESTART_TILE, block_k: int = RESTART_TILE, seeds=(0, 1),
                   critical="first", compare=True, progress=None) -> dict:
    """Restart statistics of ``e2e_hif8`` against tau on sink + recency workloads.

    Args:
        taus: restart thresholds.
        L, heads, d: workload size per seed (see :func:`sink_recency_inputs`); causal.
        block_q, block_k: tile sizes.
        seeds: one call per seed (each call has ``heads`` entries).
        critical: the critical tile set.
        compare: also report the relative error of ``e2e_hif8`` and ``naive_e2e`` against
            float64 attention.

    Returns:
        ``{"taus", "arr", "prr", "per_head": {tau: rates array}, "error": {tau: rel. error},
        "naive_error": float}`` (errors only with ``compare``).

    The pieces (:func:`restart_inputs`, :func:`restart_at_tau`, :func:`naive_restart_error`,
    :func:`restart_result`) are the units ``lowprec study`` spreads over processes.
    """
    inputs, refs = restart_inputs(L, heads=heads, d=d, seeds=seeds, compare=compare)
    total = len(taus) * len(seeds)
    per_tau = []
    for j, tau in enumerate(taus):
        per_tau.append(restart_at_tau(tau, inputs, refs, block_q=block_q, block_k=block_k,
                                      critical=critical))
        if progress is not None:
            progress((j + 1) * len(seeds), total)
    naive = naive_restart_error(inputs, refs, block_q=block_q, block_k=block_k) \
        if compare else None
    return restart_result(taus, per_tau, naive, L=L, heads=heads, seeds=seeds, block_k=block_k)


def restart_inputs(L: int, *, heads: int, d: int = 64, seeds=(0, 1), compare=True):
    """``(inputs, refs)`` of :func:`restart_vs_tau`: ``(q, k, v)`` per seed and their float64
    attention (None without ``compare``)."""
    inputs = [sink_recency_inputs(L, heads=heads, d=d, seed=s)[:3] for s in seeds]
    refs = ([attention(*(a.astype(np.float64) for a in x), "reference", causal=True)
             for x in inputs] if compare else None)
    return inputs, refs


def restart_at_tau(tau, inputs, refs, *, block_q: int = RESTART_TILE,
                   block_k: int = RESTART_TILE, critical="first") -> dict:
    """One tau of :func:`restart_vs_tau`: ``{"arr", "prr", "per_head"}`` over the calls of
    ``inputs`` and, with ``refs``, ``"error"`` (mean relative error against them)."""
    st, e = 0, 0.0
    for i, (q, k, v) in enumerate(inputs):
        out, s = attention(q, k, v, "baps", config="e2e_hif8", tau=tau, causal=True,
                           critical=critical, block_q=block_q, block_k=block_k,
                           return_stats=True)
        st = s + st
        if refs is not None:
            e += relative_error(out, refs[i])
    res = {"arr": st.restart_rate, "prr": st.peak_restart_rate, "per_head": st.rates()}
    if refs is not None:
        res["error"] = e / len(inputs)
    return res


def naive_restart_error(inputs, refs, *, block_q: int = RESTART_TILE,
                        block_k: int = RESTART_TILE) -> float:
    """Mean relative error of ``naive_e2e`` (no restart) against ``refs`` over ``inputs``."""
    naive = 0.0
    for i, (q, k, v) in enumerate(inputs):
        out = attention(q, k, v, "baps", config="naive_e2e", causal=True, block_q=block_q,
                        block_k=block_k)
        naive += relative_error(out, refs[i])
    return naive / len(inputs)


def restart_result(taus, per_tau: list, naive: float | None, *, L: int, heads: int, seeds,
                   block_k: int) -> dict:
    """:func:`restart_vs_tau`'s result from :func:`restart_at_tau` of each tau (in order) and
    :func:`naive_restart_error` (None without the comparison)."""
    res = {"taus": list(taus), "arr": [r["arr"] for r in per_tau],
           "prr": [r["prr"] for r in per_tau],
           "per_head": {t: r["per_head"] for t, r in zip(taus, per_tau, strict=True)},
           "L": L, "heads": heads, "seeds": list(seeds), "block_k": block_k}
    if naive is not None:
        res["error"] = {t: r["error"] for t, r in zip(taus, per_tau, strict=True)}
        res["naive_error"] = naive
    return res


def rate_histogram(rates, bins: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Histogram (counts, edges) of per-head restart rates on [0, 1] (the paper's Figure 4)."""
    return np.histogram(np.asarray(rates, dtype=np.float64), bins=bins, range=(0.0, 1.0))


def format_restart_vs_tau(res: dict) -> str:
    """The table of :func:`restart_vs_tau` next to the paper's Table 4 (NLP) figures."""
    lines = [f"e2e_hif8 restart rates, causal sink+recency heads (L={res['L']}, "
             f"{res['heads']} heads x {len(res['seeds'])} calls, block_k={res['block_k']})",
             f"{'tau':>4} {'ARR':>8} {'PRR':>8} {'paper ARR':>10} {'rel.err':>9}"]
    for i, tau in enumerate(res["taus"]):
        paper = PAPER_ARR_NLP.get(tau)
        p = f"{paper:>10.3f}" if paper is not None else f"{'-':>10}"
        e = f"{res['error'][tau]:>9.4f}" if "error" in res else ""
        arr, prr = (f"{'-':>8}" if r is None else f"{r:>8.3f}"  # None: no restart test ran
                    for r in (res["arr"][i], res["prr"][i]))
        lines.append(f"{tau:>4} {arr} {prr} {p} {e}")
    if "naive_error" in res:
        lines.append(f"naive_e2e rel.err {res['naive_error']:.4f}")
    for tau in res["taus"]:
        counts, _ = rate_histogram(res["per_head"][tau])
        lines.append(f"tau={tau} per-head rate histogram (10 bins on [0,1]): "
                     + " ".join(str(int(c)) for c in counts))
    lines.append("paper (Table 4): ARR roughly halves per unit of tau")
    return "\n".join(lines)


__all__ = ["error_accumulation", "format_error_accumulation", "growing_max_inputs",
           "restart_vs_tau", "restart_inputs", "restart_at_tau", "naive_restart_error",
           "restart_result", "format_restart_vs_tau", "sink_recency_inputs", "rate_histogram",
           "relative_error", "RESTART_TILE", "PAPER_ARR_NLP", "PAPER_PRR_NLP",
           "PAPER_RESTART_SHARE_NLP"]
