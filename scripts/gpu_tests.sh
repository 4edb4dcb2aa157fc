#!/usr/bin/env bash
# Run the GPU tests on the offline GPU host, from the repo root (the device call carries .gpu):
#
#   bash scripts/gpu_tests.sh 1        # plan 1: its shards side by side, then its serial shard
#   bash scripts/gpu_tests.sh 2        # plan 2 (the two plans hold every `gpu` test once)
#   bash scripts/gpu_tests.sh all      # plan 1, then plan 2 (a host without a per-call limit)
#   bash scripts/gpu_tests.sh shards swa-clean kernels   # named shards of any plan, side by side
#   bash scripts/gpu_tests.sh test/registered/e2e -k log_mode   # a subset: any pytest args
#
# Installs SGLang's bundle and this checkout (source .gpu/gpu_env.sh), then runs the plan's
# shards (GPU_PLAN below), each its own `python3 -m pytest -m gpu <selectors>` beside the
# others: the tiny-model servers the end-to-end tests start cap their KV pool, so a dozen share
# one GPU. A serial shard runs after the others, alone (its tests compare the KV pools of two
# servers, which SGLang sizes from the memory free at their start). A plan ends within
# GPU_TESTS_DEADLINE_S (default 570; the device allows 600 s a call) of its start (of the
# script's start for the first plan); the parallel shards stop early enough to leave the serial
# shard its expected time. A subset is one pytest run: `-m gpu` unless the args give -m,
# test/registered unless they name a path, -x unless GPU_TESTS_KEEP_GOING=1.
# Leaves in $OUT (default ./gpu-out):
#   gpu-tests.log       GPU header, install, each shard's exit code, seconds (expected) and
#                       summary; a subset's whole pytest output
#   shard-logs.tar.gz   every shard's full pytest output (<plan>-<shard>.log) and junit report
#   server-logs.tar.gz  every server log the tests kept, per shard
# Server process groups left behind by a shard that was cut off are killed here.
# Exit code: 0 when every shard passed, else 1 (a subset: pytest's; 124 when cut off).
set -uo pipefail

# The plan: "shard PLAN NAME EXPECTED_S [serial]" starts a shard, its selectors follow, one per
# line (a folder, a test file, or FILE::TEST for a test function with all its parameters: a
# folder takes whatever `gpu` tests it comes to hold, a file or test must hold one). EXPECTED_S is
# the shard's seconds at the per-test durations measured with ten to twelve shards side by side
# (the server tests' side-by-side durations and, for its first server, the ~85 s a cold Triton
# cache adds); PLAN_INSTALL_S + the longest parallel shard + the serial shards of a plan stay
# within PLAN_TARGET_S (test/registered/test_gpu_plan.py checks that, and that the two plans
# hold every `gpu` test exactly once). Tests sharing a module's server (`shared_servers`) stay
# in one shard. Per-test durations are in each shard's log (--durations) to rebalance from.
readonly PLAN_TARGET_S=420 PLAN_INSTALL_S=40
readonly GPU_PLAN='
shard 1 detection-graphs 210
    test/registered/e2e/test_detection_e2e.py::test_canary_on_and_off_generate_identical_tokens
    test/registered/e2e/test_detection_e2e.py::test_clean_mixed_workload_with_cuda_graphs_has_no_violation
shard 1 detection-no-graphs 215
    test/registered/e2e/test_detection_e2e.py::test_clean_mixed_workload_without_cuda_graphs_has_no_violation
    test/registered/e2e/test_detection_e2e.py::test_clean_mixed_workload_without_overlap_scheduling_has_no_violation
shard 1 detection-req-to-token 205
    test/registered/e2e/test_detection_e2e.py::test_req_to_token_fault_is_logged_and_serving_goes_on
    test/registered/e2e/test_detection_e2e.py::test_req_to_token_fault_stops_the_scheduler_in_raise_mode
shard 1 detection-real-kv 205
    test/registered/e2e/test_detection_e2e.py::test_real_kv_used_fault_is_caught_by_the_real_data_check
    test/registered/e2e/test_detection_e2e.py::test_a_real_data_stride_catches_the_faults_at_positions_due_in_their_forward
