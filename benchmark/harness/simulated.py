"""The canary on the one CPU simulator of a serving loop, its host work timed per forward.

:class:`TimedCanaryServer` is the self-check's simulated server
(:class:`sglang.srt.kv_canary.selfcheck.simulation.SimulatedServer`: SGLang's own CPU pools, real
``ForwardBatch`` objects) with the canary installed as a server installs it
(:func:`sglang.srt.kv_canary.selfcheck.scenarios.install_canary_runner`) and driven through the
public hook adapters a server registers: the ``ForwardBatch.init_new`` and ``ModelRunner.sample``
AFTER adapters of the hook table (:func:`sglang.srt.kv_canary.selfcheck.scenarios.server_hooks`)
and the ``ModelRunner.forward`` AROUND adapter
(:func:`sglang.srt.kv_canary.hooks.model_runner.around_forward`).

Per forward it records the host time of the ``init_new`` adapters, of the ``forward`` adapter
less the model runner's forward inside it, of the canary's wrapper of ``model.forward`` (inside
the model runner's forward, around the model's own computation) and of the ``sample`` adapters,
each less the canary's kernel launches made inside it (:class:`ForwardCost`). On a
CPU the launches would run the kernels' torch references (device work, done on the host), so
every launch is replaced by a no-op (:func:`stubbed_kernels`) but the counter publication, whose
torch reference runs because the host reads the publication back; every launch is counted and
its time left out. A launch that binds arguments (its result is the launch to call later) gets
a no-op launch back. On a GPU host each launch costs the host about 10 to 20 µs more (see the
kernel benchmark's ``launch us`` column). With the launches stubbed the device counters never
advance, so the periodic health check is turned off.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.sampling import OracleSampler
from sglang.srt.kv_canary.selfcheck.scenarios import install_canary_runner, server_hooks
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    ServerHooks,
    SimulatedModelRunner,
    SimulatedRequest,
    SimulatedServer,
)

from .timers import ExcludedTime

PASSED_THROUGH_LAUNCHES = frozenset({"publish_counters"})  # their torch reference runs
_NEVER = 1 << 62  # steps between health checks: never


def stubbed_kernels(*, excluded: ExcludedTime) -> CanaryKernels:
    """The torch-reference kernels with every launch but :data:`PASSED_THROUGH_LAUNCHES`
    replaced by a no-op, each launch's time added to ``excluded`` (and counted there)."""
    reference = load_kernels(KernelBackend.TORCH_REFERENCE)

    def no_launch(**_: Any) -> Callable[..., Any]:
        return stub  # what a binding launch returns: the launch to call later

    stub = excluded.excluding(no_launch)
    launches = {field.name: getattr(reference, field.name)
                for field in dataclasses.fields(reference)
                if callable(getattr(reference, field.name))}
    return dataclasses.replace(reference, **{
        name: excluded.excluding(launch) if name in PASSED_THROUGH_LAUNCHES else stub
        for name, launch in launches.items()})


def random_prompt(rng: random.Random, tokens: int) -> list[int]:
    """``tokens`` token ids of the simulated vocabulary."""
    return [rng.randrange(VOCAB_SIZE) for _ in range(tokens)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardCost:
    """The canary's host work in one forward, launches left out.

    Attributes:
        mode: the forward mode's name (``EXTEND``, ``DECODE``, ``MIXED``).
        init_new_us: the ``ForwardBatch.init_new`` adapters.
        forward_us: the ``ModelRunner.forward`` adapter less the model runner's forward inside.
        in_model_us: the model runner's forward less the model's own computation: the canary's
            wrapper of ``model.forward`` (its pre and post launches' host work).
        sample_us: the ``ModelRunner.sample`` adapters after the forward.
        launches: canary kernel launches the forward made.
    """

    mode: str
    init_new_us: float
    forward_us: float
    in_model_us: float
    sample_us: float = 0.0
    launches: int

    @property
    def server_us(self) -> float:
        """The host work of this forward as a server runs it: a decode step replays a CUDA
        graph, which holds the in-model launches, so their host work is left out there."""
        in_model = 0.0 if self.mode == "DECODE" else self.in_model_us
        return self.init_new_us + self.forward_us + in_model + self.sample_us

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "init_new_us": self.init_new_us,
                "forward_us": self.forward_us, "in_model_us": self.in_model_us,
                "sample_us": self.sample_us, "launches": self.launches,
                "server_us": self.server_us}


