"""Host time of one CUDA graph replay with and without the kind of node the canary adds.

Every canary decode graph ends with the counter publication: a device-to-host copy of the
counters into pinned memory (:mod:`sglang.srt.kv_canary.monitor.counter_mailbox`). This captures
``--kernels`` small elementwise kernels (a stand-in for a small model's decode graph) three ways
and times ``graph.replay()`` on the host, in alternating rounds of 200 replays (the device
synchronized between rounds, not timed):

* ``none``: the kernels alone;
* ``d2h-copy``: plus a non-blocking copy of 16 int64 words into pinned host memory (the
  publication's copy);
* ``kernel-store``: plus one Triton kernel that stores the same 16 words straight into the pinned
  buffer (host memory the device addresses directly under unified addressing); the script
  checks that the host sees them.

Prints the median µs per replay of each and its difference to ``none``.
Usage: ``python benchmark/bench_graph_replay_host.py [--kernels 60] [--rounds 15]`` (needs CUDA).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl

WORDS = 16
REPLAYS_PER_ROUND = 200


@triton.jit
def _store_words(source_ptr, target_ptr, WORDS: tl.constexpr):
    index = tl.arange(0, WORDS)
    tl.store(target_ptr + index, tl.load(source_ptr + index))


def measure(*, kernels: int, rounds: int) -> tuple[dict[str, list[float]], bool]:
    """µs per replay of each graph, one value per round, and whether the kernel's stores reached
    the host."""
    work = torch.zeros(64, device="cuda")
    counters = torch.arange(WORDS, dtype=torch.int64, device="cuda")
    host = torch.zeros(WORDS, dtype=torch.int64).pin_memory()
    tails: dict[str, Callable[[], object]] = {
        "none": lambda: None,
        "d2h-copy": lambda: host.copy_(counters, non_blocking=True),
        "kernel-store": lambda: _store_words[(1,)](counters, host, WORDS=WORDS),
    }

    def body(tail: Callable[[], object]) -> None:
        for _ in range(kernels):
            work.add_(1.0)
        tail()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # warm-up (Triton compiles) outside the captures
        for tail in tails.values():
            body(tail)
    torch.cuda.synchronize()
    graphs = {}
    for name, tail in tails.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body(tail)
        graphs[name] = graph
    host.zero_()
    counters.add_(100)
    torch.cuda.synchronize()
    graphs["kernel-store"].replay()
    torch.cuda.synchronize()
    stored = torch.equal(host, counters.cpu())
    results: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(REPLAYS_PER_ROUND):
                graph.replay()
            results[name].append((time.perf_counter() - start) / REPLAYS_PER_ROUND * 1e6)
            torch.cuda.synchronize()
    return results, stored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=60,
                        help="elementwise kernels in each graph (default 60)")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds (default 15)")
    options = parser.parse_args(argv)
    for flag, value in (("--kernels", options.kernels), ("--rounds", options.rounds)):
        if value < 1:
            parser.error(f"{flag}={value} is invalid; allowed: an integer >= 1")
    if not torch.cuda.is_available():
        print("bench_graph_replay_host: needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    results, stored = measure(kernels=options.kernels, rounds=options.rounds)
    print(f"{torch.cuda.get_device_name()}; {options.kernels} kernels per graph; "
          f"{options.rounds} rounds of {REPLAYS_PER_ROUND} replays; kernel store seen on the "
          f"host: {stored}")
    base = statistics.median(results["none"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<14} {median:7.2f} µs per replay ({median - base:+5.2f}; "
              f"min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
