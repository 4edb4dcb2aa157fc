"""Host cost of the canary per batch-1 request: its prefill and its first decode step.

At batch 1 an 8B prefill is bound by the scheduler's Python (the host enqueues the eager forward
for about 20 ms; the GPU runs it in about 5), so every microsecond of the canary's host work
between a request's arrival and its first token adds to its time to first token. That work is the
prefill's three hooks (``on_init_new``, ``run_forward`` less the model forward, and the pre and
post launches around the model: ``launch_before_model`` / ``launch_after_model``) and the first
decode step's two (``on_init_new``, ``run_forward`` less the replay; SGLang's overlap scheduler
enqueues that step before it sends the prefill's token; in a server its launches are inside the
CUDA graph, so they are left out here with the model).

This drives a simulated CPU server (the self-check's, real ``ForwardBatch`` objects, the canary
installed as a server installs it) through requests of ``--prompt`` fresh tokens, one at a time:
admit, prefill, one decode step, finish. The kernel launches are no-ops, so only the canary's
Python, numpy and torch host work is timed; the launches a request makes are counted instead
(each costs 10-25 µs of host time on a GPU host). ``--configs``: ``canary`` (the canary alone)
and ``all-checks`` (partial real data, verify-token, write-input assert), as in
``bench_server_overhead.py``.

Columns: median µs per request of each hook and their sum, and the launches per request. Runs on
any machine (no GPU): compare versions on one machine (``compare_decode_host.py --bench
request``), not absolute figures across machines.
Usage: ``python benchmark/bench_request_host.py [--requests 300] [--prompt 128]
[--configs canary,all-checks]``
"""

from __future__ import annotations

import argparse
import dataclasses
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
from sglang.srt.kv_canary.selfcheck.simulation import SimulatedRequest  # noqa: E402

# the stubbed launches count nothing on the device: no device-agreement check, no stats
_QUIET = dict(health_check_every_n_steps=1 << 40, stats_print_every_n_steps=0, ring_capacity=512)
CONFIGS: dict[str, CanaryConfig] = {
    "canary": CanaryConfig(mode=CanaryMode.LOG, enable_token_oracle=True, **_QUIET),
    "all-checks": CanaryConfig(
        mode=CanaryMode.LOG, real_data=RealDataMode.PARTIAL, enable_token_oracle=True,
        enable_verify_token_assert=True, enable_write_input_assert=True, **_QUIET,
    ),
}
# (hook, forward) pairs timed: the prefill's hooks and the first decode step's
PARTS = (
    ("on_init_new", "EXTEND"), ("run_forward", "EXTEND"), ("launch_before_model", "EXTEND"),
    ("launch_after_model", "EXTEND"), ("on_init_new", "DECODE"), ("run_forward", "DECODE"),
)
_LAUNCHES = ("pre_forward", "post_forward", "scatter_req_token_ids", "admission_owner_check",
             "append_history_tokens")
WARM_UP_REQUESTS = 10


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RequestHostCost:
    """Median µs per request of each of :data:`PARTS`, and the launches per request."""

    parts: dict[tuple[str, str], float]
    launches: float

    @property
    def total(self) -> float:
        return sum(self.parts.values())


class _Recorder:
    """Class-level timers of the runner's hooks (``run_forward`` less the forward it wraps, which
    holds the pre and post launches: timed on their own) and counting launch stubs;
    :meth:`undo` restores the hooks."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, str], list[float]] = {part: [] for part in PARTS}
        self.launches = 0
        self.counting = False
        names = {hook for hook, _ in PARTS}
        self._originals = {name: getattr(CanaryRunner, name) for name in names}
        for name, hook in self._originals.items():
            setattr(CanaryRunner, name, self._timed(name, hook))

    def _timed(self, name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def call(runner: CanaryRunner, *args: Any, **kwargs: Any) -> Any:
            batch = kwargs.get("forward_batch", args[0] if args else None)
            part = (name, batch.forward_mode.name)
            inner = InnerTime()
            if name == "run_forward":
                kwargs["forward"] = inner.wrap(kwargs["forward"])
            start = time.perf_counter()
            result = hook(runner, *args, **kwargs)
            elapsed = time.perf_counter() - start - inner.seconds
            if recorder.counting and part in recorder.times:
                recorder.times[part].append(elapsed * 1e6)
            return result

        return call

    def launch(self, **_: Any) -> None:
        if self.counting:
            self.launches += 1

    def undo(self) -> None:
        for name, hook in self._originals.items():
            setattr(CanaryRunner, name, hook)


def _count_publication(*, counters: torch.Tensor) -> None:
    """The publish launch reduced to the publication number the upload ring relies on."""
    counters[COUNTER_PUBLISHES] += 1


def measure(*, config: str, requests: int, prompt: int) -> RequestHostCost:
    """The canary's host cost per request over ``requests`` requests of ``prompt`` fresh tokens
    (after :data:`WARM_UP_REQUESTS`), one at a time, each prefilled and decoded one step."""
    recorder = _Recorder()
    kernels = stubbed_kernels(**{name: recorder.launch for name in _LAUNCHES},
                              publish_counters=_count_publication)
    total = requests + WARM_UP_REQUESTS
    context = prompt + 8
    try:
        server = canary_server(config=CONFIGS[config], kernels=kernels,
                               tokens=total * (context + 4), requests=total, context=context)
        rng = random.Random(0)
        for index in range(total):
            recorder.counting = index >= WARM_UP_REQUESTS
            request = SimulatedRequest(rid=f"r{index}", max_new_tokens=2,
                                       prompt=random_prompt(rng, prompt))
            server.admit(request)
            server.extend([(request, prompt - request.kv_len)])
            server.decode([request])
            server.finish(request)
    finally:
        recorder.undo()
    return RequestHostCost(
        parts={part: statistics.median(values) for part, values in recorder.times.items()},
        launches=recorder.launches / requests,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300,
                        help="measured requests per configuration (default 300)")
    parser.add_argument("--prompt", type=int, default=128,
                        help="prompt tokens per request (default 128)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, of {', '.join(CONFIGS)} (default: both)")
    options = parser.parse_args(argv)
    for name in ("requests", "prompt"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}={getattr(options, name)} is invalid; allowed: an integer >= 1")
    configs = [name.strip() for name in options.configs.split(",")]
    unknown = [name for name in configs if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs={options.configs!r}: unknown {unknown}; allowed: "
                     f"{', '.join(CONFIGS)}")
    labels = [f"{hook}[{kind}]" for hook, kind in PARTS]
    width = max(len(label) for label in labels) + 2
    print(f"{'config':<12}" + "".join(f"{label:>{width}}" for label in labels)
          + f"{'canary':>9}{'launches':>10}   (median µs per request, launches counted)")
    for name in configs:
        cost = measure(config=name, requests=options.requests, prompt=options.prompt)
        print(f"{name:<12}" + "".join(f"{cost.parts[part]:>{width}.1f}" for part in PARTS)
              + f"{cost.total:>9.1f}{cost.launches:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
