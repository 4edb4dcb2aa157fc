"""End-to-end cost of the KV canary: real servers, one per configuration, side by side in one run.

For each model (``tiny``: 4 layers, hidden 256; ``8b``: Qwen3-8B-shaped, 36 layers, hidden
4096, 32 heads, 8 KV heads, head_dim 128, MLP 12288, vocabulary 151936; dummy weights, Triton
attention, CUDA graphs) and each configuration below, this starts ``python -m
sglang.launch_server``, runs every workload once to warm up, then ``--repeats`` times measured,
and stops the server. It prints one table per model with the medians and their ratios, and the
SPEC §11 targets beside them. No assertions.

Configurations (``SGLANG_KV_CANARY_*`` of this shell never reach the servers):

- ``off``: the plugin loaded, nothing enabled; ``--sampling-backend pytorch``, temperature 0.
- ``oracle``: ``ENABLE_TOKEN_ORACLE=1``, ``--sampling-backend token_oracle``. Every configuration
  below keeps the oracle, so ``X / oracle`` isolates the canary's cost.
- ``canary``: + ``MODE=log``.
- ``canary+partial``: + ``REAL_DATA=partial``.
- ``all-checks``: + ``REAL_DATA=partial``, ``ENABLE_VERIFY_TOKEN_ASSERT=1``,
  ``ENABLE_WRITE_INPUT_ASSERT=1``.
- ``stock``: SGLang without the plugin (``SGLANG_PLUGINS`` names no installed plugin);
  ``off / stock`` is the "canary off costs nothing" check.

Workloads (prompts are random ordinary token ids, distinct per round and identical across
configurations; the radix cache is flushed before every round; ``ignore_eos``):

- ``decode64``: one batch of 64 requests, 128-token prompts, 256 new tokens (output tok/s);
- ``bs1``: 1 request, 128-token prompt, 512 new tokens (ms per decode step = wall / 512);
- ``prefill32``: 32 requests with 2048-token prompts, 8 new tokens (prompt tok/s).

A configuration that fails to start (e.g. a check not wired yet) is reported as ``refused:
<reason>`` and the run goes on. ``--time-budget-s`` bounds the whole run: a configuration is
started only if the previous one of the same model took less than what is left, a measured
round only if the warm-up round of its workload took less than what is left; whatever was
measured is printed (and written to ``--out``, after every configuration).

Usage (on a GPU host with sglang 0.5.12.post1 and sglang-kv-canary installed)::

    python benchmark/bench_server_overhead.py [--models tiny,8b] [--configs off,oracle,...]
        [--repeats 3] [--out FILE.json] [--log-dir DIR] [--time-budget-s 540]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import pathlib
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sglang.srt.kv_canary.tools.canary_log import parse_canary_log
from sglang.srt.kv_canary.tools.server import (
    TINY_MODEL_SERVER_ARGS,
    RunningServer,
    ServerLaunch,
    ServerStartError,
    start_server,
)
from sglang.srt.kv_canary.tools.tiny_model import FIRST_ORDINARY_TOKEN_ID, make_tiny_model

CONTEXT_LENGTH = 4096
MAX_ADDED_MS_PER_STEP = 0.1  # SPEC §11, all checks on
READY_TIMEOUT_S = 300.0  # bound of one server start (also bounded by the time budget)
_FLUSH_ATTEMPTS = 20
_REASON_CHARS = 240


# ----------------------------------------------------------------------------- what is measured

@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A dummy-weight model (``tiny_model.make_tiny_model``: head_dim = hidden / heads, MLP =
    3 x hidden) and what SPEC §11 asks of it."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    throughput_target: float  # all checks on vs canary off, on every workload
    first_config_estimate_s: float  # start + warm-up + rounds + stop, before one is timed
    server_args: tuple[str, ...] = ()

    def describe(self) -> str:
        return (f"{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_attention_heads}/{self.num_key_value_heads} heads, "
                f"vocab {self.vocab_size}, dummy weights")


MODELS: dict[str, ModelShape] = {
    "tiny": ModelShape(name="tiny", architecture="llama", num_layers=4, hidden_size=256,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                       throughput_target=0.92, first_config_estimate_s=90.0),
    "8b": ModelShape(name="8b", architecture="qwen3", num_layers=36, hidden_size=4096,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=151936,
                     throughput_target=0.985, first_config_estimate_s=180.0,
                     server_args=("--mem-fraction-static", "0.5")),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """One server configuration: its environment (over this shell's, canary variables dropped)
    and its sampling backend."""

    name: str
    env: Mapping[str, str]
    sampling_backend: str

    @property
    def canary_on(self) -> bool:
        return "SGLANG_KV_CANARY_MODE" in self.env


_ORACLE_ENV = {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
_CANARY_ENV = {**_ORACLE_ENV, "SGLANG_KV_CANARY_MODE": "log"}
_PARTIAL_ENV = {**_CANARY_ENV, "SGLANG_KV_CANARY_REAL_DATA": "partial"}
_ALL_CHECKS_ENV = {**_PARTIAL_ENV, "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
                   "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"}
_NO_PLUGIN = "kv-canary-bench-loads-no-plugin"  # an SGLANG_PLUGINS allow-list matching nothing

CONFIGS: dict[str, ServerConfig] = {config.name: config for config in (
    ServerConfig(name="off", env={}, sampling_backend="pytorch"),
    ServerConfig(name="oracle", env=_ORACLE_ENV, sampling_backend="token_oracle"),
    ServerConfig(name="canary", env=_CANARY_ENV, sampling_backend="token_oracle"),
    ServerConfig(name="canary+partial", env=_PARTIAL_ENV, sampling_backend="token_oracle"),
    ServerConfig(name="all-checks", env=_ALL_CHECKS_ENV, sampling_backend="token_oracle"),
    ServerConfig(name="stock", env={"SGLANG_PLUGINS": _NO_PLUGIN}, sampling_backend="pytorch"),
)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    name: str
    num_requests: int
    prompt_tokens: int
    new_tokens: int


DECODE = Workload(name="decode64", num_requests=64, prompt_tokens=128, new_tokens=256)
BS1 = Workload(name="bs1", num_requests=1, prompt_tokens=128, new_tokens=512)
PREFILL = Workload(name="prefill32", num_requests=32, prompt_tokens=2048, new_tokens=8)
WORKLOADS: tuple[Workload, ...] = (DECODE, BS1, PREFILL)


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadResult:
    """The measured rounds of one workload on one server (token counts as the server reported
    them, per round)."""

    workload: str
    num_requests: int
    wall_s: tuple[float, ...]  # one per measured round; never empty
    prompt_tokens: int
    output_tokens: int

    @property
    def median_wall_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.median_wall_s

    @property
    def prompt_tok_s(self) -> float:
        return self.prompt_tokens / self.median_wall_s

    @property
    def ms_per_step(self) -> float:
        """Wall time per generated token of one request: the decode step time at batch 1."""
        return 1e3 * self.median_wall_s * self.num_requests / self.output_tokens

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "median_wall_s": self.median_wall_s,
                "output_tok_s": self.output_tok_s, "prompt_tok_s": self.prompt_tok_s,
                "ms_per_step": self.ms_per_step}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigResult:
    """What one configuration gave. ``status``: ``measured``, ``partial: ...`` (some rounds
    left out), ``refused: ...``, ``failed: ...`` or ``skipped: ...``."""

    config: str
    status: str
    workloads: Mapping[str, WorkloadResult] = field(default_factory=dict)
    canary: str = "-"  # what the server log says of the canary (configs with MODE set)
    startup_s: float = 0.0
    duration_s: float = 0.0  # start to stop

    def to_json(self) -> dict[str, object]:
        return {"config": self.config, "status": self.status, "canary": self.canary,
                "startup_s": self.startup_s, "duration_s": self.duration_s,
                "workloads": {name: result.to_json() for name, result in self.workloads.items()}}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One table row: a configuration's medians and their ratios to ``off`` and ``oracle``
    (None where either side was not measured)."""

    config: str
    decode_tok_s: float | None
    decode_vs_off: float | None
    decode_vs_oracle: float | None
    bs1_ms_per_step: float | None
    bs1_added_ms_vs_off: float | None
    bs1_added_ms_vs_oracle: float | None
    prefill_tok_s: float | None
    prefill_vs_off: float | None
    prefill_vs_oracle: float | None
    worst_vs_oracle: float | None  # lowest throughput ratio over the three workloads
    canary: str


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


# ----------------------------------------------------------------------------- measuring

def round_payload(*, workload: Workload, vocab_size: int, round_index: int) -> dict[str, object]:
    """The ``/generate`` batch of one round: deterministic for (workload, round), so every
    configuration gets the same prompts and no two rounds share a prefix."""
    rng = random.Random(f"{workload.name}/{round_index}")
    prompts = [[rng.randrange(FIRST_ORDINARY_TOKEN_ID, vocab_size)
                for _ in range(workload.prompt_tokens)] for _ in range(workload.num_requests)]
    return {"input_ids": prompts,
            "sampling_params": {"max_new_tokens": workload.new_tokens, "temperature": 0.0,
                                "ignore_eos": True}}


def flush_radix_cache(server: RunningServer) -> None:
    """Empty the radix cache (retried: the scheduler refuses while it still holds a request).

    Raises:
        RuntimeError: still refused after ``_FLUSH_ATTEMPTS`` tries.
    """
    for _ in range(_FLUSH_ATTEMPTS):
        if server.flush_cache():
            return
        time.sleep(0.1)
    raise RuntimeError(f"/flush_cache was refused {_FLUSH_ATTEMPTS} times")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTiming:
    wall_s: float
    prompt_tokens: int  # as the server counted them
    output_tokens: int


def run_round(server: RunningServer, *, payload: Mapping[str, object],
              clock: Callable[[], float]) -> RoundTiming:
    """Send one batch on an empty radix cache and time it on ``clock`` (client side)."""
    flush_radix_cache(server)
    started = clock()
    outputs = server.generate(payload)
    wall_s = clock() - started
    return RoundTiming(
        wall_s=wall_s,
        prompt_tokens=sum(output["meta_info"]["prompt_tokens"] for output in outputs),
        output_tokens=sum(output["meta_info"]["completion_tokens"] for output in outputs),
    )


def measure_workload(server: RunningServer, *, workload: Workload, vocab_size: int,
                     repeats: int, deadline: Deadline) -> WorkloadResult | None:
    """A warm-up round, then up to ``repeats`` measured rounds, each only if the warm-up's
    time is left; None when no measured round fitted. Rounds are timed on the deadline's
    clock."""
    def run(round_index: int) -> RoundTiming:
        payload = round_payload(workload=workload, vocab_size=vocab_size,
                                round_index=round_index)
        return run_round(server, payload=payload, clock=deadline.clock)

    warm_up = run(0)
    rounds: list[RoundTiming] = []
    for round_index in range(1, repeats + 1):
        if not deadline.allows(warm_up.wall_s):
            break
        rounds.append(run(round_index))
    if not rounds:
        return None
    return WorkloadResult(workload=workload.name, num_requests=workload.num_requests,
                          wall_s=tuple(timing.wall_s for timing in rounds),
                          prompt_tokens=rounds[-1].prompt_tokens,
                          output_tokens=rounds[-1].output_tokens)


_ERROR_LINE = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
_CANARY_ERROR_LINE = re.compile(r"\b(Canary\w*Error): (.+)$")


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


def _launch(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
            log_dir: pathlib.Path, ready_timeout_s: float) -> ServerLaunch:
    return ServerLaunch(
        model_dir=model_dir, log_path=log_dir / f"{model.name}-{config.name}.log",
        env=config.env, args=(*model.server_args, "--sampling-backend", config.sampling_backend),
        ready_timeout_s=ready_timeout_s, inherit_canary_env=False,
    )


def measure_config(*, model: ModelShape, model_dir: pathlib.Path, config: ServerConfig,
                   repeats: int, deadline: Deadline, log_dir: pathlib.Path) -> ConfigResult:
    """Start one server, measure every workload, stop it. Start and request failures become
    the result's status (the server is stopped in every case)."""
    started = time.monotonic()
    ready_timeout_s = max(min(READY_TIMEOUT_S, deadline.remaining_s()), 1.0)
    launch = _launch(model=model, model_dir=model_dir, config=config, log_dir=log_dir,
                     ready_timeout_s=ready_timeout_s)
    workloads: dict[str, WorkloadResult] = {}
    with start_server(launch) as server:
        try:
            startup_s = server.wait_ready()
        except ServerStartError as error:
            if server.returncode is None:
                status = f"failed: not ready within {ready_timeout_s:.0f} s"
            else:
                status = "refused: " + refusal_reason(log_text=server.log_text(),
                                                      fallback=str(error))
            return ConfigResult(config=config.name, status=status,
                                duration_s=time.monotonic() - started)
        status = "measured"
        try:
            for workload in WORKLOADS:
                result = measure_workload(server, workload=workload, vocab_size=model.vocab_size,
                                          repeats=repeats, deadline=deadline)
                if result is not None:
                    workloads[workload.name] = result
                if result is None or len(result.wall_s) < repeats:
                    status = "partial: time budget"
                    break
        except RuntimeError as error:  # a ServerRequestError, or the cache flush was refused
            status = f"failed: {str(error).splitlines()[0][:_REASON_CHARS]}"
        canary = canary_status(config=config, log_text=server.log_text())
    return ConfigResult(config=config.name, status=status, workloads=workloads, canary=canary,
                        startup_s=startup_s, duration_s=time.monotonic() - started)


MeasureConfig = Callable[..., ConfigResult]


def iter_model_results(*, model: ModelShape, model_dir: pathlib.Path,
                       configs: Sequence[ServerConfig], repeats: int, deadline: Deadline,
                       log_dir: pathlib.Path,
                       measure: MeasureConfig = measure_config) -> Iterator[ConfigResult]:
    """Each configuration's result, in order. A configuration starts only if the last fully
    measured one of this model (at first ``model.first_config_estimate_s``) took less than
    what is left of ``deadline``; else it is ``skipped: time budget``."""
    estimate_s = model.first_config_estimate_s
    for config in configs:
        if not deadline.allows(estimate_s):
            yield ConfigResult(config=config.name,
                               status=f"skipped: time budget ({estimate_s:.0f} s needed, "
                                      f"{max(deadline.remaining_s(), 0.0):.0f} s left)")
            continue
        result = measure(model=model, model_dir=model_dir, config=config, repeats=repeats,
                         deadline=deadline, log_dir=log_dir)
        if result.status == "measured":
            estimate_s = result.duration_s
        yield result


# ----------------------------------------------------------------------------- the table

def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value / base


def _difference(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base


def table_rows(results: Sequence[ConfigResult]) -> list[Row]:
    """One row per result; ratios against the ``off`` and ``oracle`` results when present."""
    by_name = {result.config: result for result in results}

    def metric(result: ConfigResult | None, workload: Workload,
               read: Callable[[WorkloadResult], float]) -> float | None:
        measured = None if result is None else result.workloads.get(workload.name)
        return None if measured is None else read(measured)

    def decode(r: ConfigResult | None) -> float | None:
        return metric(r, DECODE, lambda w: w.output_tok_s)

    def step_ms(r: ConfigResult | None) -> float | None:
        return metric(r, BS1, lambda w: w.ms_per_step)

    def prefill(r: ConfigResult | None) -> float | None:
        return metric(r, PREFILL, lambda w: w.prompt_tok_s)

    off, oracle = by_name.get("off"), by_name.get("oracle")
    rows = []
    for result in results:
        vs_oracle = (_ratio(decode(result), decode(oracle)),
                     _ratio(step_ms(oracle), step_ms(result)),  # throughput = 1 / step time
                     _ratio(prefill(result), prefill(oracle)))
        known = [ratio for ratio in vs_oracle if ratio is not None]
        rows.append(Row(
            config=result.config,
            decode_tok_s=decode(result),
            decode_vs_off=_ratio(decode(result), decode(off)),
            decode_vs_oracle=vs_oracle[0],
            bs1_ms_per_step=step_ms(result),
            bs1_added_ms_vs_off=_difference(step_ms(result), step_ms(off)),
            bs1_added_ms_vs_oracle=_difference(step_ms(result), step_ms(oracle)),
            prefill_tok_s=prefill(result),
            prefill_vs_off=_ratio(prefill(result), prefill(off)),
            prefill_vs_oracle=vs_oracle[2],
            worst_vs_oracle=min(known) if known else None,
            canary=result.canary,
        ))
    return rows


# (header, Row attribute, number format); every column is right-aligned but the first and last.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("decode64 tok/s", "decode_tok_s", "{:.0f}"),
    ("/off", "decode_vs_off", "{:.3f}"),
    ("/oracle", "decode_vs_oracle", "{:.3f}"),
    ("bs1 ms/step", "bs1_ms_per_step", "{:.3f}"),
    ("+ms/off", "bs1_added_ms_vs_off", "{:+.3f}"),
    ("+ms/oracle", "bs1_added_ms_vs_oracle", "{:+.3f}"),
    ("prefill tok/s", "prefill_tok_s", "{:.0f}"),
    ("/off", "prefill_vs_off", "{:.3f}"),
    ("/oracle", "prefill_vs_oracle", "{:.3f}"),
    ("worst/oracle", "worst_vs_oracle", "{:.3f}"),
)


def format_table(*, model: ModelShape, results: Sequence[ConfigResult], repeats: int) -> str:
    """The table of one model: a title, a header, one row per configuration, the SPEC §11
    targets, and one note per configuration that was not fully measured."""
    rows = table_rows(results)
    name_width = max([len("config")] + [len(row.config) for row in rows])
    cells = [[("-" if getattr(row, attribute) is None
               else template.format(getattr(row, attribute)))
              for _, attribute, template in _COLUMNS] for row in rows]
    widths = [max([len(header)] + [len(line[index]) for line in cells])
              for index, (header, _, _) in enumerate(_COLUMNS)]

    def line(name: str, values: Sequence[str], canary: str) -> str:
        numbers = "  ".join(value.rjust(width) for value, width in zip(values, widths))
        return f"{name.ljust(name_width)}  {numbers}  {canary}".rstrip()

    text = [f"== {model.name}: {model.describe()}; median of {repeats} ==",
            line("config", [header for header, _, _ in _COLUMNS], "canary")]
    text += [line(row.config, values, row.canary) for row, values in zip(rows, cells)]
    text.append(f"targets (SPEC 11): all-checks >= {model.throughput_target:.3f}x of canary "
                f"off on every workload (worst/oracle), <= +{MAX_ADDED_MS_PER_STEP:.3f} "
                "ms/step (+ms/oracle); off = 1.000x of stock")
    text += [f"note: {result.config}: {result.status}"
             for result in results if result.status != "measured"]
    return "\n".join(text)


def progress_line(*, model: ModelShape, result: ConfigResult) -> str:
    """One line printed as soon as a configuration is done."""
    parts = [f"[{model.name}] {result.config}: {result.status}"]
    if result.startup_s:
        parts.append(f"ready in {result.startup_s:.0f} s, done in {result.duration_s:.0f} s")
    measured = result.workloads
    if DECODE.name in measured:
        parts.append(f"decode64 {measured[DECODE.name].output_tok_s:.0f} tok/s")
    if BS1.name in measured:
        parts.append(f"bs1 {measured[BS1.name].ms_per_step:.3f} ms/step")
    if PREFILL.name in measured:
        parts.append(f"prefill32 {measured[PREFILL.name].prompt_tok_s:.0f} tok/s")
    if result.canary != "-":
        parts.append(f"canary {result.canary}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- the command line

@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    models: tuple[str, ...]
    configs: tuple[str, ...]
    repeats: int
    out: pathlib.Path | None
    log_dir: pathlib.Path | None
    time_budget_s: float


def _names(parser: argparse.ArgumentParser, *, option: str, text: str,
           allowed: Sequence[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        parser.error(f"{option}={text!r} is invalid; allowed: a comma-separated list of "
                     + ", ".join(allowed))
    return names


def parse_args(argv: Sequence[str] | None = None) -> BenchOptions:
    """The options; bad values exit with status 2 and a message naming the option."""
    parser = argparse.ArgumentParser(prog="bench_server_overhead.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, in run order, of {', '.join(CONFIGS)} "
                             "(default: all)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measured rounds per workload; the median is reported (default 3)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="also write every number as JSON here")
    parser.add_argument("--log-dir", type=pathlib.Path, default=None,
                        help="keep the server logs here (default: a new temporary directory)")
    parser.add_argument("--time-budget-s", type=float, default=540.0,
                        help="stop starting new work after this many seconds (default 540)")
    namespace = parser.parse_args(argv)
    if namespace.repeats < 1:
        parser.error(f"--repeats={namespace.repeats} is invalid; allowed: an integer >= 1")
    if not namespace.time_budget_s > 0:
        parser.error(f"--time-budget-s={namespace.time_budget_s} is invalid; allowed: > 0")
    return BenchOptions(
        models=_names(parser, option="--models", text=namespace.models, allowed=list(MODELS)),
        configs=_names(parser, option="--configs", text=namespace.configs,
                       allowed=list(CONFIGS)),
        repeats=namespace.repeats, out=namespace.out, log_dir=namespace.log_dir,
        time_budget_s=namespace.time_budget_s,
    )


def make_model(model: ModelShape, *, directory: pathlib.Path) -> pathlib.Path:
    return make_tiny_model(
        directory=directory, architecture=model.architecture, num_layers=model.num_layers,
        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
    )


def report_json(*, options: BenchOptions,
                results: Mapping[str, Sequence[ConfigResult]]) -> dict[str, object]:
    """Every number of the run so far (raw rounds, medians, table rows) and its settings."""
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "base_server_args": list(TINY_MODEL_SERVER_ARGS),
        "repeats": options.repeats,
        "workloads": [dataclasses.asdict(workload) for workload in WORKLOADS],
        "configs": {name: {"env": dict(CONFIGS[name].env),
                           "sampling_backend": CONFIGS[name].sampling_backend}
                    for name in options.configs},
        "models": {
            name: {"shape": dataclasses.asdict(MODELS[name]),
                   "results": [result.to_json() for result in model_results],
                   "table": [dataclasses.asdict(row) for row in table_rows(model_results)]}
            for name, model_results in results.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    deadline = Deadline.after(options.time_budget_s)
    log_dir = options.log_dir or pathlib.Path(tempfile.mkdtemp(prefix="kv_canary_bench_logs_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"server logs: {log_dir}", flush=True)
    results: dict[str, list[ConfigResult]] = {}
    with tempfile.TemporaryDirectory(prefix="kv_canary_bench_models_") as models_root:
        for name in options.models:
            model = MODELS[name]
            model_dir = make_model(model, directory=pathlib.Path(models_root) / name)
            results[name] = []
            for result in iter_model_results(
                model=model, model_dir=model_dir,
                configs=[CONFIGS[config] for config in options.configs],
                repeats=options.repeats, deadline=deadline, log_dir=log_dir,
            ):
                results[name].append(result)
                print(progress_line(model=model, result=result), flush=True)
                if options.out is not None:
                    options.out.write_text(
                        json.dumps(report_json(options=options, results=results), indent=1)
                        + "\n", encoding="utf-8")
            print("\n" + format_table(model=model, results=results[name],
                                      repeats=options.repeats) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
