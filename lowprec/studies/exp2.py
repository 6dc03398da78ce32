"""BAPS Table 1 analogue: the exp2 output format of the softmax, compared at long context.

The BAPS paper (seed ``baps.txt``, section 4.2, Table 1) compares the FP8 formats used for the
softmax exponentials on RULER's common-word-extraction task at 32K to 96K tokens: E4M3 loses
most (its range, 2^-9 .. 448, cannot hold the small probabilities of long, flat rows),
E4M3 in / E5M2 out and HiF8 do best among the FP8 choices, E2E HiF8 (with restarts) stays
next to the float32 default, and Naive E2E (scores cast to HiF8 before the max subtraction)
is the worst.  We have no RULER run; :func:`exp2_comparison` measures the relative error of
the attention output against float64 attention for every BAPS configuration on synthetic
inputs whose rows get longer (``lengths``) and wider (``spreads``: the score standard
deviation in nats), the two properties that push small probabilities below a format's range.
The orderings are then compared (:func:`rank_agreement`): error, lower is better, against the
paper's accuracy, higher is better.

Inputs: ``q``, ``k``, ``v`` standard normal, q and k scaled by ``sqrt(spread)`` (score std
about ``spread``), the last ``n_query`` queries against all ``L`` keys, non-causal.

:func:`figure1` is the paper's Figure 1 and section 3.1 without attention around it: the
exponent input ``x = S - m`` (base 2, max-subtracted rows of Gaussian scores) rounded to the
input format, ``2**x`` through the float16 step of the paper's Algorithm 2, rounded to the
output format (:func:`lowprec.kernels.baps.exp2_in_format`, the kernels' own chain), against
``2**x`` in float64.  The paper's statements: E4M3 represents ``x`` more closely than E5M2;
for ``2**x`` in ``(0, 1]`` E4M3 "lacks sufficient resolution", E5M2 suits it better; E4M3 in /
E5M2 out "most closely approximates the FP32 reference distribution" of the three FP8
choices; HiF8 in / out is adopted as the practical alternative (Table 1: as accurate).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..formats import api as _fmt
from ..kernels import attention
from ..kernels.baps import exp2_in_format
from ..kernels.problem import LOG2E
from .baps import relative_error

#: Table 1 of the paper: CWE accuracy (%) per configuration at 32K, 64K and 96K tokens.
PAPER_TABLE1 = {
    "default": (88.5, 64.8, 58.9),
    "exp2_e4m3": (86.1, 58.1, 53.0),
    "exp2_e5m2": (87.8, 62.4, 58.5),
    "exp2_e4m3xe5m2": (87.5, 63.5, 57.4),
    "exp2_hif8": (89.1, 63.2, 58.1),
    "e2e_hif8": (88.0, 64.0, 58.3),
    "naive_e2e": (87.8, 54.0, 44.0),
}
PAPER_LENGTHS = (32768, 65536, 98304)
CONFIGS = tuple(PAPER_TABLE1)
LENGTHS = (512, 2048, 8192)
SPREADS = (1.0, 3.0)
#: Figure 1: label -> (input format, output format) of the exp2, the paper's four FP8 choices
FIG1_PAIRS = {"exp2_e4m3": ("e4m3", "e4m3"), "exp2_e5m2": ("e5m2", "e5m2"),
              "exp2_e4m3xe5m2": ("e4m3", "e5m2"), "exp2_hif8": ("hif8", "hif8")}
#: Figure 1: score standard deviations (nats); the paper's scores come from its models, whose
#: spread it does not give, so the verdicts are shares over these
FIG1_SPREADS = (1.0, 2.0, 3.0, 5.0)


def exp2_comparison(lengths=LENGTHS, spreads=SPREADS, configs=CONFIGS, *, heads: int = 4,
                    n_query: int = 64, d: int = 64, seed: int = 0) -> dict:
    """Relative error of each BAPS configuration per row length and score spread.

    Args:
        lengths: keys per row (L).
        spreads: score standard deviations (nats).
        configs: BAPS configurations (default: the seven of Table 1).
        heads, n_query, d: ``heads`` x ``n_query`` query rows of head dimension ``d``.
        seed: input seed.

    Returns:
        ``{"lengths", "spreads", "errors": {config: {spread: [error per length]}}}``.

    Example:
        >>> r = exp2_comparison((256,), (3.0,), ("default", "exp2_e4m3"), heads=1)
        >>> r["errors"]["default"][3.0][0] < r["errors"]["exp2_e4m3"][3.0][0]
        True
    """
    errors = {c: {float(s): [] for s in spreads} for c in configs}
    for s in spreads:
        for L in lengths:
            rng = np.random.default_rng(seed)
            g = np.float32(np.sqrt(s))
            q = rng.standard_normal((heads, n_query, d), dtype=np.float32) * g
            k = rng.standard_normal((heads, L, d), dtype=np.float32) * g
            v = rng.standard_normal((heads, L, d), dtype=np.float32)
            ref = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            "reference")
            for c in configs:
                out = attention(q, k, v, "baps", config=c)
                errors[c][float(s)].append(relative_error(out, ref))
    return {"lengths": list(lengths), "spreads": [float(s) for s in spreads],
            "errors": errors, "heads": heads, "n_query": n_query}


def figure1_inputs(L: int = 1024, rows: int = 64, spread: float = 1.0,
                   seed: int = 0) -> np.ndarray:
    """float32 ``(rows, L)`` exponent inputs ``x = fl32(fl32(s log2 e) - max)``: rows of ``L``
    Gaussian scores ``s`` of standard deviation ``spread`` (nats), minus their row max, in
    base 2 as FlashAttention-2 forms them (every ``x <= 0``, one 0 per row)."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((rows, L)) * spread
    x2 = (s.astype(np.float32) * np.float32(LOG2E)).astype(np.float32)
    return (x2 - x2.max(axis=1, keepdims=True)).astype(np.float32)