class TimedCanaryServer:
    """A simulated server of page size 1 whose canary's hook adapters are timed per forward.

    Args:
        config: the canary's configuration (its health check is turned off, see the module
            docstring).
        requests: request rows (the most requests alive at once).
        context: positions per request row.
        tokens: KV slots of the pool.
        prefill_tokens: the largest extend forward (SGLang's ``max_prefill_tokens`` and chunk
            size, which size the canary's preallocated per-forward buffers).
    """

    def __init__(self, *, config: CanaryConfig, requests: int, context: int, tokens: int,
                 prefill_tokens: int) -> None:
        config = dataclasses.replace(config, health_check_every_n_steps=_NEVER)
        self._launches = ExcludedTime()
        self._model = ExcludedTime()
        self.costs: list[ForwardCost] = []
        self._init_new_us = 0.0
        self._launch_mark = 0  # launches counted when the last forward ended
        adapters = server_hooks(config)
        self.server = SimulatedServer(
            page_size=1, num_pages=tokens, max_requests=requests + 1, max_context_len=context,
            forward=self._forward,
            hooks=ServerHooks(init_new=tuple(map(self._timed_init_new, adapters.init_new)),
                              sample=tuple(map(self._timed_sample, adapters.sample))),
            sampler=OracleSampler(vocab_size=VOCAB_SIZE),
        )
        runner = self.server.runner
        # the model's own computation, timed apart (the canary wraps this instance attribute)
        runner.model.forward = self._model.excluding(runner.model.forward)
        runner.server_args = dataclasses.replace(
            runner.server_args, max_prefill_tokens=prefill_tokens,
            chunked_prefill_size=prefill_tokens, max_running_requests=requests,
            cuda_graph_max_bs=max(requests, 1))
        install_canary_runner(model_runner=runner, config=config,
                              kernels=stubbed_kernels(excluded=self._launches))

    def _timed(self, hook: Callable[..., Any], *,
               done: Callable[[float], None]) -> Callable[..., Any]:
        """``hook`` whose every call passes ``done`` its host µs less the launches in it."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            launches_before = self._launches.seconds
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                done(1e6 * (time.perf_counter() - start
                            - (self._launches.seconds - launches_before)))

        return timed

    def _timed_init_new(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """``hook`` timed into the next forward's cost (init_new runs before the forward)."""

        def add(elapsed_us: float) -> None:
            self._init_new_us += elapsed_us

        return self._timed(hook, done=add)

    def _timed_sample(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """``hook`` timed into the cost of the forward that just ran (the server samples right
        after each forward), with the launches it made."""

        def add(elapsed_us: float) -> None:
            last = self.costs[-1]
            self.costs[-1] = dataclasses.replace(
                last, sample_us=last.sample_us + elapsed_us,
                launches=last.launches + self._launches.calls - self._launch_mark)
            self._launch_mark = self._launches.calls

        return self._timed(hook, done=add)

    def _forward(self, forward_batch: Any) -> Any:
        launches_before, model_before = self._launches.seconds, self._model.seconds
        in_model: list[float] = []  # [runner forward's seconds, launches inside it]

        def model_runner_forward(runner: Any, *args: Any, **kwargs: Any) -> Any:
            inner_launches = self._launches.seconds
            begun = time.perf_counter()
            try:
                return SimulatedModelRunner.forward(runner, *args, **kwargs)
            finally:
                in_model[:] = [time.perf_counter() - begun,
                               self._launches.seconds - inner_launches]

        start = time.perf_counter()
        result = around_forward(model_runner_forward, self.server.runner, forward_batch)
        elapsed = time.perf_counter() - start
        runner_s, launches_inside_s = in_model or [0.0, 0.0]
        launches_s = self._launches.seconds - launches_before
        self.costs.append(ForwardCost(
            mode=forward_batch.forward_mode.name, init_new_us=self._init_new_us,
            forward_us=1e6 * (elapsed - runner_s - (launches_s - launches_inside_s)),
            in_model_us=1e6 * (runner_s - launches_inside_s
                               - (self._model.seconds - model_before)),
            launches=self._launches.calls - self._launch_mark))
        self._init_new_us = 0.0
        self._launch_mark = self._launches.calls
        return result

    def take_costs(self) -> list[ForwardCost]:
        """The costs of the forwards since the last call, in order (and forget them)."""
        costs, self.costs = self.costs, []
        return costs

    def new_requests(self, *, rng: random.Random, count: int, prompt_tokens: int,
                     max_new_tokens: int, prefix: str) -> list[SimulatedRequest]:
        """``count`` fresh requests of random prompts, admitted (rids ``PREFIX-i``)."""
        batch = [SimulatedRequest(rid=f"{prefix}-{index}", prompt=random_prompt(rng, prompt_tokens),
                                  max_new_tokens=max_new_tokens) for index in range(count)]
        for request in batch:
            self.server.admit(request)
        return batch
