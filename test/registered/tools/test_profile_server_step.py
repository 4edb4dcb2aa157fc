"""``benchmark/profile_server_step.py`` without a GPU: the trace parsing and the per-step
summary on small synthetic kineto traces (CUDA graph replays whose kernels share the
``cudaGraphLaunch`` correlation, kernels and copies launched between replays, partial steps at
the window's edges), the fallbacks (GPU clock, no graph replays), the diff vs the baseline,
the printed tables, the JSON, and the options."""

import concurrent.futures
import gzip
import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

_HERE = pathlib.Path(__file__).resolve().parent
_BENCH_DIR = _HERE.parents[2] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))  # the script imports its sibling modules by name

import profile_server_step as profile  # noqa: E402

GEMM = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_"
        "align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)")
ATTN = "_fwd_kernel_stage1"
SAMPLE = "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float, ArgMaxOps>)"
CANARY = "_kv_canary_check_kernel"
MEMCPY = "Memcpy DtoH (Device -> Pinned)"
MEMSET = "Memset (Device)"


class TraceBuilder:
    """Kineto-shaped events: launches on the CPU clock, GPU events on the GPU clock."""

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}}]
        self._correlation = 0

    def launch(self, name: str, *, ts: float, category: str = "cuda_runtime") -> int:
        self._correlation += 1
        self.events.append({"ph": "X", "cat": category, "name": name, "pid": 1, "tid": 1,
                            "ts": ts, "dur": 3.0,
                            "args": {"cbid": 211, "correlation": self._correlation}})
        return self._correlation

    def gpu(self, name: str, *, ts: float, dur: float, correlation: int | None,
            category: str = "kernel") -> None:
        args = {"device": 0, "stream": 7}
        if correlation is not None:
            args["correlation"] = correlation
        self.events.append({"ph": "X", "cat": category, "name": name, "pid": 0, "tid": 7,
                            "ts": ts, "dur": dur, "args": args})

    def document(self) -> dict[str, object]:
        return {"schemaVersion": 1, "traceEvents": self.events, "displayTimeUnit": "ms"}


def decode_trace(*, steps: int = 3, canary: bool = False, attn_us: float = 16.0,
                 sample_launch_records: bool = True, sample: bool = True) -> TraceBuilder:
    """``steps + 1`` graph replays (so ``steps`` whole steps), each followed by a sampling
    kernel and a DtoH copy; the canary adds a kernel to the graph and a memset after it. A
    kernel before the first replay and one after the last are partial steps."""
    trace = TraceBuilder()
    edge = trace.launch("cudaLaunchKernel", ts=10.0)
    trace.gpu(SAMPLE, ts=900.0, dur=5.0, correlation=edge)
    for step in range(steps + 1):
        cpu, gpu = 100.0 + 100 * step, 1000.0 + 100 * step
        graph = trace.launch("cudaGraphLaunch", ts=cpu)
        trace.gpu(GEMM, ts=gpu, dur=10.0, correlation=graph)
        trace.gpu(GEMM, ts=gpu + 10, dur=10.0, correlation=graph)
        trace.gpu(ATTN, ts=gpu + 20, dur=attn_us, correlation=graph)
        if canary:
            trace.gpu(CANARY, ts=gpu + 20 + attn_us, dur=3.0, correlation=graph)
        end = gpu + 25 + attn_us
        if sample:
            launched = trace.launch("cuLaunchKernel", ts=cpu + 50, category="cuda_driver")
            trace.gpu(SAMPLE, ts=end, dur=5.0,
                      correlation=launched if sample_launch_records else None)
        copy = trace.launch("cudaMemcpyAsync", ts=cpu + 60)
        trace.gpu(MEMCPY, ts=end + 5, dur=2.0, correlation=copy, category="gpu_memcpy")
        if canary:
            fill = trace.launch("cudaMemsetAsync", ts=cpu + 70)
            trace.gpu(MEMSET, ts=end + 7, dur=1.0, correlation=fill, category="gpu_memset")
    return trace


def summary_of(trace: TraceBuilder, *, fallback_steps: int = 19) -> profile.StepSummary:
    return profile.summarise(profile.select_steps(profile.parse_trace(trace.events),
                                                  fallback_steps=fallback_steps))


def stat(summary: profile.StepSummary, name: str) -> profile.KernelStat:
    (found,) = [item for item in summary.stats if item.name == name]
    return found


# ----------------------------------------------------------------------------- parsing