def ks_distance(a, b) -> float:
    """Kolmogorov-Smirnov distance between the empirical distributions of two equally long
    samples: the largest difference of their CDFs (share of values)."""
    a = np.sort(np.ravel(a))
    b = np.sort(np.ravel(b))
    t = np.concatenate([a, b])
    fa = np.searchsorted(a, t, side="right")
    fb = np.searchsorted(b, t, side="right")
    return float(np.max(np.abs(fa - fb))) / a.size


def figure1(spreads=FIG1_SPREADS, *, L: int = 1024, rows: int = 64, pairs=tuple(FIG1_PAIRS),
            seed: int = 0) -> dict:
    """Accuracy of ``2**x`` for each FP8 input/output pair (the paper's Figure 1).

    For each spread: ``x`` from :func:`figure1_inputs`, ``y = 2**x`` in float64 (the float64
    ``exp2`` of a float32 ``x`` is within 2**-52 of the exact power), and per pair ``y8 =
    exp2_in_format(x, fmt_in, fmt_out)`` (input rounding, ``2**x`` rounded to float16, output
    rounding; the BAPS kernels' chain).  Measures, over all ``rows * L`` values:

    * ``input_error``: mean ``|fmt_in(x) - x|`` (base-2 exponent units);
    * ``mass_error``: ``sum |y8 - y| / sum y``, the L1 error of the unnormalised softmax
      weights; since every rounding is monotone it is also the Wasserstein-1 distance between
      the distributions of ``y8`` and ``y`` (Figure 1(a)'s comparison), divided by mean ``y``;
    * ``ks``: the Kolmogorov-Smirnov distance between the distributions of ``y8`` and ``y``
      (count-weighted: values flushed to 0 weigh as much as the row max);
    * ``zero_share``: the share of values that become 0 (below the output format's range);
    * ``output_error``: ``mass_error`` of the output rounding alone, ``fmt_out(fp16(2**x))``
      of the unrounded ``x`` (Figure 1(b): how well the format holds ``(0, 1]``), per output
      format.

    Returns:
        ``{"spreads", "L", "rows", "pairs": {label: (fmt_in, fmt_out)}, "input_error":
        {fmt: [e per spread]}, "output_error": {fmt: [...]}, "mass_error": {label: [...]},
        "ks": {label: [...]}, "zero_share": {label: [...]}}`` (lists in the order of
        ``spreads``).

    Example:
        >>> r = figure1((1.0,), L=256, rows=4)
        >>> r["input_error"]["e4m3"][0] < r["input_error"]["e5m2"][0]
        True
    """
    for lab in pairs:
        if lab not in FIG1_PAIRS:
            raise ValueError(f"pair {lab!r} is not one of {', '.join(FIG1_PAIRS)}")
    fmts_in = sorted({FIG1_PAIRS[p][0] for p in pairs})
    fmts_out = sorted({FIG1_PAIRS[p][1] for p in pairs})
    res: dict = {"spreads": [float(s) for s in spreads], "L": L, "rows": rows,
                 "pairs": {p: FIG1_PAIRS[p] for p in pairs},
                 **{k: {} for k in ("input_error", "output_error", "mass_error", "ks",
                                    "zero_share")}}
    for s in spreads:
        s = float(s)
        x = figure1_inputs(L, rows, s, seed)
        x64 = x.astype(np.float64)
        y = np.exp2(x64)
        total = float(y.sum())
        for f in fmts_in:
            xi = np.asarray(_fmt.quantize(x, f, saturate=True), dtype=np.float64)
            res["input_error"].setdefault(f, []).append(float(np.mean(np.abs(xi - x64))))
        y16 = y.astype(np.float16)
        for f in fmts_out:
            yo = np.asarray(_fmt.quantize(y16.astype(np.float32), f, saturate=False),
                            dtype=np.float64)
            res["output_error"].setdefault(f, []).append(float(np.abs(yo - y).sum()) / total)
        for p in pairs:
            y8 = exp2_in_format(x, *FIG1_PAIRS[p]).astype(np.float64)
            res["mass_error"].setdefault(p, []).append(float(np.abs(y8 - y).sum()) / total)
            res["ks"].setdefault(p, []).append(ks_distance(y8, y))
            res["zero_share"].setdefault(p, []).append(float(np.mean(y8 == 0)))
    return res


