"""The KV canary of one ModelRunner: one owner object, one method per SGLang event.

:class:`CanaryRunner` is created when a ``ModelRunner`` initializes and is set on it under one
attribute (:data:`RUNNER_ATTRIBUTE`). It owns everything the canary keeps for that runner: the
token oracle's manager, the device state (records, ring, counters, owner chains), the request-row
bookkeeping and token history, the write-input expectations, the graph-resident request ids, the
monitor and the fault injector. Every hook in :mod:`sglang.srt.kv_canary.hooks` is a short
adapter that finds this object (:func:`runner_of`) and calls one of its methods:

==============================  ==========================================================
SGLang event                    method
==============================  ==========================================================
ModelRunner.initialize (start)  :func:`create_canary_runner` (hooks in place, refusals,
                                oracle and its sampler factory)
KV budget profiling             :meth:`~CanaryRunner.reserve_fixed_bytes`
KV pool created                 :meth:`~CanaryRunner.on_memory_pool`
graph capture                   :meth:`~CanaryRunner.on_capture_start`,
                                :meth:`~CanaryRunner.capture_decode_graph`,
                                :meth:`~CanaryRunner.capture_draft_graph`,
                                :meth:`~CanaryRunner.capture_draft_extend_graph`
ModelRunner.initialize (end)    :meth:`~CanaryRunner.on_serving_start`
ForwardBatch.init_new           :meth:`~CanaryRunner.on_init_new` (the per-batch carrier)
ForwardBatch padding            :meth:`~CanaryRunner.on_pad_inputs`
ModelRunner.forward             :meth:`~CanaryRunner.run_forward` (host side, outside graphs)
model.forward                   :meth:`~CanaryRunner.launch_before_model`,
                                :meth:`~CanaryRunner.launch_after_model` (captured in graphs;
                                eager: deferred admissions sent first)
graph replay                    :meth:`~CanaryRunner.on_decode_replay`,
                                :meth:`~CanaryRunner.on_graph_replay`,
                                :meth:`~CanaryRunner.replay_draft`,
                                :meth:`~CanaryRunner.replay_draft_extend`
scheduler prefix cache built    :meth:`~CanaryRunner.attach_radix_cache` (radix sweep)
scheduler idle                  :meth:`~CanaryRunner.on_idle`
sampling / EAGLE verification   :meth:`~CanaryRunner.make_sampler`,
                                :meth:`~CanaryRunner.sample_eagle_verify` (then the owner
                                chains follow the accepted tokens)
EAGLE draft pass starts         :meth:`~CanaryRunner.on_draft_pass_start`
==============================  ==========================================================

EAGLE (spec v2, topk 1): the target model's canary checks its prefills and TARGET_VERIFY
forwards; the draft model's runner has its own canary on the draft pool (draft prefill, the
draft decode steps, DRAFT_EXTEND_V2), whose token history is the request's tokens from index 1
(draft slot ``p`` holds the K/V of the token at ``p + 1``). A verification writes a block of
tokens per row and keeps the first ``accept_lens``; both canaries then set each row's owner
chain after its last kept token (:mod:`sglang.jit_kernel.kv_canary.accepted_owner`).

Launch accounting (the health check's evidence): the host counts the canary launch pairs it
enqueues, one per eager ``model.forward`` and, per graph replay, as many as were captured into
that graph. Every forward with request rows must account for exactly one pair; the device's run
counters must equal the host's count at every counter snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryBatchView, CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES
from sglang.srt.kv_canary.config import CanaryConfig, PerturbConfig, get_active_config
from sglang.srt.kv_canary.hook_registration import verify_hooks_applied
from sglang.srt.kv_canary.monitor.health import CanaryHealthError
from sglang.srt.kv_canary.monitor.monitor import CanaryMonitor
from sglang.srt.kv_canary.perturb.injector import FaultInjector, build_fault_injector
from sglang.srt.kv_canary.perturb.next_token_swap import NextTokenSwapState, SampledRows
from sglang.srt.kv_canary.runner.batch_inputs import (
    CanaryBatchInputs,
    attach_batch_inputs,
    attach_sampling_inputs,
    batch_inputs_of,
    carried_field,
)
from sglang.srt.kv_canary.runner.device_state import allocate_device_state, fingerprinted_layers
from sglang.srt.kv_canary.runner.graph_buffers import GraphRequestIdBuffers
from sglang.srt.kv_canary.runner.graph_padding import point_padded_rows_at_row_zero
from sglang.srt.kv_canary.runner.kernel_inputs import (
    ForwardKind,
    UniformBlocks,
    build_batch_view,
    forward_kind,
    host_prefix_lens,
    speculative_block,
)
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.memory_budget import (
    UPLOAD_STAGING_WORDS,
    FixedBuffers,
    context_columns_bound,
    fixed_buffers,
    graph_max_bs_bound,
    max_tokens_per_forward,
    per_token_bytes,
    request_rows_bound,
    seq_lens_mirror_rows,
    uniform_block_rows,
)
from sglang.srt.kv_canary.runner.model_forward import install_model_forward
from sglang.srt.kv_canary.runner.refusals import (
    CanaryUnsupportedError,
    refuse_unless_supported,
    unsupported_pools,
    unsupported_server_args,
)
from sglang.srt.kv_canary.runner.request_rows import UPLOAD_HEADER_WORDS, RequestRows, RowUpdates
from sglang.srt.kv_canary.runner.upload_buffers import (
    UPLOAD_BUFFER_SLOTS,
    UPLOAD_BUFFER_WORDS,
    UploadBufferRing,
)
from sglang.srt.kv_canary.runner.sweep import RadixSweep, unsupported_sweep_cache
from sglang.srt.kv_canary.token_history.history import TokenHistory
from sglang.srt.kv_canary.token_history.write_expectations import (
    WriteExpectations,
    expectations_built_on_host,
    extend_expectations_on_host,
    write_input_assert_applies,
)
from sglang.srt.kv_canary.token_oracle.eagle_verify import sample_verify_with_oracle
from sglang.srt.kv_canary.token_oracle.graph_tokens import GraphOracleTokens
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.request_ids import (
    RID_PAD_VALUE,
    ROOM_PAD_VALUE,
    BatchRequestIds,
    request_ids_of,
)
from sglang.srt.kv_canary.token_oracle.sampler import (
    TOKEN_ORACLE_BACKEND,
    OracleSampler,
    register_oracle_sampler,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

RUNNER_ATTRIBUTE = "kv_canary"  # attribute of a ModelRunner
DRAFT_LINE_SUFFIX = " pool=draft"  # ends the EAGLE draft canary's violation / health / stats lines
_ORACLE_VARIABLE = "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"
_EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
STAGED_LAYOUTS = 8  # upload layouts whose sections stay cut from the upload area
_T = TypeVar("_T")


class TokenOracleSetupError(RuntimeError):
    """The token oracle is enabled in a configuration where it cannot steer the tokens."""


def _samples_decode_tokens(forward_batch: Any) -> bool:
    """Whether a captured batch is a plain decode step, whose rows' next tokens come from the
    sampler (a target-verify graph's tokens are chosen by the EAGLE verify instead)."""
    return (forward_batch.forward_mode == ForwardMode.DECODE
            and getattr(forward_batch, "spec_info", None) is None)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class CanaryRunner:
    """The canary of one ModelRunner (see the module docstring for its events).

    Args:
        config: the active configuration.
        model_runner: SGLang's ``ModelRunner`` (or the self-check's stand-in); read, never
            changed except ``model.forward`` (wrapped at :meth:`on_memory_pool`).
        kernels: the canary launches (Triton kernels in a server; torch references or the
            interpreted Triton kernels on a CPU).
    """

    def __init__(self, *, config: CanaryConfig, model_runner: Any, kernels: CanaryKernels) -> None:
        self.config = config
        self._model_runner = model_runner
        self._kernels = kernels
        self._device = torch.device(model_runner.device)
        self.oracle: TokenOracleManager | None = None
        self.state: CanaryDeviceState | None = None
        self.monitor: CanaryMonitor | None = None
        self.token_history: TokenHistory | None = None
        self.write_expectations: WriteExpectations | None = None
        self.request_rows: RequestRows | None = None
        self._injector: FaultInjector | None = None
        self._upload_buffers: UploadBufferRing | None = None  # host side of the uploads
        self._staging: torch.Tensor | None = None  # the upload area (see on_memory_pool)
        self._host_seq_lens: torch.Tensor | None = None  # after its header: the seq_lens mirror
        # rows of the last upload's unit append not yet applied by an eager pre launch (graphs
        # apply it themselves: their captured append reads the upload area's header)
        self._pending_unit_append = 0
        # the sections cut from the upload area per upload layout (layout key -> target,
        # sections), the most recent :data:`STAGED_LAYOUTS` layouts
        self._staged: dict[tuple[Any, ...], tuple[torch.Tensor, Any]] = {}
        self._sweep: RadixSweep | None = None
        self._sweep_launches = 0
        self._batch_ids = BatchRequestIds(device=self._device)
        # the next-token swap's log line names the rows it swapped (only that fault reads them)
        self._logs_sampled_rows = config.perturb.next_token_swap_prob > 0
        self._graph_ids: dict[int, GraphRequestIdBuffers] = {}
        # per graph runner: the id tensors its buffers were last filled from
        self._graph_ids_source: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # the graph runners whose graphs compute their rows' next oracle tokens (decode graphs),
        # and the offer of a prepared replay's tokens to this runner's sampler
        self._token_graph_runners: set[int] = set()
        self.graph_tokens = GraphOracleTokens()
        self._captured_launches: dict[tuple[int, int], int] = {}
        self._launches_in_capture: int | None = None
        self._launches = 0  # canary launch pairs enqueued (eager + replayed) since serving started
        # counter publications enqueued (eager + replayed) since serving started; per decode
        # graph (graph runner, batch size) the publications captured into it (one)
        self._publications = 0
        self._captured_publications: dict[tuple[int, int], int] = {}
        self._publications_in_capture: int | None = None
        self._steps = 0
        self._serving = False
        # EAGLE (spec v2): the draft model runner's canary checks the draft pool
        self._is_draft = bool(getattr(model_runner, "is_draft_worker", False))
        self._blocks: UniformBlocks | None = None
        # the owner chains the draft decode steps advance (scratch, zeroed before every draft
        # pass: the steps' tokens are guesses the next draft extend replaces)
        self._draft_decode_state: CanaryDeviceState | None = None
        self._last_upload: RowUpdates | None = None
        self._in_draft_capture = False
        self._draft_graph_launches: dict[int, int] = {}

    # ================================================================= start-up

    def refuse_unsupported_flags(self) -> None:
        """``ModelRunner.initialize`` starts, canary on: stop on flags it cannot check.

        Raises:
            CanaryUnsupportedError: naming each flag and what to change.
        """
        if self.config.canary_enabled:
            refuse_unless_supported(unsupported_server_args(self._model_runner.server_args))

    def install_oracle(self) -> None:
        """``ModelRunner.initialize`` starts, oracle on: build the oracle from the served model's
        vocabulary and register its sampler factory before ``create_sampler()`` runs (a draft
        model runner keeps its own manager for its checks; its tokens never go through the
        sampler).

        Raises:
            TokenOracleSetupError: ``--sampling-backend`` is not ``token_oracle``.
        """
        if not self.config.enable_token_oracle:
            return
        model_runner = self._model_runner
        server_args = model_runner.server_args
        if server_args.sampling_backend != TOKEN_ORACLE_BACKEND:
            raise TokenOracleSetupError(
                f"{_ORACLE_VARIABLE}=1 needs --sampling-backend {TOKEN_ORACLE_BACKEND}, got "
                f"{server_args.sampling_backend!r}: with another sampler the tokens do not follow "
                "the oracle"
            )
        self.oracle = TokenOracleManager(
            oracle=HashOracle(vocab_size=model_runner.model_config.vocab_size)
        )
        if model_runner.is_draft_worker:
            return
        register_oracle_sampler(factory=self.make_sampler)
        _log_oracle(oracle=self.oracle, server_args=server_args, perturb=self.config.perturb)

    def fixed_buffers(self, *, page_size: int) -> FixedBuffers:
        """Upper bounds of every device buffer but the records (before the pools exist)."""
        model_runner = self._model_runner
        server_args = model_runner.server_args
        history = self.config.token_history_enabled
        write_input = self.config.canary_enabled and self.config.enable_write_input_assert
        return fixed_buffers(
            page_size=page_size,
            ring_capacity=self.config.ring_capacity,
            request_rows=request_rows_bound(server_args, dp_size=model_runner.dp_size),
            context_columns=context_columns_bound(
                server_args, context_len=model_runner.model_config.context_len
            ),
            token_history=history,
            write_expectation_tokens=max_tokens_per_forward(
                server_args, max_running_requests=server_args.max_running_requests
            ) if write_input else 0,
            graph_max_bs=graph_max_bs_bound(server_args),
            graph_request_ids=self.config.enable_token_oracle,
            speculative=server_args.speculative_algorithm is not None,
        )

    def reserve_fixed_bytes(self, available_bytes: int) -> int:
        """The profiled KV budget minus the canary's fixed buffers (logged: the KV pool is sized
        from what this returns, with :data:`RECORD_BYTES` added to each token's cell)."""
        fixed = self.fixed_buffers(page_size=self._model_runner.page_size)
        reserved = fixed.total
        records = per_token_bytes()
        draft = ""
        if self._model_runner.server_args.speculative_algorithm is not None:
            # the EAGLE draft runner's canary: the same buffers but the write expectations, and a
            # record per slot of the draft pool (its pool is sized from this runner's budget)
            reserved += fixed.total - fixed.write_expectations
            records *= 2
            draft = " (target and EAGLE draft canaries)"
        logger.info(
            f"KV canary memory budget: {available_bytes} B profiled for the KV pool, "
            f"{reserved} B reserved for the canary's fixed buffers, {records} B "
            f"per token added to the KV cell size for the records{draft}"
        )
        return available_bytes - reserved

    def device_bytes(self) -> dict[str, int]:
        """Bytes of every device tensor this canary allocated, by buffer (the records, the
        fixed buffers of :class:`FixedBuffers` and the graph-resident ids)."""
        def size(*tensors: torch.Tensor | None) -> int:
            return sum(t.numel() * t.element_size() for t in tensors if t is not None)

        state = self.state
        owned = {
            "records": size(state.records),
            "ring": size(state.ring),
            "counters": size(state.counters),
            "owner_chains": size(state.owner_chains) + (
                0 if self._draft_decode_state is None
                else size(self._draft_decode_state.owner_chains)
            ),
            "seq_lens_mirror": size(self._host_seq_lens),  # the head of the upload area
            "upload_staging": size(self._staging) - size(self._host_seq_lens),
            "token_history": 0 if self.token_history is None
            else size(self.token_history.tokens, self.token_history.lens),
            "write_expectations": 0 if self.write_expectations is None
            else self.write_expectations.device_bytes,
            "graph_request_ids": sum(
                size(b.rids_int, b.bootstrap_room_ids_int, b.next_tokens)
                for b in self._graph_ids.values()
            ),
            "uniform_blocks": 0 if self._blocks is None else self._blocks.device_bytes,
        }
        return owned

    def on_memory_pool(self) -> None:
        """The KV pool exists (before graph capture): allocate the device state beside it and
        wrap ``model.forward``.

        Raises:
            CanaryUnsupportedError: the pools are not ones the canary supports.
            RuntimeError: the canary is already installed on this runner.
        """
        if self.state is not None:
            raise RuntimeError("KV canary: already installed on this ModelRunner")
        model_runner = self._model_runner
        req_to_token_pool = model_runner.req_to_token_pool
        kv_pool = model_runner.token_to_kv_pool
        refuse_unless_supported(
            unsupported_pools(req_to_token_pool=req_to_token_pool, token_to_kv_pool=kv_pool)
        )
        config = self.config
        self.state = allocate_device_state(
            config=config, req_to_token_pool=req_to_token_pool, kv_pool=kv_pool
        )
        rows, columns = req_to_token_pool.req_to_token.shape
        if config.token_history_enabled:
            self.token_history = TokenHistory(
                num_rows=rows, max_context_len=columns, device=self._device,
                scatter=self._kernels.scatter_req_token_ids,
            )
        pin_memory = self._device.type == "cuda"
        self._upload_buffers = UploadBufferRing(
            slots=UPLOAD_BUFFER_SLOTS, words=UPLOAD_BUFFER_WORDS, pin_memory=pin_memory,
        )
        self.request_rows = RequestRows(
            num_rows=rows, token_history=self.token_history is not None, owner_chains=True,
            pin_memory=pin_memory, history_offset=1 if self._is_draft else 0,
            upload_buffers=self._upload_buffers,
        )
        server_args = model_runner.server_args
        if server_args.speculative_algorithm is not None:
            self._blocks = UniformBlocks(
                rows=uniform_block_rows(
                    request_rows=rows, graph_max_bs=graph_max_bs_bound(server_args)
                ),
                blocks=(1, server_args.speculative_num_draft_tokens),
                device=self._device,
            )
        if self._is_draft:
            with torch.inference_mode(False):
                self._draft_decode_state = dataclasses.replace(
                    self.state, owner_chains=torch.zeros_like(self.state.owner_chains)
                )
        # One persistent upload area, read by captured graphs at fixed addresses: its header
        # (the unit-append count of the token-history append) and then the seq_lens mirror. An
        # upload starts with its header and the seq_lens of its rows, so copying the packed
        # upload to the start of the area refreshes both with no copy of their own.
        mirror_rows = seq_lens_mirror_rows(model_runner.server_args, request_rows=rows)
        with torch.inference_mode(False):
            self._staging = torch.zeros(
                (UPLOAD_HEADER_WORDS + mirror_rows + UPLOAD_STAGING_WORDS,), dtype=torch.int64,
                device=self._device,
            )
        self._host_seq_lens = self._staging[UPLOAD_HEADER_WORDS : UPLOAD_HEADER_WORDS + mirror_rows]
        if config.enable_write_input_assert and not self._is_draft:
            # (an EAGLE draft model's inputs are the next position's tokens or guesses: the
            # assert checks the target's forwards, whose inputs are the committed tokens)
            if self.oracle is None:
                raise RuntimeError(
                    "KV canary: SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1 compares inputs with "
                    "the token oracle, but no oracle is installed on this ModelRunner"
                )
            self.write_expectations = WriteExpectations(
                oracle=self.oracle,
                capacity=max_tokens_per_forward(
                    model_runner.server_args,
                    max_running_requests=model_runner.max_running_requests,
                ),
                device=self._device,
            )
        install_model_forward(model=model_runner.model, runner=self)
        self.monitor = CanaryMonitor(
            state=self.state, config=config, seal=self._kernels.publish_counters,
            line_suffix=DRAFT_LINE_SUFFIX if self._is_draft else "",
        )
        # faults are injected into the target model's forwards (the draft canary checks its
        # own pool and reports with DRAFT_LINE_SUFFIX)
        self._injector = None if self._is_draft else build_fault_injector(
            config=config.perturb,
            state=self.state,
            kv_pool=kv_pool,
            vocab_size=model_runner.model_config.vocab_size,
        )
        logger.info(self._installed_line())

    def on_capture_start(self, *, graph_runner: Any) -> None:
        """Before a decode graph (re)capture: its eager warm-up runs see padding rows only (a
        re-capture would otherwise run the canary on the stale rows of the last replay), and
        the upload area holds no unit append for them to apply."""
        graph_runner.buffers.req_pool_indices.zero_()
        graph_runner.buffers.out_cache_loc.zero_()
        if self._staging is not None:
            self._staging[:UPLOAD_HEADER_WORDS].zero_()

    def capture_decode_graph(
        self,
        *,
        graph_runner: Any,
        bs: int,
        capture: Callable[[Callable[..., Any]], _T],
        forward: Callable[..., Any],
    ) -> _T:
        """Capture one decode graph of ``bs`` rows: the captured forward reads graph-resident
        request ids (oracle on), a DECODE graph also computes its rows' next oracle tokens into
        the graph-resident ``next_tokens`` (the sampler takes them, see
        :mod:`..token_oracle.graph_tokens`); canary on, the graph publishes the counters after
        the forward (:meth:`CanaryMonitor.publish`, so a replay needs no host work for them), and
        the canary launches and publications captured into it are counted."""
        buffers = self._graph_ids_for(graph_runner) if self.oracle is not None else None

        @functools.wraps(forward)  # keeps inspect.signature(forward), which the runner inspects
        def forward_with_request_ids(
            input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
            **forward_kwargs: Any,
        ) -> Any:
            if buffers is not None:
                self._attach_capture_ids(forward_batch=forward_batch, buffers=buffers)
                if _samples_decode_tokens(forward_batch):
                    rids_int, rooms = buffers.capture_views(bs)
                    self.oracle.write_next_tokens_by_request(
                        rids_int=rids_int, bootstrap_room_ids_int=rooms,
                        logits_positions=positions[:bs], tokens_out=buffers.next_tokens[:bs],
                    )
                    self._token_graph_runners.add(id(graph_runner))
            result = forward(input_ids, positions, forward_batch, **forward_kwargs)
            if self.monitor is not None:
                self._publish_counters()
            return result

        self._launches_in_capture = 0
        self._publications_in_capture = 0
        try:
            result = capture(forward_with_request_ids)
            self._captured_launches[(id(graph_runner), bs)] = self._launches_in_capture
            self._captured_publications[(id(graph_runner), bs)] = self._publications_in_capture
        finally:
            self._launches_in_capture = None
            self._publications_in_capture = None
        return result

    def capture_draft_graph(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Capture one EAGLE draft graph (the draft decode steps). Oracle on: its captured
        function calls ``eagle_worker.draft_forward`` (not the forward it is given), so that
        method is shadowed on the worker instance for the duration of the capture to attach the
        graph-resident request ids. Canary on: the canary launches captured into it are counted
        (every replay enqueues them), and the ``ModelRunner.forward`` calls of the warm-up and
        capture runs pass the canary's host work by (they run start-up rows only)."""
        buffers = self._graph_ids_for(graph_runner) if self.oracle is not None else None
        worker = graph_runner.eagle_worker
        draft_forward = worker.draft_forward
        missing = object()
        shadowed = vars(worker).get("draft_forward", missing)

        def draft_forward_with_request_ids(forward_batch: Any) -> Any:
            self._attach_capture_ids(forward_batch=forward_batch, buffers=buffers)
            return draft_forward(forward_batch)

        if buffers is not None:
            worker.draft_forward = draft_forward_with_request_ids
        self._in_draft_capture = True
        try:
            return self._capture_counting_launches(graph_runner=graph_runner, capture=capture)
        finally:
            self._in_draft_capture = False
            if buffers is not None:
                if shadowed is missing:
                    del worker.draft_forward
                else:
                    worker.draft_forward = shadowed

    def capture_draft_extend_graph(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Capture one EAGLE draft-extend graph; the canary launches captured into it are
        counted (its warm-up runs call ``model.forward`` directly and count as eager)."""
        return self._capture_counting_launches(graph_runner=graph_runner, capture=capture)

    def _capture_counting_launches(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Run one capture of an EAGLE graph runner, counting the canary launches captured into
        it (every replay enqueues them); every capture size must capture the same launches."""
        self._launches_in_capture = 0
        try:
            result = capture()
            launches = self._launches_in_capture
        finally:
            self._launches_in_capture = None
        known = self._draft_graph_launches.setdefault(id(graph_runner), launches)
        if known != launches:
            raise CanaryHealthError(
                f"KV canary: {type(graph_runner).__name__} captured {launches} canary launches "
                f"for one batch size but {known} for another"
            )
        return result

    def on_serving_start(self) -> None:
        """Start-up is over (warm-up runs, graph capture): zero the device counters, so step
        numbers and stats count serving forwards only. Synchronizes once, at start-up."""
        self._serving = True
        if self.state is None:
            return
        self.state.counters.zero_()
        self.state.owner_chains.zero_()
        self._staging[:UPLOAD_HEADER_WORDS].zero_()  # no start-up append is replayed
        self._pending_unit_append = 0
        self._launches = 0
        self._sweep_launches = 0
        self._publications = 0
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        self.monitor.discard_pending()
        # publication numbers agree from here on: they tell when a buffer's copy completed
        self._upload_buffers.open(landed=self.monitor.landed_publications)
        owned = self.device_bytes()
        reserved = self.fixed_buffers(page_size=self._model_runner.token_to_kv_pool.page_size)
        fixed = sum(owned.values()) - owned["records"]
        logger.info(
            f"KV canary device memory: {sum(owned.values())} B allocated = records "
            f"{owned['records']} B ({RECORD_BYTES} B per slot, taken from the KV cell size) + "
            f"fixed buffers {fixed} B (reserved {reserved.total} B: "
            + ", ".join(f"{name} {value}" for name, value in owned.items() if name != "records")
            + ")"
        )
        if fixed > reserved.total:
            logger.warning(
                f"KV canary: the fixed buffers ({fixed} B) exceed the {reserved.total} B reserved "
                "from the KV budget; the server may run out of memory under load"
            )

    # ================================================================= per batch (host)

    def on_init_new(self, *, forward_batch: ForwardBatch, worker_batch: Any) -> None:
        """``ForwardBatch.init_new`` returned: attach the per-batch carrier. Host work and one
        small non-blocking copy; never syncs.

        Raises:
            ValueError: ``worker_batch.reqs`` does not have one request per row, or a request
                has no ``req_pool_idx``.
        """
        reqs = worker_batch.reqs
        rows = forward_batch.batch_size
        if reqs is None or len(reqs) != rows:
            count = "no" if reqs is None else len(reqs)
            raise ValueError(
                f"KV canary: the batch has {rows} rows but {count} requests "
                "(ModelWorkerBatch.reqs); the canary needs one request per row"
            )
        kind = forward_kind(forward_batch) if self.request_rows is not None else None
        rids_int = rooms = sampled_rows = None
        if self.config.enable_token_oracle:
            rids_int, rooms = self._batch_ids.tensors_for_requests(reqs)
            if self._logs_sampled_rows and forward_batch.sampling_info is not None:
                sampled_rows = SampledRows(
                    rids=forward_batch.rids, next_positions=worker_batch.seq_lens_cpu
                )
        row_updates: RowUpdates | None = None
        if kind is not None and rows > 0:
            row_updates = self.request_rows.prepare(
                reqs=reqs,
                prefix_lens=functools.partial(host_prefix_lens, forward_batch),
                seq_lens=forward_batch.seq_lens_cpu.tolist(),
                # EXTEND / MIXED forwards run eagerly: their post launch comes after the model
                # is enqueued, so new owners' tokens are read while the device runs the model
                # (and, write-input assert on, the expectations built: launch_after_model)
                defer_new_owners=kind is ForwardKind.EXTEND,
            )
        inputs = CanaryBatchInputs(
            runner=self,
            rids_int=rids_int,
            bootstrap_room_ids_int=rooms,
            row_updates=row_updates,
            sampled_rows=sampled_rows,
            extend_reqs=reqs
            if self.write_expectations is not None and expectations_built_on_host(forward_batch)
            else None,
        )
        attach_batch_inputs(forward_batch, inputs)
        if forward_batch.sampling_info is not None:
            attach_sampling_inputs(forward_batch.sampling_info, inputs)

    def on_pad_inputs(self, *, forward_batch: ForwardBatch, bs: int) -> None:
        """DP-attention / attention-TP padding: pad the request ids to ``bs`` rows with 0 / -1
        and keep ``sampling_info`` in sync. A batch without a carrier (a two-batch-overlap
        child, whose ``sampling_info`` is its parent's) is left alone.

        Raises:
            ValueError: the batch has more id rows than ``bs``.
        """
        inputs = batch_inputs_of(forward_batch)
        if inputs is None or inputs.rids_int is None:
            return
        rows = inputs.rids_int.shape[0]
        if rows == bs:
            return
        if rows > bs:
            raise ValueError(f"KV canary request ids: cannot pad {rows} id rows down to {bs}")
        rids = inputs.rids_int
        rooms = inputs.bootstrap_room_ids_int
        padded = inputs.replace(
            rids_int=torch.cat([rids, rids.new_full((bs - rows,), RID_PAD_VALUE)]),
            bootstrap_room_ids_int=torch.cat([rooms, rooms.new_full((bs - rows,), ROOM_PAD_VALUE)]),
        )
        attach_batch_inputs(forward_batch, padded)
        if forward_batch.sampling_info is not None:
            attach_sampling_inputs(forward_batch.sampling_info, padded)

    def run_forward(self, *, forward_batch: ForwardBatch, forward: Callable[[], _T]) -> _T:
        """One ``ModelRunner.forward`` under the canary's host-side work, outside any graph:
        report earlier forwards' violations, upload this batch's row updates (token history),
        inject faults, run the forward, undo the faults, check the launch count, publish the
        counters (an eager forward; a replayed decode graph published them itself), the radix
        sweep (publishing again when it launched), periodic health and stats.

        Raises:
            UnsupportedForwardModeError: the batch's mode is not checked by the canary.
            CanaryViolationError: raise mode, and an earlier forward produced violation rows.
            CanaryHealthError: this forward did not run the canary exactly once, or the periodic
                device check failed (any mode).
            RuntimeError: a live batch carries no carrier although the canary needs one.
        """
        if self._in_draft_capture:  # EAGLE draft graph warm-up / capture: start-up rows only
            return forward()
        monitor = self.monitor
        monitor.poll()
        kind = forward_kind(forward_batch)
        live = kind is not None and forward_batch.batch_size > 0
        if live:
            self._upload(forward_batch)
        faults = (
            self._injector.before_forward(forward_batch=forward_batch, step=self._steps)
            if live and self._injector is not None
            else []
        )
        launches_before = self._launches
        publications_before = self._publications
        try:
            result = forward()
        finally:
            for fault in reversed(faults):
                fault.undo()
        if live and kind is ForwardKind.DRAFT_EXTEND:  # an eager EAGLE draft extend
            self._draft_extend_done(
                forward_batch, accept_lens=forward_batch.spec_info.num_accept_tokens
            )
        ran = self._launches - launches_before
        if ran > 1 or (live and ran != 1):
            raise CanaryHealthError(
                f"KV canary health check failed: canary path is not executing as it must: "
                f"forward step {self._steps} ({forward_batch.forward_mode.name}, "
                f"{forward_batch.batch_size} rows) ran the canary launches {ran} times, "
                f"expected {int(live)}. Corruption would go unreported."
            )
        if live and self._publications == publications_before:
            self._publish_counters()
        if live:
            if self._injector is not None:
                self._injector.after_forward(forward_batch=forward_batch, step=self._steps)
            self._steps += 1
            sweep_launches = self._sweep_launches
            self._sweep_after_forward()
            if self._sweep_launches != sweep_launches:  # publish what the sweep found, too
                self._publish_counters()
        monitor.after_forward(
            steps=self._steps, launches=self._launches, sweep_launches=self._sweep_launches,
            publications=self._publications,
        )
        return result

    def on_decode_replay(self, *, graph_runner: Any, forward_batch: ForwardBatch) -> None:
        """A decode / target-verify graph's replay is prepared: refresh its request ids and
        offer a decode graph's next tokens to the sampler of this batch (oracle on)."""
        if self.oracle is not None:
            self._fill_graph_ids(graph_runner=graph_runner, forward_batch=forward_batch)
            sampling_info = getattr(forward_batch, "sampling_info", None)
            if id(graph_runner) in self._token_graph_runners and sampling_info is not None:
                self.graph_tokens.offer(sampling_info=sampling_info,
                                        tokens=self._graph_ids[id(graph_runner)].next_tokens)
            else:
                self.graph_tokens.withdraw()

    def on_graph_replay(self, *, graph_runner: Any) -> None:
        """A decode / target-verify graph was replayed: count the canary launches and counter
        publications captured into it (not at ``replay_prepare``: EAGLE prepares the verify
        graph before ``ModelRunner.forward``)."""
        self._pending_unit_append = 0  # the replay applied it
        if self._serving:
            key = (id(graph_runner), graph_runner.bs)
            self._launches += self._captured_launches.get(key, 0)
            self._publications += self._captured_publications.get(key, 0)

    def replay_draft(
        self, *, graph_runner: Any, forward_batch: ForwardBatch, replay: Callable[[], _T]
    ) -> _T:
        """Replay an EAGLE draft graph (the draft decode steps): refresh its request ids first
        (oracle on); canary on: upload the batch's row updates, replay, count the launches
        captured into it (no ``ModelRunner.forward`` runs for a replayed draft pass)."""
        if self.oracle is not None:
            self._fill_graph_ids(graph_runner=graph_runner, forward_batch=forward_batch)
        if self.state is None:
            return replay()
        return self._replay_speculative(
            graph_runner=graph_runner, forward_batch=forward_batch, replay=replay
        )

    def replay_draft_extend(
        self, *, graph_runner: Any, forward_batch: ForwardBatch, replay: Callable[[], _T]
    ) -> _T:
        """Replay an EAGLE draft-extend graph: point its padded rows at pool row 0 first (unless
        the padded-row bug is re-injected: SGLang 0.5.12 leaves stale rows there), upload the
        batch's row updates and count the launches captured into it; after the replay, the
        owner chains follow the accepted tokens."""
        if not self.config.reinject_padded_row_bug:
            buffers = graph_runner.buffers
            point_padded_rows_at_row_zero(
                buffers=buffers, raw_bs=forward_batch.batch_size,
                bs=buffers.req_pool_indices.shape[0],
            )
        # (read before the replay: a padded replay points spec_info at its padded buffers)
        accept_lens = forward_batch.spec_info.num_accept_tokens

        def replay_and_resync() -> _T:
            result = replay()
            self._draft_extend_done(forward_batch, accept_lens=accept_lens)
            return result

        return self._replay_speculative(
            graph_runner=graph_runner, forward_batch=forward_batch, replay=replay_and_resync
        )

    def _draft_extend_done(self, forward_batch: ForwardBatch, *, accept_lens: torch.Tensor) -> None:
        """A DRAFT_EXTEND_V2 forward was enqueued: keep the accepted tokens' owner chains."""
        rows = forward_batch.req_pool_indices.shape[0]
        if rows == 0:
            return
        self.on_tokens_accepted(
            req_pool_indices=forward_batch.req_pool_indices,
            out_cache_loc=forward_batch.out_cache_loc,
            accept_lens=accept_lens[:rows],
            block=speculative_block(forward_batch),
        )

    def _replay_speculative(
        self, *, graph_runner: Any, forward_batch: ForwardBatch, replay: Callable[[], _T]
    ) -> _T:
        """The host work of one replayed EAGLE graph, as :meth:`run_forward` does for an eager
        forward: report, upload, replay, count its launches, publish the counters (after the
        replay, so the publication counts its launches; these graphs capture none)."""
        self.monitor.poll()
        if forward_batch.batch_size > 0:
            self._upload(forward_batch)
        result = replay()
        self._pending_unit_append = 0  # the replay applied it
        self._launches += self._draft_graph_launches.get(id(graph_runner), 0)
        self._publish_counters()
        self._steps += 1
        self.monitor.after_forward(
            steps=self._steps, launches=self._launches, sweep_launches=self._sweep_launches,
            publications=self._publications,
        )
        return result

    def on_draft_pass_start(self) -> None:
        """An EAGLE draft pass (the draft decode steps) starts: its steps' owner chains start
        unknown (each step's pre launch adopts the record's chain, the next step checks it)."""
        if self._draft_decode_state is not None:
            self._draft_decode_state.owner_chains.zero_()

    def on_tokens_accepted(
        self,
        *,
        req_pool_indices: torch.Tensor,
        out_cache_loc: torch.Tensor,
        accept_lens: torch.Tensor,
        block: int,
    ) -> None:
        """An EAGLE verification kept ``accept_lens[b]`` of the ``block`` tokens row ``b``
        wrote at ``out_cache_loc`` (target verify, then the draft extend of the same slots):
        set each row's owner chain after its kept tokens (device only, no host sync)."""
        if self.state is None or req_pool_indices.shape[0] == 0:
            return
        self._kernels.accepted_owner_resync(
            state=self.state, req_pool_indices=req_pool_indices, out_cache_loc=out_cache_loc,
            accept_lens=accept_lens, block=block,
        )

    def attach_radix_cache(self, tree_cache: Any) -> None:
        """The scheduler built its prefix cache: with the sweep on, walk it.

        Raises:
            CanaryUnsupportedError: the sweep is on but the cache is not SGLang's RadixCache.
        """
        if self.config.sweep_interval == 0 or self.state is None:
            return
        reason = unsupported_sweep_cache(tree_cache)
        if reason is not None:
            raise CanaryUnsupportedError([reason])
        self._sweep = RadixSweep(
            tree_cache=tree_cache, state=self.state, launch=self._kernels.sweep,
            interval=self.config.sweep_interval,
        )

    def _publish_counters(self) -> None:
        """Publish the counters (:meth:`CanaryMonitor.publish`) and count the publication:
        into the graph being captured, or as enqueued."""
        self.monitor.publish()
        if _capturing(self._device):
            if self._publications_in_capture is not None:
                self._publications_in_capture += 1
        else:
            self._publications += 1

    def _sweep_after_forward(self) -> None:
        sweep = self._sweep
        if sweep is None:
            return
        if sweep.pass_starts_at(self._steps) and self._injector is not None:
            self._injector.before_sweep_pass(tree_cache=sweep.tree_cache, step=self._steps)
        before = sweep.launches
        sweep.after_forward(step=self._steps)
        self._sweep_launches += sweep.launches - before

    def on_idle(self) -> None:
        """The scheduler is idle: report the last forwards' violations now (paced: see
        :meth:`CanaryMonitor.poll_idle`)."""
        if self.monitor is not None:
            self.monitor.poll_idle()

    # ================================================================= in the forward (graphs)

    def launch_before_model(self, forward_batch: ForwardBatch) -> CanaryBatchView | None:
        """Build the batch view and launch the pre-forward kernel; None for IDLE (nothing to
        check). Inside captured graphs: views and fixed shapes only, no host sync.

        Raises:
            UnsupportedForwardModeError: a mode the canary does not check.
        """
        kind = forward_kind(forward_batch)
        if kind is None:
            return None
        capturing = _capturing(self._device)
        if self.token_history is not None:
            self._append_history(rows=forward_batch.batch_size, capturing=capturing)
        view = build_batch_view(
            forward_batch, kind=kind, checks=self._token_check_fields(forward_batch),
            host_seq_lens=self._host_seq_lens, blocks=self._blocks,
        )
        self._kernels.pre_forward(state=self._state_for(kind), batch=view)
        if capturing:
            if self._launches_in_capture is not None:
                self._launches_in_capture += 1
        else:
            self._launches += 1
        return view

    def _append_history(self, *, rows: int, capturing: bool) -> None:
        """The token-history append of the last upload's unit append, before the pre launch:
        captured into a graph of ``rows`` rows (every replay applies its own upload's, or
        nothing), or launched eagerly when the last upload has one pending."""
        if capturing:
            max_rows = rows
        else:
            max_rows, self._pending_unit_append = self._pending_unit_append, 0
            if max_rows == 0:
                return
        self._kernels.append_history_tokens(
            upload=self._staging, max_rows=max_rows, pool_out=self.token_history.tokens,
            history_lens_out=self.token_history.lens,
        )

    def launch_after_model(self, view: CanaryBatchView, *, forward_batch: ForwardBatch) -> None:
        """The model forward is enqueued: send the admissions deferred by this batch's
        :meth:`on_init_new` and, write-input assert on, an EXTEND / MIXED batch's expectations
        (eager forwards only; the host reads the requests' tokens while the device runs the
        model), then launch the post-forward kernel on the view the pre launch used (with those
        expectations: the post launch checks an EXTEND layout's written inputs)."""
        if not _capturing(self._device):
            inputs = batch_inputs_of(forward_batch)
            updates = None if inputs is None else inputs.row_updates
            admitted = None
            if updates is not None and updates.deferred:
                admitted = self.request_rows.prepare_deferred(updates.deferred)
                self._apply_row_updates(admitted)
            if self._expects_on_host(forward_batch, inputs=inputs):
                tokens, positions = self.write_expectations.compute(
                    forward_batch=forward_batch,
                    extend_expectations=self._extend_expectations(
                        forward_batch=forward_batch, admitted=admitted
                    ),
                )
                view = view.with_expected_inputs(
                    expected_input_ids=tokens, expected_positions=positions
                )
        self._kernels.post_forward(state=self._state_for(forward_kind(forward_batch)), batch=view)

    def _state_for(self, kind: ForwardKind | None) -> CanaryDeviceState:
        """The device state a forward of ``kind`` checks (EAGLE draft decode steps advance
        scratch owner chains)."""
        if kind is ForwardKind.DRAFT_DECODE and self._draft_decode_state is not None:
            return self._draft_decode_state
        return self.state

    # ================================================================= oracle

    def make_sampler(self) -> OracleSampler:
        """The ``token_oracle`` sampler of this runner (SGLang's ``create_sampler()`` calls it)."""
        return OracleSampler(
            manager=self.oracle,
            next_token_swap=NextTokenSwapState.from_config(self.config.perturb),
            graph_tokens=self.graph_tokens,
        )

    def sample_eagle_verify(
        self, *, batch: Any, logits_output: Any, verify_input: Any, sample: Callable[[], _T]
    ) -> _T:
        """EAGLE v2 verification: with the oracle it picks the oracle's tokens (see
        :mod:`..token_oracle.eagle_verify`); with the canary the target's owner chains then
        follow the accepted tokens (``sample`` returns ``(predict, accept_lens,
        accept_index)``)."""
        if self.oracle is None:
            result = sample()
        else:
            result = sample_verify_with_oracle(
                manager=self.oracle,
                batch=batch,
                logits_output=logits_output,
                draft_token_num=verify_input.draft_token_num,
                verify_positions=verify_input.positions,
                sample=sample,
            )
        if self.state is not None and not batch.forward_mode.is_idle():
            self.on_tokens_accepted(
                req_pool_indices=batch.req_pool_indices, out_cache_loc=batch.out_cache_loc,
                accept_lens=result[1], block=verify_input.draft_token_num,
            )
        return result

    # ================================================================= internals

    def _upload(self, forward_batch: ForwardBatch) -> None:
        """Copy the batch's row updates to the device and apply them (outside graphs, on the
        forward's stream, before the eager forward or the replay reads them)."""
        if self.request_rows is None:
            return
        updates = carried_field(
            forward_batch, "row_updates", what="request-row updates",
            consequence=" (the token history would be stale)",
        )
        if updates is self._last_upload:  # an eager EAGLE draft pass: one batch, several steps
            return
        self._last_upload = updates
        self._apply_row_updates(updates)

    def _apply_row_updates(self, updates: RowUpdates) -> None:
        """One host-to-device copy of ``updates.packed``, then its sections applied (token-history
        scatter, owner chains, admission checks), all on the current stream, and the
        bookkeeping committed.

        The copy lands at the start of the persistent upload area, so its header and seq_lens
        section are what the captured graphs read. The sections of a layout (its segment sizes)
        are cut once and reused whenever the layout comes again: the decode steps of one batch,
        and the few layouts batch-1 requests alternate between (a prefill's, its first decode
        step's), up to :data:`STAGED_LAYOUTS` of them. An upload larger than the area goes to a
        buffer of its own, and its header and seq_lens to the area's head (the mirror has a row
        for every request row, so it holds any batch's).

        A unit append (``updates.unit_append``: one token per row) is not scattered here: the
        pre launch's append applies it, from a captured graph or eagerly
        (:meth:`launch_before_model`); an upload whose history changed nothing
        (``updates.history_unchanged``) launches no scatter.
        """
        key = (updates.segment_sizes, updates.has_history, updates.has_owners,
               updates.has_admissions)
        staged = self._staged.get(key)
        if staged is not None:
            target, sections = staged
            in_area = True
        else:
            words = updates.packed.shape[0]
            in_area = words <= self._staging.shape[0]
            if in_area:
                target = self._staging[:words]
                sections = updates.sections_on(target)
                if len(self._staged) >= STAGED_LAYOUTS:
                    del self._staged[next(iter(self._staged))]  # the oldest
                self._staged[key] = (target, sections)
            else:
                target = torch.empty((words,), dtype=torch.int64, device=self._device)
                sections = updates.sections_on(target)
        if updates.upload_buffer is None:
            target.copy_(updates.packed, non_blocking=True)
        else:  # this forward's publication follows the copy on this stream
            self._upload_buffers.copy(
                updates.upload_buffer, to=target, mark=self._publications + 1
            )
        _, history, owners, admissions = sections
        rows = updates.segment_sizes[1]  # the seq_lens section's: one word per batch row
        if not in_area:  # (a batch never outnumbers the mirror's rows)
            head = UPLOAD_HEADER_WORDS + rows
            self._staging[:head].copy_(target[:head])
        if history is not None:
            if updates.unit_append:
                self._pending_unit_append = rows
            else:
                self._pending_unit_append = 0
                if not updates.history_unchanged:
                    self.token_history.upload(history)
        if updates.owner_rows > 0:
            self.state.owner_chains.index_copy_(0, owners.rows, owners.values)
        if updates.admission_rows > 0:
            self._kernels.admission_owner_check(
                state=self.state, req_pool_indices=admissions.rows,
                prefix_lens=admissions.prefix_lens, chains=admissions.chains,
            )
        self.request_rows.commit(updates)

    def _extend_expectations(
        self, *, forward_batch: ForwardBatch, admitted: RowUpdates | None
    ) -> torch.Tensor:
        """Device int64 ``[2, num_tokens]``: the write-input assert's expected token and
        position of every token of an EXTEND / MIXED batch, built on the host
        (:func:`extend_expectations_on_host`; the prompt tokens of a row whose whole history
        ``admitted``, the deferred admissions just sent, read come from that array) and sent
        with one non-blocking copy. Called after the model is enqueued: the post launch
        compares the prompt tokens with these."""
        reqs = carried_field(
            forward_batch, "extend_reqs", what="requests for the write-input assert's "
            "expectations of its EXTEND/MIXED forward",
        )
        read = dict(admitted.read_whole) if admitted is not None else {}
        pin = self._device.type == "cuda"
        host = extend_expectations_on_host(
            reqs=reqs,
            prefix_lens=forward_batch.extend_prefix_lens_cpu,
            extend_lens=forward_batch.extend_seq_lens_cpu,
            num_tokens=forward_batch.input_ids.shape[0],
            oracle=self.oracle.oracle,
            pin_memory=pin,
            prompt_sources=[read.get(req.req_pool_idx, req.origin_input_ids) for req in reqs]
            if read else None,
        )
        return host.to(self._device, non_blocking=pin)

    def _expects_on_host(
        self, forward_batch: ForwardBatch, *, inputs: CanaryBatchInputs | None
    ) -> bool:
        """Whether this eager forward's write-input expectations are built on the host (an
        EXTEND / MIXED batch, write-input assert on) and so go to the post launch only."""
        if self.write_expectations is None or not expectations_built_on_host(forward_batch):
            return False
        if not write_input_assert_applies(forward_batch):
            return False
        return not self._start_up_forward(inputs)

    def _start_up_forward(self, inputs: CanaryBatchInputs | None) -> bool:
        """One of SGLang's own start-up forwards (``ModelRunner._dummy_run`` for kernel
        autotuning), built without ``init_new``: no requests, no request ids, padding rows only;
        no write-input expectations exist for it."""
        return (inputs is None or inputs.rids_int is None) and not self._serving and not (
            _capturing(self._device)
        )

    def _token_check_fields(self, forward_batch: ForwardBatch) -> dict[str, Any]:
        """The token-check fields of the pre launch's batch view (history; the write-input
        expectations the forward computes on the device: an EXTEND / MIXED batch's are built
        on the host while the model runs, :meth:`launch_after_model`)."""
        if self.token_history is None:
            return {}
        fields: dict[str, Any] = {
            "token_history": self.token_history.tokens,
            "token_history_lens": self.token_history.lens,
            "verify_token": self.config.enable_verify_token_assert,
        }
        if self.write_expectations is None or not write_input_assert_applies(forward_batch):
            return fields
        if expectations_built_on_host(forward_batch):
            return fields
        if self._start_up_forward(batch_inputs_of(forward_batch)):
            return fields
        tokens, positions = self.write_expectations.compute(forward_batch=forward_batch)
        fields["expected_input_ids"] = tokens
        fields["expected_positions"] = positions
        return fields

    def _graph_ids_for(self, graph_runner: Any) -> GraphRequestIdBuffers:
        buffers = self._graph_ids.get(id(graph_runner))
        if buffers is None:
            buffers = GraphRequestIdBuffers.allocate(max_bs=graph_runner.max_bs,
                                                     device=self._device)
            self._graph_ids[id(graph_runner)] = buffers
        return buffers

    def _attach_capture_ids(self, *, forward_batch: Any, buffers: GraphRequestIdBuffers) -> None:
        rids_int, rooms = buffers.capture_views(forward_batch.batch_size)
        inputs = batch_inputs_of(forward_batch) or CanaryBatchInputs(runner=self)
        attach_batch_inputs(
            forward_batch, inputs.replace(rids_int=rids_int, bootstrap_room_ids_int=rooms)
        )

    def _fill_graph_ids(self, *, graph_runner: Any, forward_batch: ForwardBatch) -> None:
        buffers = self._graph_ids.get(id(graph_runner))
        if buffers is None:
            raise RuntimeError(
                f"KV canary request ids: {type(graph_runner).__name__} replays a graph that was "
                "captured without the request-id buffers (its capture did not go through the "
                "hooked capture_one_batch_size)"
            )
        rids_int, rooms = request_ids_of(forward_batch)  # MissingRequestIdsError names the knob
        if rids_int.shape[0] != forward_batch.batch_size:
            raise ValueError(
                f"KV canary request ids: {rids_int.shape[0]} ids for a replayed batch of "
                f"{forward_batch.batch_size} rows"
            )
        # Only fill writes the buffers, and the id tensors are never written (BatchRequestIds
        # reuses them while a batch keeps its requests): the same tensors, the same contents.
        source = self._graph_ids_source.get(id(graph_runner))
        if source is not None and source[0] is rids_int and source[1] is rooms:
            return
        buffers.fill(rids_int=rids_int, bootstrap_room_ids_int=rooms)
        self._graph_ids_source[id(graph_runner)] = (rids_int, rooms)

    def _installed_line(self) -> str:
        state = self.state
        buffers = self.fixed_buffers(page_size=self._model_runner.token_to_kv_pool.page_size)
        real_data = "off"
        if state.real_data is not None:
            layers = fingerprinted_layers(self._model_runner.token_to_kv_pool)
            real_data = (
                f"{self.config.real_data.value} (K and V of layer"
                f"{'s' if len(layers) > 1 else ''} {' and '.join(map(str, layers))}, "
                f"{len(state.real_data.sources)} rows per slot)"
            )
        token_checks = "token checks off"
        if self.token_history is not None:
            tokens = self.token_history.tokens
            write_input = (
                f"on (oracle; {self.write_expectations.capacity} tokens preallocated)"
                if self.write_expectations is not None
                else "off (EAGLE draft model: the target's forwards are asserted)"
                if self._is_draft and self.config.enable_write_input_assert
                else "off"
            )
            token_checks = (
                f"token checks: verify_token "
                f"{'on' if self.config.enable_verify_token_assert else 'off'}, "
                f"write_input_assert {write_input}, token history {tokens.shape[0]} rows x "
                f"{tokens.shape[1]}"
            )
        pool = (
            " on the EAGLE draft model's pool (slot p holds the token at p + 1; its lines end "
            f"with '{DRAFT_LINE_SUFFIX.strip()}')" if self._is_draft else ""
        )
        return (
            f"KV canary installed{pool}: records {RECORD_BYTES} B/slot x {state.num_slots} slots = "
            f"{state.num_slots * RECORD_BYTES / 2**20:.2f} MiB, violation ring "
            f"{state.ring_capacity} rows, real data {real_data}, {token_checks}, "
            f"kernels {self._kernels.backend.value}, device {state.device}; memory from the KV "
            f"budget: {per_token_bytes()} B/token added to the KV cell size, fixed buffers "
            f"reserved {buffers.describe()}"
        )


def _log_oracle(*, oracle: TokenOracleManager, server_args: Any, perturb: PerturbConfig) -> None:
    swap = (
        f"next_token_swap p={perturb.next_token_swap_prob:g} after "
        f"{perturb.warmup_steps} sampler calls, seed {perturb.seed}"
        if perturb.next_token_swap_prob > 0
        else "no next_token_swap"
    )
    logger.info(
        f"KV canary token oracle: sampling backend {TOKEN_ORACLE_BACKEND}, "
        f"vocab_size={oracle.oracle.vocab_size}, {swap}"
    )
    if server_args.speculative_algorithm in _EAGLE_ALGORITHMS and server_args.disable_overlap_schedule:
        logger.warning(
            "KV canary token oracle: speculative decoding runs the v1 EAGLE worker (overlap "
            "schedule off); its verify step picks tokens from the target logits, so only each "
            "request's first output token (sampled at prefill) follows the oracle. Spec v2 (the "
            "default, overlap on, topk 1) follows the oracle for every token"
        )


# ===================================================================== finding the owner


def create_canary_runner(model_runner: Any) -> CanaryRunner:
    """At ``ModelRunner.initialize``: check every hook the configuration needs is in place,
    create the runner's canary (Triton kernels), set it on the runner, refuse unsupported flags
    and install the oracle.

    Raises:
        HookRegistrationError: a hook the configuration needs is not in place.
        RuntimeError: the runner already has a canary.
        CanaryUnsupportedError / TokenOracleSetupError: see the methods called.
    """
    config = get_active_config()
    verify_hooks_applied(config)
    runner = attach_canary_runner(
        model_runner=model_runner,
        runner=CanaryRunner(
            config=config, model_runner=model_runner, kernels=load_kernels(KernelBackend.TRITON)
        ),
    )
    runner.refuse_unsupported_flags()
    runner.install_oracle()
    return runner


def attach_canary_runner(*, model_runner: Any, runner: CanaryRunner) -> CanaryRunner:
    """Set ``runner`` on ``model_runner`` (where the hooks find it).

    Raises:
        RuntimeError: the model runner already has a canary.
    """
    if getattr(model_runner, RUNNER_ATTRIBUTE, None) is not None:
        raise RuntimeError("KV canary: this ModelRunner already has a canary")
    setattr(model_runner, RUNNER_ATTRIBUTE, runner)
    return runner


def runner_of(model_runner: Any) -> CanaryRunner:
    """The canary :func:`create_canary_runner` set on ``model_runner``.

    Raises:
        RuntimeError: none is set (the ``ModelRunner.initialize`` hook did not run for it).
    """
    runner = getattr(model_runner, RUNNER_ATTRIBUTE, None)
    if not isinstance(runner, CanaryRunner):
        raise RuntimeError(
            "KV canary: this ModelRunner has no canary although the KV canary is enabled (the "
            "ModelRunner.initialize hook did not run for it)"
        )
    return runner


def canary_runners_of_scheduler(scheduler: Any) -> Iterator[CanaryRunner]:
    """The canaries of a scheduler's model runners (target, and EAGLE draft when present: the
    spec-v2 worker keeps its draft model runner at ``draft_worker.draft_worker.draft_runner``)."""
    draft = getattr(scheduler, "draft_worker", None)
    model_runners = (
        getattr(getattr(scheduler, "tp_worker", None), "model_runner", None),
        getattr(draft, "model_runner", None),
        getattr(getattr(draft, "draft_worker", None), "draft_runner", None),
    )
    seen: set[int] = set()
    for model_runner in model_runners:
        runner = getattr(model_runner, RUNNER_ATTRIBUTE, None)
        if isinstance(runner, CanaryRunner) and id(runner) not in seen:
            seen.add(id(runner))
            yield runner
