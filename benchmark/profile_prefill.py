"""Where the time of a 64 x 128-token prefill goes on the 8B shape: SGLang's torch profiler
started (idle) just before one round, per configuration of ``bench_server_overhead.py``.

Per configuration (one server each): the per-round median TTFT of four unprofiled rounds, then
one profiled round of 64 prompts of 128 tokens (4 new tokens): GPU events, busy time, the
canary's kernels by name and time, the 14 largest kernels, and the GPU idle gaps over 0.3 ms
(where the device waited for the host); with ``cpu``, also the scheduler thread's Python calls
before the first GEMM launch (Python tracer: several-fold slower, compare configurations only).
Finally the kernels whose total time differs by more than 50 us between the first two
configurations. Needs CUDA and sglang 0.5.12.post1; a few minutes per configuration.

Usage: ``python benchmark/profile_prefill.py OUT_DIR off,all-checks[,canary] [cpu]``
"""

from __future__ import annotations

import collections
import concurrent.futures
import pathlib
import sys
import tempfile
import time
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import profile_server_step as profiler  # noqa: E402
from bench_server_overhead import CONFIGS, MODELS, ServerConfig, launch_args, make_model  # noqa: E402
from server_workloads import Workload, flush_radix_cache, run_round  # noqa: E402

from sglang.srt.kv_canary.tools.server import ServerLaunch, start_server  # noqa: E402

MODEL = MODELS["8b"]
PREFILL = Workload(name="prefill64x128", num_requests=64, prompt_tokens=128, new_tokens=4,
                   throughput="output")
# kernel names of the canary's launches (Triton function names)
CANARY_KERNELS = ("canary", "scatter", "admission", "publish", "append_history", "hash_oracle",
                  "sweep", "accepted_owner")
GAP_US = 300.0  # GPU idle gaps listed: longer than this
HOST_WINDOW_US = 80_000.0  # with cpu: the scheduler's calls this long before the first GEMM
HOST_MIN_US = 400.0  # with cpu: calls listed: at least this long
HOST_MAX_DEPTH = 14  # with cpu: calls listed: nested at most this deep (process frames count)
HOST_KEYS = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch",
             "init_new", "kv_canary", "flush_cache")
DIFF_MIN_US = 50.0


