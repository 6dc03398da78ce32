"""The ``lowprec`` command.

``lowprec formats``        table of every format (bits, range, specials, default rounding)
``lowprec formats NAME``   properties of one format and the value of each of its 256 codes
``lowprec study``          the main job: every attention scheme on the default workloads (and
                           the installed real models), accuracy and restart-rate tables, plots
                           and a JSON report in ``--out`` (:mod:`lowprec.studies.main`);
                           ``--distributed`` under ``torchrun`` spreads it over processes
                           (:mod:`lowprec.studies.distributed`)
``lowprec bench``          speed ratios of the codecs and attention schemes against their peers
                           (:mod:`lowprec.studies.bench`)
``lowprec compile``        compile every Numba kernel ahead of time, so no first use stalls
                           (:mod:`lowprec.compile`)

Every sub-command has ``--help``.  Errors in the arguments print one line to stderr and exit
with status 2.  INFO lines of the ``"lowprec"`` logger (such as the one-time notice that Numba
kernels are being compiled) are shown on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys


def _fmt_float(v: float, integer: bool = False) -> str:
    if integer and math.isfinite(v):
        return str(int(v))
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    m, e = math.frexp(abs(v))
    if m == 0.5:
        return f"{'-' if v < 0 else ''}2^{e - 1}"
    return repr(float(v))  # exact: every code value is a short dyadic float


def format_table() -> str:
    """The one-line-per-format summary printed by ``lowprec formats``."""
    from .formats import available_formats, get_format

    head = (f"{'format':<11} {'kind':<6} {'max':>10} {'min normal':>11} {'min subnorm':>11} "
            f"{'Inf':>4} {'NaN':>4} {'-0':>3}  default rounding")
    rows = [head, "-" * len(head)]
    for name in available_formats():
        i = get_format(name).info
        rows.append(
            f"{name:<11} {i.kind:<6} {_fmt_float(i.max):>10} "
            f"{_fmt_float(i.min_normal) if i.kind != 'int' else '-':>11} "
            f"{_fmt_float(i.min_subnormal):>11} {'yes' if i.has_inf else 'no':>4} "
            f"{'yes' if i.has_nan else 'no':>4} {'yes' if i.has_neg_zero else 'no':>3}  "
            f"{i.default_rounding.name.lower()}"
        )
    return "\n".join(rows)


def format_detail(name: str) -> str:
    """Properties and the value table (every code, 8 per row) of one format."""
    from .formats import get_format

    f = get_format(name)
    i = f.info
    lines = [f"{i.name}: {i.doc}", ""]
    props = [
        ("bits", i.bits), ("kind", i.kind), ("max", _fmt_float(i.max)),
        ("min normal", _fmt_float(i.min_normal)), ("min subnormal", _fmt_float(i.min_subnormal)),
        ("has Inf", i.has_inf), ("has NaN", i.has_nan), ("has -0", i.has_neg_zero),
        ("NaN codes", " ".join(f"0x{c:02X}" for c in i.nan_codes) or "-"),
        ("Inf codes", " ".join(f"0x{c:02X}" for c in i.inf_codes) or "-"),
        ("max code", f"0x{i.max_code:02X}"),
        ("default rounding", i.default_rounding.name.lower()),
    ]
    if i.kind == "mx":
        props += [("element", i.element), ("block size", i.block_size), ("scale", "E8M0")]
    if i.kind == "int":
        props += [("code range", f"[{i.qmin}, {i.qmax}]")]
    lines += [f"  {k:<17} {v}" for k, v in props]
    what = "unscaled element value" if i.kind == "mx" else (
        "integer value" if i.kind == "int" else "value")
    lines += ["", f"code -> {what} (row label + column = code; values are exact)", ""]
    vals = f.values()
    if vals.size > 256:  # 16-bit formats: the table would have 8192 rows
        lines[-2] = f"{vals.size} codes (uint16): lowprec.get_format({i.name!r}).values()"
        return "\n".join(lines)
    lines.append("     " + "".join(f"{'+' + str(c):>18}" for c in range(8)))
    for row in range(vals.size // 8):
        cells = "".join(f"{_fmt_float(float(vals[row * 8 + c]), i.kind == 'int'):>18}"
                        for c in range(8))
        lines.append(f"0x{row * 8:02X} {cells}")
    return "\n".join(lines)


def _cmd_formats(args) -> int:
    if args.name is None:
        print(format_table())
        return 0
    try:
        print(format_detail(args.name))
    except ValueError as e:
        print(f"lowprec formats: {e}", file=sys.stderr)
        return 2
    return 0


def _fail(cmd: str, e: BaseException) -> int:
    print(f"lowprec {cmd}: error: {e}", file=sys.stderr)
    return 2


def check_output_dir(path, what: str = "--out") -> None:
    """Create the output folder ``path`` (with its parents) and check that a file can be
    written in it; ValueError naming the problem (and the option ``what``) otherwise.  Called
    before any work, so a bad ``--out`` (or ``run_study(out=...)``) fails at once, not after
    minutes of computing.  (A real write is the only reliable test: permission bits say nothing
    about ``/proc`` or a read-only mount, or when running as root.)"""
    import os
    import tempfile

    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{what} {str(path)!r} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{what} {str(path)!r} is not a writable folder ({e.strerror})") \
            from None


def check_output_file(path: str, what: str) -> None:
    """Check that the file ``path`` can be written (an existing file is kept as it is until
    the results are written); ValueError naming the problem otherwise."""
    import os

    if os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a folder, not a file")
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ValueError(f"{what} {path!r} cannot be written ({e.strerror})") from None
    if not existed:
        os.remove(path)


def _check_schemes_arg(value: str | None) -> None:
    if value is not None and not [s for s in value.split(",") if s.strip()]:
        raise ValueError(f"--schemes {value!r} names no scheme (see --list-schemes)")


def _int_list(value: str, what: str, least: int) -> list[int]:
    """``"512,2048"`` -> ``[512, 2048]``; ValueError names ``what`` for anything else."""
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} {value!r} must be comma-separated integers") from None
    if not out or min(out) < least:
        raise ValueError(f"{what} {value!r} must name integers >= {least}")
    return out


def _cmd_study(args) -> int:
    from .studies import main as study

    if args.list_schemes:
        for label, (scheme, opts) in study.scheme_runs().items():
            extra = ", ".join(f"{k}={v}" for k, v in opts.items())
            print(f"{label:<24} scheme {scheme!r}{' (' + extra + ')' if extra else ''}")
        return 0
    import os

    main_rank = not args.distributed or os.environ.get("RANK", "0") == "0"
    try:  # fail early, before any work
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        _check_schemes_arg(args.schemes)
        if main_rank:  # (only rank 0 writes the report)
            check_output_dir(args.out)
        selected = study.scheme_runs(args.schemes) if args.schemes else None
        study.resolve_models(args.model, quick=args.quick)
        lengths = _int_list(args.lengths, "--lengths", 2) if args.lengths else None
        if args.windows is not None and args.windows < 1:
            raise ValueError(f"--windows must be >= 1, got {args.windows}")
        resample = args.resample if args.resample in (None, "window", "auto") else \
            _int_list(args.resample, "--resample", 1)[0]
        resample = resample or "auto"
        if args.restart_tokens is not None and args.restart_tokens < 2:
            raise ValueError(f"--restart-tokens must be >= 2, got {args.restart_tokens}")
        group = None
        if args.distributed:
            from .studies import distributed

            group = distributed.init()
    except (ValueError, ImportError) as e:
        return _fail("study", e)
    import logging

    log = logging.getLogger("lowprec")
    level = log.level
    if not main_rank:  # one compilation notice, from rank 0
        log.setLevel(logging.WARNING)
    try:
        study.run_study(args.model, list(selected) if selected else None, quick=args.quick,
                        out=args.out, progress=not args.no_progress, plots=not args.no_plots,
                        seed=args.seed, lengths=lengths, windows=args.windows,
                        critical=args.critical, resample=resample,
                        restart_tokens=args.restart_tokens, group=group)
    finally:
        log.setLevel(level)
        if group is not None:
            distributed.finish(group)
    return 0


def _cmd_bench(args) -> int:
    from .studies import bench

    if args.repeat is not None and args.repeat < 1:
        return _fail("bench", ValueError(f"--repeat must be >= 1, got {args.repeat}"))
    if args.n is not None and args.n < 1:
        return _fail("bench", ValueError(f"--n must be >= 1, got {args.n}"))
    try:  # fail early, before minutes of timing
        _check_schemes_arg(args.schemes)
        if args.json:
            check_output_file(args.json, "--json")
        if args.schemes and args.section in ("all", "attention"):
            from .studies.main import scheme_runs

            scheme_runs(args.schemes)
    except ValueError as e:
        return _fail("bench", e)
    bench.set_omp_wait_policy()  # before torch is imported
    progress = not args.no_progress
    res = {}
    print(f"lowprec bench{' (quick)' if args.quick else ''}: {bench.machine_line()}")
    if args.section in ("all", "formats"):
        n = args.n or (bench.N_QUICK if args.quick else bench.N_DEFAULT)
        r = bench.bench_formats(n, args.repeat or (3 if args.quick else 7), progress=progress)
        res["formats"] = r
        print(bench.format_bench_formats(r))
    if args.section in ("all", "attention"):
        from .studies.main import scheme_runs

        try:
            runs = scheme_runs(args.schemes) if args.schemes else None
        except ValueError as e:
            return _fail("bench", e)
        shapes = bench.QUICK_ATTENTION_SHAPES if args.quick else bench.ATTENTION_SHAPES
        r = bench.bench_attention(shapes, args.repeat or 3, runs, progress=progress)
        res["attention"] = r
        print()
        print(bench.format_bench_attention(r))
    print(f"\n{bench.machine_line()}")
    if args.json:
        import json

        from .studies.main import to_jsonable

        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(to_jsonable(res), fh, indent=1)
        print(f"wrote {args.json}")
    return 0


def _cmd_compile(args) -> int:
    from .compile import cache_location, compile_kernels, compile_tasks

    schemes = None if args.schemes is None else args.schemes
    formats = None if args.formats is None else [f for f in args.formats.split(",") if f.strip()]
    try:
        _check_schemes_arg(args.schemes)
        if args.formats is not None and not formats:
            raise ValueError(f"--formats {args.formats!r} names no format")
        compile_tasks(schemes, formats)  # unknown names: one line, before any work
    except ValueError as e:
        return _fail("compile", e)
    print("lowprec compile: compiling Numba kernels (minutes on a fresh installation; "
          "seconds when they are cached)", flush=True)
    res = compile_kernels(schemes, formats, progress=not args.no_progress)
    failed = {k: v["error"] for k, v in res["items"].items() if "error" in v}
    for label, v in res["items"].items():
        if args.verbose and "error" not in v:
            print(f"  {label:<28} {v['seconds']:7.2f} s  {v['compiled']:3d} compiled")
    for label, err in failed.items():
        print(f"  {label}: {err}", file=sys.stderr)
    print(f"compiled {res['compiled']} kernels for {len(res['items'])} schemes and formats in "
          f"{res['seconds']:.0f} s (0: all were cached); Numba cache: {cache_location()}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lowprec`` command."""
    from . import __version__
    from .studies.main import DEFAULT_OUT, MODEL_CHOICES

    p = argparse.ArgumentParser(
        prog="lowprec",
        description="Bit-exact emulation of low-precision number formats and attention.",
        epilog="Run `lowprec COMMAND --help` for a command's options.",
    )
    p.add_argument("--version", action="version", version=f"lowprec {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    pf = sub.add_parser("formats", help="print the format table, or one format's code table",
                        description="Without NAME: one line per format. With NAME: its "
                                    "properties and the value of each of its 256 codes.")
    pf.add_argument("name", nargs="?", help="a format name (see `lowprec formats`)")
    pf.set_defaults(func=_cmd_formats)

    ps = sub.add_parser(
        "study", help="the main job: every scheme, accuracy and restart-rate tables, plots, "
                      "a JSON report",
        description="Run every attention scheme on the default workloads (synthetic LM-like "
                    "decoder heads, encoder heads and U(-4, 4) ViT-shaped inputs; plus the "
                    "real models that are installed: SmolLM2 perplexity and restart rates, "
                    "MiniLM embeddings), compare with float64 attention, sweep the BAPS "
                    "restart threshold, print the tables and write plots, summary.txt and "
                    "report.json to --out.",
        epilog="Example: lowprec study --quick --schemes flash,baps,intattention --out run1")
    ps.add_argument("--model", choices=MODEL_CHOICES, default="auto",
                    help="real models to run: auto = every installed one (none: synthetic "
                         "workloads only); synthetic = none; all = both (default: auto)")
    ps.add_argument("--schemes", metavar="LIST",
                    help="comma-separated scheme names or runs (e.g. baps/e2e_hif8,qflash; "
                         "see --list-schemes); default: all")
    ps.add_argument("--quick", action="store_true",
                    help="small sizes (a few minutes on 2 cores, including Numba compilation)")
    ps.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"output folder for plots and report.json (default: {DEFAULT_OUT})")
    ps.add_argument("--no-plots", action="store_true", help="do not write plots")
    ps.add_argument("--no-progress", action="store_true", help="no progress bars")
    ps.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    ps.add_argument("--list-schemes", action="store_true",
                    help="list the scheme runs and exit")
    ps.add_argument("--lengths", metavar="LIST",
                    help="SmolLM2 perplexity window lengths in tokens (default 512; the full "
                         "study: 512,2048,4096,8192, hours on 2 cores)")
    ps.add_argument("--windows", type=int, metavar="N",
                    help="SmolLM2 perplexity windows per length (default 8)")
    ps.add_argument("--critical", choices=("first+diagonal", "first", "first+last"),
                    help="critical tile set of the BAPS restart study on SmolLM2 (default "
                         "first+diagonal, see docs/design.md)")
    ps.add_argument("--restart-tokens", type=int, metavar="N",
                    help="window of the SmolLM2 restart study (default 2048; SmolLM2 reaches "
                         "8192)")
    ps.add_argument("--resample", metavar="UNIT",
                    help="perplexity bootstrap unit: auto (default: windows from 8 windows on, "
                         "else segments), window, or a segment length in tokens")
    ps.add_argument("--distributed", action="store_true",
                    help="spread the study's independent runs over the processes torchrun "
                         "started (torch.distributed, gloo; one process per GPU): torchrun "
                         "--nproc-per-node N -m lowprec.studies.distributed [these options]; "
                         "rank 0 gathers the results and writes the same report as one "
                         "process (docs/design.md)")
    ps.set_defaults(func=_cmd_study)

    pb = sub.add_parser(
        "bench", help="speed ratios of codecs and attention schemes against their peers",
        description="Time lowprec's encode/quantize against ml_dtypes, torch and en-dtypes "
                    "(those installed) and every attention scheme against torch SDPA, "
                    "round-robin in one process; print the medians and ratios. The source "
                    "checkout's benchmarks/ folder has the full reports.")
    pb.add_argument("--section", choices=("all", "formats", "attention"), default="all",
                    help="what to time (default: all)")
    pb.add_argument("--quick", action="store_true", help="small inputs, fewer rounds")
    pb.add_argument("--n", type=int, help="float32 elements for the codec section "
                                          "(default 2^22, quick 2^20)")
    pb.add_argument("--repeat", type=int, help="timed rounds (default 7 codecs / 3 attention)")
    pb.add_argument("--schemes", metavar="LIST",
                    help="attention runs to time (as `lowprec study --schemes`)")
    pb.add_argument("--json", metavar="PATH", help="also write the results to this file")
    pb.add_argument("--no-progress", action="store_true", help="no progress bars")
    pb.set_defaults(func=_cmd_bench)

    pc = sub.add_parser(
        "compile", help="compile every Numba kernel ahead of time (no stall on first use)",
        description="Run every attention scheme (each variant), softmax surrogate and format "
                    "once on small inputs, so that Numba compiles their kernels now and caches "
                    "them on disk; later processes load them in milliseconds instead of "
                    "compiling for 2-12 s per scheme on first use. Run it once after installing "
                    "or updating lowprec; `lowprec study` does it first by itself.",
        epilog="Example: lowprec compile --schemes flash,baps/e2e_hif8 --formats hif8")
    pc.add_argument("--schemes", metavar="LIST",
                    help="attention scheme names or runs (as `lowprec study --schemes`) and "
                         "softmax surrogates; default: all")
    pc.add_argument("--formats", metavar="LIST",
                    help="comma-separated format names; default: all (`lowprec formats`)")
    pc.add_argument("--no-progress", action="store_true", help="no progress bar")
    pc.add_argument("-v", "--verbose", action="store_true",
                    help="one line per scheme and format: seconds and kernels compiled")
    pc.set_defaults(func=_cmd_compile)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lowprec`` console script.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 2 for a usage error, 130 when interrupted.

    Example:
        >>> main(["formats"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    handler = _show_notices()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("lowprec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    finally:
        if handler is not None:
            import logging

            logging.getLogger("lowprec").removeHandler(handler)


def _show_notices():
    """Show the ``"lowprec"`` logger's INFO lines (the one-time compilation notice) on stderr
    while the command runs, unless the application configured that logger itself; returns the
    handler added (None if none)."""
    import logging

    log = logging.getLogger("lowprec")
    if log.handlers:
        return None
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("lowprec: %(message)s"))
    h.setLevel(logging.INFO)
    log.addHandler(h)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    return h


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
