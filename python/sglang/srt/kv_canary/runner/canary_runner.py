"""The KV canary of one ModelRunner: a facade with one method per SGLang event.

:class:`CanaryRunner` is created when a ``ModelRunner`` initializes and is set on it under one
attribute (:data:`RUNNER_ATTRIBUTE`). Every hook in :mod:`sglang.srt.kv_canary.hooks` is a short
adapter that finds this object (:func:`runner_of`) and calls one of its methods, which dispatch
to the components the runner builds with explicit dependencies:

=====================  ===================================================================
component              job
=====================  ===================================================================
``MemoryBudget``       the fixed buffers' reservation from the KV budget, the memory report
``CanaryPool``         the pool seam: record slots, real-data buffers, sweep enumeration
``LaunchAccounting``   launch pairs and counter publications, eager and captured per graph
``RequestRows``        host bookkeeping of request rows (new owners only)
``RowUploader``        the upload area: seq_lens mirror, row updates applied and committed
``TokenChecks``        token history (sampled tokens appended on the device), expectations
``GraphRequestIds``    the oracle's graph-resident request ids, the decode graphs' tokens
``SpeculativeCanary``  everything EAGLE
``CanaryMonitor``      violations, health, stats (no host sync)
``RadixSweep``         the incremental radix sweep
``FaultInjector``      self-test faults
``ForwardHistory``     report file on: each step's mode, batch size and rows' owners
=====================  ===================================================================

==============================  ==========================================================
SGLang event                    method
==============================  ==========================================================
ModelRunner.initialize (start)  :func:`create_canary_runner` (refusals, oracle, its sampler)
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
ModelRunner.sample              :meth:`~CanaryRunner.on_sampled` (tokens into the history)
graph replay                    :meth:`~CanaryRunner.on_decode_replay`,
                                :meth:`~CanaryRunner.on_graph_replay`,
                                :meth:`~CanaryRunner.replay_draft`,
                                :meth:`~CanaryRunner.replay_draft_extend`
scheduler prefix cache built    :meth:`~CanaryRunner.attach_radix_cache` (radix sweep)
scheduler idle                  :meth:`~CanaryRunner.on_idle`
sampling / EAGLE verification   :meth:`~CanaryRunner.make_sampler`,
                                :meth:`~CanaryRunner.sample_eagle_verify`
EAGLE draft pass starts         :meth:`~CanaryRunner.on_draft_pass_start`
==============================  ==========================================================

A decode step (plain, non-speculative) touches no request on the host: every row in it was
admitted by an earlier EXTEND / MIXED forward of this canary, so its ``init_new`` builds only the
carrier and its forward uploads only the seq_lens mirror; the tokens it samples are appended to
the history on the device.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryBatchView, CanaryDeviceState
from sglang.srt.kv_canary.batch.carrier import (
    CanaryBatchInputs,
    attach_batch_inputs,
    attach_sampling_inputs,
    batch_inputs_of,
    carried_field,
)
from sglang.srt.kv_canary.batch.forward_kind import (
    ForwardKind,
    capturing,
    forward_kind,
    host_prefix_lens,
)
from sglang.srt.kv_canary.config import (
    CanaryConfig,
    CanaryMode,
    PerturbConfig,
    get_active_config,
)
from sglang.srt.kv_canary.errors import CanaryUnsupportedError, refuse_unless_supported
from sglang.srt.kv_canary.monitor.monitor import CanaryMonitor
from sglang.srt.kv_canary.perturb.fault import InjectedFault
from sglang.srt.kv_canary.perturb.host_tier import HostTierFaults, build_host_tier_faults
from sglang.srt.kv_canary.perturb.injector import FaultInjector
from sglang.srt.kv_canary.perturb.next_token_swap import NextTokenSwapState, SampledRows
from sglang.srt.kv_canary.pools.plain_slots import is_hiradix_cache
from sglang.srt.kv_canary.pools.seam import CanaryPool
from sglang.srt.kv_canary.runner.batch_view import build_batch_view
from sglang.srt.kv_canary.runner.components import build_pool_components, installed_line
from sglang.srt.kv_canary.runner.graph_request_ids import GraphRequestIds
from sglang.srt.kv_canary.runner.host_tier import HostTierRecords
from sglang.srt.kv_canary.runner.kernels import CanaryKernels, KernelBackend, load_kernels
from sglang.srt.kv_canary.runner.launch_accounting import LaunchAccounting
from sglang.srt.kv_canary.runner.memory_budget import MemoryBudget
from sglang.srt.kv_canary.runner.model_forward import install_model_forward
from sglang.srt.kv_canary.runner.radix_sweep import RadixSweep
from sglang.srt.kv_canary.runner.refusals import unsupported_server_args
from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates
from sglang.srt.kv_canary.runner.row_uploader import RowUploader
from sglang.srt.kv_canary.runner.speculative import (
    SpeculativeCanary,
    capture_with_draft_ids,
    verify_sample,
)
from sglang.srt.kv_canary.runner.token_checks import TokenChecks
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.request_ids import (
    RID_PAD_VALUE,
    ROOM_PAD_VALUE,
    BatchRequestIds,
)
from sglang.srt.kv_canary.token_oracle.sampler import (
    TOKEN_ORACLE_BACKEND,
    OracleSampler,
    register_oracle_sampler,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.kv_canary.containment.inbox import ContainmentInbox
    from sglang.srt.kv_canary.monitor.forward_history import ForwardHistory
    from sglang.srt.kv_canary.monitor.metrics import CanaryMetrics
    from sglang.srt.kv_canary.monitor.report_file import ViolationReportFile

logger = logging.getLogger(__name__)

RUNNER_ATTRIBUTE = "kv_canary"  # attribute of a ModelRunner
_ORACLE_VARIABLE = "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"
_EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
_T = TypeVar("_T")


class TokenOracleSetupError(RuntimeError):
    """The token oracle is enabled in a configuration where it cannot steer the tokens."""


class CanaryRunner:
    """The canary of one ModelRunner (see the module docstring for its events and components).

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
        self._is_draft = bool(getattr(model_runner, "is_draft_worker", False))
        self.memory = MemoryBudget(config=config, model_runner=model_runner)
        self.accounting = LaunchAccounting(device=self._device)
        self.oracle: TokenOracleManager | None = None
        self._batch_ids = BatchRequestIds(device=self._device)
        # the next-token swap's log line names the rows it swapped (only that fault reads them)
        self._logs_sampled_rows = config.perturb.next_token_swap_prob > 0
        self.graph_ids: GraphRequestIds | None = None
        # built when the KV pool exists (on_memory_pool, build_pool_components), canary on
        self.pool: CanaryPool | None = None
        self.state: CanaryDeviceState | None = None
        self.monitor: CanaryMonitor | None = None
        self.token_checks: TokenChecks | None = None
        self.request_rows: RequestRows | None = None
        self.uploader: RowUploader | None = None
        self.speculative: SpeculativeCanary | None = None
        self._injector: FaultInjector | None = None
        self._forward_history: ForwardHistory | None = None  # report file on, or abort mode
        self.containment_inbox: ContainmentInbox | None = None  # abort mode
        self.report_file: ViolationReportFile | None = None  # report file on
        self.metrics: CanaryMetrics | None = None  # --enable-metrics
        self._inside_faults: list[InjectedFault] = []  # undone before the post launch
        self._live_batch: ForwardBatch | None = None  # the batch of the eager forward running
        self.sweep: RadixSweep | None = None
        self.host_tier: HostTierRecords | None = None  # --enable-hierarchical-cache
        self._last_upload: RowUpdates | None = None
        self._steps = 0
        self._serving = False

    # ================================================================= start-up

    def refuse_unsupported_flags(self) -> None:
        """``ModelRunner.initialize`` starts, canary on: stop on flags it cannot check.

        Raises:
            CanaryUnsupportedError: naming each flag and what to change.
        """
        if self.config.canary_enabled:
            server_args = self._model_runner.server_args
            reasons = unsupported_server_args(server_args)
            if self.config.mode is CanaryMode.ABORT:
                from sglang.srt.kv_canary.containment.refusals import abort_mode_refusals

                reasons = [*reasons, *abort_mode_refusals(server_args)]
            refuse_unless_supported(reasons)

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
        self.use_oracle(
            TokenOracleManager(oracle=HashOracle(vocab_size=model_runner.model_config.vocab_size))
        )
        if model_runner.is_draft_worker:
            return
        register_oracle_sampler(factory=self.make_sampler)
        _log_oracle(oracle=self.oracle, server_args=server_args, perturb=self.config.perturb)

    def use_oracle(self, manager: TokenOracleManager) -> None:
        """Adopt the oracle's manager and the graph-resident ids it needs (what
        :meth:`install_oracle` does before registering the sampler; a test that must leave
        SGLang's process-wide sampler registry alone calls this alone)."""
        self.oracle = manager
        self.graph_ids = GraphRequestIds(oracle=manager, owner=self, device=self._device)

    def reserve_fixed_bytes(self, available_bytes: int) -> int:
        """The profiled KV budget minus the canary's fixed buffers (see
        :meth:`MemoryBudget.reserve`)."""
        return self.memory.reserve(available_bytes)

    def on_memory_pool(self) -> None:
        """The KV pool exists (before graph capture): build the components beside it
        (:func:`~.components.build_pool_components`) and wrap ``model.forward``.

        Raises:
            CanaryUnsupportedError: the pools are not ones the canary covers.
            RuntimeError: the canary is already installed on this runner.
        """
        if self.state is not None:
            raise RuntimeError("KV canary: already installed on this ModelRunner")
        model_runner = self._model_runner
        parts = build_pool_components(
            config=self.config, model_runner=model_runner, kernels=self._kernels,
            oracle=self.oracle, accounting=self.accounting, device=self._device,
        )
        # the components the events dispatch to (fixed from here on)
        self.pool, self.state, self.monitor = parts.pool, parts.state, parts.monitor
        self.token_checks, self.request_rows = parts.token_checks, parts.request_rows
        self.uploader, self.speculative = parts.uploader, parts.speculative
        self._injector = parts.injector
        self._forward_history = parts.forward_history
        self.containment_inbox = parts.containment_inbox
        self.report_file, self.metrics = parts.report_file, parts.metrics
        install_model_forward(
            model=model_runner.model, before=self.launch_before_model,
            after=self.launch_after_model,
        )
        logger.info(installed_line(
            parts=parts, config=self.config, kernels=self._kernels, is_draft=self._is_draft,
            reserved=self.memory.fixed_buffers(page_size=model_runner.token_to_kv_pool.page_size),
        ))

    def on_capture_start(self, *, graph_runner: Any) -> None:
        """Before a decode graph (re)capture: its eager warm-up runs see padding rows only (a
        re-capture would otherwise run the canary on the stale rows of the last replay)."""
        graph_runner.buffers.req_pool_indices.zero_()
        graph_runner.buffers.out_cache_loc.zero_()

    def capture_decode_graph(
        self,
        *,
        graph_runner: Any,
        bs: int,
        capture: Callable[[Callable[..., Any]], _T],
        forward: Callable[..., Any],
    ) -> _T:
        """Capture one decode graph of ``bs`` rows: the captured forward reads graph-resident
        request ids (oracle on) and a DECODE graph computes its rows' next oracle tokens
        (:class:`GraphRequestIds`); canary on, the graph publishes the counters after the
        forward (so a replay needs no host work for them), and the canary launches and
        publications captured into it are counted."""
        graph_ids = self.graph_ids
        buffers = None if graph_ids is None else graph_ids.buffers_for(graph_runner)

        @functools.wraps(forward)  # keeps inspect.signature(forward), which the runner inspects
        def forward_with_request_ids(
            input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
            **forward_kwargs: Any,
        ) -> Any:
            if buffers is not None:
                graph_ids.attach_capture_ids(forward_batch=forward_batch, buffers=buffers)
                graph_ids.capture_next_tokens(graph_runner=graph_runner,
                                              forward_batch=forward_batch, positions=positions,
                                              bs=bs)
            result = forward(input_ids, positions, forward_batch, **forward_kwargs)
            if self.monitor is not None:
                self._publish_counters()
            return result

        return self.accounting.capture_graph(
            graph_runner=graph_runner, bs=bs, capture=lambda: capture(forward_with_request_ids)
        )

    def capture_draft_graph(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Capture one EAGLE draft graph (see :meth:`SpeculativeCanary.capture_draft_graph`)."""
        if self.speculative is None:  # oracle only: attach the graph-resident ids
            return capture_with_draft_ids(
                graph_runner=graph_runner, capture=capture, graph_ids=self.graph_ids
            )
        return self.speculative.capture_draft_graph(
            graph_runner=graph_runner, capture=capture, graph_ids=self.graph_ids
        )

    def capture_draft_extend_graph(self, *, graph_runner: Any, capture: Callable[[], _T]) -> _T:
        """Capture one EAGLE draft-extend graph; the canary launches captured into it are
        counted (its warm-up runs call ``model.forward`` directly and count as eager)."""
        return self.accounting.capture_same_per_size(graph_runner=graph_runner, capture=capture)

    def on_serving_start(self) -> None:
        """Start-up is over (warm-up runs, graph capture): zero the device counters, so step
        numbers and stats count serving forwards only. Synchronizes once, at start-up."""
        self._serving = True
        if self.state is None:
            return
        self.state.counters.zero_()
        self.state.owner_chains.zero_()
        if self.speculative is not None:
            self.speculative.on_serving_start()
        if self.token_checks is not None:
            self.token_checks.on_serving_start()
        self.accounting.reset()
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        self.monitor.discard_pending()
        # publication numbers agree from here on: they tell when a buffer's copy completed
        self.uploader.open(landed=self.monitor.landed_publications)
        self.memory.report(allocated=self.device_bytes(),
                           page_size=self._model_runner.token_to_kv_pool.page_size)

    def device_bytes(self) -> dict[str, int]:
        """Bytes of every device tensor this canary allocated, by buffer (the records and the
        buffers of :class:`~.memory_budget.FixedBuffers`)."""
        def size(tensor: torch.Tensor) -> int:
            return tensor.numel() * tensor.element_size()

        state = self.state
        speculative = {} if self.speculative is None else self.speculative.device_bytes
        checks = {} if self.token_checks is None else self.token_checks.device_bytes
        window_owners = 0 if state.window is None else size(state.window.owners)
        return {
            "records": size(state.records) + window_owners,
            "ring": size(state.ring),
            "counters": size(state.counters),
            "owner_chains": size(state.owner_chains) + speculative.get("owner_chains", 0),
            **self.uploader.device_bytes,
            "token_history": checks.get("token_history", 0),
            "write_expectations": checks.get("write_expectations", 0),
            "graph_request_ids": 0 if self.graph_ids is None else self.graph_ids.device_bytes,
            "uniform_blocks": speculative.get("uniform_blocks", 0),
        }

    # ================================================================= per batch (host)

    def on_init_new(self, *, forward_batch: ForwardBatch, worker_batch: Any) -> None:
        """``ForwardBatch.init_new`` returned: attach the per-batch carrier. A decode step reads
        no request (every row is known to the device); other forwards pack their new owners'
        updates. Host work only; never syncs.

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
        rids_int = rooms = sampled_rows = None
        if self.config.enable_token_oracle:
            rids_int, rooms = self._batch_ids.tensors_for_requests(reqs)
            if self._logs_sampled_rows and forward_batch.sampling_info is not None:
                sampled_rows = SampledRows(
                    rids=forward_batch.rids, next_positions=worker_batch.seq_lens_cpu
                )
        row_updates = None
        extend_reqs = None
        request_owners = None
        request_rows = self.request_rows
        if request_rows is not None and rows > 0:
            kind = forward_kind(forward_batch)
            if kind is not None and (kind is not ForwardKind.DECODE or request_rows.history_tails):
                row_updates = request_rows.prepare(
                    reqs=reqs,
                    prefix_lens=host_prefix_lens(forward_batch),
                    seq_lens=forward_batch.seq_lens_cpu.tolist(),
                    # EXTEND / MIXED forwards run eagerly: their post launch comes after the
                    # model is enqueued, so new owners' tokens are read while the device runs
                    # the model (and, write-input assert on, the expectations built)
                    defer_new_owners=kind is ForwardKind.EXTEND,
                )
                if self._forward_history is not None:  # (the rows are read here anyway)
                    request_owners = [(req.req_pool_idx, req.rid) for req in reqs]
            if self.token_checks is not None and self.token_checks.wants_extend_reqs(
                forward_batch
            ):
                extend_reqs = reqs
        inputs = CanaryBatchInputs(
            runner=self,
            rids_int=rids_int,
            bootstrap_room_ids_int=rooms,
            row_updates=row_updates,
            sampled_rows=sampled_rows,
            extend_reqs=extend_reqs,
            request_owners=request_owners,
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
        report earlier forwards' violations, upload this batch's rows, inject faults, run the
        forward, undo the faults, check the launch count, publish the counters (an eager
        forward; a replayed decode graph published them itself), the radix sweep (publishing
        again when it launched), periodic health and stats.

        Raises:
            UnsupportedForwardModeError: the batch's mode is not checked by the canary.
            CanaryViolationError: raise mode, and an earlier forward produced violation rows.
            CanaryHealthError: this forward did not run the canary exactly once, or the periodic
                device check failed (any mode).
            RuntimeError: a live batch carries no carrier.
        """
        speculative = self.speculative
        if speculative is not None and speculative.in_draft_capture:
            return forward()  # EAGLE draft graph warm-up / capture: start-up rows only
        accounting = self.accounting
        self.monitor.poll()
        kind = forward_kind(forward_batch)
        live = kind is not None and forward_batch.batch_size > 0
        if live:
            self._upload(forward_batch)
            if self._forward_history is not None:
                self._record_forward(forward_batch)
        if live and self.host_tier is not None:
            self.host_tier.restore_started()
        faults = (
            self._injector.before_forward(forward_batch=forward_batch, step=self._steps)
            if live and self._injector is not None
            else []
        )
        launches_before = accounting.launches
        publications_before = accounting.publications
        self._live_batch = forward_batch if live else None
        try:
            result = forward()
        finally:
            self._live_batch = None
            for fault in reversed(faults):
                fault.undo()
        if live and kind is ForwardKind.DRAFT_EXTEND:  # an eager EAGLE draft extend
            speculative.draft_extend_done(
                forward_batch, accept_lens=forward_batch.spec_info.num_accept_tokens
            )
        accounting.check_forward(launches_before=launches_before, live=live, step=self._steps,
                                 forward_batch=forward_batch)
        if live:
            if accounting.publications == publications_before:
                self._publish_counters()
            self._after_live_forward(forward_batch)
        self._monitor_after_forward()
        return result

    def _after_live_forward(self, forward_batch: ForwardBatch) -> None:
        """A forward with rows ran: its after-forward faults, the step count, the sweep step
        (its findings published too)."""
        if self._injector is not None:
            self._injector.after_forward(forward_batch=forward_batch, step=self._steps)
        self._steps += 1
        sweep = self.sweep
        if sweep is None or (self.host_tier is not None and self.host_tier.busy):
            return  # (a loaded node's records wait for the forward that reads it)
        if sweep.pass_starts_at(self._steps) and self._injector is not None:
            self._injector.before_sweep_pass(tree_cache=sweep.tree_cache, step=self._steps)
        before = sweep.launches
        sweep.after_forward(step=self._steps)
        if sweep.launches != before:
            self.accounting.count_sweep_launches(sweep.launches - before)
            self._publish_counters()

    def _monitor_after_forward(self) -> None:
        accounting = self.accounting
        self.monitor.after_forward(
            steps=self._steps, launches=accounting.launches,
            sweep_launches=accounting.sweep_launches, publications=accounting.publications,
        )

    def _upload(self, forward_batch: ForwardBatch) -> None:
        """Copy the batch's seq_lens mirror and row updates to the device and apply them
        (outside graphs, on the forward's stream, before the eager forward or the replay reads
        them).

        Raises:
            RuntimeError: the batch has no carrier (its ``init_new`` hook did not run).
        """
        inputs = batch_inputs_of(forward_batch)
        if inputs is None:
            carried_field(forward_batch, "runner", what="canary inputs",
                          consequence=" (the seq_lens mirror and the token history would be stale)")
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is None:
            raise ValueError(
                f"KV canary needs ForwardBatch.seq_lens_cpu in {forward_batch.forward_mode.name} "
                "mode (the seq_lens mirror)"
            )
        mark = self.accounting.publications + 1  # the publication that follows this forward
        self.uploader.upload_seq_lens(seq_lens_cpu, mark=mark)
        updates = inputs.row_updates
        if updates is None or updates is self._last_upload:
            return  # (the same updates: an eager EAGLE draft pass, one batch and several steps)
        self._last_upload = updates
        self.uploader.apply(updates, mark=mark)

    def _record_forward(self, forward_batch: ForwardBatch) -> None:
        """Report file on: note this step's mode, batch size and (packed batches) the rows'
        owners in the forward history, from host values only."""
        inputs = batch_inputs_of(forward_batch)
        self._forward_history.record_forward(
            step=self._steps, mode=forward_batch.forward_mode, batch_size=forward_batch.batch_size,
            owners=None if inputs is None else inputs.request_owners,
        )

    def on_sampled(self, *, forward_batch: Any, next_token_ids: torch.Tensor) -> None:
        """``ModelRunner.sample`` returned: the sampled tokens join their rows' token history on
        the device (one launch; token checks on)."""
        if self.token_checks is None or not self._serving:
            return
        self.token_checks.on_sampled(kind=forward_kind(forward_batch),
                                     forward_batch=forward_batch, next_token_ids=next_token_ids)

    def on_decode_replay(self, *, graph_runner: Any, forward_batch: ForwardBatch) -> None:
        """A decode / target-verify graph's replay is prepared: refresh its request ids and
        offer a decode graph's next tokens to the sampler of this batch (oracle on)."""
        if self.graph_ids is not None:
            self.graph_ids.fill(graph_runner=graph_runner, forward_batch=forward_batch)
            self.graph_ids.offer_tokens(graph_runner=graph_runner, forward_batch=forward_batch)

    def on_graph_replay(self, *, graph_runner: Any) -> None:
        """A decode / target-verify graph was replayed: count the canary launches and counter
        publications captured into it (not at ``replay_prepare``: EAGLE prepares the verify
        graph before ``ModelRunner.forward``)."""
        if self._serving:
            self.accounting.replayed(graph_runner=graph_runner, bs=graph_runner.bs)

    def replay_draft(
        self, *, graph_runner: Any, forward_batch: ForwardBatch, replay: Callable[[], _T]
    ) -> _T:
        """Replay an EAGLE draft graph (the draft decode steps): refresh its request ids first
        (oracle on); canary on: the host work of a forward around the replay (no
        ``ModelRunner.forward`` runs for a replayed draft pass)."""
        if self.graph_ids is not None:
            self.graph_ids.fill(graph_runner=graph_runner, forward_batch=forward_batch)
        if self.state is None:
            return replay()
        return self._replay_speculative(
            graph_runner=graph_runner, forward_batch=forward_batch, replay=replay
        )

    def replay_draft_extend(
        self, *, graph_runner: Any, forward_batch: ForwardBatch, replay: Callable[[], _T]
    ) -> _T:
        """Replay an EAGLE draft-extend graph: padded rows at pool row 0, the host work of a
        forward around the replay; after it, the owner chains follow the accepted tokens."""
        speculative = self.speculative
        accept_lens = speculative.prepare_draft_extend_replay(
            graph_runner=graph_runner, forward_batch=forward_batch
        )

        def replay_and_resync() -> _T:
            result = replay()
            speculative.draft_extend_done(forward_batch, accept_lens=accept_lens)
            return result

        return self._replay_speculative(
            graph_runner=graph_runner, forward_batch=forward_batch, replay=replay_and_resync
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
            if self._forward_history is not None:
                self._record_forward(forward_batch)
        result = replay()
        self.accounting.replayed_same_per_size(graph_runner=graph_runner)
        self._publish_counters()
        self._steps += 1
        self._monitor_after_forward()
        return result

    def on_draft_pass_start(self) -> None:
        """An EAGLE draft pass (the draft decode steps) starts."""
        if self.speculative is not None:
            self.speculative.on_draft_pass_start()

    def attach_radix_cache(self, tree_cache: Any) -> None:
        """The scheduler built its prefix cache: with the sweep on, walk it.

        Raises:
            CanaryUnsupportedError: the sweep is on but the pool seam cannot walk this cache.
        """
        if self.config.sweep_interval == 0 or self.state is None:
            return
        reason = self.pool.sweep_refusal(tree_cache)
        if reason is not None:
            raise CanaryUnsupportedError([reason])
        self.sweep = RadixSweep(
            tree_cache=tree_cache, state=self.state, pool=self.pool, launch=self._kernels.sweep,
            interval=self.config.sweep_interval,
        )

    def attach_host_tier(self, tree_cache: Any) -> tuple[HostTierRecords, HostTierFaults | None]:
        """The scheduler built a hierarchical cache: records for its host pool's slots, and the
        host-tier faults when enabled.

        Raises:
            CanaryUnsupportedError: the cache is not SGLang's ``HiRadixCache``, or the pool seam
                does not cover its host pool.
        """
        if not is_hiradix_cache(tree_cache):
            raise CanaryUnsupportedError([
                f"the hierarchical cache is {type(tree_cache).__name__}; the canary covers "
                "SGLang's HiRadixCache only (no SGLANG_ENABLE_UNIFIED_RADIX_TREE, no hybrid "
                "mamba models); remove --enable-hierarchical-cache"
            ])
        host_pool = tree_cache.cache_controller.mem_pool_host
        reason = self.pool.host_tier_refusal(host_pool)
        if reason is not None:
            raise CanaryUnsupportedError([reason])
        self.host_tier = HostTierRecords(state=self.state, num_host_slots=host_pool.size,
                                         rekey=self._kernels.rekey_loaded)
        faults = build_host_tier_faults(
            config=self.config.perturb, pool=self.pool, host_pool=host_pool,
            page_size=tree_cache.page_size, next_step=lambda: self._steps,
        )
        logger.info(
            f"KV canary host tier: records for the {host_pool.size} host slots of "
            f"{type(host_pool).__name__} ({host_pool.layout}, "
            f"{self._model_runner.server_args.hicache_io_backend} io), "
            f"{self.host_tier.device_bytes} B on {self._device}"
        )
        return self.host_tier, faults

    def _publish_counters(self) -> None:
        """Publish the counters (:meth:`CanaryMonitor.publish`) and count the publication."""
        self.monitor.publish()
        self.accounting.count_publication()

    def on_idle(self) -> None:
        """The scheduler is idle: report the last forwards' violations now (paced: see
        :meth:`CanaryMonitor.poll_idle`)."""
        if self.monitor is not None:
            self.monitor.poll_idle()

    # ================================================================= in the forward (graphs)

    def launch_before_model(self, forward_batch: ForwardBatch) -> CanaryBatchView | None:
        """Build the batch view and launch the pre-forward kernel; None for IDLE (nothing to
        check). Inside captured graphs: views and fixed shapes only, no host sync. An eager
        forward then gets its inside-forward faults (undone before the post launch).

        Raises:
            UnsupportedForwardModeError: a mode the canary does not check.
        """
        kind = forward_kind(forward_batch)
        if kind is None:
            return None
        checks = {} if self.token_checks is None else self.token_checks.view_fields(
            forward_batch, inputs=batch_inputs_of(forward_batch)
        )
        view = build_batch_view(
            forward_batch, kind=kind, checks=checks,
            host_seq_lens=self.uploader.seq_lens_mirror, live_rows=self.uploader.live_rows,
            blocks=None if self.speculative is None else self.speculative.blocks,
        )
        self._kernels.pre_forward(state=self._state_for(kind), batch=view)
        self.accounting.count_launch()
        live_batch = self._live_batch
        if self._injector is not None and live_batch is not None and not capturing(self._device):
            self._inside_faults = self._injector.inside_forward(
                forward_batch=forward_batch, live_batch=live_batch, step=self._steps
            )
        return view

    def launch_after_model(self, view: CanaryBatchView, *, forward_batch: ForwardBatch) -> None:
        """The model forward is enqueued: send the admissions deferred by this batch's
        :meth:`on_init_new` and, write-input assert on, an EXTEND / MIXED batch's expectations
        (eager forwards only; the host reads the requests' tokens while the device runs the
        model), then launch the post-forward kernel on the view the pre launch used (with those
        expectations: the post launch checks an EXTEND layout's written inputs)."""
        if not capturing(self._device):
            for fault in reversed(self._inside_faults):
                fault.undo()
            self._inside_faults = []
            inputs = batch_inputs_of(forward_batch)
            updates = None if inputs is None else inputs.row_updates
            admitted = None
            if updates is not None and updates.deferred:
                admitted = self.request_rows.prepare_deferred(updates.deferred)
                self.uploader.apply(admitted, mark=self.accounting.publications + 1)
            if self.host_tier is not None:
                self.host_tier.rekey_restored()
            if self.token_checks is not None:
                expected = self.token_checks.post_expectations(
                    forward_batch, inputs=inputs, admitted=admitted
                )
                if expected is not None:
                    view = view.with_expected_inputs(
                        expected_input_ids=expected[0], expected_positions=expected[1]
                    )
        self._kernels.post_forward(state=self._state_for(forward_kind(forward_batch)), batch=view)

    @property
    def forward_history(self) -> ForwardHistory | None:
        """Each step's mode, batch size and rows' owners (report file on, or abort mode)."""
        return self._forward_history

    def _state_for(self, kind: ForwardKind | None) -> CanaryDeviceState:
        if self.speculative is None:
            return self.state
        return self.speculative.state_for(kind)

    # ================================================================= oracle

    def make_sampler(self) -> OracleSampler:
        """The ``token_oracle`` sampler of this runner (SGLang's ``create_sampler()`` calls it)."""
        return OracleSampler(
            manager=self.oracle,
            next_token_swap=NextTokenSwapState.from_config(self.config.perturb),
            graph_tokens=self.graph_ids.graph_tokens,
        )

    def sample_eagle_verify(
        self, *, batch: Any, logits_output: Any, verify_input: Any, sample: Callable[[], _T]
    ) -> _T:
        """EAGLE v2 verification (see :meth:`SpeculativeCanary.sample_verify`; oracle only:
        the oracle's tokens, no owner chains)."""
        if self.speculative is None:
            return verify_sample(
                oracle=self.oracle, batch=batch, logits_output=logits_output,
                verify_input=verify_input, sample=sample,
            )
        return self.speculative.sample_verify(
            oracle=self.oracle, batch=batch, logits_output=logits_output,
            verify_input=verify_input, sample=sample,
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
    """At ``ModelRunner.initialize``: create the runner's canary (Triton kernels), set it on the
    runner, refuse unsupported flags and install the oracle.

    Raises:
        RuntimeError: the runner already has a canary.
        CanaryUnsupportedError / TokenOracleSetupError: see the methods called.
    """
    runner = attach_canary_runner(
        model_runner=model_runner,
        runner=CanaryRunner(
            config=get_active_config(), model_runner=model_runner,
            kernels=load_kernels(KernelBackend.TRITON),
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
