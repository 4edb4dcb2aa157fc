"""A tiny serving loop on the CPU over SGLang's own pools, for the self-check and the CPU tests.

It plays the scheduler's part: SGLang's ``ReqToTokenPool``, ``MHATokenToKVPool`` and KV allocator
(``TokenToKVPoolAllocator``, or ``PagedTokenToKVPoolAllocator`` for ``page_size > 1``), requests
admitted into request rows, page-granular prefix sharing with a small prefix cache (a stand-in
for the radix cache: shared pages, reference counts, eviction of the oldest entry), and real
``ForwardBatch`` objects for EXTEND (prefill, chunked prefill), MIXED and DECODE forwards,
written to ``req_to_token`` the way SGLang does before each forward. Each new ForwardBatch goes
through the ``ForwardBatch.init_new`` AFTER hooks the caller passes in (as SGLang's hook registry
calls them), then through the forward callable the caller passes in (the canary's
``ModelRunner.forward`` hook in the self-check), and its sampled tokens (one per row) through
the ``ModelRunner.sample`` AFTER hooks. A padded decode step is padded the way a
replayed CUDA graph pads its static batch: inside ``ModelRunner.forward``, after the canary's
host-side work saw the live batch. The model is :class:`TinyModel`, which stores each token's
K/V like attention does; the next tokens come from a :class:`Sampler`.

A :class:`ServerBug` (the self-check's persistent scheduler and engine bugs live in
:mod:`.bugs`) is consulted at six points: admission (the prefix match, then the request's
pages), before a decode step (``req_to_token`` of the batch's requests), when a decode step's
positions and slots are planned, in the model's K/V store, and at a host-tier load. A bug
changes what the server maps or writes, never undoes it, and reports each fault with
:meth:`SimulatedServer.report_fault`.
Page references stay sound whatever a bug does: a request holds a reference on every page its
``req_to_token`` row points into (``pages`` and ``extra_pages``), so no page is reallocated
under a reader and a fault's effects stay those of the bug itself.

With ``sliding_window`` the server runs SGLang's hybrid pool instead: ``SWAKVPool`` (layer 0
sliding-window, layer 1 full attention) and ``SWATokenToKVPoolAllocator``; before each decode
step it frees the SWA slots of each request's positions a page and more before the window (as
``ScheduleBatch._evict_swa``, never in a prefix it shares), and a prefix match keeps only pages
whose last window still has its SWA slots (as ``SWARadixCache.match_prefix``).

With ``host_slots`` the server has a host tier, as SGLang's hierarchical cache
(``HiRadixCache`` over ``MHATokenToKVPoolHost``, ``layer_first``): :class:`SimulatedHostPool`
holds K/V of host slots, a cached prefix is backed up (its pages' K/V copied to host slots for
every layer), evicted to the host (its device pages released, the entry kept host only; the
oldest backed-up entry also goes there when pages run out) and loaded back into new device
pages when a later prompt's best match is host only, before that request's first forward. The
host pool's copies go through the ``backup_from_device_all_layer`` AFTER and
``load_to_device_per_layer`` BEFORE hooks the caller passes in (:class:`ServerHooks`), with the
index tensors the copies use. A :class:`ServerBug` is consulted at each load (:class:`HostLoad`).

:class:`SimulatedPool` picks the other pools the canary covers: ``MHATokenToKVPool`` with FP8
bytes, ``MHATokenToKVPoolFP4`` (packed values and scales) and ``MLATokenToKVPool`` (a latent
and a RoPE part per token, one buffer per layer) in bf16 or FP8; :class:`TinyModel` writes each
in its layout.
"""

from __future__ import annotations

import enum
import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_PREFIX
from sglang.srt.kv_canary.batch.carrier import attach_batch_inputs, batch_inputs_of
from sglang.srt.kv_canary.token_oracle.request_ids import RID_PAD_VALUE, ROOM_PAD_VALUE
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MLATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator
from sglang.srt.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
    compute_position_torch,
)

logger = logging.getLogger(__name__)

VOCAB_SIZE = 1000
# Attribute of a live DECODE batch: ``(rows, stale)``, the rows a replayed CUDA graph would pad it
# with and whether they carry live request rows (see :func:`pad_like_a_graph_replay`).
GRAPH_PADDING_ATTR = "simulated_graph_padding"
_HEAD_NUM = 2
_HEAD_DIM = 8
# With a host tier the MHA rows have three heads: 48 bytes, three 16-byte windows, so a page
# loaded into another page (page size 1 or 4) mostly gets other ``partial`` windows than the
# slots it was backed up from (the re-key has work at every page size).
_HOST_TIER_HEAD_NUM = 3
_LAYER_NUM = 2
# FP4 rows: head_dim / 2 packed bytes per head and heads * head_dim / 16 scale bytes, so that
# both are at least the 16 bytes ``real_data=partial`` reads.
_FP4_HEAD_DIM = 128
# MLA rows: the latent, then the RoPE part (FP8: 32 + 16 bytes).
_MLA_KV_LORA_RANK = 32
_MLA_ROPE_DIM = 16
_HICACHE_RATIO = 2  # host slots per device slot (SGLang's default --hicache-ratio)
_IO_BACKEND = "kernel"  # what the host pool's copies are told (SGLang's --hicache-io-backend)


class SimulatedPool(enum.Enum):
    """The KV pool the simulated server runs (a hybrid pool is chosen by ``sliding_window``)."""

    MHA = "mha"  # MHATokenToKVPool, bf16
    MHA_FP8 = "mha-fp8"  # MHATokenToKVPool, float8_e4m3fn stored as bytes
    MHA_FP4 = "mha-fp4"  # MHATokenToKVPoolFP4: packed fp4 values and their scales
    MLA = "mla"  # MLATokenToKVPool, bf16
    MLA_FP8 = "mla-fp8"  # MLATokenToKVPool, float8_e4m3fn stored as bytes

    @property
    def kv_dtype(self) -> torch.dtype:
        if self in (SimulatedPool.MHA_FP8, SimulatedPool.MLA_FP8):
            return torch.float8_e4m3fn
        if self is SimulatedPool.MHA_FP4:
            return torch.float4_e2m1fn_x2
        return torch.bfloat16


