#!/usr/bin/env bash
# Run groups of GPU tests side by side on one GPU host, from the repo root (carry .gpu):
#
#   bash scripts/gpu_tests_parallel.sh "test/registered/e2e/test_detection_e2e.py" \
#       "test/registered/e2e/test_features_e2e.py -k 'sweep or seq_lens'" "test/registered/kernels"
#
# Each argument is one shard: a string of pytest args (shell words, so quote a -k expression),
# run as its own `python3 -m pytest -m gpu <shard> -q` beside the others. The tiny-model servers
# the end-to-end tests start are small (a capped KV pool; SGLang sizes the pool from the memory
# free at start), so several share one GPU; tests that compare the memory of two servers must
# not run beside others (GPU_TESTS_SERIAL names a shard run alone, before the parallel ones).
# The whole script ends within GPU_TESTS_DEADLINE_S (default 570) of its start. Leaves in $OUT:
#   gpu-tests.log       GPU header, install, each shard's summary line and exit code
#   shard-logs.tar.gz   every shard's full pytest output and junit report
#   server-logs.tar.gz  every server log the tests kept
# Exit code: 0 when every shard passed, else 1.
set -uo pipefail

repo=$(pwd)
OUT=${OUT:-$repo/gpu-out}
started=$(date +%s)
say() { echo "[gpu_tests_parallel $(date +%H:%M:%S) +$(( $(date +%s) - started ))s] $*"; }
left() { echo $(( ${GPU_TESTS_DEADLINE_S:-570} - ($(date +%s) - started) - 25 )); }

run_shard() {  # run_shard NAME "ARGS" LIMIT_S
  local name=$1 limit=$3 args
  eval "args=($2)"  # shell words: quote a -k expression
  local has_path=0 arg
  for arg in "${args[@]}"; do case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_path=1 ;; esac; done
  [ "$has_path" = 1 ] || args+=(test/registered)
  KV_CANARY_TEST_LOG_DIR="$logs/$name" timeout --signal=INT --kill-after=20 "$limit" \
    python3 -m pytest -m gpu "${args[@]}" -q -p no:cacheprovider --durations=10 \
    --junitxml="$shards/$name.xml" > "$shards/$name.log" 2>&1
  local rc=$?
  say "shard $name ($2): exit $rc; $(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$shards/$name.log" | tail -n 30 | tr '\n' ';')"
  return "$rc"
}

main() {
  if [ ! -f pyproject.toml ] || [ ! -f .gpu/gpu_env.sh ]; then
    say "run me from the repo root with .gpu carried"; return 2
  fi
  timeout 30 nvidia-smi 2>&1 | head -15
  # shellcheck source=/dev/null
  source .gpu/gpu_env.sh || { say "gpu_env.sh failed"; return 3; }
  export PYTHONUNBUFFERED=1
  logs=$(mktemp -d); shards=$(mktemp -d)
  local failed=0 pids=() i=0 shard
  if [ -n "${GPU_TESTS_SERIAL:-}" ]; then
    run_shard serial "$GPU_TESTS_SERIAL" "$(left)" || failed=1
  fi
  for shard in "$@"; do
    i=$((i + 1))
    run_shard "shard$i" "$shard" "$(left)" & pids+=($!)
    sleep 2  # stagger the first server starts
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  find "$logs" -name server-pgids.txt -exec cat {} + 2>/dev/null | while read -r pgid; do
    [ -n "$pgid" ] && kill -0 -- "-$pgid" 2>/dev/null && kill -KILL -- "-$pgid" 2>/dev/null \
      && say "killed leftover server process group $pgid"
  done
  find "$logs" -type f -size +4M -exec sh -c 'tail -c 4000000 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
  tar -C "$shards" -czf "$OUT/shard-logs.tar.gz" . && tar -C "$logs" -czf "$OUT/server-logs.tar.gz" .
  rm -rf "$logs" "$shards"
  say "done (failed=$failed); in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return "$failed"
}

mkdir -p "$OUT"
main "$@" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