def profile_config(*, config: ServerConfig, model_dir: pathlib.Path, out: pathlib.Path,
                   cpu: bool) -> tuple[list[float], float, pathlib.Path, str]:
    """One server: four unprofiled rounds (their median TTFT in ms each), then the profiled one;
    returns those medians, the profiled round's median TTFT, the trace and the server note."""
    trace_dir = (out / "traces" / config.name).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    base_args, args = launch_args(model=MODEL, config=config)
    launch = ServerLaunch(model_dir=model_dir, log_path=out / f"{config.name}.log",
                          env={**config.env, **profiler.profiler_env(trace_dir, cpu=cpu)},
                          base_args=base_args, args=args, ready_timeout_s=400,
                          inherit_canary_env=False)
    with start_server(launch) as server:
        server.wait_ready()
        medians = []
        for index in range(2 if cpu else 4):
            timing = run_round(server, workload=PREFILL, vocab_size=MODEL.vocab_size,
                               round_index=index, timeout_s=120, clock=time.monotonic)
            medians.append(1e3 * sorted(timing.ttft_s)[len(timing.ttft_s) // 2])
        flush_radix_cache(server)
        known = set(trace_dir.glob(profiler.TRACE_GLOB))
        profiler.start_profile(server, trace_dir=trace_dir, steps=3 if cpu else 4,
                               prefix=config.name, cpu=cpu)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(run_round, server, workload=PREFILL, vocab_size=MODEL.vocab_size,
                             round_index=9, timeout_s=120, clock=time.monotonic)
        path, _ = profiler.wait_for_trace(server, trace_dir=trace_dir, known=known,
                                          round_future=future, timeout_s=240 if cpu else 120)
        profiled = sorted(future.result().ttft_s)
        note = profiler.server_note(config=config, log_text=server.log_text())
        pool.shutdown()
    return medians, 1e3 * profiled[len(profiled) // 2], path, note


def gpu_lines(trace: profiler.Trace) -> tuple[list[str], collections.Counter]:
    """The printed GPU figures of a trace, and the total µs per kernel name."""
    events = trace.gpu_events
    totals: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for event in events:
        totals[event.name] += event.dur_us
        counts[event.name] += 1
    canary = {name: us for name, us in totals.items()
              if any(part in name.lower() for part in CANARY_KERNELS)}
    span = events[-1].ts_us + events[-1].dur_us - events[0].ts_us if events else 0.0
    lines = [f"   GPU events {len(events)}, busy {profiler.busy_us(events) / 1e3:.2f} ms, span "
             f"{span / 1e3:.2f} ms, kernel sum {sum(totals.values()) / 1e3:.2f} ms, canary "
             f"kernels {sum(canary.values()) / 1e3:.3f} ms"]
    lines += [f"   canary {us:9.1f} us x{counts[name]:<4d} {name[:110]}"
              for name, us in sorted(canary.items(), key=lambda item: -item[1])]
    lines += [f"   top    {us:9.1f} us x{counts[name]:<4d} {name[:110]}"
              for name, us in totals.most_common(14)]
    gaps = [(round(gap / 1e3, 2), round((before.ts_us - events[0].ts_us) / 1e3, 1),
             before.name[:50], after.name[:50])
            for before, after in zip(events, events[1:])
            if (gap := after.ts_us - (before.ts_us + before.dur_us)) > GAP_US]
    lines.append("   GPU idle gaps > 0.3 ms (ms, at ms, before, after): " + str(gaps[:12]))
    return lines, totals


def host_lines(trace: profiler.Trace) -> list[str]:
    """The scheduler thread's Python calls before the prefill's first GEMM launch."""
    gemm = next((event for event in trace.gpu_events if event.name.startswith("nvjet")), None)
    launches = {launch.correlation: launch for launch in trace.launches}
    first = launches.get(gemm.correlation) if gemm is not None else None
    if first is None:
        return ["   host: no first GEMM launch found"]
    t_gemm = first.ts_us
    calls = sorted((event for event in trace.python_events if event.thread == first.thread),
                   key=lambda event: (event.ts_us, -event.dur_us))
    open_ends: list[float] = []
    rows = []
    totals: collections.Counter = collections.Counter()
    for call in calls:
        while open_ends and call.ts_us >= open_ends[-1]:
            open_ends.pop()
        depth = len(open_ends)
        open_ends.append(call.ts_us + call.dur_us)
        if not t_gemm - HOST_WINDOW_US <= call.ts_us <= t_gemm:
            continue
        if depth <= HOST_MAX_DEPTH and call.dur_us >= HOST_MIN_US:
            rows.append(f"   {(call.ts_us - t_gemm) / 1e3:8.2f} {call.dur_us / 1e3:7.2f} "
                        f"{'  ' * depth}{call.name[-90:]}")
        for key in HOST_KEYS:
            if key in call.name:
                totals[key] += min(call.dur_us, t_gemm - call.ts_us)
    return ([f"   host timeline of thread {first.thread} before the first GEMM launch (ms "
             f"rel. to it; calls >= 0.4 ms, depth <= {HOST_MAX_DEPTH}):"] + rows[-60:]
            + ["   inclusive ms in the 80 ms before the first GEMM launch (nested calls counted "
               "again): " + str({key: round(us / 1e3, 2) for key, us in totals.items()})])


def main(argv: Sequence[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "cpu"):
        print("usage: python benchmark/profile_prefill.py OUT_DIR CONFIG[,CONFIG...] [cpu]",
              file=sys.stderr)
        return 2
    out, names, cpu = pathlib.Path(argv[0]), argv[1].split(","), len(argv) == 3
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        print(f"unknown configurations {unknown}; allowed: {', '.join(CONFIGS)}",
              file=sys.stderr)
        return 2
    totals_of: dict[str, collections.Counter] = {}
    with tempfile.TemporaryDirectory() as root:
        model_dir = make_model(MODEL, directory=pathlib.Path(root) / MODEL.name)
        for name in names:
            medians, profiled_ms, path, note = profile_config(
                config=CONFIGS[name], model_dir=model_dir, out=out, cpu=cpu)
            trace = profiler.parse_trace(profiler.iter_trace_events(path), python=cpu)
            print(f"== {name}: {note}; unprofiled TTFT p50 per round "
                  f"{[round(value, 1) for value in medians]}, profiled {profiled_ms:.1f} ms")
            lines, totals_of[name] = gpu_lines(trace)
            if cpu:
                lines[1:1] = host_lines(trace)
            print("\n".join(lines))
    if len(names) > 1:
        first, second = totals_of[names[0]], totals_of[names[1]]
        print(f"== diff {names[1]} - {names[0]} (us), |diff| > {DIFF_MIN_US:g} us:")
        for kernel in sorted(set(first) | set(second),
                             key=lambda kernel: -abs(second[kernel] - first[kernel])):
            change = second[kernel] - first[kernel]
            if abs(change) > DIFF_MIN_US:
                print(f"   {change:+10.1f} {kernel[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
