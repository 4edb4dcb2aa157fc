"""Every SGLang function this package hooks, in one table: the one file to port when SGLang
changes.

Each :class:`HookSpec` names a dotted target inside sglang 0.5.12.post1, the hook type, the
adapter (``module:function`` under :mod:`sglang.srt.kv_canary.hooks`, grouped by SGLang
component) and the predicate that says which configurations need it. Resolving, registering and
verifying the hooks is :mod:`.hook_registration`'s job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode

SUPPORTED_SGLANG_VERSION = "0.5.12.post1"

_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_KV_MIXIN = "sglang.srt.model_executor.model_runner_kv_cache_mixin.ModelRunnerKVCacheMixin"
_FB = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
_GRAPH = "sglang.srt.model_executor.cuda_graph_runner"
_DRAFT_GRAPH = "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner"
_DRAFT_EXTEND_GRAPH = (
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner"
)
_EAGLE_INFO = "sglang.srt.speculative.eagle_info_v2"
_HOST_POOL = "sglang.srt.mem_cache.memory_pool_host"
_ADAPTERS = "sglang.srt.kv_canary.hooks"


@dataclass(frozen=True, slots=True, kw_only=True)
class HookSpec:
    """One hook: where, how, with what, and when it is needed."""

    target: str  # dotted path inside SGLang, e.g. "sglang.srt....ModelRunner.forward"
    hook_type: str  # "before" | "after" | "around" (values of SGLang's HookType)
    adapter: str  # "sglang.srt.kv_canary.hooks.<component>:<function>"
    needed: Callable[[CanaryConfig], bool]
    purpose: str


def _always(config: CanaryConfig) -> bool:
    return config.anything_enabled


def _canary(config: CanaryConfig) -> bool:
    return config.canary_enabled


def _oracle(config: CanaryConfig) -> bool:
    return config.enable_token_oracle


def _oracle_or_canary(config: CanaryConfig) -> bool:
    return config.enable_token_oracle or config.canary_enabled


def _token_history(config: CanaryConfig) -> bool:
    return config.canary_enabled and config.token_history_enabled


def _sweep(config: CanaryConfig) -> bool:
    return config.canary_enabled and config.sweep_interval > 0


def _abort(config: CanaryConfig) -> bool:
    return config.mode is CanaryMode.ABORT


def _host_faults(config: CanaryConfig) -> bool:
    perturb = config.perturb
    return config.canary_enabled and (perturb.real_kv_host_prob > 0 or perturb.load_shift_prob > 0)


def _launch_flags(config: CanaryConfig) -> bool:
    return config.launch_flags


def _padded_row_fix(config: CanaryConfig) -> bool:
    return config.canary_enabled and not config.reinject_padded_row_bug


HOOK_SPECS: tuple[HookSpec, ...] = (
    # ------------------------------------------------------------- server args (CLI process)
    HookSpec(
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="before",
        adapter=f"{_ADAPTERS}.server_args:register_oracle_backend_choice",
        needed=_oracle,
        purpose="make --sampling-backend token_oracle parse (argparse reads the choices)",
    ),
    HookSpec(
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="after",
        adapter=f"{_ADAPTERS}.server_args:default_to_oracle_backend",
        needed=_oracle,
        purpose="with the token oracle on, --sampling-backend defaults to token_oracle",
    ),
    HookSpec(
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="before",
        adapter=f"{_ADAPTERS}.server_args:add_launch_flags",
        needed=_launch_flags,
        purpose="launch_server parses (and --help lists) --kv-canary, "
                "--kv-canary-on-violation, --kv-canary-real-data, --kv-canary-sweep-interval and "
                "--kv-canary-report-path",
    ),
    # ------------------------------------------------------------- scheduler
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.__init__",
        hook_type="before",
        adapter=f"{_ADAPTERS}.scheduler:log_startup_line",
        needed=_always,
        purpose="one start-up line per scheduler process saying what is enabled",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.init_cache_with_memory_pool",
        hook_type="after",
        adapter=f"{_ADAPTERS}.scheduler:after_init_cache",
        needed=_sweep,
        purpose="the radix sweep walks the scheduler's prefix cache",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.init_cache_with_memory_pool",
        hook_type="after",
        adapter=f"{_ADAPTERS}.containment:attach_containment",
        needed=_abort,
        purpose="abort mode: the scheduler's containment beside its prefix cache",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.process_batch_result",
        hook_type="before",
        adapter=f"{_ADAPTERS}.containment:before_batch_result",
        needed=_abort,
        purpose="abort mode: after the result's copy landed and before its tokens are sent, "
                "abort the requests the violation rows name and evict their radix nodes",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.stash_chunked_request",
        hook_type="around",
        adapter=f"{_ADAPTERS}.containment:stash_chunked_request",
        needed=_abort,
        purpose="abort mode: a request aborted mid chunked prefill keeps its computed chunk "
                "without inserting it into the radix cache",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.process_batch_result",
        hook_type="after",
        adapter=f"{_ADAPTERS}.containment:after_batch_result",
        needed=_abort,
        purpose="abort mode: free the evicted radix nodes the finished requests released",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler_runtime_checker_mixin."
               "SchedulerRuntimeCheckerMixin.on_idle",
        hook_type="before",
        adapter=f"{_ADAPTERS}.containment:before_idle",
        needed=_abort,
        purpose="abort mode: act on rows read while idle, free evicted nodes before SGLang's "
                "idle memory check",
    ),
    HookSpec(
        target="sglang.srt.managers.scheduler_runtime_checker_mixin."
               "SchedulerRuntimeCheckerMixin.on_idle",
        hook_type="after",
        adapter=f"{_ADAPTERS}.scheduler:poll_when_idle",
        needed=_canary,
        purpose="report the last forwards' violations while the server is idle",
    ),
    # ------------------------------------------------------------- hierarchical cache
    HookSpec(
        target="sglang.srt.managers.scheduler.Scheduler.init_cache_with_memory_pool",
        hook_type="after",
        adapter=f"{_ADAPTERS}.host_tier:attach_host_tier",
        needed=_canary,
        purpose="--enable-hierarchical-cache: host-tier records beside the host KV pool",
    ),
    *(
        HookSpec(
            target=f"{_HOST_POOL}.{host_pool}.backup_from_device_all_layer",
            hook_type="after",
            adapter=f"{_ADAPTERS}.host_tier:after_backup",
            needed=_canary,
            purpose="the records of device slots copied to host slots follow them, on the "
                    "same stream",
        )
        for host_pool in ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost")
    ),
    *(
        HookSpec(
            target=f"{_HOST_POOL}.{host_pool}.load_to_device_per_layer",
            hook_type="before",
            adapter=f"{_ADAPTERS}.host_tier:before_load_layer",
            needed=_canary,
            purpose="a load's host and device slots, restored into the records before the "
                    "next forward",
        )
        for host_pool in ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost")
    ),
    HookSpec(
        target="sglang.srt.managers.cache_controller.HiCacheController.start_loading",
        hook_type="before",
        adapter=f"{_ADAPTERS}.host_tier:before_start_loading",
        needed=_host_faults,
        purpose="the host-tier faults (real_kv_host, load_shift) act on the queued loads",
    ),
    HookSpec(
        target="sglang.srt.mem_cache.hiradix_cache.HiRadixCache.attach_storage_backend",
        hook_type="around",
        adapter=f"{_ADAPTERS}.host_tier:refuse_storage_backend",
        needed=_canary,
        purpose="an L3 storage backend attached at run time is refused (its pages carry no "
                "records)",
    ),
    # ------------------------------------------------------------- model runner
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="before",
        adapter=f"{_ADAPTERS}.model_runner:before_initialize",
        needed=_always,
        purpose="check every needed hook is in place; create the runner's canary (refuse "
                "unsupported flags, install the oracle before create_sampler())",
    ),
    HookSpec(
        target=f"{_MR}.initialize",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:after_initialize",
        needed=_canary,
        purpose="serving starts: zero the counters once warm-up and graph capture are over",
    ),
    HookSpec(
        target=f"{_MR}.forward",
        hook_type="around",
        adapter=f"{_ADAPTERS}.model_runner:around_forward",
        needed=_canary,
        purpose="per-forward host work: poll, history upload, faults, launch accounting",
    ),
    HookSpec(
        target=f"{_MR}.sample",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:after_sample",
        needed=_token_history,
        purpose="the sampled tokens join the token history on the device (decode steps send "
                "no tokens from the host)",
    ),
    HookSpec(
        target="sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
               "._compute_cell_size",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:add_record_bytes_to_cell_size",
        needed=_canary,
        purpose="budget one record per KV token inside the KV memory",
    ),
    HookSpec(
        target="sglang.srt.model_executor.pool_configurator.HybridSWAPoolConfigurator"
               ".__init__",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:add_canary_bytes_to_swa_cell_size",
        needed=_canary,
        purpose="budget one record per full-attention token and the SWA owners inside the "
                "hybrid pool's KV memory",
    ),
    HookSpec(
        target=f"{_KV_MIXIN}._profile_available_bytes",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:reserve_fixed_bytes",
        needed=_canary,
        purpose="budget the ring, counters, owner chains, padding records and token history",
    ),
    HookSpec(
        target=f"{_KV_MIXIN}.init_memory_pool",
        hook_type="after",
        adapter=f"{_ADAPTERS}.model_runner:after_init_memory_pool",
        needed=_canary,
        purpose="allocate the records beside the KV pool and wrap model.forward before capture",
    ),
    # ------------------------------------------------------------- forward batch
    HookSpec(
        target=f"{_FB}.init_new",
        hook_type="after",
        adapter=f"{_ADAPTERS}.forward_batch:after_init_new",
        needed=_oracle_or_canary,
        purpose="the per-batch carrier: request ids, token-history snapshot, prompt lengths",
    ),
    HookSpec(
        target=f"{_FB}._pad_inputs_to_size",
        hook_type="after",
        adapter=f"{_ADAPTERS}.forward_batch:after_pad_inputs",
        needed=_oracle,
        purpose="pad the request ids (rids 0, rooms -1) with the batch",
    ),
    # ------------------------------------------------------------- decode CUDA graph runner
    HookSpec(
        target=f"{_GRAPH}.CudaGraphRunner.capture",
        hook_type="before",
        adapter=f"{_ADAPTERS}.cuda_graph_runner:before_capture",
        needed=_canary,
        purpose="(re)capture warm-up runs see padding rows only, never stale requests",
    ),
    HookSpec(
        target=f"{_GRAPH}.CudaGraphRunner.capture_one_batch_size",
        hook_type="around",
        adapter=f"{_ADAPTERS}.cuda_graph_runner:around_capture_one_batch_size",
        needed=_oracle_or_canary,
        purpose="captured forwards read graph-resident request ids; record what was captured",
    ),
    HookSpec(
        target=f"{_GRAPH}.CudaGraphRunner.replay_prepare",
        hook_type="after",
        adapter=f"{_ADAPTERS}.cuda_graph_runner:after_replay_prepare",
        needed=_oracle,
        purpose="before every replay: refresh the graph's request ids",
    ),
    HookSpec(
        target=f"{_GRAPH}.CudaGraphRunner.replay",
        hook_type="after",
        adapter=f"{_ADAPTERS}.cuda_graph_runner:after_replay",
        needed=_canary,
        purpose="count the canary launches every replay enqueued",
    ),
    HookSpec(
        target=f"{_GRAPH}.DecodeInputBuffers.populate_from_forward_batch",
        hook_type="before",
        adapter=f"{_ADAPTERS}.cuda_graph_runner:before_populate_buffers",
        needed=_padded_row_fix,
        purpose="padded graph rows point at req_pool_idx 0, not at stale requests",
    ),
    # ------------------------------------------------------------- EAGLE
    HookSpec(
        target=f"{_DRAFT_GRAPH}.capture_one_batch_size",
        hook_type="around",
        adapter=f"{_ADAPTERS}.eagle:around_draft_capture_one_batch_size",
        needed=_oracle_or_canary,
        purpose="the EAGLE draft capture batch reads graph-resident request ids; count the "
                "captured canary launches",
    ),
    HookSpec(
        target=f"{_DRAFT_GRAPH}.replay",
        hook_type="around",
        adapter=f"{_ADAPTERS}.eagle:around_draft_replay",
        needed=_oracle_or_canary,
        purpose="every EAGLE draft replay: refresh the graph's request ids first; upload the "
                "draft batch's rows, count the replayed launches",
    ),
    HookSpec(
        target=f"{_DRAFT_EXTEND_GRAPH}.capture_one_batch_size",
        hook_type="around",
        adapter=f"{_ADAPTERS}.eagle:around_draft_extend_capture_one_batch_size",
        needed=_canary,
        purpose="count the canary launches captured into each EAGLE draft-extend graph",
    ),
    HookSpec(
        target=f"{_DRAFT_EXTEND_GRAPH}.replay",
        hook_type="around",
        adapter=f"{_ADAPTERS}.eagle:around_draft_extend_replay",
        needed=_canary,
        purpose="every EAGLE draft-extend replay: padded rows at pool row 0, the batch's rows "
                "uploaded, launches counted; after it, owner chains follow the accepted tokens",
    ),
    HookSpec(
        target=f"{_EAGLE_INFO}.EagleDraftInputV2Mixin.prepare_for_v2_draft",
        hook_type="before",
        adapter=f"{_ADAPTERS}.eagle:before_prepare_draft_pass",
        needed=_canary,
        purpose="each EAGLE draft pass starts with unknown scratch owner chains",
    ),
    HookSpec(
        target=f"{_EAGLE_INFO}.EagleVerifyInputV2Mixin.sample",
        hook_type="around",
        adapter=f"{_ADAPTERS}.eagle:around_verify_sample",
        needed=_oracle_or_canary,
        purpose="EAGLE v2 verification picks the oracle's tokens (it bypasses the sampler); "
                "the target's owner chains follow the accepted tokens",
    ),
)


def select_hook_specs(config: CanaryConfig) -> tuple[HookSpec, ...]:
    """The hooks the enabled features need, in table order."""
    return tuple(spec for spec in HOOK_SPECS if spec.needed(config))