shard 1 detection-landing 130
    test/registered/e2e/test_detection_e2e.py::test_a_lost_kv_write_is_caught_by_the_landing_check
shard 1 detection-ownership-faults 200
    test/registered/e2e/test_detection_e2e.py::test_real_kv_used_fault_is_silent_without_real_data
    test/registered/e2e/test_ownership_e2e.py::test_a_foreign_but_consistent_prefix_is_caught_by_ownership_alone
shard 1 ownership-clean 225
    test/registered/e2e/test_ownership_e2e.py::test_parallel_sampling_and_shared_prompts_have_no_violation
shard 1 features-sweep 215
    test/registered/e2e/test_features_e2e.py::test_sweep_keeps_a_long_run_with_eviction_clean
    test/registered/e2e/test_features_e2e.py::test_sweep_reports_a_flipped_byte_in_an_unused_cached_slot
shard 1 features-faults 210
    test/registered/e2e/test_features_e2e.py::test_a_byte_flipped_after_the_forward_is_reported_by_a_later_verify
    test/registered/e2e/test_features_e2e.py::test_reinjected_padded_row_bug_is_reported
shard 1 features-reliability 215
    test/registered/e2e/test_features_e2e.py::test_a_seq_lens_drift_is_reported_by_the_invariant
    test/registered/e2e/test_reliability_e2e.py::test_log_mode_keeps_reporting_after_a_long_persistent_fault
shard 1 refusals 215
    test/registered/e2e/test_reliability_e2e.py::test_an_invalid_client_bootstrap_room_does_not_take_the_server_down
    test/registered/e2e/test_detection_e2e.py::test_piecewise_cuda_graph_is_refused_at_start_up
    test/registered/e2e/test_startup_e2e.py::test_bad_mode_stops_the_launch_before_loading_a_model
shard 1 launch-flags 120
    test/registered/e2e/test_startup_e2e.py::test_launch_flags_alone_turn_the_canary_on
shard 1 swa-clean-graphs 150
    test/registered/e2e/test_swa_e2e.py::test_a_sliding_window_model_serves_clean_with_cuda_graphs
shard 1 swa-clean-paged 150
    test/registered/e2e/test_swa_e2e.py::test_a_sliding_window_model_serves_clean_without_graphs_at_page_16
shard 1 mla-clean 170
    test/registered/e2e/test_mla_e2e.py::test_an_mla_model_serves_clean_with_cuda_graphs
    test/registered/e2e/test_mla_e2e.py::test_an_untested_mla_attention_backend_is_refused_at_start_up
shard 1 mla-faults 230
    test/registered/e2e/test_mla_e2e.py::test_faults_on_an_mla_pool_are_caught
    test/registered/e2e/test_mla_e2e.py::test_faults_on_an_fp8_mla_pool_are_caught
shard 1 memory 125 serial
    test/registered/e2e/test_startup_e2e.py::test_canary_off_leaves_no_trace_in_the_log
    test/registered/e2e/test_startup_e2e.py::test_log_mode_serves_and_logs_the_startup_line
    test/registered/e2e/test_startup_e2e.py::test_kv_pool_shrinks_by_the_documented_amount
shard 2 oracle-eagle 265
    test/registered/token_oracle/test_oracle_e2e.py::test_tiny_eagle_draft_serves_speculatively
    test/registered/token_oracle/test_oracle_e2e.py::test_every_token_follows_the_oracle_with_eagle
shard 2 kernels-differential 185
    test/registered/kernels/test_canary_forward_differential.py
shard 2 kernels 200
    test/registered/kernels/test_accepted_owner_kernel.py
    test/registered/kernels/test_admission_owner_kernel.py
    test/registered/kernels/test_append_history_kernel.py
    test/registered/kernels/test_canary_forward_cuda_graph.py
    test/registered/kernels/test_canary_forward_detection.py
    test/registered/kernels/test_canary_forward_hand.py
    test/registered/kernels/test_canary_sweep.py
    test/registered/kernels/test_canary_triton_helpers.py
    test/registered/kernels/test_direct_launch.py
    test/registered/kernels/test_hash_oracle_kernel.py
    test/registered/kernels/test_packed_views_never_recompile.py
    test/registered/kernels/test_padded_rows.py
    test/registered/kernels/test_publish_counters_kernel.py
    test/registered/kernels/test_write_landed.py
    test/registered/kernels/test_rekey_loaded_kernel.py
    test/registered/token_history/test_token_history_gpu.py
    test/registered/token_history/test_token_checks_cuda_graph.py
    test/registered/token_oracle/test_oracle_cuda.py
    test/registered/token_oracle/test_graph_tokens.py
    test/registered/token_checks
    test/registered/runner
    test/registered/monitor
    test/registered/tools
