#!/usr/bin/env bash
# Run PEARL's main job on a fresh machine (no GPU): makes .venv if needed, installs PEARL,
# then runs python -m pearl_sglang.demo with any arguments given (--help lists them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv demo
exec .venv/bin/python -m pearl_sglang.demo "$@"
