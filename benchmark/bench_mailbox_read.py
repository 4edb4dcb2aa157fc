"""Host µs of ``CounterMailbox.read`` and of its parts, outside a server.

With CUDA the counters are on the GPU, sealed by the Triton publish launch and copied into a
pinned host buffer (what a server does); without it they are on the CPU with the torch
reference (the same Python, no device: compare parts, not machines). In a server the host timers
show the same read 3-4x slower: the scheduler process runs all its Python slower.

Usage: ``python benchmark/bench_mailbox_read.py [--reads 2000]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from sglang.jit_kernel.kv_canary.consts import COUNTER_PUBLISHES, NUM_COUNTERS
from sglang.jit_kernel.kv_canary.hashing import counters_checksum_holds
from sglang.srt.kv_canary.monitor.counter_mailbox import CounterMailbox
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels


def mean_us(fn: Callable[[], object], *, calls: int) -> float:
    """Mean host µs of ``calls`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def read_with_new_publication_us(mailbox: CounterMailbox, *, reads: int) -> list[float]:
    """Host µs of each of ``reads`` reads, each after a new, labeled, landed publication
    (sorted)."""
    cuda = torch.cuda.is_available()
    times = []
    for publication in range(1, reads + 1):
        mailbox.publish()
        mailbox.label(publications=publication, steps=publication, launches=publication,
                      sweep_launches=0)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        snapshot = mailbox.read()
        times.append((time.perf_counter() - start) * 1e6)
        if snapshot is None:
            raise RuntimeError(f"publication {publication} was not read")
    return sorted(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=2000,
                        help="publications read, and calls per timed part (default 2000)")
    options = parser.parse_args(argv)
    if options.reads < 2:
        parser.error(f"--reads={options.reads} is invalid; allowed: an integer >= 2")
    cuda = torch.cuda.is_available()
    kernels = load_kernels(KernelBackend.TRITON if cuda else KernelBackend.TORCH_REFERENCE)
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device="cuda" if cuda else "cpu")
    mailbox = CounterMailbox(counters=counters, seal=kernels.publish_counters)
    calls = options.reads
    times = read_with_new_publication_us(mailbox, reads=calls)
    print(f"device: {'cuda (pinned host copy)' if cuda else 'cpu (torch reference)'}; "
          f"numpy {np.__version__}")
    print(f"read with a new publication: median {times[len(times) // 2]:.2f} us, "
          f"p90 {times[len(times) * 9 // 10]:.2f}")
    print(f"read, nothing new: {mean_us(mailbox.read, calls=calls):.2f} us")
    # the parts of a read, on a host buffer like the mailbox's own
    host = torch.zeros(NUM_COUNTERS, dtype=torch.int64, pin_memory=cuda).numpy()
    words = host.copy()
    print(f"copy of the host buffer: {mean_us(host.copy, calls=calls):.2f} us; "
          f"publication word: {mean_us(lambda: int(host[COUNTER_PUBLISHES]), calls=calls):.2f} us")
    print(f"checksum: {mean_us(lambda: counters_checksum_holds(words), calls=calls):.2f} us; "
          f"tolist: {mean_us(lambda: tuple(words.tolist()), calls=calls):.2f} us")
    snapshot_us = mean_us(lambda: CounterSnapshot(steps=1, launches=1, sweep_launches=0,
                                                  counters=tuple(words.tolist())), calls=calls)
    print(f"CounterSnapshot: {snapshot_us:.2f} us")
    print(f"publish (seal + copy): {mean_us(mailbox.publish, calls=max(calls // 4, 1)):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