shard 2 eagle-clean 265
    test/registered/e2e/test_eagle_e2e.py::test_clean_eagle_workload_has_no_violation
shard 2 eagle-faults 280
    test/registered/e2e/test_eagle_e2e.py::test_req_to_token_fault_is_caught_with_eagle
    test/registered/e2e/test_eagle_e2e.py::test_the_sweep_reports_a_flipped_byte_in_an_unused_cached_slot_with_eagle
    test/registered/token_oracle/test_oracle_e2e.py::test_next_token_swap_changes_exactly_the_predicted_tokens
shard 2 eagle-draft 275
    test/registered/e2e/test_eagle_e2e.py::test_multi_token_acceptance_keeps_the_owner_chains
    test/registered/e2e/test_eagle_e2e.py::test_the_draft_token_sglang_writes_at_a_chunk_boundary_is_reported
    test/registered/e2e/test_eagle_e2e.py::test_the_draft_extend_runner_s_stale_padded_rows_are_reported_when_reinjected
shard 2 token-checks-clean 310
    test/registered/token_history/test_token_checks_e2e.py::test_clean_workload_with_both_token_checks_has_no_violation
shard 2 token-checks-faults 260
    test/registered/token_history/test_token_checks_e2e.py::test_next_token_swap_is_reported_by_write_token_only
    test/registered/token_history/test_token_checks_e2e.py::test_input_ids_faults_are_caught_by_the_token_checks_only
shard 2 oracle-sampled 270
    test/registered/token_oracle/test_oracle_e2e.py::test_every_token_follows_the_oracle_without_cuda_graphs
    test/registered/token_oracle/test_oracle_e2e.py::test_every_token_follows_the_oracle_with_padded_cuda_graphs
    test/registered/token_history/test_token_checks_e2e.py::test_clean_sampled_workload_with_verify_token_has_no_violation
shard 2 oracle-chunked 255
    test/registered/token_oracle/test_oracle_e2e.py::test_every_token_follows_the_oracle_with_chunked_prefill
    test/registered/token_oracle/test_oracle_e2e.py::test_oracle_without_its_sampling_backend_is_refused
shard 2 sync-demo 235
    test/registered/e2e/test_host_sync_e2e.py
    test/registered/e2e/test_demo_e2e.py
shard 2 burnin 300
    test/registered/e2e/test_burnin_e2e.py
shard 2 swa-faults-window 150
    test/registered/e2e/test_swa_e2e.py::test_faults_in_the_sliding_window_sub_pool_are_caught
shard 2 swa-faults-full 150
    test/registered/e2e/test_swa_e2e.py::test_faults_in_the_full_attention_sub_pool_are_caught
shard 2 kernels-window 90
    test/registered/kernels/test_slot_window.py
shard 2 report-metrics 150
    test/registered/e2e/test_report_e2e.py
shard 2 mla-fp8-clean 150
    test/registered/e2e/test_mla_e2e.py::test_an_mla_model_with_fp8_kv_serves_clean
shard 2 mla-flashinfer 250
    test/registered/e2e/test_mla_e2e.py::test_an_mla_model_serves_clean_with_flashinfer_attention
shard 2 fp8-mha 220
    test/registered/e2e/test_mla_e2e.py::test_an_mha_model_with_fp8_kv_serves_clean_and_its_faults_are_caught
shard 2 fp4-mha 90
    test/registered/e2e/test_mla_e2e.py::test_the_canary_attaches_to_the_fp4_pool_which_sglang_0_5_12_cannot_serve
shard 2 containment 255
    test/registered/e2e/test_containment_e2e.py
