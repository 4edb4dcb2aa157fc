"""The KV canary's kernels on one GPU, side by side with their torch references and with the
memory-bandwidth bound of the bytes they must touch.

For each scenario (``harness/kernel_cases.py``: decode at 1 and 64 rows over 1k to 32k-token
prefixes, shuffled and contiguous slots, 8k prefill chunks, 64 x 512 prefill) and each set of
checks (real data none / partial / all, and ``all-checks``: partial plus the token checks the
server's every-check configuration gives the kernels; each on an MHA pool, and
``partial+window`` and ``all-checks+window`` on a hybrid sliding-window pool like gpt-oss's:
window 127, the SWA sub-pool's K and V read at window slots through SGLang's full-to-SWA
table), the two launches of a forward, ``pre`` (before the model: verify the prefix, write the
new records) and ``post`` (after it: verify the whole batch with the real data), after a decode
forward with the token checks the sampled-token append (``append``: every row's sampled token
into the token history), and the radix sweep over 1M slots:

- ``eager us``: device time between CUDA events around one launch from Python;
- ``graph us``: the launch captured 20 times in one CUDA graph and replayed, per launch;
- ``launch us``: the host time of one eager launch call (no synchronization);
- ``bound us``: bytes the launch must touch / the device's measured copy bandwidth;
- ``graph/bound``: how far from the memory bound the kernel runs;
- ``ref us`` and ``ref/graph``: the torch reference of the same launch (one timed call after a
  warm-up; ``--no-reference`` skips them).

Each figure is the median over its repeats ± half their interquartile range. A post launch must
report no violation (its state is the consistent one the pre launch leaves); the run says so
otherwise and exits 1. The sweep runs with real data none, partial and ``partial+window``
(what the server configurations use). By default every MHA set of checks runs and, of the
hybrid pool's, ``partial+window`` (its lines pair with the ``partial`` ones). The result set
(``OUT/kernels.json``, ``OUT/kernels.txt``) is written after every scenario, and no scenario
starts that the longest one so far would carry past ``--time-budget-s`` (those are listed as
skipped). On an H200 the four MHA sets with the references take about 90 s, and
``--checks partial,partial+window --no-reference`` under 100 s.

Usage (needs CUDA): ``python benchmark/bench_kernels.py [--scenarios 'decode 64 x 8k,...']
[--checks none,partial,all-checks,all,partial+window,all-checks+window] [--no-reference]
[--no-sweep] [--time-budget-s 540] [--out DIR]``
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from harness import kernel_cases, options, timers  # noqa: E402
from harness.deadline import Deadline  # noqa: E402
from harness.kernel_cases import (  # noqa: E402
    CHECKS,
    DEFAULT_CHECKS,
    SCENARIOS,
    SWEEP,
    SWEEP_CHECKS,
    Pool,
)
from harness.kernel_timing import (  # noqa: E402
    GRAPH_LAUNCHES,
    REPEATS,
    TABLE_HEADER,
    LaunchTiming,
    time_forward,
    time_sweep,
)
from harness.results import describe_machine, machine, write_result_set  # noqa: E402
from harness.table import Table  # noqa: E402

DEFAULT_TIME_BUDGET_S = 540.0


@triton.jit
def empty_kernel(pointer):
    """The floor of a launch: one masked-off store."""
    tl.store(pointer, 0.0, mask=False)


def format_text(*, timings: Sequence[LaunchTiming], header: Mapping[str, str]) -> str:
    """The short text of the result set."""
    lines = [f"kernels: {header['device']}", f"machine: {header['machine']}",
             f"copy bandwidth {header['bandwidth']}; empty Triton kernel {header['floor']}",
             "median over repeats ± half their interquartile range; bound = bytes touched / "
             "copy bandwidth",
             "", Table(header=TABLE_HEADER, rows=tuple(timing.row() for timing in timings),
                       label_columns=3).render(indent="  ")]
    wrong = [timing for timing in timings if timing.unexpected_violations]
    lines += [f"!!! PROBLEM: {timing.scenario} {timing.checks} {timing.launch}: "
              f"{timing.unexpected_violations} violations on a clean state" for timing in wrong]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_kernels.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        type=options.names(option="--scenarios", allowed=tuple(SCENARIOS)),
                        help="comma-separated (default: all)")
    parser.add_argument("--checks", default=",".join(DEFAULT_CHECKS),
                        type=options.names(option="--checks", allowed=tuple(CHECKS)),
                        help=f"comma-separated, of {', '.join(CHECKS)} (default "
                             f"{','.join(DEFAULT_CHECKS)})")
    parser.add_argument("--no-reference", action="store_true",
                        help="do not time the torch references")
    parser.add_argument("--no-sweep", action="store_true", help="do not time the sweep")
    parser.add_argument("--time-budget-s", default=DEFAULT_TIME_BUDGET_S,
                        type=options.seconds(option="--time-budget-s"),
                        help="start no scenario that the longest one so far would carry past "
                             f"this many seconds (default {DEFAULT_TIME_BUDGET_S:.0f})")
    options.add_result_arguments(parser, result_sets="kernels.{json,txt}")
    return parser.parse_args(argv)


def _write(*, out: pathlib.Path, timings: Sequence[LaunchTiming], header: Mapping[str, str],
           description: Mapping[str, object], bandwidth: float,
           skipped: Sequence[str]) -> tuple[pathlib.Path, pathlib.Path]:
    text = format_text(timings=timings, header=header)
    text += "".join(f"\nskipped: {what}: time budget" for what in skipped)
    return write_result_set(out_dir=out, name="kernels", text=text, document={
        "benchmark": "kernels", "machine": dict(description), "header": dict(header),
        "bandwidth_bytes_per_s": bandwidth, "graph_launches": GRAPH_LAUNCHES,
        "repeats": REPEATS, "launches": [timing.to_json() for timing in timings],
        "skipped": list(skipped)})


def main(argv: Sequence[str] | None = None) -> int:
    """Time every selected launch within the time budget, writing the result set after each
    scenario; 0, or 1 when a launch reported violations on a clean state, 2 without CUDA."""
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA device; none is visible", file=sys.stderr)
        return 2
    deadline = Deadline.after(args.time_budget_s)
    torch.manual_seed(0)
    properties = torch.cuda.get_device_properties(0)
    bandwidth = timers.copy_bandwidth_bytes_per_s()
    dummy = torch.empty(1, device="cuda")
    floor_eager = timers.event_time_us(fn=lambda: empty_kernel[(1,)](dummy), repeats=REPEATS)
    floor_graph = timers.graph_time_us(fn=lambda: empty_kernel[(1,)](dummy),
                                       launches=GRAPH_LAUNCHES, repeats=10)
    description = machine(label=args.machine_label)
    header = {"device": f"{properties.name}, {properties.multi_processor_count} SMs",
              "machine": describe_machine(description),
              "bandwidth": f"{bandwidth / 1e12:.2f} TB/s (read + write)",
              "floor": f"{floor_eager.median:.1f} us eager, {floor_graph.median:.1f} us replayed"}
    print("\n".join(f"{key}: {value}" for key, value in header.items()), flush=True)
    started = time.monotonic()
    timings: list[LaunchTiming] = []
    skipped: list[str] = []
    longest_s = 0.0
    work = [(SCENARIOS[name], CHECKS[checks]) for name in args.scenarios
            for checks in args.checks]
    if not args.no_sweep:
        work += [(SWEEP, CHECKS[checks]) for checks in SWEEP_CHECKS if checks in args.checks]
    pool: Pool | None = None
    for scenario, checks in work:
        if not deadline.allows(longest_s):
            skipped.append(f"{scenario.name} {checks.name}")
            continue
        begun = time.monotonic()
        print(f"[{begun - started:.0f} s] {scenario.name}, {checks.name}", flush=True)
        if pool is None or pool.scenario != scenario:
            pool = None
            torch.cuda.empty_cache()
            pool = kernel_cases.build_pool(scenario, device="cuda")
        timed = time_sweep if scenario is SWEEP else time_forward
        new = timed(pool, checks, bandwidth=bandwidth, with_reference=not args.no_reference)
        timings += new
        longest_s = max(longest_s, time.monotonic() - begun)
        for timing in new:
            print("  " + "  ".join(timing.row()), flush=True)
        _write(out=args.out, timings=timings, header=header, description=description,
               bandwidth=bandwidth, skipped=skipped)
    paths = _write(out=args.out, timings=timings, header=header, description=description,
                   bandwidth=bandwidth, skipped=skipped)
    text = paths[1].read_text(encoding="utf-8")
    print(f"\n{text}\n(written: {', '.join(map(str, paths))})")
    return 1 if any(timing.unexpected_violations for timing in timings) else 0

if __name__ == "__main__":
    sys.exit(main())
