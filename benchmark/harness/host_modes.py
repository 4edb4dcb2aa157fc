"""What the host benchmark drives through the simulated canary server, one unit at a time.

- ``decode1`` / ``decode64``: one steady decode step of 1 / 64 running requests (128-token
  prompts, prefilled before the measured steps);
- ``prefill``: one extend forward of 16 fresh 512-token prompts (8192 tokens: one SGLang
  prefill chunk), the requests finished after it;
- ``request1``: one whole batch-1 request: admitted, its 128-token prompt prefilled, one decode
  step, finished (a request's path to its first token; the unit's cost is its two forwards').

:meth:`HostMode.start` builds a :class:`ModeRun` for one configuration; each
:meth:`ModeRun.unit` call runs one unit and returns the costs of its forwards.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from sglang.srt.kv_canary.config import CanaryConfig

from .simulated import ForwardCost, TimedCanaryServer

PROMPT_TOKENS = 128
PREFILL_REQUESTS, PREFILL_PROMPT_TOKENS = 16, 512
_SPARE_SLOTS = 64


class ModeRun:
    """One configuration's simulated server in one mode; :meth:`unit` runs the next unit."""

    def __init__(self, *, server: TimedCanaryServer, unit: Callable[[], None]) -> None:
        self.server = server
        self._unit = unit

    def unit(self) -> list[ForwardCost]:
        """Run one unit; the costs of its forwards."""
        self.server.take_costs()
        self._unit()
        return self.server.take_costs()


def _decode_run(*, config: CanaryConfig, batch: int, units: int) -> ModeRun:
    context = PROMPT_TOKENS + units + 8
    server = TimedCanaryServer(config=config, requests=batch, context=context,
                               tokens=batch * context + _SPARE_SLOTS,
                               prefill_tokens=max(batch * PROMPT_TOKENS, 8192))
    running = server.new_requests(rng=random.Random(0), count=batch, prompt_tokens=PROMPT_TOKENS,
                                  max_new_tokens=units + 4, prefix="decode")
    server.server.extend([(request, PROMPT_TOKENS) for request in running])
    return ModeRun(server=server, unit=lambda: server.server.decode(running))


def _prefill_run(*, config: CanaryConfig, units: int) -> ModeRun:
    """Every unit admits fresh requests and finishes them: the server's size does not grow
    with ``units``."""
    context = PREFILL_PROMPT_TOKENS + 8
    tokens = PREFILL_REQUESTS * context
    server = TimedCanaryServer(config=config, requests=PREFILL_REQUESTS, context=context,
                               tokens=3 * tokens + _SPARE_SLOTS, prefill_tokens=tokens)
    rng = random.Random(0)
    counter = iter(range(1 << 30))

    def unit() -> None:
        batch = server.new_requests(rng=rng, count=PREFILL_REQUESTS,
                                    prompt_tokens=PREFILL_PROMPT_TOKENS, max_new_tokens=1,
                                    prefix=f"prefill{next(counter)}")
        server.server.extend([(request, PREFILL_PROMPT_TOKENS - request.kv_len)
                              for request in batch])
        for request in batch:
            server.server.finish(request)

    return ModeRun(server=server, unit=unit)


def _request_run(*, config: CanaryConfig, units: int) -> ModeRun:
    """Every unit admits a fresh request and finishes it: the server's size does not grow
    with ``units``."""
    context = PROMPT_TOKENS + 8
    server = TimedCanaryServer(config=config, requests=1, context=context,
                               tokens=4 * context + _SPARE_SLOTS, prefill_tokens=8192)
    rng = random.Random(0)
    counter = iter(range(1 << 30))

    def unit() -> None:
        (request,) = server.new_requests(rng=rng, count=1, prompt_tokens=PROMPT_TOKENS,
                                         max_new_tokens=2, prefix=f"request{next(counter)}")
        server.server.extend([(request, PROMPT_TOKENS - request.kv_len)])
        server.server.decode([request])
        server.server.finish(request)

    return ModeRun(server=server, unit=unit)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMode:
    """One kind of unit: its name, what it stands for, and how many units a round times."""

    name: str
    summary: str
    unit: str  # what one unit is, for the table ("decode step", "request", ...)
    units_per_round: int
    warm_up_units: int
    build: Callable[..., ModeRun]  # (*, config, units) -> the server, sized for ``units``

    def start(self, *, config: CanaryConfig, rounds: int) -> ModeRun:
        """This mode's server for ``config``, sized for the warm-up and ``rounds`` rounds."""
        return self.build(config=config,
                          units=self.warm_up_units + rounds * self.units_per_round)


MODES: dict[str, HostMode] = {mode.name: mode for mode in (
    HostMode(name="decode1", summary="a steady decode step of 1 request",
             unit="decode step", units_per_round=200, warm_up_units=20,
             build=functools.partial(_decode_run, batch=1)),
    HostMode(name="decode64", summary="a steady decode step of 64 requests",
             unit="decode step", units_per_round=40, warm_up_units=10,
             build=functools.partial(_decode_run, batch=64)),
    HostMode(name="prefill", summary=f"an extend forward of {PREFILL_REQUESTS} fresh "
                                     f"{PREFILL_PROMPT_TOKENS}-token prompts",
             unit="extend forward", units_per_round=3, warm_up_units=1,
             build=_prefill_run),
    HostMode(name="request1", summary=f"a batch-1 request: its {PROMPT_TOKENS}-token prefill "
                                      "and one decode step",
             unit="request (2 forwards)", units_per_round=20, warm_up_units=5,
             build=_request_run),
)}