shard 2 hicache-clean 290
    test/registered/e2e/test_hicache_e2e.py::test_a_host_tier_workload_serves_clean_with_write_through_at_page_1
    test/registered/e2e/test_hicache_e2e.py::test_a_host_tier_workload_serves_clean_with_write_back_at_page_16
shard 2 hicache-mla 170
    test/registered/e2e/test_hicache_e2e.py::test_an_mla_model_s_host_tier_serves_clean
shard 2 hicache-faults 200
    test/registered/e2e/test_hicache_e2e.py::test_host_tier_faults_are_caught_at_the_load_back_forward
'

repo=$(pwd)
OUT=${OUT:-$repo/gpu-out}
started=$(date +%s)
plan_started=$started

say() { echo "[gpu_tests $(date +%H:%M:%S) +$(( $(date +%s) - started ))s] $*"; }

left_s() {  # seconds the current plan has left before its deadline, less a margin for the end
  echo $(( ${GPU_TESTS_DEADLINE_S:-570} - ($(date +%s) - plan_started) - 25 ))
}

plan_shards() {  # plan_shards PLAN [NAME...]: one "NAME|EXPECTED_S|KIND|SELECTORS" line per shard
  # of PLAN ("any": of every plan), only the named ones when names are given
  local plan=$1
  shift
  awk -v plan="$plan" -v names=" $* " '
    function flush() { if (name != "") print name "|" expected "|" kind "|" selectors }
    function wanted(p, n) { return (plan == "any" || p == plan) && (names == "  " || index(names, " " n " ")) }
    $1 == "shard" { flush(); name = wanted($2, $3) ? $3 : ""; expected = $4
                    kind = ($5 == "serial") ? "serial" : "parallel"; selectors = ""; next }
    NF { selectors = selectors (selectors == "" ? "" : " ") $1 }
    END { flush() }
  ' <<< "$GPU_PLAN"
}

summary_of() {  # summary_of LOG: pytest's failures and its final counts, on one line
  grep -E '^(FAILED|ERROR)|^[0-9]+ (passed|failed|skipped|errors?|deselected)|no tests ran|!!! ' \
    "$1" | tail -n 30 | tr '\n' ';'
}

run_shard() {  # run_shard ID EXPECTED_S LIMIT_S PYTEST_ARGS...: one pytest run, bounded
  local id=$1 expected=$2 limit=$3 shard_started rc
  shift 3
  shard_started=$(date +%s)
  (( limit < 10 )) && limit=10
  KV_CANARY_TEST_LOG_DIR="$logs/$id" timeout --signal=INT --kill-after=20 "$limit" \
    python3 -m pytest "$@" -q -p no:cacheprovider --durations=15 --basetemp="$work/tmp/$id" \
    --junitxml="$shards/$id.xml" < /dev/null > "$shards/$id.log" 2>&1
  rc=$?
  say "shard $id: exit $rc after $(( $(date +%s) - shard_started )) s (expected $expected s," \
      "limit $limit s); $(summary_of "$shards/$id.log")"
  return "$rc"
}

