"""Host cost of the canary per EXTEND forward (prefill), beside the floor of reading the batch's
prompt tokens once.

The tiny model's prefill workloads are host-bound, and an extend forward is where the canary's
host work grows with the batch's tokens: the write-input assert's expectations, the new
requests' token histories and owner chains. This drives a simulated CPU server (the self-check's,
real ``ForwardBatch`` objects, the canary installed as a server installs it) with the kernel
launches replaced by no-ops, so only the canary's Python, numpy and torch host work is timed:
per extend forward of fresh prompts, the three hooks of one forward (``on_init_new`` at
``ForwardBatch.init_new``, then the pre and post launches around the model), every check on
(token oracle, write-input assert, verify-token, token history, owner chains).

Columns: median µs per forward of each hook and their sum, the floor (``np.fromiter`` of every
prompt once) and the sum as a multiple of the floor. Runs on any machine (no GPU): compare ratios,
not absolute figures, across machines.
Usage: ``python benchmark/bench_extend_host.py [--forwards 12] [--batches 8x2048,64x512,1x8192]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_canary import canary_server, random_prompt, stubbed_kernels  # noqa: E402
from timing import host_time_us  # noqa: E402

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode  # noqa: E402
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner  # noqa: E402
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest  # noqa: E402

SCENARIOS = ((8, 2048), (64, 512), (1, 8192))  # (requests, prompt tokens) of one forward
HOOKS = ("on_init_new", "launch_before_model", "launch_after_model")
CONFIG = CanaryConfig(
    mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL, enable_token_oracle=True,
    enable_verify_token_assert=True, enable_write_input_assert=True, ring_capacity=512,
)


def _no_launch(**_: Any) -> None:
    return None


def _timed_hooks(times: dict[str, list[float]]) -> Callable[[], None]:
    """Wrap the runner's hooks with perf_counter timers; returns the undo."""
    originals = {name: getattr(CanaryRunner, name) for name in HOOKS}

    def timed(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = hook(*args, **kwargs)
            times[name].append((time.perf_counter() - start) * 1e6)
            return result
        return call

    for name, hook in originals.items():
        setattr(CanaryRunner, name, timed(name, hook))
    return lambda: [setattr(CanaryRunner, name, hook) for name, hook in originals.items()]


def measure(*, requests: int, prompt: int, forwards: int) -> dict[str, float]:
    """Median µs per extend forward of each hook over ``forwards`` forwards of fresh prompts
    (after one warm-up forward), and the floor."""
    kernels = stubbed_kernels(
        pre_forward=_no_launch, post_forward=_no_launch, scatter_req_token_ids=_no_launch,
        admission_owner_check=_no_launch, append_history_tokens=_no_launch,
    )
    server = canary_server(config=CONFIG, kernels=kernels,
                           tokens=(forwards + 1) * requests * prompt,
                           requests=(forwards + 1) * requests, context=prompt + 8)
    rng = random.Random(0)
    batches = []
    for index in range(forwards + 1):
        batch = [SimulatedRequest(rid=f"r{index}-{i}", max_new_tokens=1,
                                  prompt=random_prompt(rng, prompt))
                 for i in range(requests)]
        for request in batch:
            server.admit(request)
        batches.append(batch)
    times: dict[str, list[float]] = {name: [] for name in HOOKS}
    undo = _timed_hooks(times)
    try:
        for batch in batches:
            server.extend([(request, prompt) for request in batch])
    finally:
        undo()
    result = {name: statistics.median(values[1:]) for name, values in times.items()}
    result["floor"] = host_time_us(
        fn=lambda: [np.fromiter(r.prompt, np.int64, prompt) for r in batches[0]], repeats=5
    ).median
    return result


def parse_batches(value: str) -> tuple[tuple[int, int], ...]:
    """``--batches``: comma-separated ``REQUESTSxPROMPT`` items, each count an integer >= 1.

    Raises:
        ValueError: an item of another form, naming the option, the item and what is allowed.
    """
    batches = []
    for item in value.split(","):
        requests, cross, prompt = item.strip().partition("x")
        if not (cross and requests.isdigit() and prompt.isdigit()
                and int(requests) >= 1 and int(prompt) >= 1):
            raise ValueError(
                f"--batches item {item.strip()!r} is invalid; allowed: REQUESTSxPROMPT with "
                "integers >= 1 (e.g. 1x128)"
            )
        batches.append((int(requests), int(prompt)))
    return tuple(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forwards", type=int, default=12,
                        help="measured extend forwards per scenario (default 12)")
    default_batches = ",".join(f"{requests}x{prompt}" for requests, prompt in SCENARIOS)
    parser.add_argument("--batches", default=default_batches,
                        help="comma-separated REQUESTSxPROMPT scenarios: the fresh requests of "
                             f"one extend forward and their prompt tokens (default {default_batches})")
    options = parser.parse_args(argv)
    if options.forwards < 1:
        parser.error(f"--forwards={options.forwards} is invalid; allowed: an integer >= 1")
    try:
        scenarios = parse_batches(options.batches)
    except ValueError as error:
        parser.error(str(error))
    print(f"{'batch':<14}" + "".join(f"{name:>22}" for name in HOOKS)
          + f"{'canary':>10}{'floor':>9}{'x floor':>9}   (µs per extend forward)")
    for requests, prompt in scenarios:
        result = measure(requests=requests, prompt=prompt, forwards=options.forwards)
        total = sum(result[name] for name in HOOKS)
        print(f"{f'{requests} x {prompt}':<14}"
              + "".join(f"{result[name]:>22.0f}" for name in HOOKS)
              + f"{total:>10.0f}{result['floor']:>9.0f}{total / result['floor']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
