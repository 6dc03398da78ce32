"""INT-FlashAttention study (specs/attention.md section 10; seed ``int-flashattention.txt``
section 4.2, Tables 1 and 2): mean relative error (MRE) of full-INT8 and half-INT8
INT-FlashAttention and of the authors' FP8 flash attention, on ``torch.rand`` (uniform [0, 1))
and ``torch.randn`` (normal) float16 inputs, ``scale = 1``, N from 1k to 16k.

What the authors' accuracy script computes (their ``benchmark.py``, ``acc_test``; read, not run):

* inputs ``(2, 2, N, 64)`` float16, ``sm_scale = 1``; one run per N;
* reference: ``torch.matmul(q, k^T)`` in float16 (scores rounded to float16), softmax of
  ``.float()`` cast back to float16, ``matmul(p, v)`` in float16 (:func:`reference_fp16`);
* int8 inputs from float16 arithmetic (``max|x| / 127`` and ``round(x / s)`` in float16: our
  ``scale_dtype="float16"``);
* FP8: ``q, k, v`` cast to ``float8_e5m2`` (round to nearest even), then the Triton tutorial
  flash kernel, which casts ``P`` to E5M2 before ``P v`` while ``l`` sums the unrounded ``p``;
* metric: ``mean(|o - ref| / (|ref| + 1e-5))`` over the **last 4 elements** of the output
  (one query row of the last (batch, head), 4 channels).

Choices made here (documented, each an option):

* ``fp8`` column (default FP8 baseline, ``FP8_RECIPES["p_rtz"]``): q, k, v rounded to E5M2
  (nearest even), float32 flash attention with ``P`` truncated to E5M2 (toward zero) before
  ``P v``, float16 output.  This is the recipe that reproduces the paper's FP8 column on
  uniform inputs (about 8 to 8.3 % flat in N against the paper's 8.9 to 9.2 %).  With ``P``
  rounded to nearest (what Triton documents as its default downcast) and the output stored as
  E5M2 (``o = empty_like(q)`` in the tutorial), the FP8 error is 3 % at 1k and falls to 0.9 %
  at 16k (column ``fp8_rne``); with q, k, v alone in E5M2 (spec 10 read literally) it is
  0.6 % to 0.15 % (column ``fp8_qkv``): neither shows the paper's flat 9 %.  That the
  authors' Triton build truncated P is our inference from the numbers, not a documented fact.
* Statistics.  The authors' 4-element MRE is one draw of a noisy quantity, so besides it
  (``_last4``, the last 4 elements of our output) we report over ``n_query`` query rows the
  mean over all elements (``mre``) and the **median over rows of the per-row last-4 MRE**
  (``_row4``: what one run of their script gives typically).  For normal inputs the
  all-element MRE is dominated by near-zero reference elements (heavy tail) and is not
  comparable to the paper; ``_row4`` is.
* Only the last ``n_query`` query rows are computed, against all N keys: without a causal
  mask every query row is independent (per-token q scales, per-head v scale over all keys),
  so these rows are exactly what a full N x N run gives for them.
* Normal inputs do not reproduce (issue 16 item 3e; the claims table's "why" gives the numbers
  of the current run).  Not because of the FP8 kernel: every FP8 recipe gives the same error
  on randn inputs (22 % median at 1k, whatever P's rounding and the output's storage), and
  half-INT8, which has no FP8 step, misses the paper by the same factor (2.7x), while
  full-INT8, whose error is set by v's per-tensor int8 rounding (one-hot-like rows: randn
  with ``scale = 1`` gives scores of std ``sqrt(d) = 8``), matches.  So rounding q and k moves
  the output 2-3 times more in our run than the paper's numbers allow, with the inputs of the
  authors' script (``torch.randn``, commented out beside ``torch.rand`` in ``acc_test``).  The
  per-row 4-element MRE spreads widely (FP8: quartiles about 7 % and 63 %); the paper's
  7.46 % is near our 25th percentile, but its five lengths, one run each if its script's
  ``REPEAT_TIMES = 1`` was used, all lie within 7.46-7.66 %, which our distribution gives
  with probability about 1e-11.  The paper's text lost the distributions' parameters, so
  another variance or scale cannot be excluded; std 0.5 and 0.25 were tried and match no
  better (at 0.25 half-INT8 comes near the paper, but FP8 stays well above it and full-INT8
  falls below it).
* The paper's tables lost their headers in our copy; columns are read as (FP8, half-INT8,
  full-INT8) from the authors' script order and the text ("46 %" and "82 %" smaller MRE of
  full-INT8 than FP8 for normal and uniform inputs match columns 3 vs 1).
"""

from __future__ import annotations

import numpy as np

from ..formats import api as _fmt
from ..kernels import attention
from ..kernels.problem import LOG2E

