#!/usr/bin/env bash
# Run PEARL's tests on a fresh machine: makes .venv, sets up real SGLang for CPU
# (.sglang-cpu, see scripts/setup_sglang_cpu.sh), then runs pytest with any arguments given.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv test
bash scripts/setup_sglang_cpu.sh
exec .venv/bin/python -m pytest "$@"
