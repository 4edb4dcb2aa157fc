"""Adapters on SGLang's scheduler."""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.kv_canary.config import get_active_config
from sglang.srt.kv_canary.runner.canary_runner import canary_runners_of_scheduler, runner_of

logger = logging.getLogger("sglang.srt.kv_canary")


def log_startup_line(scheduler: Any, server_args: Any = None, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.__init__(server_args, ...)``: one line saying what is enabled (with
    the token oracle, the sampling backend in use: ``token_oracle`` unless the command line
    chose another, which the model runner then refuses)."""
    config = get_active_config()
    line = config.describe()
    server_args = kwargs.get("server_args", server_args)
    if config.enable_token_oracle and server_args is not None:
        line += f" sampling_backend={server_args.sampling_backend}"
    logger.info(line)


def after_init_cache(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.init_cache_with_memory_pool``: the radix sweep walks the tree cache."""
    runner_of(scheduler.tp_worker.model_runner).attach_radix_cache(scheduler.tree_cache)


def poll_when_idle(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulerRuntimeCheckerMixin.on_idle``: report violations while nothing runs."""
    for runner in canary_runners_of_scheduler(scheduler):
        runner.on_idle()
