"""The burn-in's report: what was sent, what came back, what the canary logged; the exit code.

Exit code (:func:`exit_code`):

* 1 (:attr:`ExitCode.VIOLATIONS`) when the log's window holds a violation row, whatever else
  happened (in raise mode the first violation stops the scheduler, and requests fail after it);
* else 2 (:attr:`ExitCode.FAILURE`) for any problem of :func:`problems`: a failed request or
  health probe, the server gone, work still in flight at the end, no request completed, or a
  log that shows the canary was not on (no ``KV canary enabled`` line) or failed its health
  check;
* else 0 (:attr:`ExitCode.CLEAN`). Without a log (``--url`` without ``--server-log``) 0 says
  only that the server served the whole workload: violations are unknown, and the report says
  so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sglang.srt.kv_canary.burnin.driver import RunStats
from sglang.srt.kv_canary.burnin.exit_codes import ExitCode
from sglang.srt.kv_canary.burnin.server_log import LogFindings
from sglang.srt.kv_canary.burnin.workload import WorkloadShape

SHOWN = 10
NO_LOG = "no --server-log given"


@dataclass(frozen=True, slots=True, kw_only=True)
class BurninReport:
    """Everything the summary shows.

    Attributes:
        target: the server, in one line.
        seed: the workload's seed.
        shape: the workload's sizes.
        page_size_source: where the page size came from.
        run: what the driver did.
        log: what the server log says (None: no log was read).
        log_note: why no log was read (when ``log`` is None).
        notes: remarks on the run (e.g. a page size that differs from the server's).
        server_failure: the server's failure outside the requests (e.g. it exited).
    """

    target: str
    seed: int
    shape: WorkloadShape
    page_size_source: str
    run: RunStats
    log: LogFindings | None
    log_note: str = NO_LOG
    notes: tuple[str, ...] = ()
    server_failure: str | None = None


def problems(report: BurninReport) -> list[str]:
    """What makes the run a failure (exit 2), violations aside."""
    run, log = report.run, report.log
    found = []
    if report.server_failure:
        found.append(report.server_failure)
    if run.failure_count:
        found.append(f"{run.failure_count} failure(s); the first: {run.failures[0]}"
                     if run.failures else f"{run.failure_count} failure(s)")
    if run.in_flight_at_end:
        found.append(f"{run.in_flight_at_end} action(s) still in flight when the wait ended")
    if run.completed == 0:
        found.append("no request completed")
    if log is not None and not log.startup:
        found.append(f"the server log {log.path} has no 'KV canary enabled' line: the canary "
                     "is not on (set SGLANG_KV_CANARY_MODE on the server)")
    if log is not None and log.health_failures:
        found.append(f"the canary failed its health check: {log.health_failures[0]}")
    return found


def exit_code(report: BurninReport) -> ExitCode:
    """The exit code of ``report`` (see the module docstring)."""
    if report.log is not None and report.log.violations:
        return ExitCode.VIOLATIONS
    if problems(report):
        return ExitCode.FAILURE
    return ExitCode.CLEAN


def _listing(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items()) or "none"


def _limit_lines(title: str, lines: list[str]) -> list[str]:
    out = [f"{title}:"] if lines else []
    out += [f"  {line}" for line in lines[:SHOWN]]
    if len(lines) > SHOWN:
        out.append(f"  ... and {len(lines) - SHOWN} more")
    return out


def render(report: BurninReport) -> str:
    """The summary text (plain lines, ending with ``RESULT: ...``)."""
    run, log, shape = report.run, report.log, report.shape
    chunks = (f"chunks of {shape.chunk_tokens}" if shape.chunk_tokens is not None
              else "chunk size unknown")
    lines = [
        "== KV canary burn-in ==",
        f"server       : {report.target}",
        f"workload     : seed {report.seed}, page size {shape.page_size} "
        f"({report.page_size_source}), prompts <= {shape.max_prompt_tokens} tokens ({chunks}), "
        f"generations <= {shape.max_new_tokens}, bursts of {shape.burst_requests}",
        f"ran          : {run.elapsed_s:.1f} s; stopped: {run.stop_reason}",
        f"actions      : {_listing(run.actions)}",
        f"requests     : {run.requests} sent ({run.sequences} sequences): {run.completed} "
        f"completed, {run.failure_count} failed",
        f"aborts       : {run.aborted + run.abort_missed}: {run.aborted} cut short, "
        f"{run.abort_missed} finished first",
        f"disconnects  : {run.disconnected}: {run.disconnected - run.disconnect_missed} left "
        f"early, {run.disconnect_missed} finished first",
        f"tokens       : {run.tokens} (prompt {run.prompt_tokens}, of them cached "
        f"{run.cached_tokens}; generated {run.generated_tokens})",
        f"flushes      : {run.flushes}: {run.flushed} flushed, {run.flush_refused} refused "
        "while requests ran",
    ]
    health = f"/health_generate {run.health_ok} ok, {run.health_failed} failed"
    if log is None:
        lines += [
            f"health       : {health}; canary health checks unknown ({report.log_note})",
            f"canary       : unknown ({report.log_note})",
            f"violations   : UNKNOWN -- {report.log_note}; the canary's 'kv_canary violation' "
            "lines are in the server's log",
        ]
    else:
        window = f"{log.path}, {log.window_bytes} bytes from the burn-in" + (
            " (the log was rewritten: read whole)" if log.restarted else "")
        lines += [
            f"log          : {window}",
            f"retractions  : {log.retractions} ({log.retracted_requests} requests retracted)",
            f"health       : {health}; canary health checks {log.health_ok} passed, "
            f"{len(log.health_failures)} failed",
            "canary       : " + (f"{log.startup[-1]} ({len(log.startup)} scheduler(s))"
                                  if log.startup else "NOT ON: no 'KV canary enabled' line"),
            f"canary stats : {log.latest_stats or 'no stats line during the burn-in'}",
            f"violations   : {len(log.violations)}",
        ]
        if log.by_reason:
            lines.append(f"  by reason  : {_listing(log.by_reason)}")
        lines += _limit_lines("violation rows", list(log.violations))
        lines += _limit_lines("canary notices", list(log.health_failures + log.notices))
    lines += _limit_lines("notes", list(report.notes))
    lines += _limit_lines("failures", list(run.failures))
    code = exit_code(report)
    found = problems(report)
    if code is ExitCode.VIOLATIONS:
        assert log is not None
        verdict = f"{len(log.violations)} violation(s)"
    elif code is ExitCode.FAILURE:
        verdict = "FAILED: " + "; ".join(found)
    elif log is None:
        verdict = f"served without failure; violations not checked ({report.log_note})"
    else:
        verdict = (f"clean: no violation, {run.completed} requests completed"
                   + (f", {log.protected} slot verifications" if log.protected is not None
                      else ""))
    lines.append(f"RESULT: {verdict} (exit {int(code)})")
    return "\n".join(lines)
