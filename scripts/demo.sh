#!/usr/bin/env bash
# Install everything (scripts/setup.sh) and run the main job: SGLang with the canary on a
# built-in tiny dummy-weight model (GPU), or the CPU self-check where no GPU is visible.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${KV_CANARY_VENV:-$repo/.venv}
bash "$repo/scripts/setup.sh"
exec "$venv/bin/python" -m sglang.srt.kv_canary.demo "$@"