def test_parse_keeps_gpu_events_and_correlated_launches_only() -> None:
    trace = profile.parse_trace(decode_trace(steps=1, canary=True).events + [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "ts": 1.0, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 5.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "ts": 1.0, "id": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamIsCapturing", "ts": 1.0,
         "dur": 1.0, "args": {}},
        {"ph": "X", "cat": "Kernel", "name": "no_ts_kernel", "dur": 1.0},
    ])
    kinds = [event.kind for event in trace.gpu_events]
    assert kinds.count("memcpy") == 2 and kinds.count("memset") == 2
    assert kinds.count("kernel") == 1 + 2 * 5  # the edge kernel, then 2 replays + sampling
    assert [event.ts_us for event in trace.gpu_events] == sorted(
        event.ts_us for event in trace.gpu_events)
    assert {launch.name for launch in trace.launches} == {
        "cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaMemcpyAsync",
        "cudaMemsetAsync"}


def test_load_reads_gzip_and_plain_json_and_rejects_a_truncated_gzip(
        tmp_path: pathlib.Path) -> None:
    document = decode_trace().document()
    packed = tmp_path / "x-TP-0.trace.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(document).encode()))
    plain = tmp_path / "x.json"
    plain.write_text(json.dumps(document["traceEvents"]))
    assert profile.load_trace_events(packed) == document["traceEvents"]
    assert profile.load_trace_events(plain) == document["traceEvents"]
    truncated = tmp_path / "y-TP-0.trace.json.gz"
    truncated.write_bytes(packed.read_bytes()[:-40])
    with pytest.raises(EOFError):
        profile.load_trace_events(truncated)
    assert profile._complete_trace([truncated]) is None
    assert profile._complete_trace([truncated, packed]) == packed


# ----------------------------------------------------------------------------- per-step figures

def test_graph_replays_delimit_whole_steps_by_launch_time() -> None:
    summary = summary_of(decode_trace(steps=3))
    assert summary.method == profile.LAUNCH_METHOD
    assert summary.steps == 3  # 4 replays; the edge kernels and the last replay left out
    assert summary.kernels_per_step_range == (4, 4)
    assert summary.unattributed == 0
    assert (summary.kernels_per_step, summary.kernel_us_per_step) == (4.0, 41.0)
    assert (summary.memcpy_per_step, summary.memcpy_us_per_step) == (1.0, 2.0)
    assert (summary.memset_per_step, summary.memset_us_per_step) == (0.0, 0.0)
    assert summary.busy_us_per_step == pytest.approx(43.0)  # 36 + 5 + 2: a gap of 5
    gemm = stat(summary, GEMM)
    assert (gemm.kind, gemm.count_per_step, gemm.us_per_step) == ("kernel", 2.0, 20.0)
    assert [item.name for item in summary.stats] == [GEMM, ATTN, SAMPLE, MEMCPY]
    assert stat(summary, MEMCPY).kind == "memcpy"


def test_kernels_without_launch_records_switch_to_the_gpu_clock() -> None:
    summary = summary_of(decode_trace(steps=3, sample_launch_records=False))
    assert summary.method == profile.GPU_CLOCK_METHOD
    assert summary.steps == 3 and summary.kernels_per_step_range == (4, 4)
    assert stat(summary, SAMPLE).count_per_step == 1.0
    assert summary.busy_us_per_step == pytest.approx(43.0)


def test_without_graph_replays_every_event_counts_over_the_scheduler_steps() -> None:
    trace = TraceBuilder()
    for step in range(4):
        launched = trace.launch("cudaLaunchKernel", ts=100.0 * step)
        trace.gpu(ATTN, ts=1000.0 + 100 * step, dur=8.0, correlation=launched)
    summary = summary_of(trace, fallback_steps=2)
    assert summary.method == profile.SCHEDULER_METHOD
    assert summary.steps == 2 and summary.kernels_per_step_range is None
    assert (stat(summary, ATTN).count_per_step, stat(summary, ATTN).us_per_step) == (2.0, 16.0)


def test_a_small_graph_is_not_a_step_marker() -> None:
    trace = decode_trace(steps=2)
    small = trace.launch("cudaGraphLaunch", ts=150.0)  # one kernel: less than half of 3
    trace.gpu(CANARY, ts=1060.0, dur=1.0, correlation=small)
    markers = profile.step_markers(profile.parse_trace(trace.events))
    assert [marker.ts_us for marker in markers] == [100.0, 200.0, 300.0]
    assert stat(summary_of(trace), CANARY).count_per_step == 0.5  # in the first of 2 steps


