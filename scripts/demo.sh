#!/usr/bin/env bash
# Run PEARL's main job on a fresh machine (no GPU): makes .venv if needed, installs PEARL,
# then runs python -m pearl_sglang.demo with any arguments given (--help lists them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp="$(sha256sum setup.py | cut -c1-16)"
if [ "$(cat .venv/.pearl-stamp-demo 2>/dev/null)" != "$stamp" ]; then
  echo "[demo] installing pearl-sglang[demo] into .venv" >&2
  .venv/bin/pip install -q --disable-pip-version-check -e '.[demo]' 2>&1 | grep -v '^WARNING: Location' >&2 || true
  .venv/bin/python -c "import pearl_sglang, numpy, matplotlib, aiohttp"
  echo "$stamp" > .venv/.pearl-stamp-demo
fi
exec .venv/bin/python -m pearl_sglang.demo "$@"
