"""Host cost of admitting requests: what the canary does on the CPU at ``ForwardBatch.init_new``
when a batch brings requests it has not seen (their owner chains and, with token checks, their
whole token histories), side by side with the floor and the torch form of the same arithmetic.

This host work sits on the path to a request's first token, so it is what the canary adds to
TTFT when many requests with long cached prefixes arrive together. Per scenario (requests x
prompt tokens, prefix already cached = prompt - 64):

- ``prepare``: :meth:`RequestRows.prepare` (owner chains; ``+history``: token history too), all
  of it before the forward (how the runner admitted requests before the deferral);
- ``floor``: reading every request's token list once into int64 arrays (``np.fromiter``): no
  canary can admit a request without reading its tokens;
- ``torch``: the owner chains through ``torch.tensor`` + :func:`chain_terms_torch` (the form the
  host used before; shows what the numpy path saves);
- ``deferred: before``: what the runner now does before the forward of an extend batch
  (``prepare(defer_new_owners=True)``: a new owner's row is only reset), with token history;
- ``deferred: after``: :meth:`RequestRows.prepare_deferred`, the tokens and owner chains, which
  the runner does after the model forward is enqueued (hidden behind the GPU's forward when that
  takes longer).

Runs on any machine (no GPU); ns/token and the ratios are what to compare.
Usage: ``python benchmark/bench_admission_host.py``
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import host_time_us  # noqa: E402

from sglang.jit_kernel.kv_canary.consts import CHAIN_ANCHOR  # noqa: E402
from sglang.jit_kernel.kv_canary.hashing import chain_terms_torch  # noqa: E402
from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates  # noqa: E402

SCENARIOS = ((64, 8192), (1, 32768), (64, 512))
CACHED_TAIL = 64  # prompt tokens not in the radix cache


@dataclass(slots=True, weakref_slot=True)
class _Request:
    """What RequestRows reads of SGLang's Req."""

    rid: str
    origin_input_ids: list[int]
    req_pool_idx: int
    output_ids: list[int] = field(default_factory=list)
    retraction_count: int = 0


def _torch_chains(reqs: list[_Request], prefix_len: int) -> list[int]:
    chains = []
    for req in reqs:
        tokens = torch.tensor(req.origin_input_ids[:prefix_len], dtype=torch.int64)
        terms = chain_terms_torch(tokens=tokens, positions=torch.arange(prefix_len))
        chains.append(CHAIN_ANCHOR + int(terms.sum()))
    return chains


def main() -> None:
    rng = random.Random(0)
    print(f"{'scenario':<22}{'work':<18}{'ms':>9}{'ns/token':>10}{'x floor':>9}  spread")
    for bs, prompt in SCENARIOS:
        reqs = [_Request(rid=f"r{i}", req_pool_idx=i + 1,
                         origin_input_ids=[rng.randrange(151936) for _ in range(prompt)])
                for i in range(bs)]
        prefix = prompt - CACHED_TAIL
        tokens = bs * prompt

        def admit(token_history: bool, defer: bool = False) -> tuple[RequestRows, RowUpdates]:
            rows = RequestRows(num_rows=bs + 1, token_history=token_history, owner_chains=True,
                               pin_memory=False)
            return rows, rows.prepare(reqs=reqs, prefix_lens=[prefix] * bs,
                                      seq_lens=[prompt] * bs, defer_new_owners=defer)

        deferred_rows, deferred_updates = admit(True, defer=True)

        timings = {
            "floor": host_time_us(fn=lambda: [np.fromiter(r.origin_input_ids, np.int64, prompt)
                                              for r in reqs], repeats=5),
            "prepare": host_time_us(fn=lambda: admit(False), repeats=5),
            "prepare+history": host_time_us(fn=lambda: admit(True), repeats=5),
            "torch chains": host_time_us(fn=lambda: _torch_chains(reqs, prefix), repeats=5),
            "deferred: before": host_time_us(fn=lambda: admit(True, defer=True), repeats=5),
            "deferred: after": host_time_us(
                fn=lambda: deferred_rows.prepare_deferred(deferred_updates.deferred), repeats=5
            ),
        }
        floor = timings["floor"].median
        for work, spread in timings.items():
            micros = spread.median
            print(f"{f'{bs} x {prompt}':<22}{work:<18}{micros / 1e3:>9.2f}"
                  f"{micros * 1e3 / tokens:>10.1f}{micros / floor:>9.2f}"
                  f"  (±{100 * spread.relative_spread / 2:.0f}%)")


if __name__ == "__main__":
    main()
