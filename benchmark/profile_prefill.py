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
import collections, concurrent.futures, pathlib, sys, tempfile, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import profile_server_step as p
from bench_server_overhead import CONFIGS, MODELS, launch_args, make_model
from server_workloads import Workload, run_round
from sglang.srt.kv_canary.tools.server import ServerLaunch, start_server

if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] != "cpu"):
    sys.exit("usage: python benchmark/profile_prefill.py OUT_DIR CONFIG[,CONFIG...] [cpu]")
out = pathlib.Path(sys.argv[1]); configs = sys.argv[2].split(","); CPU = len(sys.argv) == 4
unknown = [name for name in configs if name not in CONFIGS]
if unknown:
    sys.exit(f"unknown configurations {unknown}; allowed: {', '.join(CONFIGS)}")
model = MODELS["8b"]
W = Workload(name="p64", num_requests=64, prompt_tokens=128, new_tokens=4, throughput="output")
CANARY = ("canary", "scatter", "admission", "publish", "append_history", "hash_oracle", "sweep", "accepted_owner")
summary = {}

def host_timeline(trace, name):
    gemm = next((e for e in trace.gpu_events if e.name.startswith("nvjet")), None)
    launch = {l.correlation: l for l in trace.launches}
    first = launch.get(gemm.correlation) if gemm else None
    if first is None:
        print("   host: no first GEMM launch found"); return
    t_gemm, thread = first.ts_us, first.thread
    evs = sorted((e for e in trace.python_events if e.thread == thread), key=lambda e: (e.ts_us, -e.dur_us))
    # depth by nesting
    stack, rows = [], []
    for e in evs:
        while stack and e.ts_us >= stack[-1]:
            stack.pop()
        depth = len(stack)
        stack.append(e.ts_us + e.dur_us)
        if t_gemm - 80000 <= e.ts_us <= t_gemm and depth <= 6 and e.dur_us >= 400:
            rows.append((e.ts_us - t_gemm, e.dur_us, depth, e.name))
    print(f"   host timeline of thread {thread} before the first GEMM launch (ms rel. to it; calls >= 0.4 ms, depth <= 6):")
    for start, dur, depth, nm in rows[-60:]:
        print(f"   {start/1e3:8.2f} {dur/1e3:7.2f} {'  ' * depth}{nm[-90:]}")
    keys = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch", "init_new", "kv_canary", "flush_cache")
    tot = collections.Counter()
    for e in evs:
        if t_gemm - 80000 <= e.ts_us <= t_gemm:
            for k in keys:
                if k in e.name: tot[k] += min(e.dur_us, t_gemm - e.ts_us)
    print("   inclusive ms in the 80 ms before the first GEMM launch (nested calls counted again):", {k: round(v / 1e3, 2) for k, v in tot.items()})
with tempfile.TemporaryDirectory() as root:
    model_dir = make_model(model, directory=pathlib.Path(root) / "8b")
    for name in configs:
        cfg = CONFIGS[name]
        tdir = (out / "traces" / name).resolve(); tdir.mkdir(parents=True, exist_ok=True)
        base_args, args = launch_args(model=model, config=cfg)
        launch = ServerLaunch(model_dir=model_dir, log_path=out / f"{name}.log",
                              env={**cfg.env, **p.profiler_env(tdir, cpu=CPU)}, base_args=base_args, args=args,
                              ready_timeout_s=400, inherit_canary_env=False)
        with start_server(launch) as server:
            server.wait_ready()
            ttfts = []
            for i in range(2 if CPU else 4):
                t = run_round(server, workload=W, vocab_size=model.vocab_size, round_index=i, timeout_s=120, clock=time.monotonic)
                ttfts.append(1e3 * sorted(t.ttft_s)[len(t.ttft_s) // 2])
            from server_workloads import flush_radix_cache
            flush_radix_cache(server)
            known = set(tdir.glob(p.TRACE_GLOB))
            p.start_profile(server, trace_dir=tdir, steps=3 if CPU else 4, prefix=name, cpu=CPU)
            pool = concurrent.futures.ThreadPoolExecutor(1)
            fut = pool.submit(run_round, server, workload=W, vocab_size=model.vocab_size, round_index=9, timeout_s=120, clock=time.monotonic)
            path, _ = p.wait_for_trace(server, trace_dir=tdir, known=known, round_future=fut, timeout_s=240 if CPU else 120)
            prof_ttft = 1e3 * sorted(fut.result().ttft_s)[32]
            note = p.server_note(config=cfg, log_text=server.log_text())
        trace = p.parse_trace(p.iter_trace_events(path), python=CPU)
        ev = trace.gpu_events
        tot = collections.Counter(); cnt = collections.Counter()
        for e in ev:
            tot[e.name] += e.dur_us; cnt[e.name] += 1
        canary = {k: v for k, v in tot.items() if any(c in k.lower() for c in CANARY)}
        span = (ev[-1].ts_us + ev[-1].dur_us - ev[0].ts_us) if ev else 0
        print(f"== {name}: {note}; unprofiled TTFT p50 per round {[round(x,1) for x in ttfts]}, profiled {prof_ttft:.1f} ms")
        print(f"   GPU events {len(ev)}, busy {p.busy_us(ev)/1e3:.2f} ms, span {span/1e3:.2f} ms, kernel sum {sum(tot.values())/1e3:.2f} ms, canary kernels {sum(canary.values())/1e3:.3f} ms")
        for k, v in sorted(canary.items(), key=lambda kv: -kv[1]):
            print(f"   canary {v:9.1f} us x{cnt[k]:<4d} {k[:110]}")
        for k, v in tot.most_common(14):
            print(f"   top    {v:9.1f} us x{cnt[k]:<4d} {k[:110]}")
        summary[name] = tot
        if CPU:
            host_timeline(trace, name)
        # the largest gaps on the GPU timeline (idle periods)
        gaps = []
        for a, b in zip(ev, ev[1:]):
            g = b.ts_us - (a.ts_us + a.dur_us)
            if g > 300: gaps.append((round(g / 1e3, 2), round((a.ts_us - ev[0].ts_us) / 1e3, 1), a.name[:50], b.name[:50]))
        print("   GPU idle gaps > 0.3 ms (ms, at ms, before, after):", gaps[:12])
if len(summary) > 1:
    a, b = list(summary)[:2]
    print(f"== diff {b} - {a} (us), |diff| > 50 us:")
    keys = set(summary[a]) | set(summary[b])
    for k in sorted(keys, key=lambda k: -(abs(summary[b][k] - summary[a][k]))):
        d = summary[b][k] - summary[a][k]
        if abs(d) > 50: print(f"   {d:+10.1f} {k[:110]}")
