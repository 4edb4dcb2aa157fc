"""A tiny serving loop on the CPU over SGLang's own pools, for the self-check and the CPU tests.

It plays the scheduler's part: SGLang's ``ReqToTokenPool``, ``MHATokenToKVPool`` and KV allocator
(``TokenToKVPoolAllocator``, or ``PagedTokenToKVPoolAllocator`` for ``page_size > 1``), requests
admitted into request rows, page-granular prefix sharing with a small prefix cache (a stand-in
for the radix cache: shared pages, reference counts, eviction of the oldest entry), and real
``ForwardBatch`` objects for EXTEND (prefill, chunked prefill), MIXED and DECODE forwards,
written to ``req_to_token`` the way SGLang does before each forward. Each new ForwardBatch goes
through the ``ForwardBatch.init_new`` AFTER hooks the caller passes in (as SGLang's hook registry
calls them), then through the forward callable the caller passes in (the canary's
``ModelRunner.forward`` hook in the self-check). A padded decode step is padded the way a
replayed CUDA graph pads its static batch: inside ``ModelRunner.forward``, after the canary's
host-side work saw the live batch. The model is :class:`TinyModel`, which stores each token's
K/V like attention does; the next tokens come from a :class:`Sampler`.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sglang.srt.kv_canary.runner.batch_inputs import attach_batch_inputs, batch_inputs_of
from sglang.srt.kv_canary.token_oracle.request_ids import RID_PAD_VALUE, ROOM_PAD_VALUE
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
    compute_position_torch,
)

VOCAB_SIZE = 1000
# Attribute of a live DECODE batch: rows a replayed CUDA graph would pad it with.
GRAPH_PADDING_ATTR = "simulated_graph_padding"
_HEAD_NUM = 2
_HEAD_DIM = 8
_LAYER_NUM = 2


class TinyModel(torch.nn.Module):
    """Stands in for the LLM: stores every token's K/V, a function of (token, position), into
    each layer at ``out_cache_loc`` (padded tokens go to slot 0, as in SGLang)."""

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        base = (input_ids.to(torch.int64) * 131 + positions.to(torch.int64) * 7)[:, None, None]
        lanes = torch.arange(_HEAD_NUM * _HEAD_DIM, dtype=torch.int64).view(1, _HEAD_NUM, _HEAD_DIM)
        values = ((base + lanes) % 251).to(pool.dtype) / 8
        for layer in range(pool.layer_num):
            pool.k_buffer[layer][forward_batch.out_cache_loc] = values
            pool.v_buffer[layer][forward_batch.out_cache_loc] = -values
        return values.sum()


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedModelConfig:
    """The ``ModelConfig`` fields the canary reads."""

    vocab_size: int = VOCAB_SIZE
    context_len: int = 124  # req_to_token's 128 columns minus SGLang's 4 extra ones


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedServerArgs:
    """The ``ServerArgs`` fields the canary reads (sizes of its preallocated buffers). Small, so
    longer prefills take the token checks' eager overflow path."""

    max_prefill_tokens: int = 16
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_algorithm: str | None = None
    disable_overlap_schedule: bool = False
    sampling_backend: str = "token_oracle"


class SimulatedModelRunner:
    """The attributes of SGLang's ModelRunner the canary reads, and its ``forward``."""

    def __init__(
        self,
        *,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: MHATokenToKVPool,
        max_running_requests: int,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.model = TinyModel()
        self.model_config = SimulatedModelConfig()
        self.server_args = SimulatedServerArgs()
        self.max_running_requests = max_running_requests
        self.device = "cpu"
        self.is_draft_worker = False
        self.page_size = token_to_kv_pool.page_size
        self.dp_size = 1

    def forward(self, forward_batch: ForwardBatch) -> Any:
        """What ``ModelRunner.forward`` does for these batches: call ``model.forward`` (on the
        padded static batch when the live batch asks for graph padding)."""
        padded_rows = getattr(forward_batch, GRAPH_PADDING_ATTR, 0)
        if padded_rows:
            forward_batch = pad_like_a_graph_replay(forward_batch, padded_rows=padded_rows)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


def pad_like_a_graph_replay(live: ForwardBatch, *, padded_rows: int) -> ForwardBatch:
    """The batch a decode graph replayed for ``live`` runs on: the live rows, then
    ``padded_rows`` rows of request row 0, cache location 0 and sequence length 1; request ids
    (when present) padded with 0 / -1, as the graph's static id buffers are."""

    def pad(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_full((padded_rows,), value)])

    seq_lens = pad(live.seq_lens, 1)
    static = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=live.batch_size + padded_rows,
        input_ids=pad(live.input_ids, 0),
        req_pool_indices=pad(live.req_pool_indices, 0),
        seq_lens=seq_lens,
        out_cache_loc=pad(live.out_cache_loc, 0),
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.clone(),
        positions=pad(live.positions, 0),
        req_to_token_pool=live.req_to_token_pool,
        token_to_kv_pool=live.token_to_kv_pool,
        rids=live.rids,
    )
    inputs = batch_inputs_of(live)
    if inputs is not None:
        if inputs.rids_int is not None:
            inputs = inputs.replace(
                rids_int=pad(inputs.rids_int, RID_PAD_VALUE),
                bootstrap_room_ids_int=pad(inputs.bootstrap_room_ids_int, ROOM_PAD_VALUE),
            )
        attach_batch_inputs(static, inputs)
    return static


