#!/usr/bin/env bash
# Install everything on a fresh machine into a virtual environment (idempotent):
# sglang 0.5.12.post1 under the pinned constraints, then this package with `pip install .`.
#   KV_CANARY_VENV   where the venv lives (default: .venv in the repo root)
#   KV_CANARY_PYTHON the interpreter that creates it (default: python3)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${KV_CANARY_VENV:-$repo/.venv}
constraints="$repo/constraints/sglang-0.5.12.post1.txt"
if [ ! -x "$venv/bin/python" ]; then
  "${KV_CANARY_PYTHON:-python3}" -m venv "$venv"
fi
# --no-cache-dir: the wheels are not kept a second time (CI machines can be short of disk).
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.12.post1'" 2>/dev/null; then
  echo "[setup] installing sglang 0.5.12.post1 (a few minutes, several GB)"
  "${pip[@]}" install -q "sglang==0.5.12.post1" -c "$constraints"
fi
# pytest runs the tests; setuptools >= 70.1 builds wheels without isolation (wheel-contents test)
"${pip[@]}" install -q pytest "setuptools>=70.1" -c "$constraints"
echo "[setup] installing sglang-kv-canary from $repo"
"${pip[@]}" install -q "$repo" -c "$constraints"
echo "[setup] ready: $venv"