def figure1_verdicts(res: dict) -> dict:
    """The paper's statements tested on a :func:`figure1` result, as shares of the cases in
    which they hold (a case: one spread, or one spread and one rival pair):

    * ``input``: E4M3 rounds ``x`` closer than E5M2 (mean error);
    * ``output``: E5M2 holds ``2**x`` closer than E4M3 (``output_error``);
    * ``mixed``: E4M3 -> E5M2 beats each pure pair (E4M3, E5M2) in ``mass_error``;
    * ``mixed_ks``: the same in the KS distance;
    * ``hif8``: per spread, the mass error of HiF8 / that of E4M3 -> E5M2.

    Returns:
        ``{"input": (held, cases), "output": ..., "mixed": ..., "mixed_ks": ..., "hif8":
        [ratio per spread]}``.
    """
    n = len(res["spreads"])
    ie, oe = res["input_error"], res["output_error"]

    def beats(metric):
        m = res[metric]
        return (sum(m["exp2_e4m3xe5m2"][i] < m[p][i] for i in range(n)
                    for p in ("exp2_e4m3", "exp2_e5m2")), 2 * n)

    return {"input": (sum(ie["e4m3"][i] < ie["e5m2"][i] for i in range(n)), n),
            "output": (sum(oe["e5m2"][i] < oe["e4m3"][i] for i in range(n)), n),
            "mixed": beats("mass_error"), "mixed_ks": beats("ks"),
            "hif8": [a / b for a, b in zip(res["mass_error"]["exp2_hif8"],
                                           res["mass_error"]["exp2_e4m3xe5m2"], strict=True)]}