def _token_values(base: torch.Tensor, *, shape: tuple[int, ...], dtype: torch.dtype,
                  store_dtype: torch.dtype, sign: float = 1.0) -> torch.Tensor:
    """Deterministic values of each token (``base [N]``, a function of token and position)
    in a row of ``shape``, times ``sign``, as ``store_dtype`` (bytes of ``dtype`` when they
    differ; packed FP4 rows get the codes as bytes)."""
    lanes = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64).view(1, *shape)
    codes = (base.view(-1, *([1] * len(shape))) + lanes) % 251
    if store_dtype == torch.uint8 and dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return codes.to(torch.uint8)  # packed FP4 values and scales: the bytes themselves
    values = codes.to(torch.float32) * (sign / 8)
    return values.to(dtype).view(store_dtype) if store_dtype != dtype else values.to(dtype)


class TinyModel(torch.nn.Module):
    """Stands in for the LLM: stores every token's K/V, a function of (token, position), into
    each layer at ``out_cache_loc`` (padded tokens go to slot 0, as in SGLang), then calls
    ``after_store`` (the server's K/V-store bug point) when it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.after_store: Callable[[], None] | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        base = input_ids.to(torch.int64) * 131 + positions.to(torch.int64) * 7
        loc = forward_batch.out_cache_loc
        if type(pool) is MLATokenToKVPool:
            row = _token_values(base, shape=tuple(pool.kv_buffer[0].shape[1:]), dtype=pool.dtype,
                                store_dtype=pool.store_dtype)
            for layer in range(pool.layer_num):
                pool.kv_buffer[layer][loc] = row
            return self._stored(row)
        if type(pool) is MHATokenToKVPoolFP4:
            packed = _token_values(base, shape=tuple(pool.k_buffer[0].shape[1:]),
                                   dtype=pool.dtype, store_dtype=torch.uint8)
            scales = _token_values(base + 1, shape=tuple(pool.k_scale_buffer[0].shape[1:]),
                                   dtype=pool.dtype, store_dtype=torch.uint8)
            for layer in range(pool.layer_num):
                pool.k_buffer[layer][loc] = packed
                pool.v_buffer[layer][loc] = 255 - packed
                pool.k_scale_buffer[layer][loc] = scales
                pool.v_scale_buffer[layer][loc] = 255 - scales
            return self._stored(packed)
        rows = pool.full_kv_pool if isinstance(pool, SWAKVPool) else pool
        row_spec = dict(shape=tuple(rows.k_buffer[0].shape[1:]), dtype=pool.dtype,
                        store_dtype=getattr(pool, "store_dtype", pool.dtype))
        keys = _token_values(base, **row_spec)
        vals = _token_values(base, sign=-1.0, **row_spec)
        for layer in range(pool.layer_num):
            if isinstance(pool, SWAKVPool):  # each layer in its sub-pool, SWA through the map
                index, sliding = pool.layers_mapping[layer]
                target = pool.swa_kv_pool if sliding else pool.full_kv_pool
                rows = pool.full_to_swa_index_mapping[loc] if sliding else loc
                target.k_buffer[index][rows] = keys
                target.v_buffer[index][rows] = vals
            else:
                pool.k_buffer[layer][loc] = keys
                pool.v_buffer[layer][loc] = vals
        return self._stored(keys)

    def _stored(self, written: torch.Tensor) -> torch.Tensor:
        """Run the K/V-store bug point; the model's output (a sum of what it wrote)."""
        if self.after_store is not None:
            self.after_store()
        return written.to(torch.float32).sum()


class SimulatedHostPool:
    """SGLang's ``MHATokenToKVPoolHost`` in its ``layer_first`` layout, on the CPU: one buffer
    ``[2, layers, size, heads, head_dim]`` of the device pool's stored dtype (K, then V), with the
    per-layer views ``k_data_refs`` / ``v_data_refs`` (``[size, heads, head_dim]``, row = host
    slot) SGLang's host pool has; host slots ``0 .. size - 1`` handed out in whole pages from a
    free list of pages (``HostKVCache.alloc`` / ``free``, least recently freed first); and the
    two copies SGLang's cache controller runs on it, by index tensors (int64, one entry per
    token).

    Args:
        device_pool: the device pool whose pages it holds (an ``MHATokenToKVPool``).
        size: host slots, a multiple of the device pool's page size.
    """

    layout = "layer_first"

    def __init__(self, *, device_pool: MHATokenToKVPool, size: int) -> None:
        if type(device_pool) is not MHATokenToKVPool:
            raise ValueError(f"simulation: no host pool for {type(device_pool).__name__}")
        page_size = device_pool.page_size
        if size < page_size or size % page_size:
            raise ValueError(f"simulation: {size} host slots are not whole pages of {page_size}")
        self.size = size
        self.page_size = page_size
        self.layer_num = device_pool.layer_num
        rows = device_pool.k_buffer[0]
        self.kv_buffer = torch.zeros((2, self.layer_num, size, *rows.shape[1:]),
                                     dtype=rows.dtype)
        self.k_data_refs = [self.kv_buffer[0][layer] for layer in range(self.layer_num)]
        self.v_data_refs = [self.kv_buffer[1][layer] for layer in range(self.layer_num)]
        self._free_pages = torch.arange(0, size, page_size, dtype=torch.int64)  # first slots

    def available_size(self) -> int:
        return int(self._free_pages.shape[0]) * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """The slots of ``need_size // page_size`` free host pages, page by page, or None when
        fewer are free."""
        if need_size % self.page_size:
            raise ValueError(f"simulation: host allocation of {need_size} is not page-aligned")
        count = need_size // self.page_size
        if count > self._free_pages.shape[0]:
            return None
        pages, self._free_pages = self._free_pages[:count], self._free_pages[count:]
        return (pages.view(-1, 1) + torch.arange(self.page_size)).view(-1)

    def free(self, indices: torch.Tensor) -> None:
        """Free the whole pages ``indices`` holds (every slot of each, page by page)."""
        pages = indices.to(torch.int64).view(-1, self.page_size)
        if bool((pages[:, 0] % self.page_size).any()) or not torch.equal(
            pages - pages[:, :1], torch.arange(self.page_size).expand_as(pages)
        ):
            raise ValueError("simulation: host slots freed are not whole pages")
        self._free_pages = torch.cat([self._free_pages, pages[:, 0]])

    def backup_from_device_all_layer(self, device_pool: MHATokenToKVPool,
                                     host_indices: torch.Tensor, device_indices: torch.Tensor,
                                     io_backend: str) -> None:
        """Copy the K/V of ``device_indices`` into ``host_indices``, every layer."""
        for layer in range(self.layer_num):
            self.k_data_refs[layer][host_indices] = device_pool.k_buffer[layer][device_indices]
            self.v_data_refs[layer][host_indices] = device_pool.v_buffer[layer][device_indices]

    def load_to_device_per_layer(self, device_pool: MHATokenToKVPool,
                                 host_indices: torch.Tensor, device_indices: torch.Tensor,
                                 layer_id: int, io_backend: str) -> None:
        """Copy the K/V of ``host_indices`` into ``device_indices``, layer ``layer_id``."""
        device_pool.k_buffer[layer_id][device_indices] = self.k_data_refs[layer_id][host_indices]
        device_pool.v_buffer[layer_id][device_indices] = self.v_data_refs[layer_id][host_indices]


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
    # --enable-metrics and the labels of SGLang's scheduler metrics
    enable_metrics: bool = False
    served_model_name: str = "simulated"
    disaggregation_mode: str = "null"
    extra_metric_labels: dict[str, str] | None = None
    attention_backend: str = "triton"  # what the pool seam is told reads the pool
    # the hierarchical cache (a host tier of hicache_ratio host slots per device slot)
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_io_backend: str = "kernel"

    def get_attention_backends(self) -> tuple[str, str]:
        """(prefill, decode) attention backends, as ``ServerArgs.get_attention_backends``."""
        return self.attention_backend, self.attention_backend


