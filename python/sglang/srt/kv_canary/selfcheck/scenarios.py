"""The self-check's scenarios: clean runs, each perturbation, raise mode, a stopped canary path,
and each persistent scheduler/engine bug of :mod:`.bugs`.

Every scenario installs the canary exactly as the server does (a
:class:`~..runner.canary_runner.CanaryRunner` on the runner, the ``ModelRunner.forward`` and
``ForwardBatch.init_new`` adapters the hook table selects for the configuration, the monitor,
the fault injector; with the token oracle, the oracle's manager and its sampler's tokens) on a
fresh :class:`~.simulation.SimulatedServer` (running the scenario's bug, if any), runs the mixed
workload (a host-tier scenario: the host-tier workload over a server with a host KV pool, the
canary's host-tier records attached as a hierarchical-cache server attaches them), and judges
what the canary logged: the same ``kv_canary violation:`` / ``kv_canary perturb:`` / stats /
health lines a server writes.

A fault is caught by a violation row of its position carrying a reason the scenario must detect
it with, from a check the scenario names, in the window of steps it allows; a bug's fault line
also names the request row(s) the row must be attributed to. Every row of the run must carry
only reasons (and come from checks) the scenario allows.
"""

from __future__ import annotations

import logging
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.config import (
    CanaryConfig,
    CanaryMode,
    KvSubPool,
    PerturbConfig,
    RealDataMode,
)
from sglang.srt.kv_canary.hooks.host_tier import HOST_TIER_ATTRIBUTE
from sglang.srt.kv_canary.hooks.model_runner import around_forward
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX, CanaryHealthError
from sglang.srt.kv_canary.hook_targets import select_hook_specs
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner, attach_canary_runner
from sglang.srt.kv_canary.runner.host_tier import HostTierRecords
from sglang.srt.kv_canary.runner.kernels import CanaryKernels
from sglang.srt.kv_canary.runner.model_forward import uninstall_model_forward
from sglang.srt.kv_canary.selfcheck.bugs import (
    ForeignCachedPrefix,
    HostCopyByteFlip,
    KvBitFlip,
    KvBitFlipK,
    LastForwardOverwrite,
    LoadShiftedByAPage,
    PrefixRoundedUp,
    PrefixSlotZero,
    SeededBug,
    SeqLensDrift,
    SiblingMixedPointer,
    SiblingSharedSlot,
    StaleHostLoad,
    StaleSlotReuse,
    WriteSlotZero,
)
from sglang.srt.kv_canary.selfcheck.sampling import ForeignTokenFault, OracleSampler
from sglang.srt.kv_canary.selfcheck.simulation import (
    VOCAB_SIZE,
    Sampler,
    ServerHooks,
    SimulatedHostPool,
    SimulatedModelRunner,
    SimulatedPool,
    default_server,
    run_host_tier_workload,
    run_mixed_workload,
)
from sglang.srt.kv_canary.monitor.stats import STATS_LINE_RE
from sglang.srt.kv_canary.monitor.violations import (
    CanaryViolationError,
    ViolationRow,
    find_violation_rows,
    format_reasons,
)

