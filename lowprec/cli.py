"""The ``lowprec`` command.

``lowprec formats``        table of every format (bits, range, specials, default rounding)
``lowprec formats NAME``   properties of one format and the value of each of its 256 codes

(``lowprec study`` and ``lowprec bench`` arrive with the studies and kernels.)
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
    """Properties and the 16 x 16 value table of one format."""
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
    lines.append("     " + "".join(f"{'+' + str(c):>18}" for c in range(8)))
    for row in range(32):
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lowprec`` command."""
    p = argparse.ArgumentParser(
        prog="lowprec",
        description="Bit-exact emulation of low-precision number formats and attention.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    pf = sub.add_parser("formats", help="print the format table, or one format's code table",
                        description="Without NAME: one line per format. With NAME: its "
                                    "properties and the value of each of its 256 codes.")
    pf.add_argument("name", nargs="?", help="a format name (see `lowprec formats`)")
    pf.set_defaults(func=_cmd_formats)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lowprec`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
