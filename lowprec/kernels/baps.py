"""BAPS: HiF8 softmax with block-aware precision rescaling (specs/attention.md section 2; seed
``baps.txt`` sections 3.1-3.4, 4.1 and appendix A.1).

Scheme ``baps`` with ``config=``:

* ``default``: q, k, v rounded to bfloat16, FlashAttention-2 in float32 (base 2).
* ``exp2_hif8``, ``exp2_e4m3``, ``exp2_e5m2``, ``exp2_e4m3xe5m2``: as ``default`` but every exp2
  (``P = exp2(S - m)`` and ``alpha = exp2(m_old - m_new)``) is computed in format
  (:func:`exp2_in_format`); the running max is not rounded, so alpha carries rounding error that
  compounds over tiles (the paper's Figure 2).
* ``e2e_hif8``: the BAPS pipeline: critical tiles first on the high-precision path, integer
  running max (``max_round``), offloaded max subtraction ``X~ = hif8(S - m)``, restart when a
  visible ``X~ > tau``, exact power-of-two rescaling, ``P = exp2_in_format(X, hif8, hif8)``.
* ``naive_e2e``: the FA2 flow on HiF8 scores: ``X = hif8(hif8(S) - m)``, non-integer m, exp2 in
  HiF8 (Table 1's "Naive E2E").  The HiF8 cast is non-saturating, as the paper's pipeline has
  it: a base-2 score of magnitude >= 40960 becomes +-Inf, and a row whose max is +Inf gives NaN
  (Inf - Inf); ``e2e_hif8`` subtracts in float32 first and is unaffected.

Every float32 operation and its order is pinned in docs/design.md ("Exact float32 semantics of
the tiled schemes"); the restart statistics are :class:`lowprec.stats.BapsStats` (section 8).

Choices where the paper is silent (each an option): tiles of 128 x 128 (``block_q``,
``block_k``); round-half-even integer max (``max_round="rint"``; ``"ceil"`` keeps ``S - m <= 0``);
``tau=1``; ``critical="first"``; tile-granular restarts; float32 accumulators; the fp16 step of
exp2 on (``exp2_fp16``); inputs rounded to bfloat16 (``input_dtype``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..formats import api as _fmt
from ..formats._bits import F32_EXP
from ..stats import BapsStats
from . import Scheme, register
from ._check import check_bool, check_choice, check_int
from .online import (
    ACC_BF16,
    ACC_F16,
    ACC_F32,
    BLOCK_K_DEFAULT,
    BLOCK_Q_DEFAULT,
    CRIT_FIRST,
    CRIT_FIRST_DIAG,
    CRIT_FIRST_LAST,
    CRIT_LIST,
    CRIT_NONE,
    E2E,
    ENC_E4M3_SAT,
    ENC_E5M2_SAT,
    ENC_HIF8,
    ENC_HIF8_SAT,
    EXP_FLOAT,
    EXP_TABLE,
    FA2,
    GRAN_ROW,
    GRAN_TILE,
    ROUND_CEIL,
    ROUND_RINT,
    EngineConfig,
    run_engine,
    tile_stats,
)
from .problem import LOG2E, Problem, check_block, softmax_rows

CONFIGS = {
    "default": "bf16 inputs, float32 softmax (FlashAttention-2, base 2)",
    "exp2_hif8": "every exp2 (P and the rescale) in HiF8 -> HiF8",
    "exp2_e4m3": "every exp2 in E4M3 -> E4M3",
    "exp2_e5m2": "every exp2 in E5M2 -> E5M2",
    "exp2_e4m3xe5m2": "every exp2 in E4M3 -> E5M2",
    "e2e_hif8": "BAPS: integer max, offloaded subtraction, restarts, exp2 HiF8 -> HiF8",
    "naive_e2e": "scores cast to HiF8 before the max subtraction, exp2 in HiF8",
}
_EXP2_FORMATS = ("hif8", "e4m3", "e5m2")
_ENC = {"hif8": ENC_HIF8_SAT, "e4m3": ENC_E4M3_SAT, "e5m2": ENC_E5M2_SAT}
_CONFIG_FORMATS = {
    "exp2_hif8": ("hif8", "hif8"),
    "exp2_e4m3": ("e4m3", "e4m3"),
    "exp2_e5m2": ("e5m2", "e5m2"),
    "exp2_e4m3xe5m2": ("e4m3", "e5m2"),
    "e2e_hif8": ("hif8", "hif8"),
    "naive_e2e": ("hif8", "hif8"),
}
_CRITICAL = {"first": CRIT_FIRST, "first+last": CRIT_FIRST_LAST, "first+diagonal": CRIT_FIRST_DIAG}
_ROUND = {"rint": ROUND_RINT, "ceil": ROUND_CEIL}
_GRAN = {"tile": GRAN_TILE, "row": GRAN_ROW}
_ACC = {"float32": ACC_F32, "float16": ACC_F16, "bfloat16": ACC_BF16}
_INPUT = ("bfloat16", "float32")
_E2E_ONLY = ("tau", "critical", "max_round", "granularity")


def _check_fmt(name: Any, what: str) -> str:
    return check_choice(name, what, _EXP2_FORMATS)


def exp2_in_format(x, fmt_in: str = "hif8", fmt_out: str | None = None, *, fp16: bool = True,
                   saturate: bool = True) -> np.ndarray:
    """``2**x`` "in format" (BAPS appendix A.1, Algorithm 2; specs/attention.md section 2).

    The chain: round ``x`` to ``fmt_in`` (its default rounding: HiF8 nearest_away, E4M3/E5M2
    nearest_even; saturating by default, see below), convert exactly to float16, compute
    ``2**x`` and round it to float16 (nearest even), then round that to ``fmt_out`` (default
    rounding, non-saturating).  With ``fp16=False`` the float16 step is skipped and ``2**x`` is
    rounded to ``fmt_out`` directly.

    Args:
        x: float array-like (float32/float64/float16/bfloat16 numpy array or CPU tensor).
        fmt_in, fmt_out: ``"hif8"``, ``"e4m3"`` or ``"e5m2"`` (``fmt_out`` defaults to ``fmt_in``).
        fp16: keep the float16 step of the hardware pipeline.
        saturate: input rounding clamps to the input format's max (default: an E4M3 score below
            -448 would otherwise become NaN; in attention every such input gives 0 either way).

    Returns:
        float32 numpy array of ``fmt_out`` values (NaN in, NaN out; ``-inf`` gives 0).

    Example::

        >>> exp2_in_format(np.array([-1.0, -0.3]), "hif8")
        array([0.5 , 0.8125], dtype=float32)
    """
    _check_fmt(fmt_in, "fmt_in")
    fmt_out = fmt_in if fmt_out is None else _check_fmt(fmt_out, "fmt_out")
    check_bool(fp16, "fp16")
    check_bool(saturate, "saturate")
    xi = np.asarray(_to_np(_fmt.quantize(x, fmt_in, saturate=bool(saturate))), dtype=np.float64)
    with np.errstate(over="ignore"):
        y = np.exp2(xi)
        if fp16:
            y = y.astype(np.float16).astype(np.float64)
    return np.asarray(_to_np(_fmt.quantize(y, fmt_out, saturate=False)), dtype=np.float32)


def _to_np(a):
    return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a


_TABLES: dict = {}


def exp2_table(fmt_in: str, fmt_out: str, fp16: bool = True) -> np.ndarray:
    """float32 ``(256,)``: :func:`exp2_in_format` of the value of every ``fmt_in`` code."""
    key = (fmt_in, fmt_out, bool(fp16))
    tab = _TABLES.get(key)
    if tab is None:
        vals = _fmt.get_format(fmt_in).values().astype(np.float64)
        tab = exp2_in_format(vals, fmt_in, fmt_out, fp16=fp16, saturate=False)
        tab.setflags(write=False)
        _TABLES[key] = tab
    return tab


def restart_threshold(tau: int) -> float:
    """The smallest float32 ``x`` with ``hif8(x) > tau`` (nearest_away): the engine restarts a
    row iff ``fl(rowmax - m) >= threshold`` (equivalent to some ``hif8(S - m) > tau``, since
    HiF8 rounding and ``fl(. - m)`` are monotone).

    ``tau`` is the restart threshold of ``e2e_hif8``: an int >= 0 (ValueError otherwise; a
    bool or float raises ValueError like the scheme option does).

    Example:
        >>> restart_threshold(1)
        1.0625
    """
    tau = check_int(tau, "tau", 0, what="a non-negative int")
    thr = _THRESHOLDS.get(tau)
    if thr is None:
        thr = _THRESHOLDS[tau] = _threshold_search(tau)
    return thr


_THRESHOLDS: dict[int, float] = {}  # tau -> threshold (a call searched 31 quantizations)


def _threshold_search(tau: int) -> float:
    """Bisection over float32 bit patterns for :func:`restart_threshold`."""
    lo, hi = np.uint32(0), np.uint32(F32_EXP)  # bits of +0 and +inf

    def over(bits) -> bool:
        xv = np.array([bits], dtype=np.uint32).view(np.float32)
        return bool(_fmt.quantize(xv, "hif8")[0] > tau)

    while hi - lo > 1:  # invariant: not over(lo), over(hi)
        mid = np.uint32(lo + (hi - lo) // 2)
        if over(mid):
            hi = mid
        else:
            lo = mid
    return float(np.array([hi], dtype=np.uint32).view(np.float32)[0])


def softmax_exp2(scores, axis: int = -1, *, fmt: str = "hif8", fmt_out: str | None = None,
                 integer_max: bool = True, exp2_fp16: bool = True):
    """Softmax with the BAPS exponent "in format" (the softmax of ``e2e_hif8`` on one tile).

    Per row (natural-log scores ``x``, rows along ``axis``): ``x2 = fl32(x * log2(e))``,
    ``m = rowmax(x2)`` rounded to an integer (nearest even; ``integer_max=False`` keeps it
    exact, as ``exp2_hif8`` does), ``X = fl32(x2 - m)``, ``P = exp2_in_format(X, fmt, fmt_out)``
    (the input rounding to ``fmt`` happens inside), ``p = P / fl32(rowsum P)`` in float32.
    With the integer max ``X`` may be positive (up to 0.5); the result is shift invariant.

    Args:
        scores: float array (numpy or CPU torch), any shape.
        axis: the softmax axis.
        fmt, fmt_out: exp2 input/output formats (``hif8``, ``e4m3``, ``e5m2``).
        integer_max: round the row max to an integer (BAPS section 3.3).
        exp2_fp16: keep the float16 step of the exp2 chain.

    Returns:
        float32 probabilities, same shape and kind as ``scores``.  ``-inf`` scores give 0; a
        row of only ``-inf`` (or containing NaN) gives NaN.

    Example::

        >>> lp.softmax(np.array([0.0, 1.0, 2.0]), scheme="hif8_exp2")
    """
    _check_fmt(fmt, "fmt")
    fmt_out = fmt if fmt_out is None else _check_fmt(fmt_out, "fmt_out")
    check_bool(integer_max, "integer_max")
    check_bool(exp2_fp16, "exp2_fp16")
    rows, restore = softmax_rows(scores, axis)
    x2 = rows * np.float32(LOG2E)
    with np.errstate(invalid="ignore"):
        m = x2.max(axis=1, keepdims=True) if rows.shape[1] else np.zeros((rows.shape[0], 1))
        m = m.astype(np.float32)
        if integer_max:
            m = np.rint(m)
        X = x2 - m
        P = exp2_in_format(X, fmt, fmt_out, fp16=bool(exp2_fp16))
        bad = ~np.isfinite(m[:, 0]) | np.isnan(x2).any(axis=1)
        P[bad] = np.nan
        out = P / P.sum(axis=1, keepdims=True, dtype=np.float32)
    return restore(out.astype(np.float32))


def _softmax_exp2(scores, axis, return_stats, **opts):
    return softmax_exp2(scores, axis, **opts), None  # no counters


def _choice(value, table: dict, name: str) -> int:
    return table[check_choice(value, name, tuple(table))]


def _critical(value):
    if isinstance(value, str):
        return _choice(value, _CRITICAL, "critical"), ()
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if not items or not all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
            for t in items
        ):
            raise ValueError(
                f"critical list {value!r} must be non-empty non-negative key-tile indices"
            )
        seen = []
        for t in items:
            if int(t) not in seen:
                seen.append(int(t))
        return CRIT_LIST, tuple(seen)
    raise ValueError(
        f"critical {value!r} is not one of {', '.join(_CRITICAL)} or a list of key-tile indices"
    )


def make_config(config: str = "e2e_hif8", *, tau: int = 1, critical="first",
                max_round: str = "rint", granularity: str = "tile", accum: str = "float32",
                exp2_fp16: bool = True) -> EngineConfig:
    """The :class:`~lowprec.kernels.online.EngineConfig` of a BAPS configuration (validated)."""
    check_choice(config, "config", tuple(CONFIGS))
    check_int(tau, "tau", 0, what="a non-negative int")
    crit, crit_list = _critical(critical)
    mr = _choice(max_round, _ROUND, "max_round")
    gran = _choice(granularity, _GRAN, "granularity")
    acc = _choice(accum, _ACC, "accum")
    check_bool(exp2_fp16, "exp2_fp16")
    if config == "default":
        return EngineConfig(flow=FA2, exp=EXP_FLOAT, acc=acc)
    fin, fout = _CONFIG_FORMATS[config]
    table = exp2_table(fin, fout, bool(exp2_fp16))
    if config == "e2e_hif8":
        return EngineConfig(flow=E2E, exp=EXP_TABLE, enc=ENC_HIF8, crit=crit,
                            crit_list=crit_list, max_round=mr, gran=gran, acc=acc,
                            thr=restart_threshold(int(tau)), table=table)
    if config == "naive_e2e":
        return EngineConfig(flow=FA2, exp=EXP_TABLE, enc=ENC_HIF8, pre_hif8=True, acc=acc,
                            crit=CRIT_NONE, table=table)
    return EngineConfig(flow=FA2, exp=EXP_TABLE, enc=_ENC[fin], acc=acc, table=table)


def _round_inputs(prob: Problem, input_dtype: str):
    if input_dtype == "float32":
        return prob.q, prob.k, prob.v
    bf = ml_dtypes.bfloat16
    return tuple(a.astype(bf).astype(np.float32) for a in (prob.q, prob.k, prob.v))


def engine_setup(Lq: int, Lk: int, config: str = "e2e_hif8", block_q: int = BLOCK_Q_DEFAULT,
                 block_k: int = BLOCK_K_DEFAULT, input_dtype: str = "bfloat16", **opts):
    """``(cfg, block_q, block_k, round_inputs_bf16)`` of a ``baps`` call on ``Lq`` queries and
    ``Lk`` keys: the options validated (ValueError as the scheme raises them, in its order)
    and turned into the engine's arguments; shared by the CPU engine and the GPU engine
    (:mod:`lowprec.kernels.device`)."""
    if config != "e2e_hif8":
        bad = sorted(set(opts) & set(_E2E_ONLY))
        if bad:
            raise ValueError(
                f"option(s) {', '.join(bad)} apply only to config 'e2e_hif8', not {config!r}"
            )
    cfg = make_config(config, **opts)
    if cfg.crit == CRIT_LIST:
        nk = -(-Lk // check_block(block_k, "block_k", Lk)) if Lk else 0
        bad = [t for t in cfg.crit_list if t >= nk]
        if bad:
            raise ValueError(
                f"critical tile indices {bad} are out of range: there are {nk} key tiles"
            )
    check_choice(input_dtype, "input_dtype", _INPUT)
    bq = check_block(block_q, "block_q", Lq)
    bk = check_block(block_k, "block_k", Lk)
    return cfg, bq, bk, input_dtype == "bfloat16"


def _baps(prob: Problem, return_stats: bool, **options):
    cfg, bq, bk, _ = engine_setup(prob.Lq, prob.Lk, **options)
    q, k, v = _round_inputs(prob, options.get("input_dtype", "bfloat16"))
    out, flags, rr = run_engine(q, k, v, scale=prob.scale, causal=prob.causal, mask=prob.mask,
                                mask_map=prob.mask_map, block_q=bq, block_k=bk, cfg=cfg)
    return out, (tile_stats(flags, rr, cfg.flow == E2E) if return_stats else None)


register(Scheme(
    "baps",
    "BAPS HiF8 flash attention (configs: " + ", ".join(CONFIGS) + ")",
    _baps,
    noise=lambda o: "bfloat16" if o.get("input_dtype", "bfloat16") == "bfloat16" else None,
    options=("config", "block_q", "block_k", "input_dtype", "tau", "critical", "max_round",
             "granularity", "accum", "exp2_fp16"),
    variants=("config", tuple(CONFIGS)), shape_dependent=("critical",), stats=BapsStats,
    order=20, error_bound=0.15, engine=engine_setup,
))

register(Scheme("hif8_exp2", "BAPS softmax: exp2 in HiF8 (or E4M3/E5M2) with an integer row max",
                _softmax_exp2, options=("fmt", "fmt_out", "integer_max", "exp2_fp16"),
                kind="softmax"))

__all__ = ["softmax_exp2", "exp2_in_format", "exp2_table", "restart_threshold", "make_config",
           "CONFIGS"]

