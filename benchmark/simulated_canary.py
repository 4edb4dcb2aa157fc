"""The simulated CPU server the host-cost benchmarks drive (``bench_extend_host.py``,
``bench_decode_host.py``, ``bench_request_host.py``): the self-check's server (real
``ForwardBatch`` objects, the token oracle's sampler) with the canary installed as a server
installs it, on the plain-torch kernels, with the launches a benchmark names replaced (so only the
canary's Python, numpy and torch host work remains to time).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from sglang.srt.kv_canary.config import CanaryConfig
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.sampling import OracleSampler
from sglang.srt.kv_canary.selfcheck.scenarios import init_new_hooks, install_canary_runner
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    SimulatedModelRunner,
    SimulatedServer,
)

PAGE_SIZE = 4


def stubbed_kernels(**launches: Callable[..., None]) -> CanaryKernels:
    """The plain-torch kernels with each named launch (a :class:`CanaryKernels` field) replaced.

    Raises:
        TypeError: a name is not a launch of :class:`CanaryKernels`.
    """
    return dataclasses.replace(load_kernels(KernelBackend.TORCH_REFERENCE), **launches)


def canary_server(*, config: CanaryConfig, kernels: CanaryKernels, tokens: int, requests: int,
                  context: int) -> SimulatedServer:
    """A simulated server of pages of :data:`PAGE_SIZE` with room for ``tokens`` KV tokens (and
    a few pages more) and ``requests`` request rows of ``context`` positions, its canary serving
    (``config``, ``kernels``)."""
    server = SimulatedServer(
        page_size=PAGE_SIZE, num_pages=tokens // PAGE_SIZE + 64, max_requests=requests + 1,
        max_context_len=context,
        forward=lambda batch: around_forward(SimulatedModelRunner.forward, server.runner, batch),
        init_new_hooks=init_new_hooks(config), sampler=OracleSampler(vocab_size=VOCAB_SIZE),
    )
    install_canary_runner(model_runner=server.runner, config=config, kernels=kernels)
    return server


def random_prompt(rng: random.Random, tokens: int) -> list[int]:
    """``tokens`` token ids of the simulated vocabulary."""
    return [rng.randrange(VOCAB_SIZE) for _ in range(tokens)]