@dataclass(kw_only=True)  # no slots: the token-history snapshot holds requests by weak reference
class SimulatedRequest:
    """One request: its prompt, what it generated, and where its KV lives."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_len: int = 0  # tokens whose K/V is cached: the prefix length of the next forward
    pages: list[int] = field(default_factory=list)  # first slot of each page, by position
    retraction_count: int = 0  # as SGLang's Req (read by the token-history snapshot)
    bootstrap_room: int | None = None  # as SGLang's Req (read by the request-id hook)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def origin_input_ids(self) -> list[int]:
        """SGLang's ``Req.origin_input_ids`` (the same list object: identity is stable)."""
        return self.prompt

    @property
    def output_ids(self) -> list[int]:
        """SGLang's ``Req.output_ids``."""
        return self.output

    @property
    def prefilled(self) -> bool:
        return self.kv_len >= len(self.prompt)

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens


def next_token(*, rid: str, position: int) -> int:
    """The "sampled" token after ``position`` (deterministic)."""
    return (sum(map(ord, rid)) * 1_000_003 + position * 7_919) % VOCAB_SIZE


class Sampler(Protocol):
    """Where the simulated server's next tokens come from."""

    def sample(self, rows: Sequence[tuple[SimulatedRequest, int]], *, step: int) -> list[int]:
        """The next token of each ``(request, position of its last token)`` after forward
        ``step`` (0-based)."""
        ...