_VERIFY_CHECKS = frozenset({CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY})
_ALL_CHECKS = _VERIFY_CHECKS | {CheckKind.WRITE}
_PRE = frozenset({CheckKind.PRE_VERIFY})
_POST = frozenset({CheckKind.POST_VERIFY})
_WRITE = frozenset({CheckKind.WRITE})
_STOP_AT_STEP = 10  # the "canary path stopped" scenario removes the wrapper after this step
_WARMUP_STEPS = 6
_SEED = 1234
_SLIDING_WINDOW = 6  # the hybrid-pool scenarios' window: shorter than most prompts


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One self-check run and what must come out of it."""

    name: str
    config: CanaryConfig
    must_detect: int = 0  # reason bit every fault must be reported with (0: clean run)
    allowed_reasons: int = 0  # reason bits any violation row may carry
    allowed_checks: frozenset[CheckKind] = _VERIFY_CHECKS  # checks any violation row may come from
    # A fault is caught by a row of its position from its step to this many steps later (None:
    # any later step, for a fault that shows when its token is consumed).
    max_detection_delay: int | None = 0
    must_also_report: int = 0  # reason bits that must show in some row (later detections)
    expect_silent_faults: bool = False  # faults injected but no check may catch them at once
    may_report: int = 0  # silent scenarios: reason bits later rows may still carry
    stop_canary: bool = False  # remove the model wrapper mid-run: the health check must fire
    foreign_token_prob: float = 0.0  # the sampler feeds a request another request's token
    # A persistent bug the server runs with: built with (warmup_steps=, seed=). Its faults are
    # logged at the forward where the victim reads the corruption first, so they must be caught
    # from that step on (not one step earlier).
    bug: Callable[..., SeededBug] | None = None
    detecting_checks: frozenset[CheckKind] | None = None  # checks a catching row comes from
    sliding_window: int | None = None  # run SGLang's hybrid SWA pool with this window
    kv_pool: SimulatedPool = SimulatedPool.MHA  # the pool otherwise
    host_tier: bool = False  # a host KV pool and the host-tier workload instead of the mixed one


@dataclass(slots=True, kw_only=True)
class Outcome:
    """What a scenario produced and whether that is what it must produce."""

    scenario: Scenario
    page_size: int
    forwards: int = 0
    faults: int = 0
    loads: int = 0  # host tier: prefixes loaded back
    rows: list[ViolationRow] = field(default_factory=list)
    detail: str = ""
    passed: bool = False


def _base_config(*, real_data: RealDataMode, mode: CanaryMode = CanaryMode.LOG) -> CanaryConfig:
    return CanaryConfig(
        mode=mode,
        real_data=real_data,
        ring_capacity=4096,
        stats_print_every_n_steps=10,
        health_check_every_n_steps=8,
    )


def _perturbed(config: CanaryConfig, **settings: float | KvSubPool) -> CanaryConfig:
    return replace(
        config, perturb=PerturbConfig(warmup_steps=_WARMUP_STEPS, seed=_SEED, **settings)
    )


def _with_token_checks(config: CanaryConfig, *, write_input: bool) -> CanaryConfig:
    """Verify-token on; with ``write_input`` also the write-input assert and the token oracle."""
    return replace(
        config,
        enable_verify_token_assert=True,
        enable_write_input_assert=write_input,
        enable_token_oracle=write_input,
    )


def default_scenarios() -> list[Scenario]:
    partial = _base_config(real_data=RealDataMode.PARTIAL)
    position_or_chain = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER)
    return [
        Scenario(name="clean run, real_data=partial", config=partial),
        Scenario(name="clean run, real_data=all", config=_base_config(real_data=RealDataMode.ALL)),
        Scenario(
            name="req_to_token fault",
            config=_perturbed(partial, req_to_token_prob=1.0),
            must_detect=int(Reason.VERIFY_POSITION),
            allowed_reasons=position_or_chain,
        ),
        Scenario(
            name="foreign_prefix fault, real_data=none",
            config=_perturbed(_base_config(real_data=RealDataMode.NONE), foreign_prefix_prob=1.0),
            must_detect=int(Reason.VERIFY_OWNER),
            # the records the faulted forward wrote continue the foreign history: the next
            # forward may see the chain break at the row's first new position
            allowed_reasons=int(Reason.VERIFY_OWNER | Reason.VERIFY_CHAIN),
        ),
        Scenario(
            name="seq_lens fault",
            config=_perturbed(partial, seq_lens_prob=1.0),
            must_detect=int(Reason.VERIFY_SEQ_LENS),
            allowed_checks=frozenset({CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY,
                                      CheckKind.WRITE}),
            # a decode row's shifted prefix also reads the slot being written this step
            allowed_reasons=int(
                Reason.VERIFY_SEQ_LENS | Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN
                | Reason.VERIFY_OWNER | Reason.VERIFY_UNWRITTEN | Reason.WRITE_POSITION
                | Reason.VERIFY_OVERWRITTEN | Reason.VERIFY_REAL_KV | Reason.VERIFY_UNMAPPED
            ),
        ),
        Scenario(
            name="real_kv_used fault, real_data=partial",
            config=_perturbed(partial, real_kv_used_prob=1.0),
            must_detect=int(Reason.VERIFY_REAL_KV),
            allowed_reasons=int(Reason.VERIFY_REAL_KV),
        ),
        Scenario(
            name="real_kv_used fault, real_data=none",
            config=_perturbed(_base_config(real_data=RealDataMode.NONE), real_kv_used_prob=1.0),
            expect_silent_faults=True,
        ),
        Scenario(
            name="lost_write fault, real_data=partial",
            config=_perturbed(partial, lost_write_prob=1.0),
            must_detect=int(Reason.VERIFY_NOT_LANDED),
            allowed_reasons=int(Reason.VERIFY_NOT_LANDED),
        ),
        Scenario(
            name="lost_write fault, real_data=none",
            config=_perturbed(_base_config(real_data=RealDataMode.NONE), lost_write_prob=1.0),
            expect_silent_faults=True,
        ),
        Scenario(
            name="req_to_token fault, mode=raise",
            config=_perturbed(
                _base_config(real_data=RealDataMode.PARTIAL, mode=CanaryMode.RAISE),
                req_to_token_prob=1.0,
            ),
            must_detect=int(Reason.VERIFY_POSITION),
            allowed_reasons=position_or_chain,
        ),
        Scenario(name="canary path stopped mid-run", config=partial, stop_canary=True),
        *_token_check_scenarios(partial),
        *bug_scenarios(),
        *swa_scenarios(),
        *pool_scenarios(),
        *host_tier_scenarios(),
    ]


def host_tier_scenarios() -> list[Scenario]:
    """The host tier (a hierarchical cache's host KV pool): clean runs of the host-tier
    workload with every check and with each real-data mode, and its server bugs: a load shifted
    by a page (records follow the bytes, so the request's positions are another page's), a host
    copy changed between backup and load (with real data ``all`` and ``partial``; ``none``: the
    negative control) and a stale load of another prefix's host slots (every check on)."""
    host = {"host_tier": True}
    partial = _base_config(real_data=RealDataMode.PARTIAL)
    every_check = _with_token_checks(partial, write_input=True)
    real_kv = int(Reason.VERIFY_REAL_KV)
    scenarios = [
        Scenario(name="host tier: clean run, every check", config=every_check, **host),
        *(
            Scenario(name=f"host tier: clean run, real_data={mode.value}",
                     config=_base_config(real_data=mode), **host)
            for mode in (RealDataMode.PARTIAL, RealDataMode.ALL, RealDataMode.NONE)
        ),
        Scenario(
            name="host tier bug: load shifted by a page",
            config=partial,
            bug=LoadShiftedByAPage,
            must_detect=int(Reason.VERIFY_POSITION),
            # each page holds the records of the page before it: positions are off by a page,
            # the chain breaks where the last page follows the first's predecessor, and the
            # seeds (and the records written from them) continue another history
            allowed_reasons=int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN
                                | Reason.VERIFY_OWNER),
            detecting_checks=_PRE,
            **host,
        ),
    ]
    for real_data in (RealDataMode.ALL, RealDataMode.PARTIAL):
        scenarios.append(Scenario(
            name=f"host tier bug: host copy flipped, real_data={real_data.value}",
            config=_base_config(real_data=real_data),
            bug=HostCopyByteFlip,
            must_detect=real_kv,
            allowed_reasons=real_kv,
            detecting_checks=_POST,
            **host,
        ))
    scenarios += [
        Scenario(
            name="host tier bug: host copy flipped, real_data=none",
            config=_base_config(real_data=RealDataMode.NONE),
            bug=HostCopyByteFlip,
            expect_silent_faults=True,
            **host,
        ),
        Scenario(
            name="host tier bug: stale host slots loaded",
            config=every_check,
            bug=StaleHostLoad,
            must_detect=int(Reason.VERIFY_OWNER),
            # another prompt's history from position 0: its positions and chain are
            # consistent, its tokens and its owner chain are not the request's
            allowed_reasons=int(Reason.VERIFY_OWNER | Reason.VERIFY_TOKEN),
            detecting_checks=_PRE,
            **host,
        ),
    ]
    return scenarios


