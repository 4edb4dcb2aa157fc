"""A simulated SGLang schedule for the token-history tests (CPU and GPU), and the request-row
bookkeeping plus device history driven the way the model runner's canary drives them.

Requests arrive, are prefilled (in chunks: they sit in batches without new tokens), decode
(one or several tokens per step, as with speculative decoding), finish, get retracted and
re-admitted (sometimes with their outputs dropped, as SGLang does for ``input_embeds``), and
their ``req_to_token`` rows are recycled (first-in first-out like ``ReqToTokenPool``, or
last-in first-out, so a retracted request often comes back to its old row).
Histories may outgrow the pool's ``max_context_len`` so truncation is exercised too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch

from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates
from sglang.srt.kv_canary.token_history.history import TokenHistory


class FakeReq:
    """The attributes of SGLang's ``Req`` that the canary reads (weak-referenceable)."""

    def __init__(self, rid: str, prompt: list[int]) -> None:
        self.rid = rid
        self.bootstrap_room: int | None = None
        self.origin_input_ids = prompt
        self.output_ids: list[int] = []
        self.req_pool_idx: int | None = None
        self.retraction_count = 0

    def history(self) -> list[int]:
        return self.origin_input_ids + self.output_ids


class SimulatedSchedule:
    """Yields one batch (list of requests) per forward step; see the module docstring."""

    def __init__(
        self, *, seed: int, pool_rows: int, max_prompt_len: int, steady: bool = False
    ) -> None:
        """``steady``: batches keep their order and nobody sits out, and finishing,
        retraction and multi-token steps are ten times rarer, so most batches repeat the one
        before with one more token per row (decode steps)."""
        self._steady = steady
        self._rng = random.Random(seed)
        self._free_rows = list(range(1, pool_rows))
        self._max_prompt_len = max_prompt_len
        self._waiting: list[FakeReq] = []
        self._prefilling: dict[int, int] = {}  # id(req) -> chunks left
        self.running: list[FakeReq] = []
        self._next_rid = 0

    def _admit(self) -> None:
        rng = self._rng
        for _ in range(rng.randint(0, 3)):
            prompt_len = rng.randint(1, self._max_prompt_len)
            prompt = [rng.randrange(1 << 20) for _ in range(prompt_len)]
            self._waiting.append(FakeReq(f"r{self._next_rid}", prompt))
            self._next_rid += 1
        while self._waiting and self._free_rows:
            req = self._waiting.pop(0)
            req.req_pool_idx = self._free_rows.pop(0)
            self.running.append(req)
            self._prefilling[id(req)] = rng.randint(0, 2)

    def _release(self, req: FakeReq) -> None:
        self.running.remove(req)
        self._prefilling.pop(id(req), None)
        if self._rng.random() < 0.5:  # ReqToTokenPool recycles FIFO; LIFO reuses rows at once
            self._free_rows.append(req.req_pool_idx)
        else:
            self._free_rows.insert(0, req.req_pool_idx)
        req.req_pool_idx = None

    def _advance(self) -> None:
        rng = self._rng
        for req in list(self.running):
            chunks_left = self._prefilling.get(id(req))
            if chunks_left:
                self._prefilling[id(req)] = chunks_left - 1
                continue
            self._prefilling.pop(id(req), None)
            count = (1 if rng.random() < 0.975 else 3) if self._steady else rng.choice((1, 1, 1, 3))
            req.output_ids.extend(rng.randrange(1 << 20) for _ in range(count))
            roll = rng.random() * (10 if self._steady else 1)
            if roll < 0.08:
                self._release(req)  # finished
            elif roll < 0.12:
                self._release(req)  # retracted; re-queued with its history
                req.retraction_count += 1
                if rng.random() < 0.5:
                    req.output_ids = []  # input_embeds requests drop their outputs
                self._waiting.append(req)

    def batches(self, num_steps: int) -> Iterator[list[FakeReq]]:
        for _ in range(num_steps):
            self._admit()
            if self._steady:
                batch = list(self.running)
            else:
                batch = [r for r in self.running if self._rng.random() < 0.9]  # a few sit out
                self._rng.shuffle(batch)
            yield batch
            self._advance()


class SyncedHistory:
    """The bookkeeping and the device history of one pool, driven as the model runner's canary
    drives them: :meth:`prepare` at ``ForwardBatch.init_new``, :meth:`upload` before the forward
    (the packed host buffer copied to the device, its history section scattered, or, for a
    unit append, applied from the device copy by ``append``, or nothing where the upload changes
    no history, then the bookkeeping committed). ``unit_appends`` counts the uploads applied by
    ``append``, ``unchanged`` those that changed nothing."""

    def __init__(self, *, incremental: bool, rows: int, width: int, device: str,
                 scatter: Callable[..., None], append: Callable[..., None]) -> None:
        self.incremental = incremental
        self.device = device
        self.append = append
        self.unit_appends = 0
        self.unchanged = 0
        self.rows = RequestRows(num_rows=rows, token_history=True, owner_chains=False,
                                pin_memory=device == "cuda", incremental=incremental)
        self.history = TokenHistory(num_rows=rows, max_context_len=width, device=device,
                                    scatter=scatter)

    def prepare(self, reqs: list[FakeReq]) -> RowUpdates:
        return self.rows.prepare(reqs=reqs, prefix_lens=[0] * len(reqs), seq_lens=[1] * len(reqs))

    def upload(self, updates: RowUpdates) -> None:
        device_packed = updates.packed.to(self.device, non_blocking=True, copy=True)
        _, section, owners, _ = updates.sections_on(device_packed)
        assert owners is None  # owner chains are not kept here
        if updates.unit_append:
            self.unit_appends += 1
            self.append(upload=device_packed, max_rows=section.req_pool_indices.shape[0],
                        pool_out=self.history.tokens, history_lens_out=self.history.lens)
        elif updates.history_unchanged:
            self.unchanged += 1
        else:
            self.history.upload(section)
        self.rows.commit(updates)

    @property
    def tokens(self) -> torch.Tensor:
        return self.history.tokens

    @property
    def lens(self) -> torch.Tensor:
        return self.history.lens
