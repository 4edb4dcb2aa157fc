"""A simulated SGLang schedule for the token-history tests (CPU and GPU), and the request-row
bookkeeping plus device history driven the way the model runner's canary drives them.

Requests arrive, are prefilled (in chunks: a chunk's sampled token is discarded), decode (one
token per forward, or several, as EAGLE's verifications accept), finish, get retracted and
re-admitted (sometimes with their outputs dropped, as SGLang does for ``input_embeds``), and
their ``req_to_token`` rows are recycled (first-in first-out like ``ReqToTokenPool``, or
last-in first-out, so a retracted request often comes back to its old row).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardRow:
    """One row of a simulated forward: its request, the tokens cached before it, its
    ``seq_lens`` after it, the tokens it produces (none kept for a chunk of a prefill), and
    whether it extends (a prefill chunk) or decodes."""

    req: FakeReq
    prefix_len: int
    seq_len: int
    sampled: tuple[int, ...]
    extend: bool


class SimulatedSchedule:
    """Yields one forward (a list of :class:`ForwardRow`) per step; see the module docstring.

    Args:
        seed: the schedule's random seed.
        pool_rows: rows of ``req_to_token`` (row 0 is padding, never handed out).
        max_prompt_len: prompts are 1 to this many tokens.
        max_history_len: a request finishes before its history outgrows this.
        multi_token_steps: some decode rows produce 3 tokens per forward (EAGLE).
    """

    def __init__(self, *, seed: int, pool_rows: int, max_prompt_len: int, max_history_len: int,
                 multi_token_steps: bool = False) -> None:
        self._rng = random.Random(seed)
        self._free_rows = list(range(1, pool_rows))
        self._max_prompt_len = max_prompt_len
        self._max_history_len = max_history_len
        self._multi = multi_token_steps
        self._waiting: list[FakeReq] = []
        self._kv_len: dict[int, int] = {}  # id(req) -> tokens in its KV cache
        self._decoding: set[int] = set()  # id(req) of the requests whose prefill is done
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
            self._kv_len[id(req)] = 0

    def _release(self, req: FakeReq) -> None:
        self.running.remove(req)
        del self._kv_len[id(req)]
        self._decoding.discard(id(req))
        if self._rng.random() < 0.5:  # ReqToTokenPool recycles FIFO; LIFO reuses rows at once
            self._free_rows.append(req.req_pool_idx)
        else:
            self._free_rows.insert(0, req.req_pool_idx)
        req.req_pool_idx = None

    def _row(self, req: FakeReq) -> ForwardRow:
        rng = self._rng
        kv_len = self._kv_len[id(req)]
        history = len(req.history())
        extend = id(req) not in self._decoding
        if extend:  # prefill the whole history, in chunks
            seq_len = min(history, kv_len + rng.randint(1, max(history // 2, 1)))
            kept = seq_len == history
            count = 1
        else:  # decode the last token (multi: a verification accepts three)
            seq_len, kept = history, True
            count = 3 if self._multi and rng.random() < 0.25 else 1
        sampled = tuple(rng.randrange(1 << 20) for _ in range(count)) if kept else ()
        return ForwardRow(req=req, prefix_len=kv_len, seq_len=seq_len, sampled=sampled,
                          extend=extend)

    def forwards(self, num_steps: int) -> Iterator[list[ForwardRow]]:
        """Each forward's rows (a few running requests sit out), then the step's outcome: kept
        tokens appended, finishing and retraction."""
        rng = self._rng
        for _ in range(num_steps):
            self._admit()
            batch = [self._row(r) for r in self.running if rng.random() < 0.9]
            rng.shuffle(batch)
            yield batch
            for row in batch:
                self._kv_len[id(row.req)] = row.seq_len
                if row.sampled:
                    self._decoding.add(id(row.req))
                row.req.output_ids.extend(row.sampled)
                roll = rng.random()
                if len(row.req.history()) + 3 >= self._max_history_len or roll < 0.06:
                    self._release(row.req)  # finished
                elif roll < 0.1:
                    self._release(row.req)  # retracted; re-queued with its history
                    row.req.retraction_count += 1
                    if rng.random() < 0.5:
                        row.req.output_ids = []  # input_embeds requests drop their outputs
                    self._waiting.append(row.req)


class SyncedHistory:
    """The bookkeeping and the device history of one pool, driven as the model runner's canary
    drives them: an EXTEND forward (a row still prefilling) prepares its rows' updates
    (deferring new owners), uploads them, then the deferred admissions (after the model is
    enqueued); a decode forward prepares nothing unless the host sends every row's new tokens
    (``history_tails``, EAGLE); after the forward the sampled tokens are appended on the device
    (unless ``history_tails``)."""

    def __init__(self, *, history_tails: bool, rows: int, width: int, device: str,
                 scatter: Callable[..., None], bind_append: Callable[..., Callable[..., None]]) -> None:
        self.device = device
        self.history_tails = history_tails
        self.rows = RequestRows(num_rows=rows, token_history=True, owner_chains=False,
                                pin_memory=device == "cuda", history_tails=history_tails)
        self.history = TokenHistory(num_rows=rows, max_context_len=width, device=device,
                                    scatter=scatter, bind_append=bind_append)
        self.tokens_sent = 0

    def forward(self, batch: list[ForwardRow]) -> None:
        """One forward of ``batch`` and its sampling."""
        reqs = [row.req for row in batch]
        extend = any(row.extend for row in batch)
        if extend or self.history_tails:
            updates = self.rows.prepare(
                reqs=reqs, prefix_lens=[row.prefix_len for row in batch],
                seq_lens=[row.seq_len for row in batch], defer_new_owners=extend,
            )
            self.upload(updates)
            if updates.deferred:
                self.upload(self.rows.prepare_deferred(updates.deferred))
        if not self.history_tails and batch:
            device = self.device
            self.history.append_sampled(
                req_pool_indices=torch.tensor([r.req.req_pool_idx for r in batch], device=device),
                seq_lens=torch.tensor([r.seq_len for r in batch], device=device),
                # a discarded chunk sample too: the append must leave the prompt as it is
                tokens=torch.tensor([r.sampled[0] if r.sampled else 7 for r in batch],
                                    device=device),
            )

    def upload(self, updates: RowUpdates) -> None:
        """Copy the packed updates to the device, scatter their history, commit."""
        if updates.history_rows:
            device_packed = updates.packed.to(self.device, non_blocking=True, copy=True)
            section = updates.sections_on(device_packed).history
            self.tokens_sent += section.req_all_ids_flat.shape[0]
            self.history.scatter(
                req_pool_indices=section.req_pool_indices, lens=section.req_all_ids_lens,
                offsets=section.offsets, tokens=section.req_all_ids_flat,
            )
        self.rows.commit(updates)

    @property
    def tokens(self) -> torch.Tensor:
        return self.history.tokens

    @property
    def lens(self) -> torch.Tensor:
        return self.history.lens
