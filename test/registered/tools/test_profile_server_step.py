"""``benchmark/profile_server_step.py`` without a GPU: the trace parsing and the per-step
summary on small synthetic kineto traces (CUDA graph replays whose kernels share the
``cudaGraphLaunch`` correlation, kernels and copies launched between replays, partial steps at
the window's edges), the fallbacks (GPU clock, no graph replays), the diff vs the baseline,
the printed tables, the JSON, and the options; with ``--cpu``, the host (Python) figures of
nested ``python_function`` events on two threads (inclusive, self, recursion counted once, the
window cut at the graph launches, the kv_canary section, the diff), and the streaming reader."""

import concurrent.futures
import dataclasses
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


# ----------------------------------------------------------------------------- host time (--cpu)

SITE = "/venv/lib/python3.11/site-packages/sglang/srt"
RUN_BATCH = f"{SITE}/managers/scheduler.py(100): run_batch"
FORWARD = f"{SITE}/model_executor/model_runner.py(200): forward"
REPLAY = f"{SITE}/model_executor/cuda_graph_runner.py(300): replay"
C_REPLAY = "<built-in method replay of torch._C._CUDAGraph object>"
CHECK = f"{SITE}/kv_canary/checker.py(50): check"
FOLD = f"{SITE}/kv_canary/hashing.py(10): fold"
EMIT = f"{SITE}/kv_canary/checker.py(70): _emit"
WAIT = "/usr/lib/python3.11/threading.py(320): wait"
MAIN, OTHER = 11, 12  # tids of the python_function events (the launches are on tid 1)


def python_event(trace: TraceBuilder, name: str, *, tid: int, ts: float, dur: float) -> None:
    trace.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 1,
                         "tid": tid, "ts": ts, "dur": dur,
                         "args": {"Python parent id": 0, "Python id": 1, "Python thread": 0}})


def host_trace(*, canary: bool, main_tid: int = MAIN) -> TraceBuilder:
    """:func:`decode_trace` (graph launches at 100, 200, 300, 400 us: 3 steps) with the
    scheduler's Python calls around each launch t0, repeating every 100 us (offsets from t0):
    run_batch [-5, 45) (off: [-5, 20)) > forward [-4, 20) > replay [-1, 6) > the C call
    [-0.5, 5) (an address per step); with ``canary``, run_batch > check [20, 40) > fold
    [21, 35) > fold [22, 30) > fold [23, 25) (recursion), check > _emit [36, 39). The window
    [100, 400) cuts the first and last repetition. Thread OTHER waits through it all."""
    trace = decode_trace(steps=3)
    for step in range(4):
        t0 = 100.0 + 100 * step
        calls = [(RUN_BATCH, -5, 50 if canary else 25), (FORWARD, -4, 24), (REPLAY, -1, 7),
                 (f"<built-in method replay of torch._C._CUDAGraph object at 0x7f{step:04x}>",
                  -0.5, 5.5)]
        if canary:
            calls += [(CHECK, 20, 20), (FOLD, 21, 14), (FOLD, 22, 8), (FOLD, 23, 2),
                      (EMIT, 36, 3)]
        for name, offset, dur in reversed(calls):  # the trace's order does not matter
            python_event(trace, name, tid=main_tid, ts=t0 + offset, dur=dur)
    python_event(trace, WAIT, tid=OTHER, ts=0.0, dur=1000.0)
    python_event(trace, "<built-in method acquire of _thread.lock object at 0x1>", tid=OTHER,
                 ts=1.0, dur=998.0)
    return trace


def host_of(trace: TraceBuilder) -> profile.HostSummary:
    host = profile.summarise_host(profile.parse_trace(trace.events, python=True),
                                  fallback_steps=19)
    assert host is not None
    return host


def function(host: profile.HostSummary, name: str) -> tuple[float, float, float]:
    (found,) = [stat for stat in host.functions if stat.name == name]
    return (found.calls_per_step, pytest.approx(found.inclusive_us_per_step),
            pytest.approx(found.self_us_per_step))


def test_python_events_are_parsed_only_when_asked_and_lose_addresses() -> None:
    trace = host_trace(canary=False)
    assert profile.parse_trace(trace.events).python_events == ()
    events = profile.parse_trace(trace.events, python=True).python_events
    assert len(events) == 4 * 4 + 2
    assert {event.thread for event in events} == {"1:11", "1:12"}
    assert sum(event.name == C_REPLAY for event in events) == 4  # 4 addresses, one name


