"""Host cost of the canary per DECODE step, every check on, launches stubbed out.

On a small model a decode step is bound by the scheduler's Python, so every microsecond of the
canary's host work per step shows in throughput. This drives a simulated CPU server (the
self-check's, real ``ForwardBatch`` objects, the canary installed as a server installs it) through
steady decode steps of B requests, with the kernel launches replaced by no-ops, and times the
canary's two per-step host hooks: ``on_init_new`` (at ``ForwardBatch.init_new``: the carrier, the
request ids, the steady pack) and ``run_forward`` less the model forward it wraps (the upload, the
poll, the label of the counter publication, the health and stats bookkeeping). In a server a
decode step replays a CUDA graph, so the pre and post launches' Python (inside the model forward
here) is not part of a step's host work and is left out with the model; so is the counter
publication, which the graph captures (here the forward is eager: it publishes, stubbed down to
counting the publication, and copies the counters, a host copy of 13 words).

Columns: median µs per decode step of each hook and their sum. Runs on any machine (no GPU; the
device is the CPU, so copies are host copies): compare versions on one machine, not absolute
figures across machines.

``--steady-floor`` measures each batch size a second time, side by side, with
``RequestRows.prepare`` answering a steady batch (the same request objects as the committed one)
with the updates it returned for the forward before: such a step reads no request, packs nothing
and uploads nothing (the runner skips an upload it has already made). That is not a mode of the
canary (the device would learn none of the new tokens); it is the floor of these two hooks, what a
design that took the steady step's per-row host work off the host could at most save.
Usage: ``python benchmark/bench_decode_host.py [--steps 400] [--batches 1,64] [--rounds 1]
[--steady-floor]``
"""

from __future__ import annotations

import argparse
import operator
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_canary import canary_server, random_prompt, stubbed_kernels  # noqa: E402
from timing import InnerTime  # noqa: E402

from sglang.jit_kernel.kv_canary.consts import COUNTER_PUBLISHES  # noqa: E402
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode  # noqa: E402
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner  # noqa: E402
from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates  # noqa: E402
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest  # noqa: E402

CONFIG = CanaryConfig(
    mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL, enable_token_oracle=True,
    enable_verify_token_assert=True, enable_write_input_assert=True, ring_capacity=512,
    # the stubbed launches count nothing on the device: no device-agreement check, no stats
    health_check_every_n_steps=1 << 40, stats_print_every_n_steps=0,
)
PROMPT = 128


def _no_launch(**_: Any) -> None:
    return None


def _count_publication(*, counters: torch.Tensor) -> None:
    """The publish launch reduced to what the host relies on: the publication number, which
    tells the upload ring that the copies before it completed (no checksum: the monitor's
    periodic whole reads find none and are ignored, as the health check is off here)."""
    words = _COUNTER_WORDS.get(id(counters))
    if words is None:
        words = _COUNTER_WORDS[id(counters)] = counters.numpy()
    words[COUNTER_PUBLISHES] += 1


_COUNTER_WORDS: dict[int, Any] = {}  # numpy views of the (CPU) counters, made once


class _StepTimer:
    """Times ``on_init_new`` and ``run_forward`` minus the forward it wraps (class-level
    wrappers; :meth:`undo` restores them)."""

    def __init__(self) -> None:
        self.init_new: list[float] = []
        self.run_forward: list[float] = []
        self._originals = (CanaryRunner.on_init_new, CanaryRunner.run_forward)
        on_init_new, run_forward = self._originals
        timer = self

        def timed_init_new(runner: CanaryRunner, **kwargs: Any) -> None:
            start = time.perf_counter()
            on_init_new(runner, **kwargs)
            timer.init_new.append((time.perf_counter() - start) * 1e6)

        def timed_run_forward(
            runner: CanaryRunner, *, forward_batch: Any, forward: Callable[[], Any]
        ) -> Any:
            inner = InnerTime()
            start = time.perf_counter()
            result = run_forward(runner, forward_batch=forward_batch, forward=inner.wrap(forward))
            timer.run_forward.append((time.perf_counter() - start - inner.seconds) * 1e6)
            return result

        CanaryRunner.on_init_new = timed_init_new
        CanaryRunner.run_forward = timed_run_forward

    def undo(self) -> None:
        CanaryRunner.on_init_new, CanaryRunner.run_forward = self._originals


