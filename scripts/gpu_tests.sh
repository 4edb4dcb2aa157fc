#!/usr/bin/env bash
# Run the GPU tests on the offline GPU host, from the repo root (the device call carries .gpu):
#
#   bash scripts/gpu_tests.sh                                   # every `gpu` test
#   bash scripts/gpu_tests.sh test/registered/e2e -k log_mode   # a subset: any pytest args
#
# Installs SGLang's bundle and this checkout (source .gpu/gpu_env.sh), then runs
# `python3 -m pytest -m gpu <args> -x -q` (`-m gpu` unless the args give -m; test/registered
# unless they name a path), bounded so the whole script ends within GPU_TESTS_DEADLINE_S of its
# start (default 570; the device allows 600 s a call). Leaves in $OUT (default ./gpu-out):
#   gpu-tests.log       everything printed: GPU header, install, pytest, timings
#   gpu-junit.xml       pytest's junit report
#   server-logs.tar.gz  every server log the tests kept ($KV_CANARY_TEST_LOG_DIR)
# Server process groups left behind by a test that was cut off are killed here.
# GPU_TESTS_KEEP_GOING=1 runs past the first failure (default: -x).
# Exit code: pytest's (124 when the time limit cut it off).
set -uo pipefail

repo=$(pwd)
OUT=${OUT:-$repo/gpu-out}
started=$(date +%s)

say() { echo "[gpu_tests $(date +%H:%M:%S) +$(( $(date +%s) - started ))s] $*"; }

run() {
  if [ ! -f pyproject.toml ] || [ ! -f .gpu/gpu_env.sh ]; then
    say "run me from the repo root with .gpu carried (pyproject.toml or .gpu/gpu_env.sh missing)"
    return 2
  fi
  timeout 30 nvidia-smi 2>&1 | head -15
  # shellcheck source=/dev/null
  source .gpu/gpu_env.sh || { say "gpu_env.sh failed"; return 3; }
  say "installed: $(python3 -c 'import importlib.metadata as m, torch; print("sglang", m.version("sglang"), "| sglang-kv-canary", m.version("sglang-kv-canary"), "| torch", torch.__version__, "| cuda", torch.cuda.is_available())' 2>&1 | tail -1)"

  local logs
  logs=$(mktemp -d "${TMPDIR:-/tmp}/kv_canary_gpu_logs.XXXXXX")
  export KV_CANARY_TEST_LOG_DIR="$logs" PYTHONUNBUFFERED=1

  local args=("$@") has_path=0 has_marker=0 arg
  for arg in "${args[@]}"; do
    [ "$arg" = "-m" ] && has_marker=1
    case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_path=1 ;; esac
  done
  [ "$has_marker" = 1 ] || args=(-m gpu "${args[@]}")
  [ "$has_path" = 1 ] || args+=(test/registered)

  local budget=$(( ${GPU_TESTS_DEADLINE_S:-570} - ($(date +%s) - started) - 20 ))
  local stop_flag=-x  # GPU_TESTS_KEEP_GOING=1: run every selected test even after a failure
  [ "${GPU_TESTS_KEEP_GOING:-0}" = 1 ] && stop_flag=
  say "python3 -m pytest ${args[*]} $stop_flag -q (limit ${budget} s)"
  timeout --signal=INT --kill-after=20 "$budget" python3 -m pytest "${args[@]}" $stop_flag -q \
    -p no:cacheprovider --durations=15 --junitxml="$OUT/gpu-junit.xml"
  local rc=$?
  say "pytest exit code $rc"

  local pgid
  if [ -f "$logs/server-pgids.txt" ]; then
    while read -r pgid; do
      if [ -n "$pgid" ] && kill -0 -- "-$pgid" 2>/dev/null; then
        say "killing leftover server process group $pgid"
        kill -KILL -- "-$pgid" 2>/dev/null
      fi
    done < "$logs/server-pgids.txt"
  fi
  find "$logs" -type f -size +4M -exec sh -c 'tail -c 4000000 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
  tar -C "$logs" -czf "$OUT/server-logs.tar.gz" . && rm -rf "$logs"
  say "done; in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return "$rc"
}

mkdir -p "$OUT"
run "$@" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
