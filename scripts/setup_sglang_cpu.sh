#!/usr/bin/env bash
# Set up real SGLang 0.5.23 for CPU-only test machines, into a folder git ignores.
#
#   bash scripts/setup_sglang_cpu.sh [DIR]      (default: .sglang-cpu)
#
# Idempotent: each step is skipped when its result is already there and up to date.
# Needs only PyPI and Debian's archive. What it makes:
#   DIR/venv       CPU torch 2.13.0, SGLang's pure-Python needs, sglang (no deps),
#                  mooncake-transfer-engine-non-cuda, sglang-router 0.3.2
#   DIR/sysroot    libibverbs userland (Mooncake needs libibverbs.so.1), unpacked locally
#   DIR/env.json   what a test fixture needs to start a server: python, environment
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
dir="${1:-$repo/.sglang-cpu}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
req="$here/sglang-cpu-requirements.txt"
shims="$repo/tests/realsglang/shims"
log() { printf '[setup-sglang-cpu] %s\n' "$*" >&2; }

stamp="$(cat "$req" "$0" | sha256sum | cut -c1-16)"
if [ -f "$dir/venv/.pearl-stamp" ] && [ "$(cat "$dir/venv/.pearl-stamp")" = "$stamp" ]; then
  log "venv up to date"
else
  log "creating venv in $dir/venv (a few minutes on a cold pip cache)"
  rm -rf "$dir/venv"
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q --disable-pip-version-check -r "$req" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  # sglang pins torch 2.14.1 and CUDA-only kernels; the CPU lane runs it on 2.13.0.
  "$dir/venv/bin/pip" install -q --disable-pip-version-check --no-deps sglang==0.5.23 2>&1 | grep -v '^WARNING: Location' >&2 || true
  PYTHONPATH="$shims" "$dir/venv/bin/python" -c "import sglang, torch, torchvision, mooncake, sglang_router" \
    || { log "venv is incomplete"; exit 1; }
  echo "$stamp" > "$dir/venv/.pearl-stamp"
fi

libdir="$dir/sysroot/usr/lib/x86_64-linux-gnu"
if [ ! -e "$libdir/libibverbs.so.1" ]; then
  log "unpacking libibverbs userland into $dir/sysroot"
  debs="$dir/debs"
  mkdir -p "$debs"
  pkgs=(libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200)
  (cd "$debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1) || {
    log "apt-get download found nothing; running apt-get update once"
    apt-get update -qq >/dev/null
    (cd "$debs" && apt-get download "${pkgs[@]}" >/dev/null)
  }
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dir/sysroot"; done
  [ -e "$libdir/libibverbs.so.1" ] || { log "libibverbs.so.1 missing after unpack"; exit 1; }
fi

ld="$libdir:$dir/sysroot/lib/x86_64-linux-gnu"
python3 - "$dir" "$ld" "$shims" <<'PY'
import json, sys
d, ld, shims = sys.argv[1:4]
env = {"LD_LIBRARY_PATH": ld, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": shims}
json.dump({"python": f"{d}/venv/bin/python", "env": env}, open(f"{d}/env.json", "w"), indent=1)
PY
log "ready: $dir/env.json"