def test_host_figures_nest_by_time_and_count_recursion_once() -> None:
    host = host_of(host_trace(canary=True))
    assert (host.thread, host.thread_rule) == ("1:11", profile.THREAD_IN_LAUNCHES)
    assert (host.threads, host.steps, host.window) == (2, 3, profile.STEP_WINDOW)
    assert host.wall_us_per_step == pytest.approx(100.0)
    assert host.python_us_per_step == pytest.approx(50.0)  # run_batch, cut at both edges
    assert host.canary_us_per_step == pytest.approx(20.0)  # check; fold, _emit inside it
    # calls starting in [100, 400): 9 a repetition, the first's 4 outer calls (95..99.5) and
    # the last's 5 canary calls (420..436) are out, its 4 outer calls (395..399.5) are in
    assert host.calls_per_step == pytest.approx((5 + 2 * 9 + 4) / 3)
    assert function(host, RUN_BATCH) == (1.0, 50.0, 6.0)  # 50 - forward 24 - check 20
    assert function(host, FORWARD) == (1.0, 24.0, 17.0)
    assert function(host, REPLAY) == (1.0, 7.0, 1.5)
    assert function(host, C_REPLAY) == (1.0, 5.5, 5.5)
    assert function(host, CHECK) == (1.0, 20.0, 3.0)  # 20 - fold 14 - _emit 3
    assert function(host, FOLD) == (3.0, 14.0, 14.0)  # not 24: nested folds counted once
    assert function(host, EMIT) == (1.0, 3.0, 3.0)
    assert [stat.name for stat in host.functions] == [RUN_BATCH, FORWARD, CHECK, FOLD, REPLAY,
                                                      C_REPLAY, EMIT]
    assert sum(stat.self_us_per_step for stat in host.functions) == pytest.approx(50.0)
    assert [stat.name for stat in host.canary_functions()] == [CHECK, FOLD, EMIT]


def test_the_main_thread_is_that_of_the_launches_or_the_busiest_inside_them() -> None:
    same = host_of(host_trace(canary=False, main_tid=1))  # the launches' own thread
    assert (same.thread, same.thread_rule) == ("1:1", profile.THREAD_OF_LAUNCHES)
    # the waiting thread is inside a call at every launch and has more time, fewer calls
    assert host_of(host_trace(canary=False)).thread == "1:11"
    no_graphs = TraceBuilder()
    python_event(no_graphs, WAIT, tid=OTHER, ts=0.0, dur=900.0)
    for step in range(3):
        python_event(no_graphs, RUN_BATCH, tid=MAIN, ts=100.0 * step, dur=40.0)
        python_event(no_graphs, FORWARD, tid=MAIN, ts=100.0 * step + 1, dur=20.0)
    host = profile.summarise_host(profile.parse_trace(no_graphs.events, python=True),
                                  fallback_steps=2)
    assert (host.thread, host.thread_rule, host.window) == (
        "1:11", profile.THREAD_MOST_CALLS, profile.WHOLE_WINDOW)
    assert (host.steps, host.wall_us_per_step) == (2, pytest.approx(120.0))  # 0..240 / 2
    assert function(host, RUN_BATCH) == (1.5, 60.0, 30.0)
    assert profile.summarise_host(profile.parse_trace(decode_trace().events, python=True),
                                  fallback_steps=2) is None


def test_host_diff_lists_changes_of_20_us_or_more_added_first() -> None:
    base, other = host_of(host_trace(canary=False)), host_of(host_trace(canary=True))
    assert function(base, RUN_BATCH) == (1.0, 25.0, 1.0)
    diffs = profile.diff_hosts(base=base, other=other)
    assert [(diff.change, diff.name) for diff in diffs] == [("added", CHECK),
                                                            ("time", RUN_BATCH)]
    assert diffs[0].delta_us == pytest.approx(20.0) and diffs[1].delta_us == pytest.approx(25.0)
    assert (diffs[0].base_calls, diffs[0].calls) == (0.0, 1.0)  # fold +14, _emit +3: below 20
    assert [diff.change for diff in profile.diff_hosts(base=other, other=base)] == [
        "removed", "time"]
    lines = profile.host_diff_table(base=base, other=other, diffs=diffs)
    assert lines[0].startswith("  wall +0.0 us/step (100.0 -> 100.0); in Python calls +25.0; "
                               "in kv_canary functions +20.0; calls +5/step")
    assert lines[2].split()[0] == "added" and lines[2].endswith(
        "kv_canary/checker.py(50): check")
    assert profile.host_diff_table(base=base, other=base, diffs=())[-1] == (
        "  no function differs")


def test_function_names_shorten_to_two_path_components() -> None:
    assert profile.short_function(CHECK) == "kv_canary/checker.py(50): check"
    assert profile.short_function(C_REPLAY) == C_REPLAY
    long = f"{SITE}/kv_canary/checker.py(7): " + "f" * 100
    assert len(profile.short_function(long)) == 80 and profile.short_function(long).endswith(
        "...")
    twins = [f"/a/{SITE}/x/y.py(1): g", f"/b/{SITE}/x/y.py(1): g"]
    names = profile.display_functions(twins)
    assert len(set(names.values())) == 2 and all(name.startswith("x/y.py(1): g [")
                                                 for name in names.values())
    assert profile.is_canary_function(FOLD) and not profile.is_canary_function(RUN_BATCH)
    assert not profile.is_canary_function("<built-in method kv_canary_thing>")


