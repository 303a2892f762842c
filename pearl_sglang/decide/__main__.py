"""Read a profile (file or stdin), print the decision (or, with --plan, the plan) as JSON.

Exit status 0 on success, 2 on bad input with a message naming the bad key (also for
inputs whose predictions overflow: the output is strict JSON, never ``Infinity``).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from pearl_sglang.decide.request import InputError, parse, run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pearl_sglang.decide", description=__doc__)
    p.add_argument("input", nargs="?", default="-", help="JSON profile file, or - for stdin (default)")
    p.add_argument("--plan", action="store_true",
                   help="also read 'table' (and optional 'target', 'available_gpus') and print the minimal-change plan")
    p.add_argument("--indent", type=_indent, default=2, help="JSON indent, 0-16 (default 2)")
    return p


def _indent(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be in [0, 16], got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        print(f"error: cannot read {args.input}: {e.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"error: cannot read {args.input}: not UTF-8 text ({e.reason} at byte {e.start})", file=sys.stderr)
        return 2
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, an int past 4300 digits, nesting
        print(f"error: input is not valid JSON: {e}", file=sys.stderr)
        return 2
    try:
        result = run(parse(data, plan_mode=args.plan))
        out = json.dumps(result, indent=args.indent, allow_nan=False)
    except InputError as e:
        print(f"error: invalid input: {e}", file=sys.stderr)
        return 2
    except (OverflowError, ValueError) as e:  # an int past a float's range, or a prediction that overflows
        print(f"error: invalid input: a value is too large for the model ({e})", file=sys.stderr)
        return 2
    sys.stdout.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