class DeterministicSampler:
    """:func:`next_token` of each row (a stand-in for a real model's sampler)."""

    def sample(self, rows: Sequence[tuple[SimulatedRequest, int]], *, step: int) -> list[int]:
        return [next_token(rid=request.rid, position=position) for request, position in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedWorkerBatch:
    """The ``ModelWorkerBatch`` fields the ``ForwardBatch.init_new`` hooks read."""

    reqs: list[SimulatedRequest]
    seq_lens_cpu: torch.Tensor


# AFTER hook of ForwardBatch.init_new: hook(forward_batch, ForwardBatch, worker_batch, runner).
InitNewHook = Callable[[ForwardBatch, type, SimulatedWorkerBatch, SimulatedModelRunner], Any]


class SimulatedServer:
    """Requests, pools, prefix sharing and forward batches; each forward goes to ``forward``."""

    def __init__(
        self,
        *,
        page_size: int,
        num_pages: int,
        max_requests: int,
        max_context_len: int,
        forward: Callable[[ForwardBatch], Any],
        init_new_hooks: Sequence[InitNewHook] = (),
        sampler: Sampler | None = None,
    ) -> None:
        self.page_size = page_size
        self.req_to_token_pool = ReqToTokenPool(
            size=max_requests,
            max_context_len=max_context_len,
            device="cpu",
            enable_memory_saver=False,
        )
        self.kv_pool = MHATokenToKVPool(
            num_pages * page_size,
            page_size=page_size,
            dtype=torch.bfloat16,
            head_num=_HEAD_NUM,
            head_dim=_HEAD_DIM,
            layer_num=_LAYER_NUM,
            device="cpu",
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        allocator_args = dict(
            dtype=torch.bfloat16, device="cpu", kvcache=self.kv_pool, need_sort=False
        )
        self.allocator = (
            TokenToKVPoolAllocator(num_pages, **allocator_args)
            if page_size == 1
            else PagedTokenToKVPoolAllocator(
                num_pages * page_size, page_size=page_size, **allocator_args
            )
        )
        self.runner = SimulatedModelRunner(
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            max_running_requests=max_requests,
        )
        self.forward = forward
        self.init_new_hooks = tuple(init_new_hooks)
        self.sampler = sampler or DeterministicSampler()
        self.forwards = 0
        self.evictions = 0
        self._page_refs: dict[int, int] = {}
        self._prefix_cache: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()

    # ------------------------------------------------------------------ requests and pages

    def admit(self, request: SimulatedRequest) -> None:
        """Give the request a request row and share the longest cached page-aligned prefix."""
        if self.req_to_token_pool.alloc([request]) is None:
            raise RuntimeError("simulation: no free request row")
        shared_pages = self._match_prefix(request.prompt)
        for page in shared_pages:
            self._page_refs[page] += 1
        request.pages = list(shared_pages)
        request.kv_len = len(shared_pages) * self.page_size
        if request.kv_len:
            slots = [self._slot(request, p) for p in range(request.kv_len)]
            self.req_to_token_pool.write(
                (request.req_pool_idx, slice(0, request.kv_len)),
                torch.tensor(slots, dtype=torch.int32),
            )

    def finish(self, request: SimulatedRequest) -> None:
        """Cache the request's full pages, release its pages and request row."""
        full_pages = request.kv_len // self.page_size
        key = tuple(request.tokens[: full_pages * self.page_size])
        if full_pages and key not in self._prefix_cache:
            self._prefix_cache[key] = request.pages[:full_pages]
            for page in request.pages[:full_pages]:
                self._page_refs[page] += 1
        for page in request.pages:
            self._release(page)
        request.pages = []
        self.req_to_token_pool.free(request)

    def _match_prefix(self, prompt: Sequence[int]) -> list[int]:
        best: list[int] = []
        limit = (len(prompt) - 1) // self.page_size  # at least one token left to compute
        for key, pages in self._prefix_cache.items():
            common = 0
            while common < min(len(key), len(prompt)) and key[common] == prompt[common]:
                common += 1
            usable = min(common // self.page_size, limit, len(pages))
            if usable > len(best):
                best = pages[:usable]
        return best

    def _slot(self, request: SimulatedRequest, position: int) -> int:
        while len(request.pages) <= position // self.page_size:
            request.pages.append(self._alloc_page())
        return request.pages[position // self.page_size] + position % self.page_size

    def _alloc_page(self) -> int:
        while True:
            slots = self.allocator.alloc(self.page_size)
            if slots is not None:
                page = int(slots[0])
                self._page_refs[page] = 1
                return page
            if not self._prefix_cache:
                raise RuntimeError("simulation: KV pool exhausted with nothing to evict")
            _, pages = self._prefix_cache.popitem(last=False)
            self.evictions += 1
            for page in pages:
                self._release(page)

    def _release(self, page: int) -> None:
        self._page_refs[page] -= 1
        if self._page_refs[page] == 0:
            del self._page_refs[page]
            self.allocator.free(torch.arange(page, page + self.page_size, dtype=torch.int64))

    # ------------------------------------------------------------------ forwards

    def extend(
        self,
        chunks: Sequence[tuple[SimulatedRequest, int]],
        *,
        decoding: Sequence[SimulatedRequest] = (),
    ) -> None:
        """One EXTEND forward (MIXED when ``decoding`` rows ride along): ``(request, n)`` adds the
        next ``n`` prompt tokens of each request (chunked prefill when fewer than remain)."""
        rows = [(request, n) for request, n in chunks] + [(request, 1) for request in decoding]
        input_ids, slots = [], []
        for request, n in rows:
            positions = range(request.kv_len, request.kv_len + n)
            input_ids += request.tokens[request.kv_len : request.kv_len + n]
            slots += self._write_slots(request, positions)
        prefix_lens = [request.kv_len for request, _ in rows]
        extend_lens = [n for _, n in rows]
        extend_prefix_lens = torch.tensor(prefix_lens, dtype=torch.int32)
        extend_seq_lens = torch.tensor(extend_lens, dtype=torch.int32)
        positions, extend_start_loc = compute_position_torch(extend_prefix_lens, extend_seq_lens)
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        batch = ForwardBatch(
            forward_mode=ForwardMode.MIXED if decoding else ForwardMode.EXTEND,
            batch_size=len(rows),
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r, _ in rows], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            out_cache_loc=torch.tensor(slots, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
            positions=positions,
            extend_num_tokens=len(input_ids),
            extend_seq_lens=extend_seq_lens,
            extend_prefix_lens=extend_prefix_lens,
            extend_start_loc=extend_start_loc,
            extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=extend_lens,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            rids=[request.rid for request, _ in rows],
        )
        self._run(batch, [request for request, _ in rows])
        for request, n in rows:
            request.kv_len += n
        self._sample([request for request, _ in rows if request.prefilled])

    def decode(self, requests: Sequence[SimulatedRequest], *, padded_rows: int = 0) -> None:
        """One DECODE forward; the model runs it padded with ``padded_rows`` rows as a replayed
        CUDA graph pads it (see :func:`pad_like_a_graph_replay`)."""
        slots = [self._write_slots(r, [r.kv_len])[0] for r in requests]
        seq_lens = [r.kv_len + 1 for r in requests]
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(seq_lens),
            input_ids=torch.tensor([r.tokens[-1] for r in requests], dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in requests], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            out_cache_loc=torch.tensor(slots, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
            positions=torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            rids=[r.rid for r in requests],
        )
        if padded_rows:
            setattr(batch, GRAPH_PADDING_ATTR, padded_rows)
        self._run(batch, list(requests))
        for request in requests:
            request.kv_len += 1
        self._sample(list(requests))

    def _write_slots(self, request: SimulatedRequest, positions: Sequence[int]) -> list[int]:
        """Allocate the slots of ``positions`` and write them to ``req_to_token`` (as SGLang
        does before the forward)."""
        slots = [self._slot(request, p) for p in positions]
        if slots:
            self.req_to_token_pool.write(
                (request.req_pool_idx, slice(positions[0], positions[-1] + 1)),
                torch.tensor(slots, dtype=torch.int32),
            )
        return slots

    def _run(self, batch: ForwardBatch, requests: list[SimulatedRequest]) -> None:
        worker_batch = SimulatedWorkerBatch(reqs=requests, seq_lens_cpu=batch.seq_lens_cpu)
        for hook in self.init_new_hooks:
            hook(batch, ForwardBatch, worker_batch, self.runner)
        self.forward(batch)
        self.forwards += 1

    def _sample(self, requests: list[SimulatedRequest]) -> None:
        """Append each request's next token (sampled after the forward just run)."""
        rows = [(request, request.kv_len - 1) for request in requests]
        for request, token in zip(requests, self.sampler.sample(rows, step=self.forwards - 1)):
            request.output.append(token)


def run_mixed_workload(server: SimulatedServer, *, seed: int = 7) -> None:
    """Prefill at page boundaries +-1, decode, chunked prefill (alone and mixed with decode),
    finished requests, shared prefixes A -> B -> A, padded decode rows, and enough new requests
    that cached prefixes are evicted and their slots (and request rows) reused.

    Sized for ``num_pages=40`` and ``max_requests=12`` (see :func:`default_server`)."""
    rng = random.Random(seed)
    page = server.page_size
    running: list[SimulatedRequest] = []
    counter = iter(range(10**6))

    def tokens(count: int) -> list[int]:
        return [rng.randrange(VOCAB_SIZE) for _ in range(count)]

    def new_request(
        prompt_len: int, max_new_tokens: int, prompt: list[int] | None = None
    ) -> SimulatedRequest:
        request = SimulatedRequest(
            rid=f"req{next(counter)}",
            prompt=prompt if prompt is not None else tokens(prompt_len),
            max_new_tokens=max_new_tokens,
        )
        server.admit(request)
        return request

    def prefill(requests: list[SimulatedRequest]) -> None:
        server.extend([(r, len(r.prompt) - r.kv_len) for r in requests])
        running.extend(requests)

    def decode_steps(count: int, *, padded_rows: int = 0) -> None:
        for _ in range(count):
            if not running:
                return
            server.decode(running, padded_rows=padded_rows)
            for request in [r for r in running if r.finished]:
                running.remove(request)
                server.finish(request)

    # prompts at page boundaries +-1
    lengths = [max(1, page - 1), page, page + 1, 3 * page - 1, 3 * page + 1]
    prefill([new_request(n, m) for n, m in zip(lengths, [3, 9, 5, 12, 7])])
    decode_steps(2)
    # chunked prefill: mixed with decode rows, alone, mixed again
    long_request = new_request(5 * page + 3, 4)
    chunk = 2 * page + 1
    server.extend([(long_request, chunk)], decoding=list(running))
    server.extend([(long_request, chunk)])
    server.extend([(long_request, len(long_request.prompt) - 2 * chunk)], decoding=list(running))
    running.append(long_request)
    decode_steps(4)
    # shared prefix A -> B -> A
    shared = tokens(3 * page)
    request_a = new_request(0, 3, prompt=shared + tokens(page + 2))
    prefill([request_a])
    decode_steps(3)
    prefill([new_request(0, 2, prompt=shared + tokens(2))])
    decode_steps(2)
    prefill([new_request(0, 3, prompt=list(request_a.prompt))])
    decode_steps(1, padded_rows=2)
    decode_steps(2)
    # waves of new requests: cached prefixes get evicted, slots and request rows reused
    for _ in range(4):
        prefill([new_request(4 * page + 1, 2), new_request(2 * page, 3)])
        decode_steps(2)
    decode_steps(16)
    if server.evictions == 0:
        raise RuntimeError("simulation: the workload never evicted a cached prefix")


def default_server(
    *,
    page_size: int,
    forward: Callable[[ForwardBatch], Any],
    init_new_hooks: Sequence[InitNewHook] = (),
    sampler: Sampler | None = None,
) -> SimulatedServer:
    """The pool sizes :func:`run_mixed_workload` is written for (small: eviction and reuse)."""
    return SimulatedServer(
        page_size=page_size, num_pages=40, max_requests=12, max_context_len=128, forward=forward,
        init_new_hooks=init_new_hooks, sampler=sampler,
    )