def test_busy_time_is_the_union_of_intervals() -> None:
    events = [profile.GpuEvent(name="a", kind="kernel", ts_us=ts, dur_us=dur, correlation=None)
              for ts, dur in ((0.0, 10.0), (5.0, 10.0), (12.0, 1.0), (20.0, 5.0))]
    assert profile.busy_us(events) == 20.0
    assert profile.busy_us([]) == 0.0


def test_a_window_without_steps_is_an_error() -> None:
    with pytest.raises(ValueError, match="no whole decode step"):
        summary_of(decode_trace(steps=0), fallback_steps=0)


# ----------------------------------------------------------------------------- the diff

def test_diff_lists_added_then_removed_then_count_then_time_changes() -> None:
    base = summary_of(decode_trace(steps=3))
    other = summary_of(decode_trace(steps=3, canary=True, attn_us=24.0, sample=False))
    diffs = profile.diff_summaries(base=base, other=other, min_us=0.5)
    assert [(diff.change, diff.name) for diff in diffs] == [
        ("added", CANARY), ("added", MEMSET), ("removed", SAMPLE), ("time", ATTN)]
    canary = diffs[0]
    assert (canary.kind, canary.base_count, canary.count, canary.delta_us) == (
        "kernel", 0.0, 1.0, 3.0)
    assert diffs[2].delta_count == -1.0 and diffs[3].delta_us == pytest.approx(8.0)
    assert profile.diff_summaries(base=base, other=base, min_us=0.5) == ()


def test_diff_ignores_small_time_changes_and_reports_count_changes() -> None:
    base = summary_of(decode_trace(steps=3))
    slightly = summary_of(decode_trace(steps=3, attn_us=16.4))  # < 0.5 us and < 5 %
    assert profile.diff_summaries(base=base, other=slightly, min_us=0.5) == ()
    assert [diff.name for diff in profile.diff_summaries(base=base, other=slightly,
                                                         min_us=0.0)] == []  # < 5 %
    doubled = decode_trace(steps=3)
    for step in range(4):
        launched = doubled.launch("cuLaunchKernel", ts=155.0 + 100 * step,
                                  category="cuda_driver")
        doubled.gpu(SAMPLE, ts=1080.0 + 100 * step, dur=5.0, correlation=launched)
    (diff,) = profile.diff_summaries(base=base, other=summary_of(doubled), min_us=0.5)
    assert (diff.change, diff.name, diff.base_count, diff.count) == ("count", SAMPLE, 1.0, 2.0)


def test_diff_table_prints_totals_and_rows_in_order() -> None:
    base = summary_of(decode_trace(steps=3))
    other = summary_of(decode_trace(steps=3, canary=True))
    lines = profile.diff_table(base=base, other=other, diffs=profile.diff_summaries(
        base=base, other=other, min_us=0.5))
    assert lines[0].startswith("  GPU busy +4.0 us/step (43.0 -> 47.0); kernels +1.00/step")
    assert "memset +1.00/step" in lines[0]
    assert lines[2].split()[:2] == ["added", "kernel"] and lines[2].endswith(CANARY)
    assert lines[3].split()[:2] == ["added", "memset"] and "+1.00" in lines[3]
    assert profile.diff_table(base=base, other=base, diffs=())[-1] == "  no kernel differs"


# ----------------------------------------------------------------------------- names, reports

def test_short_names_drop_void_and_parameters_and_stay_distinct() -> None:
    assert profile.short_name(SAMPLE) == "at::native::reduce_kernel<512, 1>"
    assert profile.short_name(MEMCPY, kind="memcpy") == MEMCPY
    assert profile.short_name(GEMM).endswith("...") and len(profile.short_name(GEMM)) == 60
    twins = [("kernel", "void " + "k" * 70 + "<1>(int)"), ("kernel", "void " + "k" * 70 + "<2>")]
    names = profile.display_names(twins)
    assert len(set(names.values())) == 2 and all(len(name) <= 60 for name in names.values())


def _result(config: str, trace: TraceBuilder) -> profile.ConfigProfile:
    return profile.ConfigProfile(config=config, status="profiled", summary=summary_of(trace),
                                 client_step_ms=1.25, trace_path=f"/t/{config}.trace.json.gz",
                                 notes=("/start_profile sent 12 ms after round 2's last first "
                                        "token",), duration_s=60.0)