def swa_scenarios() -> list[Scenario]:
    """The hybrid sliding-window pool (``SWAKVPool``): clean runs whose windows slide (SWA slots
    freed and reused), a full-pool mapping fault, a sliding-window mapping fault, and K/V flips
    in either sub-pool (``all``: every position's full-pool bytes and every in-window position's
    SWA bytes are verified in each forward)."""
    swa = {"sliding_window": _SLIDING_WINDOW}
    partial = _base_config(real_data=RealDataMode.PARTIAL)
    every = _base_config(real_data=RealDataMode.ALL)
    position_or_chain = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER)
    return [
        Scenario(name="swa pool: clean run, real_data=partial", config=partial, **swa),
        Scenario(name="swa pool: clean run, real_data=all", config=every, **swa),
        Scenario(name="swa pool: clean run, verify_token + write_input",
                 config=_with_token_checks(partial, write_input=True), **swa),
        Scenario(
            name="swa pool: req_to_token fault",
            config=_perturbed(partial, req_to_token_prob=1.0),
            must_detect=int(Reason.VERIFY_POSITION),
            # the foreign slot's window slot belongs to it (or was freed behind its window)
            allowed_reasons=position_or_chain | int(Reason.VERIFY_WINDOW_OWNER
                                                    | Reason.VERIFY_WINDOW_UNMAPPED),
            **swa,
        ),
        Scenario(
            name="swa pool: window_table fault",
            config=_perturbed(partial, window_table_prob=1.0),
            must_detect=int(Reason.VERIFY_WINDOW_OWNER),
            allowed_reasons=int(Reason.VERIFY_WINDOW_OWNER | Reason.VERIFY_REAL_KV),
            **swa,
        ),
        *(
            Scenario(
                name=f"swa pool: real_kv_used fault, {sub_pool.value} sub-pool, real_data=all",
                config=_perturbed(every, real_kv_used_prob=1.0, kv_sub_pool=sub_pool),
                must_detect=int(Reason.VERIFY_REAL_KV),
                allowed_reasons=int(Reason.VERIFY_REAL_KV),
                **swa,
            )
            for sub_pool in (KvSubPool.FULL, KvSubPool.WINDOW)
        ),
    ]