def format_figure1(res: dict) -> str:
    """The errors of :func:`figure1` per spread: input error in exponent units, the others in
    % (KS and zero share in % of the values)."""
    sp = res["spreads"]
    head = "".join(f"{f'std {s:g}':>9}" for s in sp)
    lines = [f"BAPS Figure 1: 2**x with x = S - m in FP8 ({res['rows']} rows x {res['L']} "
             "Gaussian scores of std (nats) below; vs float64)"]

    def block(title, d, scale):
        lines.append(f"{title:<34}{head}")
        for f, v in d.items():
            lines.append(f"  {f:<32}" + "".join(f"{scale * x:>9.3f}" for x in v))

    block("input error (mean |dx|)", res["input_error"], 1)
    block("output error (mass %)", res["output_error"], 100)
    block("in -> out: mass error %", res["mass_error"], 100)
    block("in -> out: KS distance %", res["ks"], 100)
    block("in -> out: zero share %", res["zero_share"], 100)
    v = figure1_verdicts(res)
    lines.append("cases where the paper's statement holds: " + ", ".join(
        f"{k} {v[k][0]}/{v[k][1]}" for k in ("input", "output", "mixed", "mixed_ks"))
        + "; HiF8 / mixed mass error: " + ", ".join(f"{r:.2f}" for r in v["hif8"]))
    return "\n".join(lines)


def rank_agreement(errors: dict, paper_column: int = 1) -> dict:
    """Pairwise agreement of our error ordering with the paper's accuracy ordering.

    Args:
        errors: ``{config: error}`` (lower is better).
        paper_column: Table 1 column (0: 32K, 1: 64K, 2: 96K).

    Returns:
        ``{"ours": configs best first, "paper": configs best first, "agree": n, "pairs": n}``
        where a pair agrees when both orderings put the same configuration first (ties in the
        paper count as agreeing).

    Example:
        >>> rank_agreement({"default": 0.01, "exp2_e4m3": 0.05, "naive_e2e": 0.2})["agree"]
        3
    """
    cs = [c for c in errors if c in PAPER_TABLE1]
    paper = {c: PAPER_TABLE1[c][paper_column] for c in cs}
    agree = pairs = 0
    for a, b in itertools.combinations(cs, 2):
        pairs += 1
        pa, pb = paper[a], paper[b]
        if pa == pb or (errors[a] < errors[b]) == (pa > pb):
            agree += 1
    return {"ours": sorted(cs, key=lambda c: errors[c]),
            "paper": sorted(cs, key=lambda c: -paper[c]), "agree": agree, "pairs": pairs}


def format_exp2_comparison(res: dict) -> str:
    """Error table (%) per configuration, length and spread, then our ordering at the longest
    rows next to the paper's Table 1 ordering at 64K."""
    cfgs = list(res["errors"])
    cols = [(s, L) for s in res["spreads"] for L in res["lengths"]]
    lines = [f"BAPS exp2 formats: rel. error (%) vs float64 ({res['heads']} heads x "
             f"{res['n_query']} queries; columns: score std / keys)",
             f"{'config':<16}" + "".join(f"{f'{s:g}/{L}':>11}" for s, L in cols)
             + f"{'paper 64K':>11}"]
    for c in cfgs:
        cells = "".join(f"{100 * res['errors'][c][s][res['lengths'].index(L)]:>11.3f}"
                        for s, L in cols)
        p = PAPER_TABLE1.get(c)
        lines.append(f"{c:<16}{cells}{(f'{p[1]:.1f}%' if p else '-'):>11}")
    for s in res["spreads"]:
        last = {c: res["errors"][c][s][-1] for c in cfgs}
        r = rank_agreement(last)
        lines.append(f"ours (std {s:g}, {res['lengths'][-1]} keys), best first: "
                     + " > ".join(r["ours"]) + f"   [{r['agree']}/{r['pairs']} pairs agree "
                     "with the paper]")
    r = rank_agreement({c: 0.0 for c in cfgs})
    lines.append("paper (Table 1, CWE accuracy at 64K), best first: " + " > ".join(r["paper"]))
    return "\n".join(lines)


__all__ = ["exp2_comparison", "format_exp2_comparison", "rank_agreement", "PAPER_TABLE1",
           "PAPER_LENGTHS", "CONFIGS", "FIG1_PAIRS", "FIG1_SPREADS", "figure1_inputs",
           "ks_distance", "figure1",
           "figure1_verdicts", "format_figure1"]
