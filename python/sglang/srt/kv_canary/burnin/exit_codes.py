"""The burn-in's exit codes (one place: the CLI, the summary and the docs agree on them)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What ``python -m sglang.srt.kv_canary.burnin`` returns."""

    CLEAN = 0  # the workload ran and no violation was logged (or no log was read: see summary)
    VIOLATIONS = 1  # the server log holds at least one violation row from the burn-in's window
    FAILURE = 2  # bad input, or the server failed (start, request, health probe, exit)