# The pools besides the bf16 MHA pool and the hybrid one, by the name scenarios carry.
_OTHER_POOLS = {
    SimulatedPool.MHA_FP8: "fp8 mha pool",
    SimulatedPool.MHA_FP4: "fp4 mha pool",
    SimulatedPool.MLA: "mla pool",
    SimulatedPool.MLA_FP8: "fp8 mla pool",
}


def pool_scenarios() -> list[Scenario]:
    """The other pools behind the seam (FP8 and FP4 MHA, bf16 and FP8 MLA), each: clean runs
    with every check, a redirected ``req_to_token`` entry, a foreign but consistent prefix
    (ownership alone), a flipped byte of a live slot (in any of the pool's fingerprint buffers:
    FP4 scales, MLA latent and RoPE parts) and a lost K/V write."""
    partial = _base_config(real_data=RealDataMode.PARTIAL)
    scenarios = []
    for kind, label in _OTHER_POOLS.items():
        scenarios += [
            Scenario(name=f"{label}: clean run, every check",
                     config=_with_token_checks(partial, write_input=True), kv_pool=kind),
            Scenario(name=f"{label}: clean run, real_data=all",
                     config=_base_config(real_data=RealDataMode.ALL), kv_pool=kind),
            Scenario(
                name=f"{label}: req_to_token fault",
                config=_perturbed(partial, req_to_token_prob=1.0),
                must_detect=int(Reason.VERIFY_POSITION),
                allowed_reasons=int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN
                                    | Reason.VERIFY_OWNER),
                kv_pool=kind,
            ),
            Scenario(
                name=f"{label}: foreign_prefix fault",
                config=_perturbed(_base_config(real_data=RealDataMode.NONE),
                                  foreign_prefix_prob=1.0),
                must_detect=int(Reason.VERIFY_OWNER),
                allowed_reasons=int(Reason.VERIFY_OWNER | Reason.VERIFY_CHAIN),
                kv_pool=kind,
            ),
            Scenario(
                name=f"{label}: real_kv_used fault",
                config=_perturbed(partial, real_kv_used_prob=1.0),
                must_detect=int(Reason.VERIFY_REAL_KV),
                allowed_reasons=int(Reason.VERIFY_REAL_KV),
                kv_pool=kind,
            ),
            Scenario(
                name=f"{label}: lost_write fault",
                config=_perturbed(partial, lost_write_prob=1.0),
                must_detect=int(Reason.VERIFY_NOT_LANDED),
                allowed_reasons=int(Reason.VERIFY_NOT_LANDED),
                kv_pool=kind,
            ),
        ]
    return scenarios


