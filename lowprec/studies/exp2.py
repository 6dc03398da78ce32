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
"""

from __future__ import annotations

import itertools

import numpy as np

from ..kernels import attention
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
           "PAPER_LENGTHS", "CONFIGS"]
