"""Host time of one upload copy: ``Tensor.copy_`` against the ring's driver copy, side by side.

Every decode step copies its packed row updates (a ring slot of pinned host words) into the
device upload area. This times, on one GPU, the host side of that copy both ways, in alternating
rounds of ``--calls`` copies each (the device synchronized between rounds, not timed), for the
word counts of a steady decode step of 1 and of 64 rows:

* ``torch``: ``Tensor.copy_(pinned, non_blocking=True)``, what the ring did before;
* ``driver``: :class:`~sglang.srt.kv_canary.runner.driver_copy.DriverCopy`, what it does now;
* ``ring``: ``UploadBufferRing.copy`` of a ring slot as the runner calls it (the driver copy,
  the slot checks and the mark).

Prints the median µs per call over the rounds, their spread, and driver / torch.
Usage: ``python benchmark/bench_upload_copy.py [--rounds 20] [--calls 2000]`` (needs CUDA).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

from sglang.srt.kv_canary.runner.driver_copy import DriverCopy
from sglang.srt.kv_canary.runner.request_rows import _UnitStepLayout
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing

from timing import spread


def _per_call_us(copy: Callable[[], None], *, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        copy()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def measure(*, rows: int, rounds: int, calls: int) -> dict[str, list[float]]:
    """µs per call of each way, one value per round, for a steady decode step of ``rows``."""
    words = _UnitStepLayout.of(bs=rows, owner_chains=True).words
    device = torch.zeros(words, dtype=torch.int64, device="cuda")
    driver_copy = DriverCopy(device_index=torch.cuda.current_device())
    ring = UploadBufferRing(slots=1, words=words, pin_memory=True, slot_copy=driver_copy)
    ring.open(landed=lambda: 1 << 62)  # every copy counts as landed: the slot is always free
    slot = ring.take(words)
    host = slot.tensor

    def ring_copy() -> None:
        ring.copy(ring.take(words), to=device, mark=1)

    ways: dict[str, Callable[[], None]] = {
        "torch": lambda: device.copy_(host, non_blocking=True),
        "driver": lambda: driver_copy(host=host, device=device),
        "ring": ring_copy,
    }
    for copy in ways.values():  # warm-up
        _per_call_us(copy, calls=100)
    results: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, copy in ways.items():
            results[name].append(_per_call_us(copy, calls=calls))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds (default 20)")
    parser.add_argument("--calls", type=int, default=2000, help="copies per round (default 2000)")
    options = parser.parse_args(argv)
    for flag, value in (("--rounds", options.rounds), ("--calls", options.calls)):
        if value < 1:
            parser.error(f"{flag}={value} is invalid; allowed: an integer >= 1")
    if not torch.cuda.is_available():
        print("bench_upload_copy: needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}; {options.rounds} rounds of {options.calls} copies; "
          "median host µs per copy (± half the spread over rounds)")
    print(f"{'rows':<6}{'words':>7}{'torch':>16}{'driver':>16}{'ring':>16}{'driver/torch':>14}")
    for rows in (1, 64):
        results = measure(rows=rows, rounds=options.rounds, calls=options.calls)
        spreads = {name: spread(values) for name, values in results.items()}
        cells = "".join(
            f"{s.median:>9.2f} ±{s.half_width:<5.2f}" for s in spreads.values()
        )
        words = _UnitStepLayout.of(bs=rows, owner_chains=True).words
        by_round = [d / t for d, t in zip(results["driver"], results["torch"])]
        print(f"{rows:<6}{words:>7}{cells}{spread(by_round).median:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