run_plan() {  # run_plan PLAN [NAME...]: its (named) parallel shards side by side, then its serial
  # shards
  local plan=$1 failed=0 name expected kind selectors reserve=0 pids=() pid
  local -a parallel=() serial=()
  shift
  while IFS='|' read -r name expected kind selectors; do
    if [ "$kind" = serial ]; then
      serial+=("$name|$expected|$selectors"); reserve=$(( reserve + expected * 13 / 10 ))
    else
      parallel+=("$name|$expected|$selectors")
    fi
  done < <(plan_shards "$plan" "$@")
  if [ $(( ${#parallel[@]} + ${#serial[@]} )) -eq 0 ]; then
    say "plan $plan has no shard${*:+ named $*} (plans: 1, 2)"; return 2
  fi
  say "plan $plan: ${#parallel[@]} shards side by side, then ${#serial[@]} alone;" \
      "$(left_s) s left"
  local shard
  for shard in "${parallel[@]}"; do
    IFS='|' read -r name expected selectors <<< "$shard"
    # shellcheck disable=SC2086 # selectors: pytest node ids, one word each
    run_shard "$plan-$name" "$expected" $(( $(left_s) - reserve )) -m gpu $selectors &
    pids+=($!)
    sleep 2  # stagger the first server starts
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  kill_leftovers
  for shard in "${serial[@]}"; do
    IFS='|' read -r name expected selectors <<< "$shard"
    # shellcheck disable=SC2086
    run_shard "$plan-$name" "$expected" "$(left_s)" -m gpu $selectors || failed=1
    kill_leftovers
  done
  return "$failed"
}

run_subset() {  # run_subset PYTEST_ARGS...: one pytest run, its output in gpu-tests.log too
  local args=("$@") has_path=0 has_marker=0 arg rc
  for arg in "${args[@]}"; do
    [ "$arg" = "-m" ] && has_marker=1
    case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_path=1 ;; esac
  done
  [ "$has_marker" = 1 ] || args=(-m gpu "${args[@]}")
  [ "$has_path" = 1 ] || args+=(test/registered)
  [ "${GPU_TESTS_KEEP_GOING:-0}" = 1 ] || args+=(-x)
  say "python3 -m pytest ${args[*]}"
  run_shard subset - "$(left_s)" "${args[@]}" &
  local pid=$!
  tail --pid="$pid" -n +1 -F "$shards/subset.log" 2>/dev/null
  wait "$pid"
  rc=$?
  kill_leftovers
  return "$rc"
}

kill_leftovers() {  # kill the server process groups a cut-off shard left behind
  local pgid
  find "$logs" -name server-pgids.txt -exec cat {} + 2>/dev/null | sort -u | while read -r pgid; do
    if [ -n "$pgid" ] && kill -0 -- "-$pgid" 2>/dev/null; then
      say "killing leftover server process group $pgid"
      kill -KILL -- "-$pgid" 2>/dev/null
    fi
  done
}

pack_outputs() {  # the shard logs and the kept server logs, each folder into its tarball
  find "$logs" -type f -size +4M -exec sh -c 'tail -c 4000000 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
  tar -C "$shards" -czf "$OUT/shard-logs.tar.gz" . && rm -rf "$shards"
  tar -C "$logs" -czf "$OUT/server-logs.tar.gz" . && rm -rf "$logs"
}

main() {
  if [ $# -eq 0 ]; then
    say "usage: bash scripts/gpu_tests.sh 1 | 2 | all | shards NAME... | PYTEST_ARGS..."
    return 2
  fi
  if [ ! -f pyproject.toml ] || [ ! -f .gpu/gpu_env.sh ]; then
    say "run me from the repo root with .gpu carried (pyproject.toml or .gpu/gpu_env.sh missing)"
    return 2
  fi
  timeout 30 nvidia-smi 2>&1 | head -15
  # shellcheck source=/dev/null
  source .gpu/gpu_env.sh || { say "gpu_env.sh failed"; return 3; }
  say "installed: $(python3 -c 'import importlib.metadata as m, torch; print("sglang", m.version("sglang"), "| sglang-kv-canary", m.version("sglang-kv-canary"), "| torch", torch.__version__, "| cuda", torch.cuda.is_available())' 2>&1 | tail -1)"
  export PYTHONUNBUFFERED=1
  # The logs are written under $OUT as they come (a cut-off call still returns them), packed
  # at the end; pytest's temporary folders (the servers' own logs among them) stay outside.
  work=$(mktemp -d "${TMPDIR:-/tmp}/kv_canary_gpu.XXXXXX")
  logs="$OUT/server-logs" shards="$OUT/shard-logs"
  mkdir -p "$logs" "$shards" "$work/tmp"
  local rc=0
  case "$1" in
    1 | 2) run_plan "$1" || rc=1 ;;
    all) run_plan 1 || rc=1; plan_started=$(date +%s); run_plan 2 || rc=1 ;;
    shards) shift; run_plan any "$@" || rc=1 ;;
    *) run_subset "$@"; rc=$? ;;
  esac
  pack_outputs
  rm -rf "$work"
  say "done (exit $rc); in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return "$rc"
}

mkdir -p "$OUT"
main "$@" 2>&1 | tee "$OUT/gpu-tests.log"
exit "${PIPESTATUS[0]}"