LENGTHS_FULL = (1024, 2048, 4096, 8192, 16384)
#: The paper's Tables 1 (normal) and 2 (uniform): MRE in percent per N in LENGTHS_FULL.
PAPER_MRE = {
    "normal": {"fp8": (7.46, 7.50, 7.66, 7.51, 7.57),
               "half": (0.890, 0.802, 0.843, 0.932, 0.775),
               "full": (4.05, 4.18, 4.21, 4.38, 4.52)},
    "uniform": {"fp8": (8.94, 9.15, 8.89, 9.02, 8.97),
                "half": (0.317, 0.300, 0.280, 0.299, 0.296),
                "full": (1.69, 1.62, 1.65, 1.85, 1.82)},
}
MRE_EPS = 1e-5  # the authors' denominator guard
#: FP8 flash-attention recipes: (rounding of P to E5M2 or None, format of the output).
FP8_RECIPES = {
    "p_rtz": ("toward_zero", "float16"),
    "rne": ("nearest_even", "e5m2"),
    "qkv": (None, "float32"),
}
COLUMNS = ("fp8", "fp8_rne", "fp8_qkv", "half", "full")
REFERENCES = ("fp16", "float64")
FP8_P_BLOCK = 64  # key tile of the FP8 emulation


def mre(out, ref, eps: float = MRE_EPS) -> float:
    """Mean relative error ``mean(|out - ref| / (|ref| + eps))`` over all elements.

    Example::

        >>> mre(np.array([1.0, 2.0]), np.array([1.0, 4.0]))  # doctest: +SKIP
        0.25
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.mean(np.abs(out - ref) / (np.abs(ref) + eps)))


def row4_values(out, ref, eps: float = MRE_EPS) -> np.ndarray:
    """The MRE of each query row's last 4 channels, flattened over rows: the distribution of
    what one run of the authors' 4-element metric gives."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    rel = np.abs(out - ref)[..., -4:] / (np.abs(ref[..., -4:]) + eps)
    return rel.mean(axis=-1).reshape(-1)


def row4_mre(out, ref, eps: float = MRE_EPS) -> float:
    """Median over query rows of the MRE of each row's last 4 channels (what one run of the
    authors' 4-element metric gives typically)."""
    return float(np.median(row4_values(out, ref, eps)))