def _token_check_scenarios(partial: CanaryConfig) -> list[Scenario]:
    token_checks = _with_token_checks(partial, write_input=True)
    # A wrong token stored consistently is caught by the token checks; when its prefix is later
    # reused by a new request (radix hit), the host's owner chain (from the true tokens) no
    # longer matches the records either.
    token_reasons = int(Reason.WRITE_TOKEN | Reason.VERIFY_TOKEN | Reason.VERIFY_OWNER)
    return [
        Scenario(name="clean run, verify_token + write_input", config=token_checks),
        Scenario(
            name="clean run, verify_token, real sampler",
            config=_with_token_checks(partial, write_input=False),
        ),
        Scenario(
            name="input_ids fault, token checks",
            config=_perturbed(token_checks, input_ids_prob=1.0),
            must_detect=int(Reason.WRITE_TOKEN),
            allowed_reasons=token_reasons,
            allowed_checks=_ALL_CHECKS,
            must_also_report=int(Reason.VERIFY_TOKEN),
        ),
        Scenario(
            name="input_ids fault, token checks off",
            config=_perturbed(partial, input_ids_prob=1.0),
            expect_silent_faults=True,
            may_report=int(Reason.VERIFY_OWNER),
        ),
        Scenario(
            name="foreign next token, token checks",
            config=token_checks,
            foreign_token_prob=0.5,
            must_detect=int(Reason.WRITE_TOKEN),
            allowed_reasons=int(Reason.WRITE_TOKEN),
            allowed_checks=frozenset({CheckKind.WRITE}),
            max_detection_delay=None,
        ),
    ]