class SimulatedModelRunner:
    """The attributes of SGLang's ModelRunner the canary reads, and its ``forward``."""

    def __init__(
        self,
        *,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: MHATokenToKVPool | MHATokenToKVPoolFP4 | MLATokenToKVPool | SWAKVPool,
        max_running_requests: int,
        sliding_window_size: int | None = None,
        server_args: SimulatedServerArgs = SimulatedServerArgs(),
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.model = TinyModel()
        self.model_config = SimulatedModelConfig()
        self.server_args = server_args
        self.max_running_requests = max_running_requests
        self.device = "cpu"
        self.is_draft_worker = False
        self.page_size = token_to_kv_pool.page_size
        self.dp_size = 1
        self.tp_rank = self.pp_rank = self.moe_ep_rank = 0
        self.dp_rank: int | None = None
        self.sliding_window_size = sliding_window_size

    def forward(self, forward_batch: ForwardBatch) -> Any:
        """What ``ModelRunner.forward`` does for these batches: call ``model.forward`` (on the
        padded static batch when the live batch asks for graph padding)."""
        padded_rows, stale = getattr(forward_batch, GRAPH_PADDING_ATTR, (0, False))
        if padded_rows:
            forward_batch = pad_like_a_graph_replay(forward_batch, padded_rows=padded_rows,
                                                    stale=stale)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


def pad_like_a_graph_replay(
    live: ForwardBatch, *, padded_rows: int, stale: bool = False
) -> ForwardBatch:
    """The batch a decode graph replayed for ``live`` runs on: the live rows, then
    ``padded_rows`` rows of request row 0 (``stale``: the live rows' request rows in turn, as
    SGLang 0.5.12 leaves an earlier replay's indices there), cache location 0 and sequence
    length 1; request ids (when present) padded with 0 / -1, as the graph's static id buffers
    are."""

    def pad(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_full((padded_rows,), value)])

    req_pool_indices = pad(live.req_pool_indices, 0)
    if stale and live.batch_size:
        rows = torch.arange(padded_rows) % live.batch_size
        req_pool_indices[live.batch_size:] = live.req_pool_indices[rows]

    seq_lens = pad(live.seq_lens, 1)
    static = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=live.batch_size + padded_rows,
        input_ids=pad(live.input_ids, 0),
        req_pool_indices=req_pool_indices,
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
    # Pages the request holds a reference on besides ``pages`` (a bug mapped them into its
    # req_to_token row); released when it finishes.
    extra_pages: list[int] = field(default_factory=list)
    cacheable: bool = True  # False: a bug made its KV or mapping differ from its tokens
    shared_len: int = 0  # positions shared from the prefix cache at admission
    swa_freed_len: int = 0  # hybrid pool: positions whose SWA slots were freed
    group: str | None = None  # parallel sampling (n > 1): the requests of one prompt
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