def test_start_profile_request_and_environment_with_and_without_cpu() -> None:
    base = profile.profile_request(trace_dir=pathlib.Path("/t"), steps=20, prefix="p")
    assert (base["activities"], base["with_stack"], base["record_shapes"]) == (
        ["GPU"], False, False)
    cpu = profile.profile_request(trace_dir=pathlib.Path("/t"), steps=20, prefix="p", cpu=True)
    assert (cpu["activities"], cpu["with_stack"], cpu["num_steps"]) == (
        ["CPU", "GPU"], True, 20)
    assert "SGLANG_PROFILE_WITH_STACK" not in profile.profiler_env(pathlib.Path("/t"))
    assert profile.profiler_env(pathlib.Path("/t"), cpu=True)["SGLANG_PROFILE_WITH_STACK"] == (
        "true")
    assert profile.parse_args([]).cpu is False and profile.parse_args(["--cpu"]).cpu is True


def test_streaming_reader_matches_the_whole_file_reader(tmp_path: pathlib.Path) -> None:
    document = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "H200"}],
                "traceName": "x", "traceEvents": host_trace(canary=True).events,
                "displayTimeUnit": "ms"}
    packed = tmp_path / "x.trace.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(document, indent=2).encode()))
    plain = tmp_path / "bare.json"
    plain.write_text(json.dumps(document["traceEvents"]))
    for path in (packed, plain):
        for read_chars in (7, 1 << 20):  # refills inside numbers, strings and events
            assert list(profile.iter_trace_events(path, read_chars=read_chars)) == (
                document["traceEvents"])
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": [ ]}')
    assert list(profile.iter_trace_events(empty)) == []
    truncated = tmp_path / "cut.json"
    truncated.write_text(plain.read_text()[:-300])
    with pytest.raises(ValueError):
        list(profile.iter_trace_events(truncated, read_chars=64))
    no_events = tmp_path / "none.json"
    no_events.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="no list of trace events"):
        list(profile.iter_trace_events(no_events))
    assert profile.uncompressed_bytes(packed) == len(json.dumps(document, indent=2).encode())
    assert profile.uncompressed_bytes(plain) == plain.stat().st_size


def test_analyse_trace_adds_host_figures_or_says_why_not(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(host_trace(canary=True).document()).encode()))
    analysis = profile.analyse_trace(path, fallback_steps=19, host=True)
    assert analysis.summary == summary_of(host_trace(canary=True))
    assert analysis.host == host_of(host_trace(canary=True)) and analysis.host_note is None
    assert profile.analyse_trace(path, fallback_steps=19, host=False).host is None
    big = profile.analyse_trace(path, fallback_steps=19, host=True, max_host_bytes=100)
    assert big.host is None and big.host_note.startswith("skipped: the trace holds 0.00 GB")
    assert big.summary == analysis.summary
    gpu_only = tmp_path / "y.trace.json.gz"
    gpu_only.write_bytes(gzip.compress(json.dumps(decode_trace().document()).encode()))
    assert profile.analyse_trace(gpu_only, fallback_steps=19, host=True).host_note == (
        "no python_function events in the trace (stacks were not recorded)")
    assert profile.summarise_trace(gpu_only, fallback_steps=19) == summary_of(decode_trace())


def test_cpu_reports_hold_host_tables_and_diffs(tmp_path: pathlib.Path) -> None:
    options = profile.parse_args(["--cpu", "--configs", "off,all-checks,oracle",
                                  "--out-dir", str(tmp_path)])
    model = profile.MODELS["tiny"]
    workload = profile.WORKLOADS_BY_NAME["decode64_8k"]
    results = [
        dataclasses.replace(_result("off", decode_trace()), host=host_of(
            host_trace(canary=False))),
        dataclasses.replace(_result("all-checks", decode_trace(canary=True)),
                            host=host_of(host_trace(canary=True))),
        dataclasses.replace(_result("oracle", decode_trace()),
                            host_note="skipped: the trace holds 2.00 GB of JSON")]
    text = profile.write_reports(options=options, model=model, workload=workload,
                                 results=results)
    assert "with host (Python) time ==" in text.splitlines()[0]
    assert text.count("host (Python): scheduler main thread 1:11 of 2 traced") == 2
    assert "host figures per step = totals over that window / 3 steps" in text
    assert "with_stack's Python tracer inflates Python time" in text
    assert "top 25 by inclusive us/step" in text and "top 25 by self us/step" in text
    assert "3 functions whose path contains kv_canary" in text
    assert "0 functions whose path contains kv_canary, by inclusive us/step: none" in text
    assert "host (Python): skipped: the trace holds 2.00 GB of JSON" in text
    assert "-- all-checks vs off: host (Python) inclusive us/step, changes of 20 us" in text
    assert "-- oracle vs off: host" not in text
    row = next(line for line in text.splitlines() if line.endswith("hashing.py(10): fold"))
    assert row.split()[:3] == ["3.00", "14.0", "14.0"]
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["options"]["cpu"] is True
    functions = document["results"][1]["host"]["functions"]
    assert functions[0] == {"name": RUN_BATCH, "calls_per_step": 1.0,
                            "inclusive_us_per_step": pytest.approx(50.0),
                            "self_us_per_step": pytest.approx(6.0)}
    assert [row["change"] for row in document["host_diffs"]["all-checks"]] == ["added", "time"]
    assert document["results"][2]["host"] is None
    assert "host 100 us/step wall, 50 in Python" in profile.progress_line(results[1])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