def bug_scenarios() -> list[Scenario]:
    """One scenario per persistent bug of :mod:`.bugs`, and the clean run they are measured
    against. The consistent-but-foreign histories run with the token checks and real data off
    (only the ownership check can catch them) and must bring nothing but ``verify_owner``; the
    K/V bit flips run with each real-data mode (``none``: the negative control)."""
    none = _base_config(real_data=RealDataMode.NONE)
    owner = int(Reason.VERIFY_OWNER)
    unmapped = int(Reason.VERIFY_UNMAPPED)
    real_kv = int(Reason.VERIFY_REAL_KV)
    foreign_histories = [
        ("stale slots reused", StaleSlotReuse, _PRE),
        ("foreign cached prefix", ForeignCachedPrefix, _PRE),
        ("prefix match rounded up a page", PrefixRoundedUp, _PRE),
        ("siblings mixed at P-1", SiblingMixedPointer, _PRE),
        ("siblings given one new slot", SiblingSharedSlot, _POST),
        ("seq_lens drift -1", SeqLensDrift, _PRE),
    ]
    scenarios = [Scenario(name="clean run, real_data=none", config=none)]
    scenarios += [
        Scenario(
            name=f"bug: {label}", config=none, bug=bug, must_detect=owner,
            allowed_reasons=owner, detecting_checks=checks,
        )
        for label, bug, checks in foreign_histories
    ]
    scenarios += [
        Scenario(
            name="bug: slot 0 in a prefix",
            config=_base_config(real_data=RealDataMode.PARTIAL),
            bug=PrefixSlotZero,
            must_detect=unmapped,
            allowed_reasons=unmapped,
            detecting_checks=_PRE,
        ),
        Scenario(
            name="bug: new token written to slot 0",
            config=_base_config(real_data=RealDataMode.PARTIAL),
            bug=WriteSlotZero,
            must_detect=int(Reason.WRITE_UNMAPPED),
            # the slot-0 position is unmapped from then on, and the next seed is slot 0's
            allowed_reasons=int(Reason.WRITE_UNMAPPED) | unmapped | owner,
            allowed_checks=_ALL_CHECKS,
            detecting_checks=_WRITE,
        ),
        Scenario(
            name="bug: prefix overwritten in last forward",
            config=none,
            bug=LastForwardOverwrite,
            must_detect=int(Reason.VERIFY_OVERWRITTEN),
            # the overwritten record holds another position and chain; the next position's
            # chain no longer follows it
            allowed_reasons=int(
                Reason.VERIFY_OVERWRITTEN | Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN
            ),
            detecting_checks=_POST,
        ),
    ]
    for label, bug in (("V", KvBitFlip), ("K", KvBitFlipK)):
        for real_data in (RealDataMode.ALL, RealDataMode.PARTIAL):
            scenarios.append(Scenario(
                name=f"bug: last-layer {label} bit flip, real_data={real_data.value}",
                config=_base_config(real_data=real_data),
                bug=bug,
                must_detect=real_kv,
                allowed_reasons=real_kv,
                detecting_checks=_POST,
            ))
        scenarios.append(Scenario(
            name=f"bug: last-layer {label} bit flip, real_data=none",
            config=none,
            bug=bug,
            expect_silent_faults=True,
        ))
    return scenarios


def server_hooks(config: CanaryConfig) -> ServerHooks:
    """The adapters the hook table registers for ``config`` on the functions the simulated
    server calls hooks around (what SGLang's hook registry would call in a server):
    ``ForwardBatch.init_new`` and ``ModelRunner.sample`` AFTER, ``MHATokenToKVPoolHost``'s
    ``backup_from_device_all_layer`` AFTER and ``load_to_device_per_layer`` BEFORE."""

    def adapters(target_suffix: str, hook_type: str = "after") -> tuple:
        return tuple(
            pkgutil.resolve_name(spec.adapter)
            for spec in select_hook_specs(config)
            if spec.target.endswith(target_suffix) and spec.hook_type == hook_type
        )

    host_pool = ".MHATokenToKVPoolHost"
    return ServerHooks(
        init_new=adapters(".ForwardBatch.init_new"),
        sample=adapters(".ModelRunner.sample"),
        backup=adapters(f"{host_pool}.backup_from_device_all_layer"),
        load_layer=adapters(f"{host_pool}.load_to_device_per_layer", "before"),
    )


def _sampler(scenario: Scenario) -> Sampler | None:
    """The token oracle's sampler when the oracle is on (with the scenario's fault), else the
    simulation's default."""
    if not scenario.config.enable_token_oracle:
        return None
    fault = None
    if scenario.foreign_token_prob > 0:
        fault = ForeignTokenFault(
            probability=scenario.foreign_token_prob, warmup_steps=_WARMUP_STEPS, seed=_SEED
        )
    return OracleSampler(vocab_size=VOCAB_SIZE, fault=fault)


