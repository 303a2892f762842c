"""Read a profile (file or stdin), print the decision (or, with --plan, the plan) as JSON.

Exit status 0 on success, 2 on bad input with a message naming the bad key.
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
    p.add_argument("--indent", type=int, default=2, help="JSON indent (default 2)")
    return p


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
    try:
        data = json.loads(text)
        result = run(parse(data, plan_mode=args.plan))
    except json.JSONDecodeError as e:
        print(f"error: input is not valid JSON: {e}", file=sys.stderr)
        return 2
    except InputError as e:
        print(f"error: invalid input: {e}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout, indent=args.indent)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
