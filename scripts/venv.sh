# Sourced by scripts/demo.sh and scripts/test.sh: make .venv and install PEARL with the
# extra named in $1 once per version of setup.py.
ensure_venv() {
  local extra="$1"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  local stamp
  stamp="$(sha256sum setup.py | cut -c1-16)"
  if [ "$(cat ".venv/.pearl-stamp-$extra" 2>/dev/null)" != "$stamp" ]; then
    echo "[pearl] installing pearl-sglang[$extra] into .venv" >&2
    .venv/bin/pip install -q --disable-pip-version-check -e ".[$extra]" 2>&1 | grep -v '^WARNING: Location' >&2 || true
    .venv/bin/python -c "import pearl_sglang, aiohttp, numpy"
    echo "$stamp" > ".venv/.pearl-stamp-$extra"
  fi
  # Compile the numba kernels once per checkout (cached under __pycache__; ~1 s when they
  # are). Otherwise the first emulated workers on a fresh machine compile them inside their
  # engine's first step: seconds with the event loop blocked while emulated time runs on.
  .venv/bin/python -c "from pearl_sglang.router import block_keys, prefix_map
from pearl_sglang.emulator import prefix_cache, stretch_draws
for kernels in (block_keys, prefix_map, prefix_cache, stretch_draws): kernels.warm()"
}
