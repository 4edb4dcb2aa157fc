#!/usr/bin/env bash
# Install everything (scripts/setup.sh) and run the registered tests. Tests marked `gpu` skip
# cleanly without a CUDA device. Extra arguments go to pytest. Fails when no test ran.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${KV_CANARY_VENV:-$repo/.venv}
bash "$repo/scripts/setup.sh"
cd "$repo"
# pytest exits 5 when it collected no test: that is a failure here, like any non-zero code.
exec "$venv/bin/python" -m pytest test/registered -q "$@"