def make_inputs(n: int, dist: str, *, batch: int = 2, heads: int = 2, d: int = 64,
                seed: int = 0):
    """float16 ``q, k, v`` of shape ``(batch, heads, n, d)``: ``"uniform"`` = U[0, 1) (as
    ``torch.rand``), ``"normal"`` = N(0, 1) (as ``torch.randn``).

    Raises:
        ValueError for another ``dist``.
    """
    rng = np.random.default_rng(seed)
    shape = (batch, heads, n, d)
    if dist == "uniform":
        return tuple(rng.random(shape).astype(np.float16) for _ in range(3))
    if dist == "normal":
        return tuple(rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    raise ValueError(f"dist {dist!r} is not one of uniform, normal")


def rel_l1(out, ref) -> float:
    """``sum|out - ref| / sum|ref|``."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.abs(out - ref).sum() / np.abs(ref).sum())


def reference_fp16(q, k, v, scale: float = 1.0) -> np.ndarray:
    """The authors' reference attention on float16 tensors, emulated in numpy: scores
    ``q k^T * scale`` rounded to float16, softmax in float32 (here float64, then rounded to
    float32), probabilities rounded to float16, ``p v`` accumulated in float32 and rounded to
    float16.  Returns float64 holding float16 values."""
    s = np.matmul(np.asarray(q, np.float32), np.swapaxes(np.asarray(k, np.float32), -1, -2))
    s = (s.astype(np.float16) * np.float16(scale)).astype(np.float64)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    p = p.astype(np.float32).astype(np.float16).astype(np.float32)
    o = np.matmul(p, np.asarray(v, np.float32))
    return o.astype(np.float16).astype(np.float64)


def flash_p_e5m2(q, k, v, scale: float, block_k: int = FP8_P_BLOCK,
                 rounding: str | None = "nearest_even", output: str = "float32") -> np.ndarray:
    """Approximate FP8 flash attention (the Triton tutorial kernel with FP8 inputs) in float32
    numpy: base-2 online softmax over key tiles of ``block_k``; ``P`` rounded to E5M2 with
    ``rounding`` before ``P v`` (``None``: not rounded); ``l`` sums the unrounded ``p``.  Not
    bit-exact (numpy matmul order).

    Args:
        q, k, v: arrays that already hold E5M2 values (``lp.quantize(x, "e5m2")``).
        scale: softmax scale.
        block_k: key tile.
        rounding: rounding of P to E5M2 (``"nearest_even"``, ``"toward_zero"``, ...) or None.
        output: ``"float32"``, ``"float16"`` or ``"e5m2"`` (nearest even): the stored output.

    Returns:
        float32 ``(..., Lq, dv)``.

    Raises:
        ValueError for an unknown ``output``.
    """
    if output not in ("float32", "float16", "e5m2"):
        raise ValueError(f"output {output!r} is not one of float32, float16, e5m2")
    q = np.asarray(q, np.float32)
    k = np.asarray(k, np.float32)
    v = np.asarray(v, np.float32)
    c = np.float32(scale * LOG2E)
    lead, n = q.shape[:-2], q.shape[-2]
    m = np.full(lead + (n,), -np.inf, np.float32)
    lsum = np.ones(lead + (n,), np.float32)
    acc = np.zeros(lead + (n, v.shape[-1]), np.float32)
    for j0 in range(0, k.shape[-2], block_k):
        s = np.matmul(q, np.swapaxes(k[..., j0:j0 + block_k, :], -1, -2)) * c
        m_new = np.maximum(m, s.max(axis=-1))
        p = np.exp2(s - m_new[..., None])
        alpha = np.exp2(m - m_new)
        lsum = lsum * alpha + p.sum(axis=-1)
        if rounding is not None:
            p = _fmt.quantize(p, "e5m2", rounding=rounding)
        acc = acc * alpha[..., None] + np.matmul(p, v[..., j0:j0 + block_k, :])
        m = m_new
    o = acc / lsum[..., None]
    if output == "float16":
        return o.astype(np.float16).astype(np.float32)
    if output == "e5m2":
        return _fmt.quantize(o, "e5m2")
    return o


def fp8_flash(q, k, v, scale: float, recipe: str = "p_rtz",
              block_k: int = FP8_P_BLOCK) -> np.ndarray:
    """FP8-E5M2 flash attention baseline: q, k, v rounded to E5M2 (nearest even, as torch's
    ``.to(torch.float8_e5m2)``), then :func:`flash_p_e5m2` with the P rounding and output of
    ``FP8_RECIPES[recipe]`` (see the module docstring).

    Raises:
        ValueError for an unknown recipe.
    """
    if recipe not in FP8_RECIPES:
        raise ValueError(f"recipe {recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    p_round, out = FP8_RECIPES[recipe]
    q8, k8, v8 = (_fmt.quantize(np.asarray(x), "e5m2") for x in (q, k, v))
    return flash_p_e5m2(q8, k8, v8, scale, block_k, rounding=p_round, output=out)


def mre_vs_fp8(lengths=(1024, 2048), dists=("normal", "uniform"), *, batch: int = 2,
               heads: int = 2, d: int = 64, n_query: int = 128, block_q: int = 64,
               block_k: int = 64, seed: int = 0, reference: str = "fp16",
               scale_dtype: str = "float16", fp8_recipe: str = "p_rtz") -> dict:
    """MRE (fractions, not percent) of each column per N and input distribution (the paper's
    Tables 1 and 2; ``scale = 1``).

    Args:
        lengths: sequence lengths N (keys; the paper: 1k to 16k, :data:`LENGTHS_FULL`).
        dists: ``"normal"`` and/or ``"uniform"``.
        batch, heads, d: the authors' script uses 2, 2, 64.
        n_query: the last query rows evaluated (see the module docstring).
        block_q, block_k: INT-FlashAttention tiles (the authors autotune 32 to 64 keys).
        seed: input seed.
        reference: ``"fp16"`` (the authors' float16 torch reference, :func:`reference_fp16`)
            or ``"float64"`` (exact attention).
        scale_dtype: INT-FlashAttention's quantizer arithmetic (``"float16"``: the authors').
        fp8_recipe: the recipe of column ``fp8`` (a key of :data:`FP8_RECIPES`).

    Returns:
        ``{dist: {"N": [...], "d": d, col: [MRE], col + "_row4": [median per-row last-4 MRE],
        col + "_row4_q": [(25th, 75th percentile) of the per-row last-4 MRE], col +
        "_paper_rank": [share of rows whose last-4 MRE is at most the paper's value, or None
        for an N or column the paper does not give], col + "_paper_band": [share of rows whose
        last-4 MRE lies between the paper's smallest and largest value of the column over N,
        or None],
        col + "_last4": [MRE of the last 4 output elements], col + "_l1": [rel_l1],
        "reduction": [1 - full / fp8 on MRE], "reduction_row4": [same on _row4]}}`` with
        ``col`` in :data:`COLUMNS` (``fp8_rne`` and ``fp8_qkv`` are the recipes ``"rne"`` and
        ``"qkv"``).

    Raises:
        ValueError for an unknown reference, distribution or recipe.
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference {reference!r} is not one of {', '.join(REFERENCES)}")
    if fp8_recipe not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe {fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    res = {}
    for dist in dists:
        r = {"N": [], "d": d}
        for col in COLUMNS:
            for suffix in ("", "_row4", "_row4_q", "_paper_rank", "_paper_band", "_last4",
                           "_l1"):
                r[col + suffix] = []
        for n in lengths:
            q, k, v = make_inputs(n, dist, batch=batch, heads=heads, d=d, seed=seed)
            nq = min(n_query, n)
            qs = q[..., n - nq:, :]
            if reference == "fp16":
                ref = reference_fp16(qs, k, v)
            else:
                ref = attention(qs.astype(np.float32), k.astype(np.float32),
                                v.astype(np.float32), "reference", scale=1.0).astype(np.float64)
            opts = dict(scale=1.0, block_q=block_q, block_k=block_k, scale_dtype=scale_dtype)
            outs = {
                "fp8": fp8_flash(qs, k, v, 1.0, fp8_recipe),
                "fp8_rne": fp8_flash(qs, k, v, 1.0, "rne"),
                "fp8_qkv": fp8_flash(qs, k, v, 1.0, "qkv"),
                "half": attention(qs, k, v, "intflash", variant="half", **opts),
                "full": attention(qs, k, v, "intflash", variant="full", **opts),
            }
            r["N"].append(n)
            for col, out in outs.items():
                rows = row4_values(out, ref)
                paper = PAPER_MRE[dist].get(col)
                r[col].append(mre(out, ref))
                r[col + "_row4"].append(float(np.median(rows)))
                r[col + "_row4_q"].append([float(x) for x in np.percentile(rows, (25, 75))])
                r[col + "_paper_rank"].append(
                    float(np.mean(rows <= paper[LENGTHS_FULL.index(n)] / 100))
                    if paper and n in LENGTHS_FULL else None)
                r[col + "_paper_band"].append(
                    float(np.mean((rows >= min(paper) / 100) & (rows <= max(paper) / 100)))
                    if paper else None)
                r[col + "_l1"].append(rel_l1(out, ref))
                r[col + "_last4"].append(mre(np.asarray(out).reshape(-1)[-4:],
                                             ref.reshape(-1)[-4:]))
        for suffix in ("", "_row4"):
            r["reduction" + suffix] = [1 - f / p for f, p in
                                       zip(r["full" + suffix], r["fp8" + suffix], strict=True)]
        res[dist] = r
    return res


def _cell(r: dict, paper: dict, col: str, pcol, width: int, i: int, j) -> str:
    s = f"{100 * r[col + '_row4'][i]:.3g}"
    if pcol and j is not None:
        s += f" ({paper[pcol][j]:.3g})"
    return (s + f" [{100 * r[col][i]:.3g}]").rjust(width)


def format_mre_vs_fp8(res: dict) -> str:
    """Tables 1/2 layout: per N, the median per-row last-4 MRE in percent (the statistic
    comparable to the paper's 4-element MRE) with the paper's value in ``(...)``, the
    all-element MRE, and the reduction of full-INT8 against the FP8 column."""
    lines = []
    for dist, r in res.items():
        paper = PAPER_MRE[dist]
        lines.append(f"INT-FlashAttention MRE (%), {dist} inputs, scale 1: median per-row "
                     "last-4 MRE [ours (paper)]; all-element MRE in [...]")
        lines.append(f"{'N':>6} {'FP8 (P rtz)':>22} {'FP8 rne':>15} {'FP8 qkv':>15} "
                     f"{'half-INT8':>22} {'full-INT8':>22}  {'full vs FP8 (paper)':>20}")
        for i, n in enumerate(r["N"]):
            j = LENGTHS_FULL.index(n) if n in LENGTHS_FULL else None

            red = f"{100 * r['reduction_row4'][i]:.0f}"
            if j is not None:
                red += f" ({100 * (1 - paper['full'][j] / paper['fp8'][j]):.0f})"
            cells = " ".join(_cell(r, paper, col, pcol, w, i, j) for col, pcol, w in
                             (("fp8", "fp8", 22), ("fp8_rne", None, 15), ("fp8_qkv", None, 15),
                              ("half", "half", 22), ("full", "full", 22)))
            lines.append(f"{n:>6} {cells}  {red:>20}")
    return "\n".join(lines)


def print_mre_vs_fp8(**kwargs) -> dict:
    """Run :func:`mre_vs_fp8` and print it; returns the result."""
    res = mre_vs_fp8(**kwargs)
    print(format_mre_vs_fp8(res))
    return res


__all__ = ["PAPER_MRE", "LENGTHS_FULL", "FP8_RECIPES", "mre", "row4_mre", "row4_values",
           "make_inputs",
           "rel_l1", "reference_fp16", "flash_p_e5m2", "fp8_flash", "mre_vs_fp8",
           "format_mre_vs_fp8", "print_mre_vs_fp8"]
