"""Timing of the canary's launches on one GPU for the kernel benchmark: a forward's pre and post
launch (:func:`time_forward`; after a decode forward with the token checks also the
sampled-token append, :func:`time_append`) and the radix sweep (:func:`time_sweep`), each
against the memory-bandwidth bound of :func:`.kernel_cases.launch_bytes` and, optionally, its
torch reference (one synchronized call on a copy of the state). Needs CUDA when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang.jit_kernel.kv_canary import (
    append_history,
    append_history_ref,
    canary_forward,
    canary_forward_ref,
    sweep,
    sweep_ref,
)
from sglang.jit_kernel.kv_canary.consts import COUNTER_VIOLATIONS
from sglang.jit_kernel.kv_canary.kernel_inputs import BatchLayout

from . import kernel_cases, timers
from .kernel_cases import Checks, Pool, Scenario
from .stats import Spread
from .table import MISSING, value_cell

GRAPH_LAUNCHES = 20
REPEATS = 20
TABLE_HEADER = ("scenario", "checks", "launch", "eager us", "graph us", "launch us", "bound us",
                "graph/bound", "ref us", "ref/graph")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchTiming:
    """One launch of one scenario with one set of checks."""

    scenario: str
    checks: str
    launch: str
    eager_us: Spread
    graph_us: Spread | None
    host_us: Spread
    bound_us: float
    bytes: int
    reference_us: float | None
    unexpected_violations: int

    def to_json(self) -> dict[str, object]:
        return {"scenario": self.scenario, "checks": self.checks, "launch": self.launch,
                "eager_us": self.eager_us.to_json(),
                "graph_us": None if self.graph_us is None else self.graph_us.to_json(),
                "host_us": self.host_us.to_json(), "bound_us": self.bound_us,
                "bytes": self.bytes, "reference_us": self.reference_us,
                "unexpected_violations": self.unexpected_violations}

    def row(self) -> tuple[str, ...]:
        """Its cells under :data:`TABLE_HEADER` (device time: the graph replay's, else the
        eager launch's)."""
        device_us = self.graph_us or self.eager_us

        def times(numerator: float, denominator: float) -> str:
            return f"{numerator / denominator:.1f}" if numerator > 0 < denominator else MISSING

        return (self.scenario, self.checks, self.launch, value_cell(self.eager_us, digits=1),
                value_cell(self.graph_us, digits=1), value_cell(self.host_us, digits=1),
                f"{self.bound_us:.2f}", times(device_us.median, self.bound_us),
                MISSING if self.reference_us is None else f"{self.reference_us:.0f}",
                MISSING if self.reference_us is None
                else times(self.reference_us, device_us.median))


def _time_launch(*, name: str, launch: Callable[[], None], reference: Callable[[], None] | None,
                 scenario: Scenario, checks: Checks, bound_bytes: int, bandwidth: float,
                 graph: bool, violations: Callable[[], int]) -> LaunchTiming:
    eager = timers.event_time_us(fn=launch, repeats=REPEATS)
    host = timers.launch_host_time_us(fn=launch, repeats=REPEATS)
    replayed = (timers.graph_time_us(fn=launch, launches=GRAPH_LAUNCHES, repeats=10)
                if graph else None)
    reference_us = None
    if reference is not None:
        reference_us = timers.host_time_us(fn=reference, repeats=1).median
    return LaunchTiming(scenario=scenario.name, checks=checks.name, launch=name,
                        eager_us=eager, graph_us=replayed, host_us=host,
                        bound_us=bound_bytes / bandwidth * 1e6, bytes=bound_bytes,
                        reference_us=reference_us, unexpected_violations=violations())


def time_forward(pool: Pool, checks: Checks, *, bandwidth: float,
                 with_reference: bool) -> list[LaunchTiming]:
    """The pre and the post launch of ``pool``'s forward with ``checks``."""
    state = kernel_cases.state_of(pool, checks)
    batch = kernel_cases.batch_of(pool, checks)

    def synchronized(launch: Callable[..., None]) -> Callable[[], None] | None:
        if not with_reference:
            return None
        copy = kernel_cases.clone_state(state)

        def run() -> None:
            launch(state=copy, batch=batch)
            torch.cuda.synchronize()

        return run

    timings = []
    for name, launch, reference in (
            ("pre", canary_forward.launch_pre_forward, canary_forward_ref.launch_pre_forward),
            ("post", canary_forward.launch_post_forward,
             canary_forward_ref.launch_post_forward)):
        if name == "post":
            kernel_cases.prepare_post(state, pool)
        # repeated pre launches re-advance the owner chains, so they report owner rows by
        # design; only the post launches, on the consistent state, must report nothing
        timings.append(_time_launch(
            name=name, launch=lambda launch=launch: launch(state=state, batch=batch),
            reference=synchronized(reference), scenario=pool.scenario, checks=checks,
            bound_bytes=kernel_cases.launch_bytes(pool.scenario, checks, launch=name),
            bandwidth=bandwidth, graph=True,
            violations=(lambda: int(state.counters[COUNTER_VIOLATIONS])) if name == "post"
            else (lambda: 0)))
    return timings + time_append(pool, checks, bandwidth=bandwidth,
                                 with_reference=with_reference)


def time_append(pool: Pool, checks: Checks, *, bandwidth: float,
                with_reference: bool) -> list[LaunchTiming]:
    """The sampled-token append after ``pool``'s forward (a decode forward with the token
    checks: the runtime appends every sampled token to the token history); none otherwise."""
    if pool.scenario.layout is not BatchLayout.DECODE or not checks.tokens:
        return []
    inputs = kernel_cases.append_inputs(pool)
    per_batch = {"req_pool_indices": inputs.req_pool_indices, "seq_lens": inputs.seq_lens,
                 "tokens": inputs.tokens}
    launch = append_history.bind_append_history_tokens(
        pool_out=inputs.pool_out, history_lens_out=inputs.history_lens_out)
    reference_launch = append_history_ref.bind_append_history_tokens(
        pool_out=inputs.pool_out.clone(), history_lens_out=inputs.history_lens_out.clone())

    def reference() -> None:
        reference_launch(**per_batch)
        torch.cuda.synchronize()

    return [_time_launch(
        name="append", launch=lambda: launch(**per_batch),
        reference=reference if with_reference else None, scenario=pool.scenario,
        checks=checks, bound_bytes=kernel_cases.launch_bytes(pool.scenario, checks,
                                                             launch="append"),
        bandwidth=bandwidth, graph=True, violations=lambda: 0)]


def time_sweep(pool: Pool, checks: Checks, *, bandwidth: float,
               with_reference: bool) -> list[LaunchTiming]:
    """The sweep over every prefix slot of ``pool``'s one long clean history."""
    entries = kernel_cases.sweep_entries(pool)
    state = kernel_cases.state_of(pool, checks)

    def reference() -> None:
        sweep_ref.launch_sweep(state=kernel_cases.clone_state(state), entries=entries)
        torch.cuda.synchronize()

    return [_time_launch(
        name="sweep", launch=lambda: sweep.launch_sweep(state=state, entries=entries),
        reference=reference if with_reference else None, scenario=pool.scenario,
        checks=checks, bound_bytes=kernel_cases.launch_bytes(pool.scenario, checks,
                                                             launch="sweep"),
        bandwidth=bandwidth, graph=False,
        violations=lambda: int(state.counters[COUNTER_VIOLATIONS]))]