def test_reports_hold_every_configuration_and_the_diffs(tmp_path: pathlib.Path) -> None:
    options = profile.parse_args(["--configs", "off,all-checks,oracle", "--top", "2",
                                  "--out-dir", str(tmp_path)])
    model = profile.MODELS["tiny"]
    workload = profile.WORKLOADS_BY_NAME["decode64_8k"]
    results = [_result("off", decode_trace()), _result("all-checks", decode_trace(canary=True)),
               profile.ConfigProfile(config="oracle", status="skipped: time budget (90 s "
                                                             "needed, 10 s left)")]
    text = profile.write_reports(options=options, model=model, workload=workload,
                                 results=results)
    assert (tmp_path / "summary.txt").read_text() == text
    assert "-- off --" in text and "-- all-checks --" in text
    assert "3 steps (graph launches, by CPU launch time); kernels per step 4..4" in text
    assert "client 1.250 ms/step" in text and "(2 more names" in text
    assert "-- all-checks vs off: what it adds per step --" in text
    assert text.rstrip().endswith("oracle: skipped: time budget (90 s needed, 10 s left)")
    assert "GPU busy 43.0 us/step; client 1.250 ms/step (round 1, unprofiled)" in text
    assert "per step: kernels 4.00 (41.0 us), memcpy 1.00 (2.0 us), memset 0.00 (0.0 us)" in text
    table = text[text.index("  kind"):text.index("-- all-checks --")]
    assert all(len(line) <= 100 for line in table.splitlines())
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["baseline"] == "off"
    assert [row["change"] for row in document["diffs"]["all-checks"]] == ["added", "added"]
    assert document["results"][0]["summary"]["stats"][0]["name"] == GEMM
    assert document["results"][2]["summary"] is None
    assert "--sampling-backend" in document["configs"]["all-checks"]["server_args"]


def test_without_a_baseline_trace_no_diff_is_printed(tmp_path: pathlib.Path) -> None:
    options = profile.parse_args(["--out-dir", str(tmp_path)])
    results = [profile.ConfigProfile(config="off", status="failed: boom"),
               _result("oracle", decode_trace())]
    assert profile.diffs_by_config(options=options, results=results) == {}
    text = profile.report_text(options=options, model=profile.MODELS["tiny"],
                               workload=profile.WORKLOADS_BY_NAME["decode64_8k"],
                               results=results)
    assert "(no diff: the baseline off" in text and "off: failed: boom" in text


# ----------------------------------------------------------------------------- options

def test_defaults_and_profile_steps_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    options = profile.parse_args([])
    assert (options.model, options.configs, options.workload) == (
        "tiny", ("off", "oracle", "all-checks"), "decode64_8k")
    assert (options.profile_steps, options.time_budget_s, options.top) == (20, 540.0, 15)
    assert options.out_dir == pathlib.Path("profile-out")
    shortest = profile.parse_args(["--workload", "prefill32", "--profile-steps", "4"])
    assert shortest.profile_steps == 4
    for argv in (["--workload", "prefill32"], ["--profile-steps", "2"],
                 ["--configs", "off,nope"], ["--time-budget-s", "0"]):
        with pytest.raises(SystemExit):
            profile.parse_args(argv)
    assert "--configs='off,nope' is invalid" in capsys.readouterr().err


def test_window_notes_say_where_the_profile_started() -> None:
    timing = profile.RoundTiming(wall_s=2.0, ttft_s=(0.1, 0.3), decode_s=1.5, new_tokens=256,
                                 prompt_tokens=8192, output_tokens=512)
    after = profile.window_notes(round_two=timing, ended_at=102.0, profile_sent_at=100.35,
                                 forced_stop=False)
    assert after == ("/start_profile sent 50 ms after round 2's last first token",)
    before = profile.window_notes(round_two=timing, ended_at=102.0, profile_sent_at=100.1,
                                  forced_stop=True)
    assert "200 ms BEFORE" in before[0] and "/stop_profile sent" in before[1]


def test_a_failed_round_two_leaves_the_window_unchecked() -> None:
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(RuntimeError("POST /generate failed: reset\nmore"))
    assert profile.round_two_notes(failed, profile_sent_at=1.0, forced_stop=False,
                                   timeout_s=0.1) == (
        "round 2 did not complete (POST /generate failed: reset); window unchecked",)
    running: concurrent.futures.Future = concurrent.futures.Future()
    (note,) = profile.round_two_notes(running, profile_sent_at=1.0, forced_stop=False,
                                      timeout_s=0.01)
    assert note.endswith("window unchecked")
