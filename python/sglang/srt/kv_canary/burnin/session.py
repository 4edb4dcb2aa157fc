"""One burn-in, start to end: the server, its facts, the workload, the run, the log, the report.

:func:`run_burnin` attaches to (or starts) the server, asks ``/server_info`` for its page size
and limits, cuts the workload to them, runs the :class:`~.driver.Driver`, waits ``settle_s``
for the server's last log lines (the canary reports a forward's rows at its next poll, which the
scheduler's idle loop also runs), reads the log, stops a started server, prints the summary to
``out`` and returns the exit code. Progress and start-up messages go to ``err``.
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import TextIO

from sglang.srt.kv_canary.burnin import target as targets
from sglang.srt.kv_canary.burnin.cli import BurninConfig
from sglang.srt.kv_canary.burnin.client import Client, ClientError
from sglang.srt.kv_canary.burnin.driver import Driver, Limits
from sglang.srt.kv_canary.burnin.exit_codes import ExitCode
from sglang.srt.kv_canary.burnin.server_log import LogFollower, read_findings
from sglang.srt.kv_canary.burnin.summary import NO_LOG, BurninReport, exit_code, render
from sglang.srt.kv_canary.burnin.workload import (
    WorkloadShape,
    actions,
    burst_tokens,
    derive_shape,
)

PREFIX = "[kv_canary burnin]"


def choose_page_size(*, asked: int | None,
                     facts: targets.ServerFacts) -> tuple[int, str, tuple[str, ...]]:
    """The page size to cut prefixes at, where it came from, and a note when the server
    disagrees with ``--page-size``."""
    if asked is not None:
        notes = ()
        if facts.page_size is not None and facts.page_size != asked:
            notes = (f"--page-size {asked} differs from the server's page size "
                     f"{facts.page_size}; prefixes are cut at {asked} as asked",)
        return asked, "--page-size", notes
    if facts.page_size is not None:
        return facts.page_size, "the server's", ()
    return 1, "default: the server did not say", ()


def _shape_notes(shape: WorkloadShape, facts: targets.ServerFacts) -> tuple[str, ...]:
    notes = []
    if not facts.available:
        notes.append("the server did not answer /server_info: the workload is sized from the "
                     "arguments alone")
    if not shape.chunked_prompts:
        notes.append("long prompts do not exceed a prefill chunk (chunked-prefill size unknown "
                     "or not below --max-prompt-tokens): chunked prefill is not exercised")
    pool = facts.max_total_num_tokens
    if pool is not None and burst_tokens(shape) < pool:
        notes.append(f"a burst of {shape.burst_requests} requests asks for about "
                     f"{burst_tokens(shape)} tokens, within the KV pool of {pool}: retraction "
                     "is unlikely (raise --burst-requests or --max-new-tokens)")
    return tuple(notes)


def _describe(target: targets.Target, facts: targets.ServerFacts) -> str:
    extra = [f"model {facts.model_path}" if facts.model_path else "",
             f"sglang {facts.version}" if facts.version else ""]
    return ", ".join([target.description, *filter(None, extra)])


def run_burnin(config: BurninConfig, *, out: TextIO | None = None, err: TextIO | None = None,
               rid_prefix: str | None = None) -> ExitCode:
    """Run one burn-in (see the module docstring); its exit code.

    ``rid_prefix`` (default ``burnin-<seed>-<random hex>``) starts every request id, so runs
    against one server never reuse an id.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    def say(message: str) -> None:
        print(f"{PREFIX} {message}", file=err, flush=True)

    try:
        target = (targets.attach(url=config.url, server_log=config.server_log)
                  if config.url is not None else
                  targets.start(config.start, request_timeout_s=config.request_timeout_s,
                                say=say))
    except targets.TargetError as error:
        say(f"the server failed to start: {error}")
        print(f"RESULT: FAILED: the server failed to start (exit {int(ExitCode.FAILURE)})",
              file=out, flush=True)
        return ExitCode.FAILURE
    with target:
        client = Client(base_url=target.base_url, timeout_s=config.request_timeout_s)
        try:
            facts = targets.facts_from_server_info(client.server_info())
        except ClientError as error:
            say(f"the server cannot be reached: {error}")
            print(f"RESULT: FAILED: the server cannot be reached (exit {int(ExitCode.FAILURE)})",
                  file=out, flush=True)
            return ExitCode.FAILURE
        page_size, page_source, notes = choose_page_size(asked=config.page_size, facts=facts)
        try:
            shape = derive_shape(
                page_size=page_size, token_ids=config.token_ids,
                max_new_tokens=config.max_new_tokens, max_prompt_tokens=config.max_prompt_tokens,
                burst_requests=config.burst_requests, chunk_tokens=facts.chunked_prefill_size,
                max_input_tokens=facts.max_req_input_len,
                kv_pool_tokens=facts.max_total_num_tokens)
        except ValueError as error:
            say(f"bad input: {error}")
            print(f"RESULT: FAILED: bad input (exit {int(ExitCode.FAILURE)})", file=out,
                  flush=True)
            return ExitCode.FAILURE
        prefix = rid_prefix or f"burnin-{config.seed}-{secrets.token_hex(3)}"
        limits = [f"{config.duration_s:g} s" if config.duration_s is not None else "",
                  f"{config.max_tokens} tokens" if config.max_tokens is not None else ""]
        say(f"burn-in of {' or '.join(filter(None, limits))}: seed {config.seed}, page size "
            f"{shape.page_size} ({page_source}), concurrency {config.concurrency}, request ids "
            f"{prefix}-*")
        follower = (LogFollower(path=target.log_path, start_offset=target.log_start_offset)
                    if target.log_path is not None else None)
        driver = Driver(
            client=client, actions=actions(shape=shape, seed=config.seed, rid_prefix=prefix),
            limits=Limits(duration_s=config.duration_s, max_tokens=config.max_tokens),
            concurrency=config.concurrency, progress_interval_s=config.progress_interval_s,
            health_interval_s=config.health_interval_s, say=say,
            server_gone=target.exit_status,
            violations_so_far=follower.violations_so_far if follower is not None else None)
        run = driver.run()
        if follower is not None:
            if not follower.wait_until_polled(timeout_s=config.settle_s):
                notes += ("no 'KV canary idle' line within --settle-s after the last answer: "
                          "the last forwards' rows may be missing",)
        else:
            time.sleep(config.settle_s)
        server_failure = target.exit_status()
        if server_failure in run.failures:
            server_failure = None  # the driver saw it go: reported once, as its failure
        findings = (read_findings(path=target.log_path, start_offset=target.log_start_offset)
                    if target.log_path is not None else None)
        description = _describe(target, facts)
    report = BurninReport(
        target=description, seed=config.seed, shape=shape,
        page_size_source=page_source, run=run, log=findings, log_note=NO_LOG,
        notes=notes + _shape_notes(shape, facts), server_failure=server_failure)
    print(render(report), file=out, flush=True)
    return exit_code(report)
