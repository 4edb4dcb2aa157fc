"""Host µs of ``CounterMailbox.read`` and of its parts, with CUDA counters and their pinned host
copy, outside a server (the server's timers show the same call 3-4x slower: the scheduler
process runs all Python slower). Needs CUDA; a few seconds.

Usage: ``python benchmark/bench_mailbox_read.py``
"""
import time, numpy as np, torch
from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, COUNTER_PUBLISHES
from sglang.jit_kernel.kv_canary.hashing import counters_checksum_holds
from sglang.srt.kv_canary.monitor.counter_mailbox import CounterMailbox
from sglang.srt.kv_canary.monitor.counter_snapshots import CounterSnapshot
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
k = load_kernels(KernelBackend.TRITON)
counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device="cuda")
mb = CounterMailbox(counters=counters, seal=k.publish_counters)
def t(fn, n=2000):
    s = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - s) / n * 1e6
reads = []
for i in range(1, 2001):
    mb.publish(); mb.label(publications=i, steps=i, launches=i, sweep_launches=0)
    torch.cuda.synchronize()
    s = time.perf_counter(); snap = mb.read(); reads.append((time.perf_counter() - s) * 1e6)
    assert snap is not None
reads.sort()
print(f"read with a new publication: median {reads[1000]:.2f} us, p90 {reads[1800]:.2f}")
print(f"read, nothing new: {t(mb.read):.2f} us")
w = mb._words
print(f"words.copy(): {t(lambda: w.copy()):.2f} us; int(words[PUB]): {t(lambda: int(w[COUNTER_PUBLISHES])):.2f} us")
c = w.copy()
print(f"checksum: {t(lambda: counters_checksum_holds(c)):.2f} us; tolist: {t(lambda: tuple(c.tolist())):.2f} us")
print(f"CounterSnapshot: {t(lambda: CounterSnapshot(steps=1, launches=1, sweep_launches=0, counters=tuple(c.tolist()))):.2f} us")
plain = np.zeros(NUM_COUNTERS, dtype=np.int64)
print(f"copy of a plain numpy array: {t(lambda: plain.copy()):.2f} us; numpy {np.__version__}")
ev = torch.cuda.Event(); ev.record()
print(f"Event.query: {t(lambda: ev.query()):.2f} us; publish (seal + copy): {t(mb.publish, 500):.2f} us")
