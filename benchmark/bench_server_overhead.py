"""End-to-end cost of the KV canary: real servers, one per configuration, side by side in one run.

For each model (``tiny``: 4 layers, hidden 256; ``8b``: Qwen3-8B-shaped, 36 layers, hidden
4096, 32 heads, 8 KV heads, head_dim 128, MLP 12288, vocabulary 151936; dummy weights, Triton
attention, CUDA graphs) and each configuration below, this starts ``python -m
sglang.launch_server``, runs every selected workload once to warm up, then ``--repeats`` times
measured, and stops the server. The run's first configuration is started once more at the end
(``NAME#2``), so drift over the run is visible. It prints one block per workload with medians,
ratios to each configuration's baseline, the noise beside every figure, the targets with
their verdicts and, when a baseline configuration has two servers, a ``pairs`` line (each server
against its baseline's server started just before it). No assertions.
``server_overhead_report.py FILE.json`` prints the report of an ``--out`` file again.

Configurations (``SGLANG_KV_CANARY_*`` of this shell never reach the servers) and the baseline
each is compared with:

- ``off`` (vs ``stock``): the plugin loaded, nothing enabled; ``--sampling-backend pytorch``,
  temperature 0. ``off / stock`` is the "canary off costs nothing" check.
- ``oracle`` (vs ``off``): ``ENABLE_TOKEN_ORACLE=1``, ``--sampling-backend token_oracle``. Every
  canary configuration below keeps the oracle; their ``x oracle`` column isolates the canary.
- ``canary`` (vs ``off``): + ``MODE=log``.
- ``canary+partial`` (vs ``off``): + ``REAL_DATA=partial``.
- ``canary+verify-token``, ``canary+write-input`` (vs ``off``, run only when named): the canary
  with one of all-checks' two token checks (``ENABLE_VERIFY_TOKEN_ASSERT=1``,
  ``ENABLE_WRITE_INPUT_ASSERT=1``), to split all-checks' cost by check.
- ``all-checks`` (vs ``off``): + ``REAL_DATA=partial``, ``ENABLE_VERIFY_TOKEN_ASSERT=1``,
  ``ENABLE_WRITE_INPUT_ASSERT=1``.
- ``all-checks-s4`` (vs ``off``): all checks with ``REAL_DATA_STRIDE=4`` (each prefix slot's
  bytes verified every fourth forward).
- ``stock`` (vs ``stock-piecewise``): SGLang without the plugin (``SGLANG_PLUGINS`` names no
  installed plugin), with ``--disable-piecewise-cuda-graph`` like every configuration above.
- ``stock-piecewise`` (no baseline): stock SGLang with its default piecewise CUDA graphs, so
  ``stock / stock-piecewise`` is what the ``--disable-piecewise-cuda-graph`` flag that the canary
  requires costs.

Targets (printed with a verdict, vs ``off``): on ``8b`` every workload: all-checks throughput
>= 0.985x and TTFT <= 1.03x, canary throughput >= 0.995x, and all-checks adds <= 0.1 ms per
decode step on ``decode64_8k``; on ``tiny``: all-checks throughput >= 0.92x.

Workloads (``server_workloads.py``): one streamed ``/generate`` batch per round (``ttft1``: 32
of them, one after another), all requests of a batch arriving together; prompts are random ordinary token ids, identical across configurations;
``ignore_eos``. Every workload reports throughput (output tok/s, prompt tok/s for
``prefill32``), the mean TTFT (request sent to its first token's chunk) and ms per decode step
(the last request's first token to the end of the batch, over ``new_tokens - 1`` steps):

- ``decode64``: 64 x 128-token prompts, 256 new tokens (decode-heavy);
- ``bs1``: 1 x 128-token prompt, 512 new tokens (batch-1 decode);
- ``ttft1``: 32 batch-1 requests of a 128-token prompt and 2 new tokens, one after another
  (batch-1 time to first token: each round's TTFT is a mean over 32 requests, where ``bs1``'s is
  one request's);
- ``prefill32``: 32 x 2048-token prompts, 8 new tokens (prefill-heavy);
- ``prefill64x512``: 64 x 512-token prompts, 512 new tokens (concurrent prefill);
- ``decode64_8k``: 64 x 8192-token prompts, 256 new tokens (decode over 8k-token histories);
  the 8128-token prefixes are prefilled in the warm-up round and reused from the radix cache by
  the measured rounds, whose prompts differ in their last 64 tokens;
- ``bs1_32k``: 1 x 32768-token prompt, 256 new tokens (batch-1 decode at 32k), prefix reused
  the same way;
- ``admit64_8k``: the prompts of ``decode64_8k`` (prefixes reused the same way) with 2 new tokens:
  a round takes about a second, so many rounds measure the TTFT of admitting 64 requests with
  8k cached tokens each, which varies by tens of ms from round to round.

KV pool: every server gets ``--context-length 40960 --max-total-tokens 614400`` (64 x (8192 +
256) = 540672 tokens run together in ``decode64_8k``); the 8b model also gets
``--mem-fraction-static 0.8``: 614400 tokens x 144 KiB (36 layers x 8 KV heads x 128 x K,V x
bf16) = 84 GiB + 15 GiB of weights fit the 139 GiB of an H200. A workload the server's logged
pool (``max_total_num_tokens``, ``max_running_requests``, ``context_len``) cannot hold is
``skipped: does not fit`` (e.g. ``decode64_8k`` on an 80 GB GPU).

Time budget (``--time-budget-s``, default 570 s: a 10-minute GPU command with room to stop): a
server starts only if the last fully measured server of the model took less than what is left
(before the first one: an estimate per model and workload), from the third server on with as
much again kept for the final repeat of the first configuration; a workload's warm-up only if
its last warm-up (or the estimate) fits; a measured round only if the longest measured round so
far (at first the last server's, or the estimate) fits. What does not fit is labelled
``skipped: time budget`` and the run goes on; whatever was measured is printed and written to
``--out`` after every server. A configuration that fails to start is ``refused: <reason>``.

On a fresh machine the first server compiles Triton kernels during its first requests, some of
them after its warm-up rounds (an 8b ``off`` server's TTFT read 40.6 ±24 % ms where the later
ones read 25 ms): ``--warm-start`` first runs every workload's warm-up round on a throwaway
server of the first configuration (printed, not reported).

``--together MODELS`` starts all servers of those models at once and measures them
interleaved, round by round (:func:`measure_together`): for the tiny model, whose servers fit
the GPU together. All of them start in the time of one, and every configuration is measured
over the same minutes.

On one H200 an 8b server with every workload takes about 3.5 minutes (a tiny one about 1), so
the default budget measures ``off`` and ``all-checks`` of the 8b model, and every tiny
server. Usage (on a GPU host with sglang 0.5.12.post1 and sglang-kv-canary installed)::

    python benchmark/bench_server_overhead.py [--models 8b,tiny] [--configs off,all-checks,...]
        [--workloads decode64,prefill64x512,...] [--repeats 3 | tiny=12,8b=3] [--out FILE.json]
        [--log-dir DIR] [--time-budget-s 570] [--no-repeat-first] [--cycles N]
        [--pin-scheduler] [--host-timers N] [--eagle-steps N] [--warm-start]
        [--together tiny]

    # the whole 8b table, nine servers (about 35 minutes)
    python benchmark/bench_server_overhead.py --models 8b --time-budget-s 2400 \
        --out bench-8b.json --log-dir bench-8b-logs
    # the tiny table (about 9 minutes)
    python benchmark/bench_server_overhead.py --models tiny --out bench-tiny.json \
        --log-dir bench-tiny-logs

Under a 10-minute limit per command, split the 8b table into runs that each hold a configuration
and its baseline: three servers with every workload do not fit, but four do with ``--workloads
decode64,bs1,prefill32,prefill64x512`` and three with ``--workloads decode64_8k,bs1_32k``.

``--out`` JSON: ``options``, ``workloads``, ``configs`` (env, sampling backend, baseline),
``noise`` (how noise is estimated), and per model ``models.NAME``: ``server_args``,
``targets``, ``results`` (one per server, in run order: ``label``, ``status``, ``command``,
``log_path``, ``kv_pool_tokens``, ``workloads.W.rounds[]`` with ``wall_s``, per-request
``ttft_s``, ``decode_s``, token counts and the derived ``output_tok_s`` / ``prompt_tok_s`` /
``mean_ttft_s`` / ``step_ms``, and ``workloads.W.host_timers``: with ``--host-timers``, the last
timer line the server logged while W ran) and ``tables.W`` (the printed rows with medians, ratios and
noise, the target verdicts and notes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.metadata
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.srt.kv_canary.tools.server import (
    TINY_MODEL_SERVER_ARGS,
    RunningServer,
    ServerLaunch,
    ServerStartError,
    start_server,
)
from sglang.srt.kv_canary.tools.tiny_model import make_tiny_eagle_draft, make_tiny_model

# Sibling modules (this directory is on sys.path when the script runs).
from cpu_contention import cpu_use, take_snapshot
from cpu_pinning import (
    SCHEDULER_TITLE,
    PinningPlan,
    pin_server,
    plan_pinning,
    plan_pinning_apart,
    process_title,
)
from server_overhead_table import (
    MEASURED,
    NOISE_NOTE,
    ConfigResult,
    Target,
    WorkloadResult,
    check_round_targets,
    check_targets,
    control_line,
    format_workload_table,
    paired_comparisons,
    round_pairs,
    ttft_distribution_line,
    workload_notes,
    workload_rows,
)
from server_workloads import (
    WORKLOADS_BY_NAME,
    BenchServer,
    RoundRunner,
    RoundTiming,
    Workload,
    run_round,
)

CONTEXT_LENGTH = 40960  # >= the longest workload (32768 + 256), Qwen3-8B's own context length
MAX_TOTAL_TOKENS = 614400  # decode64_8k runs 540672 together; the rest: earlier rounds' tails
POOL_ARGS: tuple[str, ...] = ("--context-length", str(CONTEXT_LENGTH),
                              "--max-total-tokens", str(MAX_TOTAL_TOKENS))
DISABLE_PIECEWISE_FLAG = "--disable-piecewise-cuda-graph"
READY_TIMEOUT_S = 300.0  # bound of one server start (also bounded by the time budget)
DEFAULT_TIME_BUDGET_S = 570.0
DEFAULT_REPEATS = 3  # measured rounds per workload when --repeats names none for a model
_REASON_CHARS = 240


# ----------------------------------------------------------------------------- models

@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A dummy-weight model (``tiny_model.make_tiny_model``: head_dim = hidden / heads, MLP =
    3 x hidden), its server flags, its targets, and time estimates for the budget before
    anything was measured.

    Attributes:
        server_args: flags after ``TINY_MODEL_SERVER_ARGS`` and before the configuration's.
        startup_estimate_s: launch to ready, plus stopping.
        warm_up_estimate_s: per workload, its warm-up round (longer than a measured round when
            it compiles kernels or prefills a cached prefix).
        round_estimate_s: per workload, one measured round.
    """

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    targets: tuple[Target, ...]
    startup_estimate_s: float
    warm_up_estimate_s: Mapping[str, float]
    round_estimate_s: Mapping[str, float]
    server_args: tuple[str, ...] = ()

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer in bf16 (the canary's 32-byte record not included)."""
        head_dim = self.hidden_size // self.num_attention_heads
        return self.num_layers * self.num_key_value_heads * head_dim * 2 * 2

    def describe(self) -> str:
        return (f"{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_attention_heads}/{self.num_key_value_heads} heads, "
                f"vocab {self.vocab_size}, dummy weights, "
                f"{self.kv_bytes_per_token / 1024:g} KiB of KV per token")

    def first_config_estimate_s(self, *, workloads: Sequence[Workload], repeats: int) -> float:
        """A server's whole duration before one was measured: start, stop, and every workload's
        warm-up and measured rounds."""
        return self.startup_estimate_s + sum(
            self.warm_up_estimate_s[workload.name] + repeats * self.round_estimate_s[workload.name]
            for workload in workloads)


def _all_checks_and_canary(*, throughput: float, ttft: float | None = None,
                           added_step_ms: float | None = None,
                           canary_throughput: float | None = None) -> tuple[Target, ...]:
    targets = [Target(config="all-checks", metric="tok_s", bound=throughput, at_most=False)]
    if ttft is not None:
        targets.append(Target(config="all-checks", metric="ttft", bound=ttft, at_most=True))
    if added_step_ms is not None:
        targets.append(Target(config="all-checks", metric="step_added_ms", bound=added_step_ms,
                              at_most=True))
    if canary_throughput is not None:
        targets.append(Target(config="canary", metric="tok_s", bound=canary_throughput,
                              at_most=False))
    return tuple(targets)


MODELS: dict[str, ModelShape] = {
    "8b": ModelShape(
        name="8b", architecture="qwen3", num_layers=36, hidden_size=4096, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=151936,
        # target: all checks >= 0.985x of canary off in throughput, <= 1.03x in TTFT, <= 0.1 ms
        # added per decode step at 8k-token prefixes; the canary alone >= 0.995x.
        targets=_all_checks_and_canary(throughput=0.985, ttft=1.03, added_step_ms=0.1,
                                       canary_throughput=0.995),
        # Seen on one H200: ready after 50-95 s; the 8k and 32k warm-ups prefill every prefix.
        startup_estimate_s=100.0,
        warm_up_estimate_s={"decode64": 4.5, "bs1": 3.0, "ttft1": 2.0, "prefill32": 2.0,
                            "prefill64x512": 5.5,
                            "decode64_8k": 28.0, "bs1_32k": 8.0, "admit64_8k": 20.0},
        round_estimate_s={"decode64": 2.0, "bs1": 3.0, "ttft1": 1.5, "prefill32": 2.0,
                          "prefill64x512": 5.5,
                          "decode64_8k": 10.5, "bs1_32k": 5.0, "admit64_8k": 1.5},
        server_args=(*POOL_ARGS, "--mem-fraction-static", "0.8"),
    ),
    "tiny": ModelShape(
        name="tiny", architecture="llama", num_layers=4, hidden_size=256, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=4096,
        targets=_all_checks_and_canary(throughput=0.92),  # target: all checks >= 0.92x of off
        # Seen on one H200: ready after 100 s on a fresh host (Triton compiles), 40-50 s later;
        # the first canary server compiles its kernels in its first warm-up.
        startup_estimate_s=110.0,
        warm_up_estimate_s={"decode64": 3.0, "bs1": 1.0, "ttft1": 1.0, "prefill32": 0.5,
                            "prefill64x512": 1.5,
                            "decode64_8k": 1.5, "bs1_32k": 0.5, "admit64_8k": 1.5},
        round_estimate_s={"decode64": 0.7, "bs1": 0.8, "ttft1": 0.6, "prefill32": 0.2,
                          "prefill64x512": 1.2,
                          "decode64_8k": 1.0, "bs1_32k": 0.5, "admit64_8k": 0.5},
        server_args=POOL_ARGS,
    ),
}


# ----------------------------------------------------------------------------- configurations

@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """One server configuration: its environment (over this shell's, canary variables dropped),
    its sampling backend, whether SGLang's piecewise CUDA graphs stay on, and the configuration
    its ratios compare with."""

    name: str
    env: Mapping[str, str]
    sampling_backend: str
    baseline: str | None
    piecewise_cuda_graph: bool = False

    @property
    def canary_on(self) -> bool:
        return "SGLANG_KV_CANARY_MODE" in self.env

    @property
    def uses_oracle(self) -> bool:
        return "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE" in self.env

    def to_json(self) -> dict[str, object]:
        return {"env": dict(self.env), "sampling_backend": self.sampling_backend,
                "baseline": self.baseline, "piecewise_cuda_graph": self.piecewise_cuda_graph}


_ORACLE_ENV = {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
_CANARY_ENV = {**_ORACLE_ENV, "SGLANG_KV_CANARY_MODE": "log"}
_PARTIAL_ENV = {**_CANARY_ENV, "SGLANG_KV_CANARY_REAL_DATA": "partial"}
_ALL_CHECKS_ENV = {**_PARTIAL_ENV, "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
                   "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"}
_ALL_CHECKS_STRIDE4_ENV = {**_ALL_CHECKS_ENV, "SGLANG_KV_CANARY_REAL_DATA_STRIDE": "4"}
_VERIFY_TOKEN_ENV = {**_CANARY_ENV, "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1"}
_WRITE_INPUT_ENV = {**_CANARY_ENV, "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"}
_NO_PLUGIN_ENV = {"SGLANG_PLUGINS": "kv-canary-bench-loads-no-plugin"}  # matches no plugin

CONFIGS: dict[str, ServerConfig] = {config.name: config for config in (
    ServerConfig(name="off", env={}, sampling_backend="pytorch", baseline="stock"),
    ServerConfig(name="all-checks", env=_ALL_CHECKS_ENV, sampling_backend="token_oracle",
                 baseline="off"),
    ServerConfig(name="all-checks-s4", env=_ALL_CHECKS_STRIDE4_ENV,
                 sampling_backend="token_oracle", baseline="off"),
    ServerConfig(name="canary", env=_CANARY_ENV, sampling_backend="token_oracle",
                 baseline="off"),
    ServerConfig(name="canary+partial", env=_PARTIAL_ENV, sampling_backend="token_oracle",
                 baseline="off"),
    ServerConfig(name="canary+verify-token", env=_VERIFY_TOKEN_ENV,
                 sampling_backend="token_oracle", baseline="off"),
    ServerConfig(name="canary+write-input", env=_WRITE_INPUT_ENV,
                 sampling_backend="token_oracle", baseline="off"),
    ServerConfig(name="oracle", env=_ORACLE_ENV, sampling_backend="token_oracle",
                 baseline="off"),
    ServerConfig(name="stock", env=_NO_PLUGIN_ENV, sampling_backend="pytorch",
                 baseline="stock-piecewise"),
    ServerConfig(name="stock-piecewise", env=_NO_PLUGIN_ENV, sampling_backend="pytorch",
                 baseline=None, piecewise_cuda_graph=True),
)}
BASELINES: dict[str, str | None] = {name: config.baseline for name, config in CONFIGS.items()}
# What --configs defaults to: every configuration but the two that split all-checks' token
# checks apart (``canary+verify-token``, ``canary+write-input``), which run when named.
DEFAULT_CONFIGS: tuple[str, ...] = tuple(
    name for name in CONFIGS if name not in ("canary+verify-token", "canary+write-input"))
VS_ORACLE: frozenset[str] = frozenset(
    name for name, config in CONFIGS.items() if config.canary_on)


def _without_flags(args: Sequence[str], *, flags: Collection[str]) -> tuple[str, ...]:
    """``args`` without each flag of ``flags`` and its value (the next item, unless it is a
    flag itself)."""
    kept: list[str] = []
    skipping_value = False
    for arg in args:
        if skipping_value and not arg.startswith("--"):
            skipping_value = False
            continue
        skipping_value = arg in flags
        if not skipping_value:
            kept.append(arg)
    return tuple(kept)


def launch_args(*, model: ModelShape, config: ServerConfig) -> tuple[tuple[str, ...],
                                                                    tuple[str, ...]]:
    """``(base_args, args)`` of the server's ``ServerLaunch``: ``TINY_MODEL_SERVER_ARGS``
    without the flags that the model's flags or the configuration set (and without
    ``--disable-piecewise-cuda-graph`` for a piecewise configuration), then the model's flags
    and the sampling backend. Every flag appears once."""
    args = (*model.server_args, "--sampling-backend", config.sampling_backend)
    dropped = {arg for arg in args if arg.startswith("--")}
    if config.piecewise_cuda_graph:
        dropped.add(DISABLE_PIECEWISE_FLAG)
    return _without_flags(TINY_MODEL_SERVER_ARGS, flags=dropped), args


# ----------------------------------------------------------------------------- the time budget

@dataclass(frozen=True, slots=True, kw_only=True)
class Deadline:
    end: float  # on ``clock``
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def after(cls, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(end=clock() + seconds, clock=clock)

    def remaining_s(self) -> float:
        return self.end - self.clock()

    def allows(self, estimate_s: float) -> bool:
        """Whether something expected to take ``estimate_s`` ends before the deadline."""
        return self.remaining_s() >= estimate_s

    def earlier_by(self, seconds: float) -> Deadline:
        """The same clock, ``seconds`` earlier (time kept for later work)."""
        return dataclasses.replace(self, end=self.end - seconds)


# ----------------------------------------------------------------------------- server logs

_ERROR_LINE = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
_CANARY_ERROR_LINE = re.compile(r"\b(Canary\w*Error): (.+)$")
_POOL_FIELDS = {"kv_tokens": re.compile(r"\bmax_total_num_tokens=(\d+)"),
                "max_running_requests": re.compile(r"\bmax_running_requests=(\d+)"),
                "context_len": re.compile(r"\bcontext_len=(\d+)")}
PIECEWISE_CAPTURED_LINE = "Capture piecewise CUDA graph end"


def refusal_reason(*, log_text: str, fallback: str) -> str:
    """Why a server stopped at start-up: the canary's own error line if the log has one, else
    the first ``SomeError: message`` line starting a line (a traceback's last line), else the
    first line of ``fallback``; at most ``_REASON_CHARS`` characters."""
    lines = [line.strip("\r") for line in log_text.splitlines()]
    for pattern in (_CANARY_ERROR_LINE, _ERROR_LINE):
        for line in lines:
            if match := pattern.search(line):
                return f"{match.group(1)}: {match.group(2)}"[:_REASON_CHARS]
    return (fallback.splitlines() or ["no reason given"])[0][:_REASON_CHARS]


def canary_status(*, config: ServerConfig, log_text: str) -> str:
    """``-`` without the canary; else whether it started in the configured mode, how many
    tokens its latest stats line says it checked, and how many violation lines it logged."""
    if not config.canary_on:
        return "-"
    summary = parse_canary_log(log_text)
    mode = config.env["SGLANG_KV_CANARY_MODE"]
    if not any(line.fields.get("mode") == mode for line in summary.startup):
        return "NOT RUNNING"
    latest = summary.latest_stats
    checked = ("no stats line" if latest is None
               else f"{latest.counts.get('tokens', 0)} tokens checked")
    return f"on, {checked}, {len(summary.violations)} violations"


def server_note(*, config: ServerConfig, log_text: str) -> str:
    """What the log says of the configuration's feature: the canary's status, whether the
    piecewise CUDA graphs were captured, or ``-``."""
    if config.canary_on:
        return "canary " + canary_status(config=config, log_text=log_text)
    if config.piecewise_cuda_graph:
        captured = PIECEWISE_CAPTURED_LINE in log_text
        return "piecewise CUDA graph " + ("captured" if captured else "NOT captured")
    return "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLimits:
    """What the scheduler logged of its pools (None: not found in the log)."""

    kv_tokens: int | None
    max_running_requests: int | None
    context_len: int | None


def read_pool_limits(log_text: str) -> PoolLimits:
    """The last ``max_total_num_tokens=``, ``max_running_requests=`` and ``context_len=``
    values of a server log."""
    found: dict[str, int | None] = {}
    for name, pattern in _POOL_FIELDS.items():
        values = pattern.findall(log_text)
        found[name] = int(values[-1]) if values else None
    return PoolLimits(**found)


def misfit(*, workload: Workload, limits: PoolLimits) -> str | None:
    """Why ``workload`` cannot run as one batch on a server with ``limits`` (None: it fits, or
    the limits are unknown)."""
    if limits.kv_tokens is not None and limits.kv_tokens < workload.kv_tokens:
        return (f"does not fit (KV pool {limits.kv_tokens} tokens < {workload.kv_tokens} "
                "needed)")
    if (limits.max_running_requests is not None
            and limits.max_running_requests < workload.num_requests):
        return (f"does not fit (max_running_requests {limits.max_running_requests} < "
                f"{workload.num_requests})")
    if limits.context_len is not None and limits.context_len < workload.context_tokens:
        return f"does not fit (context {limits.context_len} < {workload.context_tokens} tokens)"
    return None


# ----------------------------------------------------------------------------- measuring

@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadEstimate:
    """Expected seconds of one workload's warm-up round and of one measured round (each with
    its cache flush and payload)."""

    warm_up_s: float
    round_s: float


def measure_workload(server: BenchServer, *, workload: Workload, vocab_size: int, repeats: int,
                     deadline: Deadline, estimate: WorkloadEstimate, timeout_s: float,
                     round_runner: RoundRunner = run_round) -> WorkloadResult:
    """A warm-up round if ``estimate.warm_up_s`` is left, then up to ``repeats`` measured
    rounds, each only if the longest measured round so far (at first ``estimate.round_s``)
    still fits. Rounds are timed on the deadline's clock; ``round_runner`` is called as
    :func:`run_round`.

    Raises:
        RuntimeError: a round failed (the server answered an error or went away).
    """
    clock = deadline.clock

    def run(round_index: int) -> RoundTiming:
        return round_runner(server, workload=workload, vocab_size=vocab_size,
                            round_index=round_index, timeout_s=timeout_s, clock=clock)

    if not deadline.allows(estimate.warm_up_s):
        return WorkloadResult(
            workload=workload.name,
            status=f"skipped: time budget ({estimate.warm_up_s:.0f} s needed, "
                   f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
    started = clock()
    warm_up = run(0)
    warm_up_s = clock() - started
    rounds: list[RoundTiming] = []
    longest_round_s = 0.0
    for round_index in range(1, repeats + 1):
        if not deadline.allows(longest_round_s if rounds else estimate.round_s):
            break
        started = clock()
        rounds.append(run(round_index))
        longest_round_s = max(longest_round_s, clock() - started)
    return WorkloadResult(workload=workload.name,
                          status=_rounds_status(measured=len(rounds), repeats=repeats),
                          rounds=tuple(rounds),
                          warm_up=warm_up, warm_up_s=warm_up_s,
                          longest_round_s=longest_round_s)


def _rounds_status(*, measured: int, repeats: int) -> str:
    """A workload's status once ``measured`` of its ``repeats`` rounds ran (the warm-up did)."""
    if measured == repeats:
        return MEASURED
    if measured:
        return f"partial: time budget ({measured} of {repeats} rounds)"
    return "skipped: time budget (after the warm-up round)"

def _log_name(*, model: ModelShape, config: ServerConfig, run: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{model.name}-{config.name}-run{run}") + ".log"


def measure_config(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig, run: int,
                   workloads: Sequence[Workload], repeats: int, deadline: Deadline,
                   log_dir: pathlib.Path, estimates: Mapping[str, WorkloadEstimate],
                   round_runner: RoundRunner = run_round,
                   server_module: str = "sglang.launch_server",
                   pinning: PinningPlan | None = None) -> ConfigResult:
    """Start one server, measure every workload that fits its pools and the budget, stop it.

    ``estimates``: per workload name, what its rounds are expected to take (absent: the
    model's estimates). ``server_module`` is run with ``python -m`` (a stand-in in
    tests). ``pinning``: once the server is ready, its scheduler and the rest go where the plan
    says (:mod:`cpu_pinning`). Start and request failures become the result's status (the
    server is stopped in every case).
    """
    started = time.monotonic()
    ready_timeout_s = max(min(READY_TIMEOUT_S, deadline.remaining_s()), 1.0)
    launch = _server_launch(model=model, model_dir=model_dir, config=config, run=run,
                            log_dir=log_dir, ready_timeout_s=ready_timeout_s,
                            server_module=server_module)
    results: dict[str, WorkloadResult] = {}
    with start_server(launch) as server:
        command = tuple(launch.command(port=server.port))
        try:
            startup_s = server.wait_ready()
        except ServerStartError as error:
            return ConfigResult(config=config.name, run=run,
                                status=_start_failure(server, error=error,
                                                      ready_timeout_s=ready_timeout_s),
                                command=command, log_path=str(launch.log_path),
                                duration_s=time.monotonic() - started)
        limits = read_pool_limits(server.log_text())
        placement = "not pinned" if pinning is None else _pin(server, pinning)
        scheduler_pid = next((pid for pid in server.live_pids()
                              if process_title(pid).startswith(SCHEDULER_TITLE)), None)
        status = MEASURED
        try:
            for workload in workloads:
                why = misfit(workload=workload, limits=limits)
                if why is not None:
                    results[workload.name] = WorkloadResult(workload=workload.name,
                                                            status=f"skipped: {why}")
                    continue
                timer_lines_before = len(host_timer_lines(server.log_text()))
                cpu_before = take_snapshot(scheduler_pid=scheduler_pid)
                result = measure_workload(
                    server, workload=workload, vocab_size=model.vocab_size, repeats=repeats,
                    deadline=deadline, timeout_s=launch.request_timeout_s,
                    estimate=estimates.get(workload.name) or WorkloadEstimate(
                        warm_up_s=model.warm_up_estimate_s[workload.name],
                        round_s=model.round_estimate_s[workload.name]),
                    round_runner=round_runner)
                result = dataclasses.replace(result, cpu=cpu_use(
                    cpu_before, take_snapshot(scheduler_pid=scheduler_pid),
                    scheduler_cpus=None if pinning is None else pinning.scheduler_cpus))
                logged_meanwhile = host_timer_lines(server.log_text())[timer_lines_before:]
                if logged_meanwhile:
                    result = dataclasses.replace(result, host_timers=logged_meanwhile[-1])
                results[workload.name] = result
                if result.status != MEASURED:
                    status = "partial: time budget"
        except RuntimeError as error:  # a StreamError, or the cache flush was refused
            status = f"failed: {str(error).splitlines()[0][:_REASON_CHARS]}"
        note = server_note(config=config, log_text=server.log_text())
    return ConfigResult(config=config.name, run=run, status=status, workloads=results,
                        server_note=note, startup_s=startup_s,
                        duration_s=time.monotonic() - started, command=command,
                        log_path=str(launch.log_path), kv_pool_tokens=limits.kv_tokens,
                        max_running_requests=limits.max_running_requests, placement=placement)


def _server_launch(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig, run: int,
                   log_dir: pathlib.Path, ready_timeout_s: float,
                   server_module: str) -> ServerLaunch:
    """How one server of ``config`` is launched (its log named after the model, config, run)."""
    base_args, args = launch_args(model=model, config=config)
    return ServerLaunch(
        model_dir=model_dir, log_path=log_dir / _log_name(model=model, config=config, run=run),
        env=config.env, base_args=base_args, args=args, ready_timeout_s=ready_timeout_s,
        inherit_canary_env=False, server_module=server_module,
    )


def _start_failure(server: RunningServer, *, error: ServerStartError,
                   ready_timeout_s: float) -> str:
    """The status of a server that did not become ready."""
    if server.returncode is None:
        return f"failed: not ready within {ready_timeout_s:.0f} s"
    return "refused: " + refusal_reason(log_text=server.log_text(), fallback=str(error))


def _pin(server: RunningServer, plan: PinningPlan) -> str:
    """Pin a ready server as ``plan`` says; where its processes run, in words."""
    if pin_server(pids=server.live_pids(), plan=plan):
        return plan.describe()
    return f"not pinned: no {SCHEDULER_TITLE} process found"


@dataclass(slots=True, kw_only=True)
class _TogetherServer:
    """One server of :func:`measure_together` while it runs (mutable bookkeeping)."""

    config: ServerConfig
    run: int
    launch: ServerLaunch
    server: RunningServer
    status: str = MEASURED
    startup_s: float = 0.0
    limits: PoolLimits | None = None
    placement: str = "not pinned"
    parked: PinningPlan | None = None  # where it waits (measure_together's pinning)
    measuring: PinningPlan | None = None  # where its rounds run
    results: dict[str, WorkloadResult] = dataclasses.field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.status == MEASURED or self.status.startswith("partial")

    def fail(self, error: RuntimeError) -> None:
        self.status = f"failed: {str(error).splitlines()[0][:_REASON_CHARS]}"


def measure_together(*, model: ModelShape, model_dir: pathlib.Path,
                     plan: Sequence[tuple[ServerConfig, int]], workloads: Sequence[Workload],
                     repeats: int, deadline: Deadline, log_dir: pathlib.Path,
                     round_runner: RoundRunner = run_round,
                     server_module: str = "sglang.launch_server",
                     pinning: TogetherPinning | None = None) -> list[ConfigResult]:
    """Start every server of ``plan`` (configuration, run) at once, measure them interleaved,
    stop them all; one result per server, in ``plan`` order.

    Per workload: a warm-up round on each server, then measured round 1 on each server, round 2
    on each, and so on, the servers' order rotated by one from round to round. Every
    configuration is then measured over the same minutes, so a slow spell of the machine falls
    on all of them, and the round-by-round pairs (:func:`round_pairs`) compare rounds run
    seconds apart. What stays is each server's own speed; on the H200 host most of it was the
    vCPU its scheduler ran on, which ``pinning`` makes the same for every round. A sweep of
    warm-ups starts only if the model's warm-up estimate times the servers still fits the
    deadline, a sweep of measured rounds only if the longest sweep so
    far (at first the model's round estimate times the servers) fits. A server that fails to
    start, or whose round fails, is reported so and left out of the later rounds.
    ``pinning``: each server's scheduler waits on a core of its own (``pinning.parked``, one
    plan per server of ``plan``) and runs its rounds on the one measuring core
    (``pinning.measuring``), so that every round of every server runs on the same CPU.

    Servers share the GPU's memory: only for models whose servers fit it together (the tiny
    model's take about 2 GB each).
    """
    started = time.monotonic()
    ready_timeout_s = max(min(READY_TIMEOUT_S, deadline.remaining_s()), 1.0)
    servers: list[_TogetherServer] = []
    outcome: list[ConfigResult] = []
    with contextlib.ExitStack() as stack:
        for config, run in plan:
            launch = _server_launch(model=model, model_dir=model_dir, config=config, run=run,
                                    log_dir=log_dir, ready_timeout_s=ready_timeout_s,
                                    server_module=server_module)
            servers.append(_TogetherServer(config=config, run=run, launch=launch,
                                           server=stack.enter_context(start_server(launch))))
        for index, entry in enumerate(servers):
            try:
                entry.startup_s = entry.server.wait_ready()
            except ServerStartError as error:
                entry.status = _start_failure(entry.server, error=error,
                                              ready_timeout_s=ready_timeout_s)
                continue
            entry.limits = read_pool_limits(entry.server.log_text())
            if pinning is not None:
                entry.parked = pinning.parked[index]
                entry.measuring = pinning.measuring
                entry.placement = (
                    _pin(entry.server, entry.parked)
                    + f"; its rounds: scheduler on CPUs {_cpu_names(pinning.measuring)}")
        for workload in workloads:
            fitting = []
            for entry in servers:
                if not entry.live:
                    continue
                why = misfit(workload=workload, limits=entry.limits)
                if why is None:
                    fitting.append(entry)
                else:
                    entry.results[workload.name] = WorkloadResult(workload=workload.name,
                                                                  status=f"skipped: {why}")
            _measure_interleaved(fitting, model=model, workload=workload, repeats=repeats,
                                 deadline=deadline, round_runner=round_runner)
        for entry in servers:
            note = server_note(config=entry.config, log_text=entry.server.log_text())
            outcome.append(ConfigResult(
                config=entry.config.name, run=entry.run, status=entry.status,
                workloads=entry.results, server_note=note, startup_s=entry.startup_s,
                command=tuple(entry.launch.command(port=entry.server.port)),
                log_path=str(entry.launch.log_path),
                kv_pool_tokens=None if entry.limits is None else entry.limits.kv_tokens,
                max_running_requests=None if entry.limits is None
                else entry.limits.max_running_requests,
                placement=entry.placement if entry.startup_s else ""))
    duration_s = time.monotonic() - started
    return [dataclasses.replace(result, duration_s=duration_s) for result in outcome]


def _measure_interleaved(servers: Sequence[_TogetherServer], *, model: ModelShape,
                         workload: Workload, repeats: int, deadline: Deadline,
                         round_runner: RoundRunner) -> None:
    """One workload on ``servers`` as :func:`measure_together` says; sets each one's result."""
    if not servers:
        return
    clock = deadline.clock
    count = len(servers)
    warm_up_s = model.warm_up_estimate_s[workload.name] * count
    if not deadline.allows(warm_up_s):
        for entry in servers:
            entry.results[workload.name] = WorkloadResult(
                workload=workload.name, status=f"skipped: time budget ({warm_up_s:.0f} s "
                f"needed, {max(deadline.remaining_s(), 0.0):.0f} s left)")
        return
    timer_lines_before = {id(entry): len(host_timer_lines(entry.server.log_text()))
                          for entry in servers}
    warm_ups: dict[int, tuple[RoundTiming, float]] = {}
    rounds: dict[int, list[RoundTiming]] = {id(entry): [] for entry in servers}
    longest: dict[int, float] = {id(entry): 0.0 for entry in servers}

    def run(entry: _TogetherServer, round_index: int) -> tuple[RoundTiming, float] | None:
        if not entry.live:
            return None
        if entry.measuring is not None:
            pin_server(pids=entry.server.live_pids(), plan=entry.measuring)
        begun = clock()
        try:
            timing = round_runner(entry.server, workload=workload, vocab_size=model.vocab_size,
                                  round_index=round_index,
                                  timeout_s=entry.launch.request_timeout_s, clock=clock)
        except RuntimeError as error:  # a StreamError, or the cache flush was refused
            entry.fail(error)
            return None
        finally:
            if entry.parked is not None:
                pin_server(pids=entry.server.live_pids(), plan=entry.parked)
        return timing, clock() - begun

    for entry in servers:
        done = run(entry, 0)
        if done is not None:
            warm_ups[id(entry)] = done
    sweep_s = model.round_estimate_s[workload.name] * count
    swept = 0
    for round_index in range(1, repeats + 1):
        if not deadline.allows(sweep_s):
            break
        begun = clock()
        shift = (round_index - 1) % count
        for entry in [*servers[shift:], *servers[:shift]]:
            done = run(entry, round_index)
            if done is not None:
                rounds[id(entry)].append(done[0])
                longest[id(entry)] = max(longest[id(entry)], done[1])
        sweep_s = max(sweep_s if swept else 0.0, clock() - begun)
        swept += 1
    for entry in servers:
        measured = rounds[id(entry)]
        status = _rounds_status(measured=len(measured), repeats=repeats)
        if entry.live and status != MEASURED:
            entry.status = "partial: time budget"
        warm_up, warm_up_took = warm_ups.get(id(entry), (None, 0.0))
        logged = host_timer_lines(entry.server.log_text())[timer_lines_before[id(entry)]:]
        entry.results[workload.name] = WorkloadResult(
            workload=workload.name, status=status, rounds=tuple(measured), warm_up=warm_up,
            warm_up_s=warm_up_took, longest_round_s=longest[id(entry)],
            host_timers=logged[-1] if logged else "")


class MeasureConfig(Protocol):
    """Measures one server as :func:`measure_config` does (a stand-in in tests)."""

    def __call__(self, *, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
                 run: int, workloads: Sequence[Workload], repeats: int, deadline: Deadline,
                 log_dir: pathlib.Path,
                 estimates: Mapping[str, WorkloadEstimate]) -> ConfigResult: ...


class MeasureTogether(Protocol):
    """Measures a model's servers together as :func:`measure_together` does (a stand-in in
    tests)."""

    def __call__(self, *, model: ModelShape, model_dir: pathlib.Path,
                 plan: Sequence[tuple[ServerConfig, int]], workloads: Sequence[Workload],
                 repeats: int, deadline: Deadline, log_dir: pathlib.Path,
                 pinning: TogetherPinning | None) -> list[ConfigResult]: ...


def _measured_any(result: ConfigResult) -> bool:
    return any(measured.rounds for measured in result.workloads.values())


def run_plan(*, configs: Sequence[ServerConfig], cycles: int,
             repeat_first: bool) -> list[tuple[ServerConfig, int]]:
    """The servers of one model, (configuration, run) in start order: every configuration
    ``cycles`` times in turn (run ``k`` in cycle ``k``), then, with ``repeat_first``, one cycle
    and more than one configuration, the first configuration again as run 2."""
    plan = [(config, cycle) for cycle in range(1, cycles + 1) for config in configs]
    if repeat_first and len(configs) > 1 and cycles == 1:
        plan.append((configs[0], 2))
    return plan


def iter_model_results(*, model: ModelShape, model_dir: pathlib.Path,
                       configs: Sequence[ServerConfig], workloads: Sequence[Workload],
                       repeats: int, deadline: Deadline, log_dir: pathlib.Path,
                       repeat_first: bool, cycles: int = 1,
                       measure: MeasureConfig = measure_config) -> Iterator[ConfigResult]:
    """Each server's result, in run order: every configuration once, then (``repeat_first``
    and more than one configuration) the first configuration again as run 2. With ``cycles``
    > 1 the configurations are run ``cycles`` times in turn instead (run ``k`` in cycle ``k``;
    no repeat at the end: the later cycles show the drift).

    A server starts only if the estimate of one server is left, plus, from the third server on,
    as much again kept for the final repeat; else it is ``skipped: time budget``. The estimate is
    the duration of the last fully measured server of this model, its start-up counted as the
    quickest start-up seen so far or the model's ``startup_estimate_s``, whichever is less (a
    fresh machine's first server starts cold: the 8B model's once in 187 s against 78-103 s
    after); before any, ``model.first_config_estimate_s``. Those servers measure against a
    deadline earlier by the time kept. (The second server gets the whole budget: a comparison
    comes before the drift check.) The repeat is skipped, and no time is kept for it, when the
    first server measured nothing; it is also skipped when no other server measured anything.
    """
    repeat_planned = repeat_first and len(configs) > 1 and cycles == 1
    plan = run_plan(configs=configs, cycles=cycles, repeat_first=repeat_first)
    estimate_s = model.first_config_estimate_s(workloads=workloads, repeats=repeats)
    quickest_startup_s = model.startup_estimate_s
    estimates: dict[str, WorkloadEstimate] = {}
    first: ConfigResult | None = None
    others_measured = False
    for position, (config, run) in enumerate(plan):
        first_measured = first is not None and _measured_any(first)
        if repeat_planned and run > 1 and not (first_measured and others_measured):
            why = ("the first server of this configuration measured nothing" if not
                   first_measured else "no other server measured anything")
            yield ConfigResult(config=config.name, run=run, status=f"skipped: {why}")
            continue
        keep_s = 0.0
        if run == 1 and position >= 2 and repeat_planned and first_measured:
            keep_s = estimate_s
        if not deadline.allows(estimate_s + keep_s):
            kept = f" + {keep_s:.0f} s kept for {configs[0].name}#2" if keep_s else ""
            yield ConfigResult(config=config.name, run=run,
                               status=f"skipped: time budget ({estimate_s:.0f} s needed{kept}, "
                                      f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
            continue
        result = measure(model=model, model_dir=model_dir, config=config, run=run,
                         workloads=workloads, repeats=repeats,
                         deadline=deadline.earlier_by(keep_s), log_dir=log_dir,
                         estimates=dict(estimates))
        if first is None:
            first = result
        elif _measured_any(result):
            others_measured = True
        if result.status == MEASURED:
            quickest_startup_s = min(quickest_startup_s, result.startup_s)
            estimate_s = result.duration_s - result.startup_s + quickest_startup_s
        for name, measured in result.workloads.items():
            if measured.rounds:
                estimates[name] = WorkloadEstimate(warm_up_s=measured.warm_up_s,
                                                   round_s=measured.longest_round_s)
        yield result


def warm_start(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
               workloads: Sequence[Workload], deadline: Deadline, log_dir: pathlib.Path,
               measure: MeasureConfig = measure_config) -> str:
    """Start a throwaway server of ``config`` (run 0) and run each workload's warm-up round on
    it, no measured round, if the model's estimate of that is left in the budget; the line to
    print. The servers measured after it find this machine's Triton and SGLang kernel caches
    filled (a fresh machine's first server otherwise compiles during its measured rounds)."""
    estimate_s = model.first_config_estimate_s(workloads=workloads, repeats=0)
    if not deadline.allows(estimate_s):
        return (f"[{model.name}] warm start skipped: time budget ({estimate_s:.0f} s needed, "
                f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
    result = measure(model=model, model_dir=model_dir, config=config, run=0,
                     workloads=workloads, repeats=0, deadline=deadline, log_dir=log_dir,
                     estimates={})
    return (f"[{model.name}] warm start on a throwaway {config.name} server (not reported): "
            f"{result.status}; ready in {result.startup_s:.0f} s, done in "
            f"{result.duration_s:.0f} s; log {result.log_path}")


# ----------------------------------------------------------------------------- the report

def model_tables(*, model: ModelShape, workloads: Sequence[Workload],
                 results: Sequence[ConfigResult],
                 together: bool = False) -> dict[str, dict[str, object]]:
    """Per workload: its rows, the target verdicts, the pairs (``together``, the servers were
    measured together: the round-by-round pairs too) and the notes (what is printed)."""
    tables = {}
    for workload in workloads:
        rows = workload_rows(workload=workload, results=results, baselines=BASELINES,
                             vs_oracle=VS_ORACLE)
        by_round = (round_pairs(workload=workload, results=results, baselines=BASELINES)
                    if together else [])
        tables[workload.name] = {
            "rows": rows,
            "verdicts": check_targets(workload=workload, rows=rows, targets=model.targets),
            "pairs": paired_comparisons(workload=workload, results=results, baselines=BASELINES),
            "by_round": by_round,
            "round_verdicts": check_round_targets(by_round=by_round, targets=model.targets,
                                                  baselines=BASELINES),
            "controls": control_line(workload=workload, results=results),
            "ttft_distribution": ttft_distribution_line(workload=workload, results=results,
                                                        baselines=BASELINES),
            "notes": workload_notes(workload=workload, results=results),
        }
    return tables


def baselines_line(configs: Sequence[str]) -> str:
    """Which configuration each of ``configs`` (those of a run) is compared with."""
    pairs = []
    for name in configs:
        baseline = BASELINES[name]
        if baseline is not None:
            pairs.append(f"{name} vs {baseline}" if baseline in configs
                         else f"{name}: no baseline ({baseline} not in this run)")
    return "baselines: " + "; ".join(pairs + ["NAME#2 vs NAME#1"])


def format_model_report(*, model: ModelShape, workloads: Sequence[Workload],
                        results: Sequence[ConfigResult], repeats: int,
                        together: bool = False) -> str:
    """The printed report of one model: a title, the baselines and how noise is estimated,
    one block per workload (``together``: with the round-by-round pairs of servers measured
    together), and one note per server that was not fully measured."""
    text = [f"== {model.name}: {model.describe()}; median of {repeats} measured rounds per "
            "workload ==",
            "server args: " + " ".join(launch_args(model=model, config=CONFIGS["off"])[0]
                                       + model.server_args)
            + f" --sampling-backend (per configuration); stock-piecewise: without "
              f"{DISABLE_PIECEWISE_FLAG}",
            baselines_line(list(dict.fromkeys(result.config for result in results))),
            NOISE_NOTE, ""]
    for workload in workloads:
        table = model_tables(model=model, workloads=[workload], results=results,
                             together=together)[workload.name]
        text.append(format_workload_table(workload=workload, rows=table["rows"],
                                          verdicts=table["verdicts"], notes=table["notes"],
                                          pairs=table["pairs"], controls=table["controls"],
                                          ttft_distribution=table["ttft_distribution"],
                                          by_round=table["by_round"],
                                          round_verdicts=table["round_verdicts"]))
        text.append("")
    text += [f"server {result.label}: {result.status}"
             for result in results if result.status != MEASURED]
    return "\n".join(text).rstrip()


def progress_line(*, model: ModelShape, result: ConfigResult) -> str:
    """One line printed as soon as a server is done: per workload, the medians of its measured
    rounds."""
    parts = [f"[{model.name}] {result.label}: {result.status}"]
    if result.startup_s:
        parts.append(f"ready in {result.startup_s:.0f} s, done in {result.duration_s:.0f} s")
    if result.kv_pool_tokens is not None:
        parts.append(f"KV pool {result.kv_pool_tokens} tokens")
    for name, measured in result.workloads.items():
        if not measured.rounds:
            parts.append(f"{name} {measured.status}")
            continue
        kind = WORKLOADS_BY_NAME[name].throughput
        rounds = measured.rounds
        tok_s = statistics.median(timing.tok_s(kind) for timing in rounds)
        ttft_ms = 1e3 * statistics.median(timing.mean_ttft_s for timing in rounds)
        step_ms = statistics.median(timing.step_ms for timing in rounds)
        of = f" (median of {len(rounds)} rounds)" if len(rounds) > 1 else ""
        parts.append(f"{name} {tok_s:.0f} {kind} tok/s, TTFT {ttft_ms:.1f} ms, "
                     f"{step_ms:.3f} ms/step{of}")
    if result.server_note != "-":
        parts.append(result.server_note)
    if result.placement.startswith("not pinned:"):
        parts.append(result.placement)
    return "; ".join(parts)


# ----------------------------------------------------------------------------- the command line

@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    models: tuple[str, ...]
    configs: tuple[str, ...]
    workloads: tuple[str, ...]
    repeats: int  # measured rounds per workload of a model not in ``repeats_by_model``
    out: pathlib.Path | None
    log_dir: pathlib.Path | None
    time_budget_s: float
    repeat_first: bool
    host_timers: int = 0
    eagle_steps: int = 0
    cycles: int = 1
    pin_scheduler: bool = False
    warm_start: bool = False
    together: tuple[str, ...] = ()  # models whose servers run at once (measure_together)
    max_total_tokens: int = 0  # every server's KV pool cap (0: MAX_TOTAL_TOKENS)
    repeats_by_model: tuple[tuple[str, int], ...] = ()  # (model, rounds) named in --repeats

    def repeats_for(self, model: str) -> int:
        """Measured rounds per workload of ``model``."""
        return dict(self.repeats_by_model).get(model, self.repeats)

    def to_json(self) -> dict[str, object]:
        return {**{key: value for key, value in dataclasses.asdict(self).items()
                   if key not in ("out", "log_dir")},
                "out": None if self.out is None else str(self.out),
                "log_dir": None if self.log_dir is None else str(self.log_dir)}


def _names(parser: argparse.ArgumentParser, *, option: str, text: str,
           allowed: Sequence[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        parser.error(f"{option}={text!r} is invalid; allowed: a comma-separated list of "
                     + ", ".join(allowed))
    return names


def _repeats(parser: argparse.ArgumentParser,
             text: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """``--repeats``: the rounds of the models not named (a bare number's, else DEFAULT_REPEATS) and
    the named models' rounds, in the order given."""
    default: int | None = None  # a bare number's rounds (DEFAULT_REPEATS without one)
    by_model: dict[str, int] = {}
    for part in (part.strip() for part in text.split(",")):
        name, _, number = part.rpartition("=")
        name = name.strip()
        try:
            rounds = int(number)
        except ValueError:
            rounds = 0
        repeated = name in by_model if name else default is not None
        if (rounds < 1 or repeated or (name and name not in MODELS)
                or (not name and "=" in part)):
            parser.error(f"--repeats={text!r} is invalid; allowed: an integer >= 1, or "
                         f"MODEL=N pairs (MODEL one of {', '.join(MODELS)}, N >= 1, each model "
                         "once) separated by commas, with at most one bare integer for the "
                         "other models")
        if name:
            by_model[name] = rounds
        else:
            default = rounds
    return DEFAULT_REPEATS if default is None else default, tuple(by_model.items())


def parse_args(argv: Sequence[str] | None = None) -> BenchOptions:
    """The options; bad values exit with status 2 and a message naming the option."""
    parser = argparse.ArgumentParser(prog="bench_server_overhead.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="8b",
                        help=f"comma-separated, in run order, of {', '.join(MODELS)} "
                             "(default: 8b)")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated, in run order, of {', '.join(CONFIGS)} "
                             f"(default: {','.join(DEFAULT_CONFIGS)}: the headline comparison "
                             "first)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS_BY_NAME),
                        help=f"comma-separated, in run order, of {', '.join(WORKLOADS_BY_NAME)} "
                             "(default: all)")
    parser.add_argument("--repeats", default=str(DEFAULT_REPEATS), metavar="N|MODEL=N,...",
                        help="measured rounds per workload; the median is reported. A number, "
                             "or per model (tiny=12,8b=3; a bare number among them is the "
                             f"rounds of the models not named) (default {DEFAULT_REPEATS})")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="also write every number as JSON here (rewritten after each server)")
    parser.add_argument("--log-dir", type=pathlib.Path, default=None,
                        help="keep the server logs here (default: a new temporary directory)")
    parser.add_argument("--time-budget-s", type=float, default=DEFAULT_TIME_BUDGET_S,
                        help="start no work that would end later than this many seconds after "
                             f"the start (default {DEFAULT_TIME_BUDGET_S:.0f})")
    parser.add_argument("--repeat-first", action=argparse.BooleanOptionalAction, default=True,
                        help="start the first configuration again at the end to show drift "
                             "(default: on)")
    parser.add_argument("--host-timers", type=int, default=0, metavar="N",
                        help="time the canary's host-side functions inside every server "
                             "(benchmark/host_timers/sitecustomize.py) and print, per server "
                             "and workload, the last line of means over N forwards it logged "
                             "while the workload ran; the models' decoder layers are timed too, "
                             "as each server's process-speed control (printed per workload and "
                             "per pair) (default 0: off)")
    parser.add_argument("--eagle-steps", type=int, default=0, metavar="N",
                        help="serve every model with EAGLE speculative decoding (a one-layer "
                             "dummy draft built beside it, spec v2, topk 1, N draft steps, N + 1 "
                             "draft tokens), in every configuration (default 0: off)")
    parser.add_argument("--cycles", type=int, default=1, metavar="N",
                        help="start every configuration N times, in turn (off, all-checks, off, "
                             "all-checks, ...); a configuration's figures pool its N servers "
                             "(default 1: once each, and the first again at the end)")
    parser.add_argument("--pin-scheduler", action=argparse.BooleanOptionalAction, default=False,
                        help="once a server is ready, pin its scheduler process to the last "
                             "physical core and the rest of the server and this script to the "
                             "other CPUs (benchmark/cpu_pinning.py; default: off)")
    parser.add_argument("--together", default="", metavar="MODELS",
                        help="comma-separated models whose servers (every configuration, "
                             "--cycles times, and the repeat of the first) start at once and "
                             "are measured interleaved: per workload one round of each server "
                             "before the next round of any; for models whose servers fit the "
                             "GPU together, such as tiny (default: none)")
    parser.add_argument("--max-total-tokens", type=int, default=0, metavar="N",
                        help="every server's --max-total-tokens (its KV pool cap) instead of "
                             f"{MAX_TOTAL_TOKENS}: a small pool lets 8B servers fit one GPU "
                             "together (--together 8b) for the short workloads; a workload "
                             "that does not fit a server's pool is reported as skipped "
                             "(default 0: the full pool)")
    parser.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=False,
                        help="before the measured servers of each model, start a throwaway "
                             "server of the first configuration and run each workload's warm-up "
                             "round on it, so that a fresh machine's first measured server does "
                             "not compile kernels during its rounds; not reported (default: off)")
    namespace = parser.parse_args(argv)
    if namespace.cycles < 1:
        parser.error(f"--cycles={namespace.cycles} is invalid; allowed: an integer >= 1")
    if namespace.eagle_steps < 0:
        parser.error(f"--eagle-steps={namespace.eagle_steps} is invalid; allowed: an integer "
                     ">= 0 (0: off)")
    if namespace.host_timers < 0:
        parser.error(f"--host-timers={namespace.host_timers} is invalid; allowed: an integer "
                     ">= 0 (0: off)")
    if namespace.max_total_tokens < 0:
        parser.error(f"--max-total-tokens={namespace.max_total_tokens} is invalid; allowed: an "
                     "integer >= 1 (0: the full pool)")
    repeats, repeats_by_model = _repeats(parser, namespace.repeats)
    if not namespace.time_budget_s > 0:
        parser.error(f"--time-budget-s={namespace.time_budget_s} is invalid; allowed: > 0")
    return BenchOptions(
        models=_names(parser, option="--models", text=namespace.models, allowed=list(MODELS)),
        configs=_names(parser, option="--configs", text=namespace.configs,
                       allowed=list(CONFIGS)),
        workloads=_names(parser, option="--workloads", text=namespace.workloads,
                         allowed=list(WORKLOADS_BY_NAME)),
        repeats=repeats, repeats_by_model=repeats_by_model, out=namespace.out,
        log_dir=namespace.log_dir,
        time_budget_s=namespace.time_budget_s, repeat_first=namespace.repeat_first,
        host_timers=namespace.host_timers, eagle_steps=namespace.eagle_steps,
        cycles=namespace.cycles, pin_scheduler=namespace.pin_scheduler,
        warm_start=namespace.warm_start,
        together=_names(parser, option="--together", text=namespace.together,
                        allowed=list(MODELS)) if namespace.together else (),
        max_total_tokens=namespace.max_total_tokens,
    )



@dataclass(frozen=True, slots=True, kw_only=True)
class TogetherPinning:
    """``--pin-scheduler`` for servers measured together: the plan of the one core every
    round runs on (``measuring``) and, per server, the plan of the core its scheduler waits on
    between its rounds (``parked``); everything else of every server, and the benchmark, on
    the CPUs left (the same in every plan)."""

    measuring: PinningPlan
    parked: tuple[PinningPlan, ...]

    def describe(self) -> str:
        parked = " / ".join(_cpu_names(plan) for plan in self.parked)
        return (f"every round's scheduler on CPUs {_cpu_names(self.measuring)}, the schedulers "
                f"waiting on CPUs {parked}, the rest of the servers and the benchmark on "
                f"{','.join(map(str, sorted(self.measuring.other_cpus)))}")


def _cpu_names(plan: PinningPlan) -> str:
    return ",".join(map(str, sorted(plan.scheduler_cpus)))


def together_pinning(*, servers: int, allowed: Collection[int]) -> TogetherPinning | None:
    """The :class:`TogetherPinning` of ``servers`` on the ``allowed`` CPUs; None when they hold
    fewer than ``servers`` + 2 physical cores."""
    plans = plan_pinning_apart(allowed, servers=servers + 1)
    if plans is None:
        return None
    return TogetherPinning(measuring=plans[0], parked=tuple(plans[1:]))

HOST_TIMERS_DIR = pathlib.Path(__file__).resolve().parent / "host_timers"


# the benchmark models' decoder layers, timed as the first token's process-speed control
# (server_overhead_table.MODEL_CONTROLS); a model the run does not serve is never called
MODEL_CONTROL_TIMERS = ("sglang.srt.models.qwen3:Qwen3DecoderLayer.forward",
                        "sglang.srt.models.llama:LlamaDecoderLayer.forward")


def with_host_timers(config: ServerConfig, *, every_n_forwards: int) -> ServerConfig:
    """``config`` whose server loads ``host_timers/sitecustomize.py`` (timer lines in its log),
    timing also the models' decoder layers (:data:`MODEL_CONTROL_TIMERS`) beside any
    ``KV_CANARY_HOST_TIMERS_EXTRA`` of this script's environment."""
    python_path = os.pathsep.join(
        part for part in (str(HOST_TIMERS_DIR), os.environ.get("PYTHONPATH", "")) if part
    )
    extra = [item.strip() for item in os.environ.get("KV_CANARY_HOST_TIMERS_EXTRA", "").split(",")
             if item.strip()]
    extra += [item for item in MODEL_CONTROL_TIMERS if item not in extra]
    return dataclasses.replace(config, env={
        **config.env, "PYTHONPATH": python_path, "KV_CANARY_HOST_TIMERS": str(every_n_forwards),
        "KV_CANARY_HOST_TIMERS_EXTRA": ",".join(extra),
    })


HOST_TIMERS_MARK = "KV canary host timers over"  # starts every timer line (sitecustomize.py)


def host_timer_lines(log_text: str) -> list[str]:
    """The timer lines of a server log (see ``host_timers/sitecustomize.py``), in order, each
    from :data:`HOST_TIMERS_MARK` on (the logger's prefix cut off)."""
    return [line[line.index(HOST_TIMERS_MARK):] for line in log_text.splitlines()
            if HOST_TIMERS_MARK in line]


def last_host_timers_line(log_path: str) -> str | None:
    """The last timer line a server logged, or None (no line, or no log)."""
    try:
        text = pathlib.Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = host_timer_lines(text)
    return found[-1] if found else None


def host_timers_report(result: ConfigResult) -> list[str]:
    """``--host-timers``' lines for one server: per workload, the last timer line the server
    logged while that workload ran; when no workload has one, the server's last line."""
    lines = [f"{result.label} {name}: {measured.host_timers}"
             for name, measured in result.workloads.items() if measured.host_timers]
    if not lines:
        last = last_host_timers_line(result.log_path) if result.log_path else None
        if last is not None:
            lines = [f"{result.label}: {last}"]
    return lines


def cpu_report(result: ConfigResult) -> list[str]:
    """One line per workload of a server that read its CPU use (:mod:`cpu_contention`)."""
    return [f"{result.label} {name} cpu: {measured.cpu.describe()}"
            for name, measured in result.workloads.items() if measured.cpu is not None]


def with_pool(model: ModelShape, *, max_total_tokens: int) -> ModelShape:
    """``model`` whose servers cap their KV pool at ``max_total_tokens`` (its
    ``--max-total-tokens`` replaced)."""
    args = list(model.server_args)
    index = args.index("--max-total-tokens")
    args[index + 1] = str(max_total_tokens)
    return dataclasses.replace(model, server_args=tuple(args))


def with_eagle(model: ModelShape, *, draft_dir: pathlib.Path, steps: int) -> ModelShape:
    """``model`` served with EAGLE (spec v2, topk 1, ``steps`` draft steps) from ``draft_dir``."""
    return dataclasses.replace(model, server_args=(
        *model.server_args, "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(draft_dir),
        "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(steps + 1),
    ))


def make_model(model: ModelShape, *, directory: pathlib.Path) -> pathlib.Path:
    return make_tiny_model(
        directory=directory, architecture=model.architecture, num_layers=model.num_layers,
        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
    )


def _jsonable(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def _served(name: str, options: BenchOptions) -> ModelShape:
    """The model ``name`` as the run serves it (``--max-total-tokens``; EAGLE's draft flags are
    in each server's command line)."""
    model = MODELS[name]
    return (with_pool(model, max_total_tokens=options.max_total_tokens)
            if options.max_total_tokens else model)


def report_json(*, options: BenchOptions,
                results: Mapping[str, Sequence[ConfigResult]]) -> dict[str, object]:
    """Every number of the run so far (raw rounds, medians, ratios, noise, verdicts), the
    servers' command lines and log paths, and the settings."""
    workloads = [WORKLOADS_BY_NAME[name] for name in options.workloads]
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "options": options.to_json(),
        "noise": NOISE_NOTE,
        "workloads": {workload.name: {**dataclasses.asdict(workload),
                                      "kv_tokens": workload.kv_tokens}
                      for workload in workloads},
        "configs": {name: CONFIGS[name].to_json() for name in options.configs},
        "models": {
            name: {"shape": {**dataclasses.asdict(MODELS[name]),
                             "kv_bytes_per_token": MODELS[name].kv_bytes_per_token},
                   "server_args": {config: list(sum(launch_args(model=_served(name, options),
                                                                config=CONFIGS[config]), ()))
                                   for config in options.configs},
                   "targets": [dataclasses.asdict(target) for target in MODELS[name].targets],
                   "results": [result.to_json() for result in model_results],
                   "tables": _jsonable(model_tables(model=MODELS[name], workloads=workloads,
                                                    results=model_results,
                                                    together=name in options.together))}
            for name, model_results in results.items()
        },
    }


def main(argv: Sequence[str] | None = None, *, measure: MeasureConfig = measure_config,
         together: MeasureTogether = measure_together) -> int:
    """Run the benchmark (``measure`` measures one server: :func:`measure_config`, or a
    stand-in in tests; ``together`` the servers of a ``--together`` model:
    :func:`measure_together`, or a stand-in); always 0: missing figures are reported, never
    raised."""
    options = parse_args(argv)
    deadline = Deadline.after(options.time_budget_s)
    log_dir = options.log_dir or pathlib.Path(tempfile.mkdtemp(prefix="kv_canary_bench_logs_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    workloads = [WORKLOADS_BY_NAME[name] for name in options.workloads]
    configs = [CONFIGS[name] for name in options.configs]
    if options.host_timers:
        configs = [with_host_timers(config, every_n_forwards=options.host_timers)
                   for config in configs]
    print(f"server logs: {log_dir}; time budget {options.time_budget_s:.0f} s", flush=True)
    if options.pin_scheduler and set(options.models) - set(options.together):
        pinning = plan_pinning(os.sched_getaffinity(0))
        if pinning is None:
            print("--pin-scheduler: this process may use one physical core only; not pinning",
                  flush=True)
        else:
            print(f"--pin-scheduler: {pinning.describe()}", flush=True)
            measure = functools.partial(measure, pinning=pinning)
    results: dict[str, list[ConfigResult]] = {}
    with tempfile.TemporaryDirectory(prefix="kv_canary_bench_models_") as models_root:
        for name in options.models:
            model = _served(name, options)
            model_dir = make_model(model, directory=pathlib.Path(models_root) / name)
            if options.eagle_steps:
                draft_dir = make_tiny_eagle_draft(
                    directory=pathlib.Path(models_root) / f"{name}-eagle", target_dir=model_dir
                )
                model = with_eagle(model, draft_dir=draft_dir, steps=options.eagle_steps)
            results[name] = []
            if options.warm_start:
                print(warm_start(model=model, model_dir=model_dir, config=configs[0],
                                 workloads=workloads, deadline=deadline, log_dir=log_dir,
                                 measure=measure), flush=True)
            if name in options.together:
                plan = run_plan(configs=configs, cycles=options.cycles,
                                repeat_first=options.repeat_first)
                pinning = None
                if options.pin_scheduler:
                    pinning = together_pinning(servers=len(plan),
                                               allowed=os.sched_getaffinity(0))
                    if pinning is None:
                        print(f"--pin-scheduler: {len(plan)} servers together need "
                              f"{len(plan) + 2} physical cores; not pinning", flush=True)
                print(f"[{model.name}] {len(plan)} servers together, measured interleaved"
                      + ("" if pinning is None else f"; {pinning.describe()}"), flush=True)
                model_results: Iterable[ConfigResult] = together(
                    model=model, model_dir=model_dir, plan=plan, workloads=workloads,
                    repeats=options.repeats_for(name), deadline=deadline, log_dir=log_dir,
                    pinning=pinning)
            else:
                model_results = iter_model_results(
                    model=model, model_dir=model_dir, configs=configs, workloads=workloads,
                    repeats=options.repeats_for(name), deadline=deadline, log_dir=log_dir,
                    repeat_first=options.repeat_first, cycles=options.cycles, measure=measure,
                )
            for result in model_results:
                results[name].append(result)
                print(progress_line(model=model, result=result), flush=True)
                for line in cpu_report(result):
                    print(f"  {line}", flush=True)
                if options.host_timers:
                    for line in host_timers_report(result):
                        print(f"  {line}", flush=True)
                if options.out is not None:
                    options.out.write_text(
                        json.dumps(report_json(options=options, results=results), indent=1)
                        + "\n", encoding="utf-8")
            print("\n" + format_model_report(model=model, workloads=workloads,
                                             results=results[name],
                                             repeats=options.repeats_for(name),
                                             together=name in options.together)
                  + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