def _common_length(key: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens ``key`` and ``prompt`` share."""
    common = 0
    while common < min(len(key), len(prompt)) and key[common] == prompt[common]:
        common += 1
    return common


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


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixMatch:
    """What the prefix cache returns for a prompt: ``pages`` are shared as the request's first
    pages; ``key`` is the matched entry's tokens (None: no match) and ``common`` how many
    leading prompt tokens equal the entry's."""

    pages: list[int]
    key: tuple[int, ...] | None = None
    common: int = 0


@dataclass(slots=True, kw_only=True)
class DecodeSlot:
    """One row of a decode step as planned: the token ``request.tokens[-1]`` gets ``position``
    (its seq_len is ``position + 1``) and its K/V goes to ``slot``, which is also written to
    ``req_to_token[request.req_pool_idx, position]``. A correct scheduler plans ``position =
    kv_len`` and the slot it allocated for it."""

    request: SimulatedRequest
    position: int
    slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HostLoad:
    """One load-back of a host-only prefix as the cache controller runs it: the K/V of
    ``host_slots`` is copied into ``device_slots`` for every layer (int64 ``[n]``, one entry per
    token, the same tensors the load hooks get). ``key`` is the cached prefix, ``shared_len``
    how many of its first positions the admitted request reads. A correct server copies the
    prefix's own host copy into the new pages the prefix is then mapped to."""

    key: tuple[int, ...]
    host_slots: torch.Tensor
    device_slots: torch.Tensor
    shared_len: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCopy:
    """A cached prefix's host copy: the first host slot of each of its pages, and the device
    pages it was backed up from (by position)."""

    host_pages: list[int]
    origin_pages: list[int]


class ServerBug:
    """A persistent scheduler or engine bug, consulted by :class:`SimulatedServer` at defined
    points; this base class is the correct server (every hook leaves things as they are).

    Contract of the hooks: they run on the host, may change the server's mappings, pages,
    plans and K/V bytes (never undone), call :meth:`SimulatedServer.report_fault` once per
    fault, and keep page references sound (see the module docstring).
    """

    name = "none"

    def match_prefix(
        self, *, server: SimulatedServer, request: SimulatedRequest, match: PrefixMatch
    ) -> PrefixMatch:
        """Admission: the prefix match ``request`` gets (``match`` is the correct one)."""
        return match

    def after_admit(self, *, server: SimulatedServer, request: SimulatedRequest) -> None:
        """Admission: ``request`` has its row and shared pages (``request.pages``); pages
        appended to ``request.pages`` here hold its next positions."""

    def before_decode(
        self, *, server: SimulatedServer, requests: Sequence[SimulatedRequest]
    ) -> None:
        """Before a decode step's slots are allocated (``req_to_token`` holds the prefixes)."""

    def plan_decode(self, *, server: SimulatedServer, rows: list[DecodeSlot]) -> None:
        """A decode step's positions and slots, as allocated; may change them in place."""

    def after_kv_store(self, *, server: SimulatedServer) -> None:
        """Inside the model forward, after it stored this forward's K/V (``server.batch`` is
        the forward's requests; their ``kv_len`` is still the forward's prefix length)."""

    def before_load(
        self, *, server: SimulatedServer, request: SimulatedRequest, load: HostLoad
    ) -> HostLoad:
        """Admission of ``request``, host tier: the load about to run (``load`` is the correct
        one; the prefix is mapped to the pages of ``load.device_slots`` whatever is returned).
        May change the host pool's bytes."""
        return load


# AFTER hook of ForwardBatch.init_new: hook(forward_batch, ForwardBatch, worker_batch, runner).
InitNewHook = Callable[[ForwardBatch, type, SimulatedWorkerBatch, SimulatedModelRunner], Any]
# AFTER hook of ModelRunner.sample: hook(next_token_ids, runner, logits_output, forward_batch).
SampleHook = Callable[[torch.Tensor, SimulatedModelRunner, Any, ForwardBatch], Any]
# AFTER hook of MHATokenToKVPoolHost.backup_from_device_all_layer:
# hook(None, host_pool, device_pool, host_indices, device_indices, io_backend).
BackupHook = Callable[[None, SimulatedHostPool, Any, torch.Tensor, torch.Tensor, str], Any]
# BEFORE hook of MHATokenToKVPoolHost.load_to_device_per_layer:
# hook(host_pool, device_pool, host_indices, device_indices, layer_id, io_backend).
LoadLayerHook = Callable[[SimulatedHostPool, Any, torch.Tensor, torch.Tensor, int, str], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerHooks:
    """The hooks the simulated server calls as SGLang's hook registry would: ``init_new``
    after each ``ForwardBatch.init_new``, ``sample`` after each ``ModelRunner.sample``,
    ``backup`` after each host-tier backup and ``load_layer`` before each layer's load-back copy
    (see ``selfcheck.scenarios.server_hooks`` for the canary's)."""

    init_new: tuple[InitNewHook, ...] = ()
    sample: tuple[SampleHook, ...] = ()
    backup: tuple[BackupHook, ...] = ()
    load_layer: tuple[LoadLayerHook, ...] = ()


class SimulatedServer:
    """Requests, pools, prefix sharing and forward batches; each forward goes to ``forward``.
    ``host_slots`` > 0: a host tier of that many host slots (a plain ``MHATokenToKVPool``
    only)."""

    def __init__(
        self,
        *,
        page_size: int,
        num_pages: int,
        max_requests: int,
        max_context_len: int,
        forward: Callable[[ForwardBatch], Any],
        hooks: ServerHooks = ServerHooks(),
        sampler: Sampler | None = None,
        bug: ServerBug | None = None,
        sliding_window: int | None = None,
        kv_pool: SimulatedPool = SimulatedPool.MHA,
        host_slots: int = 0,
    ) -> None:
        self.page_size = page_size
        self.sliding_window = sliding_window
        self.req_to_token_pool = ReqToTokenPool(
            size=max_requests,
            max_context_len=max_context_len,
            device="cpu",
            enable_memory_saver=False,
        )
        if sliding_window is None:
            self.kv_pool = _kv_pool(kind=kv_pool, size=num_pages * page_size,
                                    page_size=page_size,
                                    head_num=_HOST_TIER_HEAD_NUM if host_slots else _HEAD_NUM)
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
        else:  # both sub-pools as large: the workload never runs out of SWA slots
            size = num_pages * page_size
            self.kv_pool = SWAKVPool(
                size=size, size_swa=size, page_size=page_size, dtype=torch.bfloat16,
                head_num=_HEAD_NUM, head_dim=_HEAD_DIM, swa_attention_layer_ids=[0],
                full_attention_layer_ids=[1], enable_kvcache_transpose=False, device="cpu",
                enable_memory_saver=False, enable_alt_stream=False,
            )
            self.allocator = SWATokenToKVPoolAllocator(
                size=size, size_swa=size, page_size=page_size, dtype=torch.bfloat16,
                device="cpu", kvcache=self.kv_pool, need_sort=False,
            )
        self.host_pool = (
            SimulatedHostPool(device_pool=self.kv_pool, size=host_slots) if host_slots else None
        )
        self.runner = SimulatedModelRunner(
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            max_running_requests=max_requests,
            sliding_window_size=sliding_window,
            server_args=SimulatedServerArgs(
                enable_hierarchical_cache=bool(host_slots),
                hicache_ratio=host_slots / (num_pages * page_size) if host_slots else 2.0,
            ),
        )
        self.forward = forward
        self.hooks = hooks
        self.sampler = sampler or DeterministicSampler()
        self.bug = bug or ServerBug()
        self.runner.model.after_store = lambda: self.bug.after_kv_store(server=self)
        self.forwards = 0
        self.evictions = 0
        self.live_requests: list[SimulatedRequest] = []  # admitted, not finished
        self.batch: list[SimulatedRequest] | None = None  # the forward being built or run
        self._page_refs: dict[int, int] = {}
        self._prefix_cache: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()
        self._pending_faults: list[tuple[SimulatedRequest, str]] = []
        # host tier: the cached prefixes with a host copy, least recently used first (an entry
        # also in ``_prefix_cache`` is on both tiers, else host only)
        self._host_cache: OrderedDict[tuple[int, ...], HostCopy] = OrderedDict()
        self.backups = 0  # prefixes backed up
        self.loads = 0  # prefixes loaded back
        self.moved_loads = 0  # loads into other device pages than the ones backed up
        self.overwritten_loads = 0  # loads whose backed-up pages were overwritten since
        self._loads_in_flight: list[torch.Tensor] = []  # host slots loaded since the last forward
        self._host_frees_after_forward: list[torch.Tensor] = []

    # ------------------------------------------------------------------ requests and pages

    def admit(self, request: SimulatedRequest) -> None:
        """Give the request a request row and share the longest cached page-aligned prefix."""
        if self.req_to_token_pool.alloc([request]) is None:
            raise RuntimeError("simulation: no free request row")
        self.live_requests.append(request)
        self._load_back(request)
        match = self.bug.match_prefix(
            server=self, request=request, match=self._match_prefix(request.prompt)
        )
        for page in match.pages:
            self._page_refs[page] += 1
        request.pages = list(match.pages)
        request.kv_len = len(match.pages) * self.page_size
        request.shared_len = request.swa_freed_len = request.kv_len
        self.bug.after_admit(server=self, request=request)
        if request.kv_len:
            slots = [self._slot(request, p) for p in range(request.kv_len)]
            self.req_to_token_pool.write(
                (request.req_pool_idx, slice(0, request.kv_len)),
                torch.tensor(slots, dtype=torch.int32),
            )

    def finish(self, request: SimulatedRequest) -> None:
        """Cache the request's full pages (unless a bug made them differ from its tokens),
        release its pages and request row."""
        full_pages = request.kv_len // self.page_size
        key = tuple(request.tokens[: full_pages * self.page_size])
        if request.cacheable and full_pages and key not in self._prefix_cache:
            self._prefix_cache[key] = request.pages[:full_pages]
            for page in request.pages[:full_pages]:
                self._page_refs[page] += 1
        for page in request.pages + request.extra_pages:
            self._release(page)
        request.pages = []
        request.extra_pages = []
        self.req_to_token_pool.free(request)
        self.live_requests.remove(request)

    def prefix_limit(self, *, prompt: Sequence[int]) -> int:
        """The most pages a prompt may share: at least one token is left to compute."""
        return (len(prompt) - 1) // self.page_size

    def prefix_cache(self) -> list[tuple[tuple[int, ...], list[int]]]:
        """The cached prefixes, oldest first: ``(tokens, pages)``."""
        return list(self._prefix_cache.items())

    def page_refs(self, *, page: int) -> int:
        """References held on ``page`` (requests and cache entries; 0: free)."""
        return self._page_refs.get(page, 0)

    def page_of(self, *, slot: int) -> int:
        """The first slot of the page holding ``slot``."""
        return slot - slot % self.page_size

    def reference_page(self, *, page: int) -> None:
        """One more reference on the allocated ``page`` (its holder releases it at finish)."""
        if page not in self._page_refs:
            raise RuntimeError(f"simulation: page {page} is not allocated")
        self._page_refs[page] += 1

    def share_page(self, *, request: SimulatedRequest, page: int) -> None:
        """``request`` maps ``page`` outside its own ``pages``: it holds a reference on it."""
        self.reference_page(page=page)
        request.extra_pages.append(page)

    def report_fault(
        self,
        *,
        fault: str,
        victim: SimulatedRequest,
        position: int,
        req_pool_indices: Sequence[int] = (),
        detail: str = "",
    ) -> None:
        """Log one ``kv_canary perturb:`` line for a fault whose effect ``victim`` reads first at
        ``position``: ``step`` and ``row`` are the victim's next forward (the one being built
        when it is in it, else its next one) and its batch row there; ``req_pool_idx`` the
        request row(s) a detection is attributed to (comma-separated: any of them; default the
        victim's); ``injected_step`` the forward index when the bug acted (the forward being
        built or run, else the next one); ``detail`` more ``key=value`` pairs. The line is logged
        once the victim's forward is known (at once, or when its next forward is built)."""
        rows = ",".join(map(str, req_pool_indices or [victim.req_pool_idx]))
        tail = (
            f"rid={victim.rid} position={position} req_pool_idx={rows} "
            f"injected_step={self.forwards}" + (f" {detail}" if detail else "")
        )
        self._pending_faults.append((victim, f"fault={fault} step={{step}} row={{row}} {tail}"))
        if self.batch is not None:
            self._flush_faults(self.batch)

    def _flush_faults(self, batch: list[SimulatedRequest]) -> None:
        """Log the reported faults whose victim is in ``batch`` (the forward ``self.forwards``)."""
        pending = []
        for victim, line in self._pending_faults:
            row = next((i for i, request in enumerate(batch) if request is victim), None)
            if row is None:
                pending.append((victim, line))
            else:
                logger.info(f"{PERTURB_LINE_PREFIX} {line.format(step=self.forwards, row=row)}")
        self._pending_faults = pending

    def _match_prefix(self, prompt: Sequence[int]) -> PrefixMatch:
        best = PrefixMatch(pages=[])
        for key, pages in self._prefix_cache.items():
            common = _common_length(key, prompt)
            usable = self._usable_pages(common=common, prompt=prompt, pages=len(pages))
            while usable and not self._window_live(pages[:usable]):
                usable -= 1
            if usable > len(best.pages):
                best = PrefixMatch(pages=pages[:usable], key=key, common=common)
        return best

    def _usable_pages(self, *, common: int, prompt: Sequence[int], pages: int) -> int:
        """Pages of an entry of ``pages`` pages a prompt matching ``common`` tokens shares."""
        return min(common // self.page_size, self.prefix_limit(prompt=prompt), pages)

    def _window_live(self, pages: Sequence[int]) -> bool:
        """Hybrid pool: whether the last window of the prefix ``pages`` hold still has its SWA
        slots (always, on a plain pool)."""
        if self.sliding_window is None:
            return True
        end = len(pages) * self.page_size
        start = max(0, end - self.sliding_window)
        slots = [pages[p // self.page_size] + p % self.page_size for p in range(start, end)]
        mapping = self.allocator.full_to_swa_index_mapping
        return bool((mapping[torch.tensor(slots, dtype=torch.int64)] > 0).all()) if slots else True

    def _free_out_of_window(self, request: SimulatedRequest) -> None:
        """Hybrid pool: free the SWA slots of the request's own positions a page and more
        before its window (``ScheduleBatch._evict_swa``), page-aligned."""
        if self.sliding_window is None:
            return
        frontier = request.kv_len - self.sliding_window - self.page_size
        frontier -= frontier % self.page_size
        if frontier <= request.swa_freed_len:
            return
        slots = [self._slot(request, p) for p in range(request.swa_freed_len, frontier)]
        self.allocator.free_swa(torch.tensor(slots, dtype=torch.int64))
        request.swa_freed_len = frontier

    def _slot(self, request: SimulatedRequest, position: int) -> int:
        while len(request.pages) <= position // self.page_size:
            request.pages.append(self.alloc_page())
        return request.pages[position // self.page_size] + position % self.page_size

    def alloc_page(self) -> int:
        """A free page (evicting the oldest cached prefixes as needed), with one reference held
        by the caller."""
        while True:
            slots = self._alloc_slots()
            if slots is not None:
                page = int(slots[0])
                self._page_refs[page] = 1
                return page
            if not self._prefix_cache:
                raise RuntimeError("simulation: KV pool exhausted with nothing to evict")
            _, pages = self._prefix_cache.popitem(last=False)  # a backed-up one stays host only
            self.evictions += 1
            for page in pages:
                self._release(page)

    def _alloc_slots(self) -> torch.Tensor | None:
        """One page of slots (hybrid pool: full and SWA, mapped), or None when none is free."""
        if self.sliding_window is None:
            return self.allocator.alloc(self.page_size)
        full = self.allocator.full_attn_allocator.alloc(self.page_size)
        if full is None:
            return None
        swa = self.allocator.swa_attn_allocator.alloc(self.page_size)
        if swa is None:
            raise RuntimeError("simulation: the SWA sub-pool is exhausted")
        self.allocator.full_to_swa_index_mapping[full] = swa
        return full

    def _release(self, page: int) -> None:
        self._page_refs[page] -= 1
        if self._page_refs[page] == 0:
            del self._page_refs[page]
            self.allocator.free(torch.arange(page, page + self.page_size, dtype=torch.int64))

    # ------------------------------------------------------------------ host tier

    def host_cache(self) -> list[tuple[tuple[int, ...], HostCopy]]:
        """The cached prefixes with a host copy, least recently used first."""
        return list(self._host_cache.items())

    def backed_up(self, *, key: tuple[int, ...]) -> bool:
        """Whether the cached prefix ``key`` has a host copy."""
        return key in self._host_cache

    def host_only(self, *, key: tuple[int, ...]) -> bool:
        """Whether the cached prefix ``key`` has a host copy and no device pages."""
        return key in self._host_cache and key not in self._prefix_cache

    def back_up(self, *, key: tuple[int, ...]) -> bool:
        """Back up the device-cached prefix ``key`` (``HiCacheController.write``): host slots
        for its pages (the least recently used host copies dropped as needed), their K/V copied
        from its device pages for every layer, then the backup hooks with the same indices.
        False when it already has a host copy (nothing is copied)."""
        host_pool = self._require_host_pool()
        if key in self._host_cache:
            self._host_cache.move_to_end(key)
            return False
        pages = self._prefix_cache[key]
        host = self._alloc_host(len(pages) * self.page_size)
        device = self.page_slots(pages=pages)
        host_pool.backup_from_device_all_layer(self.kv_pool, host, device, _IO_BACKEND)
        for hook in self.hooks.backup:
            hook(None, host_pool, self.kv_pool, host, device, _IO_BACKEND)
        self._host_cache[key] = HostCopy(host_pages=host[:: self.page_size].tolist(),
                                         origin_pages=list(pages))
        self.backups += 1
        return True

    def evict_to_host(self, *, key: tuple[int, ...]) -> None:
        """Evict the backed-up prefix ``key`` from the device (``HiRadixCache.evict`` of a
        backed-up node): its references on its device pages are released (a page no request
        holds is freed, reallocated and overwritten by later requests); it stays host only."""
        if key not in self._host_cache:
            raise RuntimeError("simulation: evicting a prefix that has no host copy")
        for page in self._prefix_cache.pop(key):
            self._release(page)
        self.evictions += 1

    def forget_prefix(self, *, key: tuple[int, ...]) -> None:
        """Drop the cached prefix ``key`` from both tiers (no later request matches it)."""
        for page in self._prefix_cache.pop(key, []):
            self._release(page)
        copy = self._host_cache.pop(key, None)
        if copy is not None:
            self._free_host(self.page_slots(pages=copy.host_pages))

    def _load_back(self, request: SimulatedRequest) -> None:
        """Admission, host tier: when a host-only prefix gives the prompt a longer match than
        the device's, load it back (see :meth:`_load`)."""
        if self.host_pool is None:
            return
        prompt = request.prompt
        best_key, best = None, len(self._match_prefix(prompt).pages)
        for key, copy in self._host_cache.items():
            if key in self._prefix_cache:
                continue
            usable = self._usable_pages(common=_common_length(key, prompt), prompt=prompt,
                                        pages=len(copy.host_pages))
            if usable > best:
                best_key, best = key, usable
        if best_key is not None:
            self._load(request=request, key=best_key, shared_pages=best)

    def _load(self, *, request: SimulatedRequest, key: tuple[int, ...], shared_pages: int) -> None:
        """Load the host-only prefix ``key`` back (``HiRadixCache.load_back``): new device pages
        for all its pages, the load as the bug has it (:class:`HostLoad`), for each layer the
        load hooks then the host-to-device copy, and the prefix mapped to the new pages."""
        host_pool = self._require_host_pool()
        copy = self._host_cache[key]
        self._host_cache.move_to_end(key)
        pages = [self.alloc_page() for _ in copy.host_pages]
        correct = HostLoad(key=key, host_slots=self.page_slots(pages=copy.host_pages),
                           device_slots=self.page_slots(pages=pages),
                           shared_len=shared_pages * self.page_size)
        self._count_load(copy=copy, pages=pages)
        load = self.bug.before_load(server=self, request=request, load=correct)
        self._loads_in_flight.append(load.host_slots)
        for layer in range(host_pool.layer_num):
            for hook in self.hooks.load_layer:
                hook(host_pool, self.kv_pool, load.host_slots, load.device_slots, layer,
                     _IO_BACKEND)
            host_pool.load_to_device_per_layer(self.kv_pool, load.host_slots, load.device_slots,
                                               layer, _IO_BACKEND)
        self._prefix_cache[key] = pages

    def _count_load(self, *, copy: HostCopy, pages: list[int]) -> None:
        """Count a load; whether it goes to other pages than the backed-up ones, and whether
        those were overwritten since (their layer-0 K differs from the host copy's)."""
        self.loads += 1
        self.moved_loads += pages != copy.origin_pages
        host_rows = self.host_pool.k_data_refs[0][self.page_slots(pages=copy.host_pages)]
        device_rows = self.kv_pool.k_buffer[0][self.page_slots(pages=copy.origin_pages)]
        self.overwritten_loads += not torch.equal(host_rows, device_rows)

    def _alloc_host(self, need_size: int) -> torch.Tensor:
        """Host slots for ``need_size`` tokens, dropping the least recently used host copies
        (a host-only prefix is gone with its copy; a copy a load since the last forward read is
        kept) until they fit."""
        host_pool = self._require_host_pool()
        while (slots := host_pool.alloc(need_size)) is None:
            victim = next((key for key, copy in self._host_cache.items()
                           if not self._host_in_flight(self.page_slots(pages=copy.host_pages))),
                          None)
            if victim is None:
                raise RuntimeError("simulation: the host pool is smaller than one prefix")
            self._free_host(self.page_slots(pages=self._host_cache.pop(victim).host_pages))
        return slots

    def _free_host(self, slots: torch.Tensor) -> None:
        """Free host slots; those a load since the last forward read only after the next
        forward (as ``HiRadixCache`` protects a loading node's host copy: the canary restores
        the records of a load from the host records at the next forward)."""
        if self._host_in_flight(slots):
            self._host_frees_after_forward.append(slots)
        else:
            self._require_host_pool().free(slots)

    def _host_in_flight(self, slots: torch.Tensor) -> bool:
        return any(bool(torch.isin(slots, loaded).any()) for loaded in self._loads_in_flight)

    def _after_forward_host(self) -> None:
        """The loads before the forward just run are done: their host slots may be freed."""
        self._loads_in_flight.clear()
        frees, self._host_frees_after_forward = self._host_frees_after_forward, []
        for slots in frees:
            self._free_host(slots)

    def page_slots(self, *, pages: Sequence[int]) -> torch.Tensor:
        """Every slot of ``pages`` (first slots), in order: int64 ``[len(pages) * page]``."""
        first = torch.tensor(list(pages), dtype=torch.int64).view(-1, 1)
        return (first + torch.arange(self.page_size, dtype=torch.int64)).view(-1)

    def _require_host_pool(self) -> SimulatedHostPool:
        if self.host_pool is None:
            raise RuntimeError("simulation: this server has no host tier (host_slots=0)")
        return self.host_pool

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
        self.batch = [request for request, _ in rows]
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
        self._sample(batch, [request for request, _ in rows])

    def decode(
        self, requests: Sequence[SimulatedRequest], *, padded_rows: int = 0,
        stale_padding: bool = False,
    ) -> None:
        """One DECODE forward; the model runs it padded with ``padded_rows`` rows as a replayed
        CUDA graph pads it (see :func:`pad_like_a_graph_replay`; ``stale_padding``: the padded
        rows carry live request rows). Each request's token goes to
        the position and slot of its :class:`DecodeSlot` (after the bug's plan); its ``kv_len``
        becomes that position + 1."""
        self.batch = list(requests)
        for request in requests:
            self._free_out_of_window(request)
        self.bug.before_decode(server=self, requests=self.batch)
        plan = [
            DecodeSlot(request=r, position=r.kv_len, slot=self._write_slots(r, [r.kv_len])[0])
            for r in requests
        ]
        self.bug.plan_decode(server=self, rows=plan)
        for row in plan:
            self.req_to_token_pool.write((row.request.req_pool_idx, row.position), row.slot)
        seq_lens = [row.position + 1 for row in plan]
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(seq_lens),
            input_ids=torch.tensor([r.tokens[-1] for r in requests], dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in requests], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            out_cache_loc=torch.tensor([row.slot for row in plan], dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
            positions=torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            rids=[r.rid for r in requests],
        )
        if padded_rows:
            setattr(batch, GRAPH_PADDING_ATTR, (padded_rows, stale_padding))
        self._run(batch, list(requests))
        for row in plan:
            row.request.kv_len = row.position + 1
        self._sample(batch, list(requests))

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
        self.batch = requests
        self._flush_faults(requests)
        worker_batch = SimulatedWorkerBatch(reqs=requests, seq_lens_cpu=batch.seq_lens_cpu)
        for hook in self.hooks.init_new:
            hook(batch, ForwardBatch, worker_batch, self.runner)
        try:
            self.forward(batch)
        finally:
            self.batch = None
        self.forwards += 1
        self._after_forward_host()

    def _sample(self, batch: ForwardBatch, requests: list[SimulatedRequest]) -> None:
        """What ``ModelRunner.sample`` and the scheduler do after the forward just run: a token
        for every row (the sample hooks see them all, in row order), kept in the output of each
        request whose prompt is prefilled (a chunked prefill's token is discarded, as SGLang
        discards it)."""
        kept = [request for request in requests if request.prefilled]
        tokens = iter(self.sampler.sample(
            [(request, request.kv_len - 1) for request in kept], step=self.forwards - 1
        ))
        sampled = [
            next(tokens) if request.prefilled
            else next_token(rid=request.rid, position=request.kv_len - 1)
            for request in requests
        ]
        next_token_ids = torch.tensor(sampled, dtype=torch.int64)
        for hook in self.hooks.sample:
            hook(next_token_ids, self.runner, None, batch)
        for request, token in zip(requests, sampled):
            if request.prefilled:
                request.output.append(token)


def run_mixed_workload(server: SimulatedServer, *, seed: int = 7) -> None:
    """Prefill at page boundaries +-1, decode, chunked prefill (alone and mixed with decode),
    finished requests, shared prefixes A -> B -> A (B matches A's cached prefix up to a partial
    page), padded decode rows, parallel sampling (groups of 2 and 3 requests of one prompt,
    prefilled and decoded together; the first group's prompt shares cached pages), and enough
    new requests that cached prefixes are evicted and their slots (and request rows) reused.

    Sized for ``num_pages=40`` and ``max_requests=12`` (see :func:`default_server`)."""
    rng = random.Random(seed)
    page = server.page_size
    running: list[SimulatedRequest] = []
    counter = iter(range(10**6))

    def tokens(count: int) -> list[int]:
        return [rng.randrange(VOCAB_SIZE) for _ in range(count)]

    def new_request(
        prompt_len: int,
        max_new_tokens: int,
        prompt: list[int] | None = None,
        group: str | None = None,
    ) -> SimulatedRequest:
        request = SimulatedRequest(
            rid=f"req{next(counter)}",
            prompt=list(prompt) if prompt is not None else tokens(prompt_len),
            max_new_tokens=max_new_tokens,
            group=group,
        )
        server.admit(request)
        return request

    def siblings(prompt: list[int], *, n: int, max_new_tokens: int) -> list[SimulatedRequest]:
        group = f"group{next(counter)}"
        return [new_request(0, max_new_tokens, prompt=prompt, group=group) for _ in range(n)]

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
    prefill([new_request(0, 2, prompt=shared + tokens(page + 2))])
    decode_steps(2)
    prefill([new_request(0, 3, prompt=list(request_a.prompt))])
    decode_steps(1, padded_rows=2)
    decode_steps(2)
    # parallel sampling: two siblings sharing two cached pages, then three of a new prompt
    prefill(siblings(shared[: 2 * page] + tokens(page + 3), n=2, max_new_tokens=4))
    decode_steps(3)
    # waves of new requests (one of each runs on into the next wave): cached prefixes get
    # evicted, slots and request rows reused
    for wave in range(4):
        group = siblings(tokens(2 * page + 1), n=3, max_new_tokens=3) if wave == 1 else []
        prefill([new_request(4 * page + 1, 2), new_request(2 * page, 5), *group])
        decode_steps(2)
    decode_steps(16)
    if server.evictions == 0:
        raise RuntimeError("simulation: the workload never evicted a cached prefix")


def run_host_tier_workload(server: SimulatedServer, *, seed: int = 11, rounds: int = 5) -> None:
    """Shared prefixes through the host tier, again and again. Three prompts' prefixes of three
    pages are prefilled and cached; then each round

    * backs up every prefix the device caches and evicts the backed-up ones to the host;
    * runs other traffic, whose prefills and decodes take free pages, the evicted ones among
      them (reallocated and overwritten) once the free list comes round;
    * admits requests on the shared prefixes, whose matches load them back into new pages: one
      prefilled in a MIXED forward with the other traffic's decode rows, two loaded before one
      EXTEND forward (both loads restored in it), one prefilled in two chunks after its load;
      decode steps, one padded as a replayed graph pads it.

    Finished requests cache longer prefixes whose first pages are loaded ones, so later backups
    copy slots that were loaded back themselves; the host pool drops its least recently used
    copies when full. Sized for :func:`default_server` with ``host_tier=True``.

    Raises:
        RuntimeError: no load read pages that were overwritten since their backup.
    """
    rng = random.Random(seed)
    page = server.page_size
    running: list[SimulatedRequest] = []
    counter = iter(range(10**6))

    def tokens(count: int) -> list[int]:
        return [rng.randrange(VOCAB_SIZE) for _ in range(count)]

    def new_request(prompt: list[int], max_new_tokens: int) -> SimulatedRequest:
        request = SimulatedRequest(rid=f"req{next(counter)}", prompt=prompt,
                                   max_new_tokens=max_new_tokens)
        server.admit(request)
        return request

    def prefill(requests: list[SimulatedRequest], *, mixed: bool = False) -> None:
        decoding = [r for r in running if r.prefilled] if mixed else []
        server.extend([(r, len(r.prompt) - r.kv_len) for r in requests], decoding=decoding)
        running.extend(requests)

    def decode_steps(count: int, *, padded_rows: int = 0) -> None:
        for _ in range(count):
            if not running:
                return
            server.decode(running, padded_rows=padded_rows)
            for request in [r for r in running if r.finished]:
                running.remove(request)
                server.finish(request)

    def park() -> None:
        for key, _ in server.prefix_cache():
            server.back_up(key=key)
        for key, _ in server.prefix_cache():
            if server.backed_up(key=key):  # (unless the host pool dropped its copy since)
                server.evict_to_host(key=key)

    shared = [tokens(3 * page) for _ in range(3)]
    prefill([new_request(prefix + tokens(page + 1), 2) for prefix in shared])
    decode_steps(8)
    for round_ in range(rounds):
        park()
        prefill([new_request(tokens(5 * page + 1), 4), new_request(tokens(4 * page + 2), 3)])
        decode_steps(1)
        prefill([new_request(shared[0] + tokens(page + 2), 3)], mixed=True)
        decode_steps(1)
        prefill([new_request(shared[1] + tokens(page + round_ % 2), 2),
                 new_request(shared[2] + tokens(2 * page + 1), 3)])
        decode_steps(1, padded_rows=2)
        park()
        chunked = new_request(shared[round_ % 3] + tokens(2 * page + 3), 2)
        server.extend([(chunked, page + 1)])
        server.extend([(chunked, len(chunked.prompt) - chunked.kv_len)])
        running.append(chunked)
        decode_steps(8)
    if server.overwritten_loads == 0:
        raise RuntimeError("simulation: no load read pages overwritten since their backup")


def _kv_pool(*, kind: SimulatedPool, size: int, page_size: int, head_num: int = _HEAD_NUM
             ) -> MHATokenToKVPool | MHATokenToKVPoolFP4 | MLATokenToKVPool:
    """SGLang's pool of ``kind`` with ``size`` token slots on the CPU (``head_num``: of the
    bf16 and FP8 MHA pools)."""
    common = dict(page_size=page_size, dtype=kind.kv_dtype, layer_num=_LAYER_NUM, device="cpu",
                  enable_memory_saver=False)
    if kind in (SimulatedPool.MLA, SimulatedPool.MLA_FP8):
        return MLATokenToKVPool(size, kv_lora_rank=_MLA_KV_LORA_RANK,
                                qk_rope_head_dim=_MLA_ROPE_DIM, **common)
    if kind is SimulatedPool.MHA_FP4:
        return MHATokenToKVPoolFP4(size, head_num=_HEAD_NUM, head_dim=_FP4_HEAD_DIM,
                                   enable_alt_stream=False, **common)
    return MHATokenToKVPool(size, head_num=head_num, head_dim=_HEAD_DIM,
                            enable_alt_stream=False, **common)


def default_server(
    *,
    page_size: int,
    forward: Callable[[ForwardBatch], Any],
    hooks: ServerHooks = ServerHooks(),
    sampler: Sampler | None = None,
    bug: ServerBug | None = None,
    sliding_window: int | None = None,
    kv_pool: SimulatedPool = SimulatedPool.MHA,
    host_tier: bool = False,
) -> SimulatedServer:
    """The pool sizes :func:`run_mixed_workload` and :func:`run_host_tier_workload` are
    written for (small: eviction and reuse); ``sliding_window``: SGLang's hybrid pool with that
    window instead of ``kv_pool``; ``host_tier``: a host pool of twice the device pool's slots
    (SGLang's default ``--hicache-ratio``)."""
    num_pages = 40
    return SimulatedServer(
        page_size=page_size, num_pages=num_pages, max_requests=12, max_context_len=128,
        forward=forward, hooks=hooks, sampler=sampler, bug=bug, sliding_window=sliding_window,
        kv_pool=kv_pool,
        host_slots=_HICACHE_RATIO * num_pages * page_size if host_tier else 0,
    )
