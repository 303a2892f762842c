#!/usr/bin/env bash
# Run PEARL's tests on a fresh machine: makes .venv, sets up real SGLang for CPU
# (.sglang-cpu, see scripts/setup_sglang_cpu.sh), then runs pytest with any arguments given.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp="$(sha256sum setup.py | cut -c1-16)"
if [ "$(cat .venv/.pearl-stamp-test 2>/dev/null)" != "$stamp" ]; then
  echo "[test] installing pearl-sglang[test] into .venv" >&2
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v '^WARNING: Location' >&2 || true
  .venv/bin/python -c "import pearl_sglang, pytest, hypothesis, aiohttp" 
  echo "$stamp" > .venv/.pearl-stamp-test
fi
bash scripts/setup_sglang_cpu.sh
exec .venv/bin/python -m pytest "$@"