class _LogCapture(logging.Handler):
    """Collects the canary's log lines of one run (and keeps them off the console)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> _LogCapture:
        logger = logging.getLogger("sglang.srt.kv_canary")
        self._saved = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("sglang.srt.kv_canary")
        logger.removeHandler(self)
        logger.setLevel(self._saved[0])
        logger.propagate = self._saved[1]


def install_canary_runner(
    *, model_runner: SimulatedModelRunner, config: CanaryConfig, kernels: CanaryKernels
) -> CanaryRunner:
    """What the server's ``ModelRunner.initialize`` and memory-pool hooks do, on a CPU runner:
    the runner's canary (with the oracle when on), its device state beside the pool, serving
    started. (The server's flag refusals are skipped: this runs on a CPU.)"""
    runner = attach_canary_runner(
        model_runner=model_runner,
        runner=CanaryRunner(config=config, model_runner=model_runner, kernels=kernels),
    )
    runner.install_oracle()
    runner.on_memory_pool()
    runner.on_serving_start()
    return runner


def attach_simulated_host_tier(*, runner: CanaryRunner,
                               host_pool: SimulatedHostPool) -> HostTierRecords:
    """What ``hooks.host_tier.attach_host_tier`` does on a hierarchical-cache server (its
    ``CanaryRunner.attach_host_tier`` needs SGLang's ``HiRadixCache``): host-tier records of the
    host pool's slots on the runner, and on the host pool under the attribute the backup and
    load adapters find them by."""
    tier = HostTierRecords(state=runner.state, num_host_slots=host_pool.size,
                           rekey=runner._kernels.rekey_loaded)
    runner.host_tier = tier
    setattr(host_pool, HOST_TIER_ATTRIBUTE, tier)
    return tier


def run_scenario(scenario: Scenario, *, page_size: int, kernels: CanaryKernels) -> Outcome:
    """Run the mixed workload under ``scenario`` and judge the canary's output."""
    outcome = Outcome(scenario=scenario, page_size=page_size)
    stopped_at: list[int] = []

    def forward(batch: object) -> object:
        if scenario.stop_canary and server.forwards == _STOP_AT_STEP and not stopped_at:
            uninstall_model_forward(server.runner.model)
            stopped_at.append(server.forwards)
        return around_forward(SimulatedModelRunner.forward, server.runner, batch)

    server = default_server(
        page_size=page_size,
        forward=forward,
        hooks=server_hooks(scenario.config),
        sampler=_sampler(scenario),
        bug=None if scenario.bug is None else scenario.bug(
            warmup_steps=_WARMUP_STEPS, seed=_SEED
        ),
        sliding_window=scenario.sliding_window,
        kv_pool=scenario.kv_pool,
        host_tier=scenario.host_tier,
    )
    error: Exception | None = None
    with _LogCapture() as capture:
        runner = install_canary_runner(
            model_runner=server.runner, config=scenario.config, kernels=kernels
        )
        if server.host_pool is not None:
            attach_simulated_host_tier(runner=runner, host_pool=server.host_pool)
        workload = run_host_tier_workload if scenario.host_tier else run_mixed_workload
        try:
            workload(server)
            runner.on_idle()
        except (CanaryViolationError, CanaryHealthError) as exc:
            error = exc
    outcome.forwards = server.forwards
    outcome.loads = server.loads
    outcome.rows = find_violation_rows("\n".join(capture.lines))
    faults = [m for m in map(PERTURB_LINE_RE.search, capture.lines) if m is not None]
    outcome.faults = len(faults)
    judge = _judge_stopped if scenario.stop_canary else _judge_run
    outcome.passed, outcome.detail = judge(
        scenario=scenario, rows=outcome.rows, faults=faults, error=error,
        lines=capture.lines, steps=server.forwards,
    )
    return outcome


def _judge_stopped(*, error: Exception | None, steps: int, **_: object) -> tuple[bool, str]:
    if isinstance(error, CanaryHealthError):
        return True, (
            f"health check fired at step {steps} (wrapper removed after step {_STOP_AT_STEP})"
        )
    return False, f"no health-check failure after the wrapper was removed (error: {error!r})"


def _judge_run(
    *,
    scenario: Scenario,
    rows: list[ViolationRow],
    faults: list[re.Match[str]],
    error: Exception | None,
    lines: list[str],
    steps: int,
) -> tuple[bool, str]:
    raising = scenario.config.mode is CanaryMode.RAISE
    if error is not None and not (raising and isinstance(error, CanaryViolationError)):
        return False, f"unexpected error: {error}"
    if not scenario.must_detect:
        return _judge_silent(scenario=scenario, rows=rows, faults=faults, lines=lines)
    if not faults:
        return False, "no fault was injected"
    if raising:
        if error is None:
            return False, "raise mode did not raise"
        first = int(faults[0]["step"])
        if steps != first + 1:
            return False, f"raised at step {steps}, expected {first + 1} (one step after the fault)"
        rows = list(error.rows)
        faults = [f for f in faults if int(f["step"]) == first]
    stray = [
        row for row in rows
        if row.reasons & ~scenario.allowed_reasons or row.check not in scenario.allowed_checks
    ]
    if stray:
        return False, f"unexpected violation: {stray[0].to_line()}"
    missed = [
        fault for fault in faults
        if not fault_caught(scenario=scenario, fault=fault, rows=rows)
    ]
    if missed:
        return False, f"missed {len(missed)}/{len(faults)} faults, first: {missed[0].group(0)}"
    unseen = scenario.must_also_report & ~_union(rows)
    if unseen:
        return False, f"no violation row carries {format_reasons(unseen)}"
    reasons = format_reasons(_union(rows))
    checks = ",".join(sorted({row.check.name.lower() for row in rows}))
    how = "raised" if raising else "logged"
    return True, f"caught {len(faults)}/{len(faults)} ({how}) by {reasons} at {checks}"


def fault_caught(
    *, scenario: Scenario, fault: re.Match[str], rows: list[ViolationRow]
) -> bool:
    """A row of the fault's position, with a reason it must be detected with, from the fault's
    step to ``max_detection_delay`` steps later (a runtime perturbation: from one step earlier;
    log mode does not print a row again while the same corruption is still present one step
    later, so a fault repeated at the same position in consecutive steps is caught by the first
    step's row); from a check in ``detecting_checks`` when given; and, when the fault line names
    ``req_pool_idx`` (comma-separated), attributed to one of those request rows."""
    step, position = int(fault["step"]), int(fault["position"])
    delay = scenario.max_detection_delay
    first = step if scenario.bug is not None else step - 1
    details = fault_details(fault=fault)
    pool_rows = (
        {int(index) for index in details["req_pool_idx"].split(",")}
        if "req_pool_idx" in details
        else None
    )
    return any(
        row.position == position
        and row.reasons & scenario.must_detect
        and first <= row.step
        and (delay is None or row.step <= step + delay)
        and (scenario.detecting_checks is None or row.check in scenario.detecting_checks)
        and (pool_rows is None or row.req_pool_idx in pool_rows)
        for row in rows
    )


def fault_details(*, fault: re.Match[str]) -> dict[str, str]:
    """The ``key=value`` pairs after ``position`` in a ``kv_canary perturb:`` line."""
    return dict(pair.split("=", 1) for pair in fault["detail"].split())


def _judge_silent(
    *,
    scenario: Scenario,
    rows: list[ViolationRow],
    faults: list[re.Match[str]],
    lines: list[str],
) -> tuple[bool, str]:
    stray = [row for row in rows if row.reasons & ~scenario.may_report]
    if stray:
        return False, f"{len(stray)} violation(s) in a silent run, first: {stray[0].to_line()}"
    if scenario.expect_silent_faults and not faults:
        return False, "no fault was injected"
    health = sum(line.startswith(HEALTH_OK_PREFIX) for line in lines)
    stats = [m for m in map(STATS_LINE_RE.search, lines) if m is not None]
    if not health or not stats or int(stats[-1]["protected"]) == 0:
        return False, f"health checks passed: {health}, stats lines: {len(stats)}, or 0 protected"
    silent = f"{len(faults)} faults, " if scenario.expect_silent_faults else ""
    later = f" ({len(rows)} later {format_reasons(_union(rows))})" if rows else ""
    return True, (
        f"{silent}0 violations at once{later}; health ok x{health}; protected "
        f"{stats[-1]['protected']} tokens, {stats[-1]['written']} slots written"
    )


def _union(rows: list[ViolationRow]) -> int:
    bits = 0
    for row in rows:
        bits |= row.reasons
    return bits