class _SteadyFloor:
    """``--steady-floor`` (module docstring): ``RequestRows.prepare`` wrapped so that a batch of
    the request objects of the steady batch its last answer leaves committed
    (``RowUpdates.steady_after``) gets that answer again (:meth:`undo` restores it)."""

    def __init__(self) -> None:
        self._original = prepare = RequestRows.prepare
        last: dict[int, RowUpdates] = {}  # per RequestRows (by id), its last answer

        def steady_floor_prepare(rows: RequestRows, *, reqs: Any, **kwargs: Any) -> RowUpdates:
            previous = last.get(id(rows))
            steady = None if previous is None else previous.steady_after
            if (steady is not None and len(reqs) == len(steady.reqs)
                    and all(map(operator.is_, reqs, steady.reqs))):
                return previous
            updates = last[id(rows)] = prepare(rows, reqs=reqs, **kwargs)
            return updates

        RequestRows.prepare = steady_floor_prepare

    def undo(self) -> None:
        RequestRows.prepare = self._original


def measure(*, requests: int, steps: int, steady_floor: bool = False) -> tuple[float, float]:
    """Median µs per steady decode step of ``on_init_new`` and of ``run_forward``'s own work,
    over ``steps`` steps after ten warm-up steps (``steady_floor``: see ``--steady-floor``)."""
    kernels = stubbed_kernels(
        pre_forward=_no_launch, post_forward=_no_launch, scatter_req_token_ids=_no_launch,
        admission_owner_check=_no_launch, append_history_tokens=_no_launch,
        publish_counters=_count_publication,
    )
    context = PROMPT + steps + 16
    server = canary_server(config=CONFIG, kernels=kernels, tokens=requests * (context + 4),
                           requests=requests, context=context)
    rng = random.Random(0)
    batch = [
        SimulatedRequest(rid=f"r{i}", max_new_tokens=steps + 12,
                         prompt=random_prompt(rng, PROMPT))
        for i in range(requests)
    ]
    for request in batch:
        server.admit(request)
    server.extend([(request, PROMPT) for request in batch])
    for _ in range(10):
        server.decode(batch)
    floor = _SteadyFloor() if steady_floor else None
    timer = _StepTimer()
    try:
        for _ in range(steps):
            server.decode(batch)
    finally:
        timer.undo()
        if floor is not None:
            floor.undo()
    return statistics.median(timer.init_new), statistics.median(timer.run_forward)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400,
                        help="measured decode steps per batch size (default 400)")
    parser.add_argument("--batches", default="1,64",
                        help="comma-separated batch sizes (default 1,64)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each batch size this many times (with --steady-floor, the "
                             "canary and the floor alternating) and print the medians; with "
                             "--steady-floor also the quartiles of the per-round floor / canary "
                             "ratios (default 1)")
    parser.add_argument("--steady-floor", action="store_true",
                        help="also measure each batch size with steady steps that read, pack and "
                             "upload nothing (the floor of a steady step's host work; not a mode "
                             "of the canary) and print it beside the canary's figure")
    options = parser.parse_args(argv)
    if options.steps < 1:
        parser.error(f"--steps={options.steps} is invalid; allowed: an integer >= 1")
    if options.rounds < 1:
        parser.error(f"--rounds={options.rounds} is invalid; allowed: an integer >= 1")
    try:
        batches = [int(value) for value in options.batches.split(",")]
    except ValueError:
        parser.error(f"--batches={options.batches!r} is invalid; allowed: integers >= 1, "
                     "comma-separated")
    if not batches or min(batches) < 1:
        parser.error(f"--batches={options.batches!r} is invalid; allowed: integers >= 1, "
                     "comma-separated")
    floor_header = (f"{'floor':>10}{'floor / canary (quartiles)':>30}"
                    if options.steady_floor else "")
    print(f"{'batch':<8}{'on_init_new':>14}{'run_forward':>14}{'canary':>10}{floor_header}"
          f"   (median µs per decode step over {options.rounds} round(s), launches and model "
          "left out)")
    for requests in batches:
        init_news: list[float] = []
        run_forwards: list[float] = []
        floors: list[float] = []
        ratios: list[float] = []
        for _ in range(options.rounds):
            init_new, run_forward = measure(requests=requests, steps=options.steps)
            init_news.append(init_new)
            run_forwards.append(run_forward)
            if options.steady_floor:
                floors.append(sum(measure(requests=requests, steps=options.steps,
                                          steady_floor=True)))
                ratios.append(floors[-1] / (init_new + run_forward))
        canaries = [a + b for a, b in zip(init_news, run_forwards)]
        line = (f"{requests:<8}{statistics.median(init_news):>14.1f}"
                f"{statistics.median(run_forwards):>14.1f}{statistics.median(canaries):>10.1f}")
        if options.steady_floor:
            low, _, high = (statistics.quantiles(ratios, n=4) if len(ratios) > 1
                            else (ratios[0],) * 3)
            line += (f"{statistics.median(floors):>10.1f}"
                     f"{f'{statistics.median(ratios):.3f} ({low:.3f}-{high:.3f})':>30}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
