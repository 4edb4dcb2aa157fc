"""Start-up hooks: the one line each scheduler process logs, and the check that every hook the
enabled features need is in place when a model runner initializes."""

from __future__ import annotations

import logging

from sglang.srt.kv_canary.config import get_active_config
from sglang.srt.kv_canary.hook_targets import verify_hooks_applied

logger = logging.getLogger("sglang.srt.kv_canary")


def log_startup_line(*args: object, **kwargs: object) -> None:
    """BEFORE ``Scheduler.__init__``: log what is enabled (mode, checks, perturbations)."""
    logger.info(get_active_config().describe())


def check_hooks_at_model_runner_init(*args: object, **kwargs: object) -> None:
    """BEFORE ``ModelRunner.initialize``: raise if a registered hook is not wrapping its target."""
    verify_hooks_applied()
