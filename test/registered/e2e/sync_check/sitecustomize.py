"""The CUDA sync check of a real server: does the KV canary ever make the host wait for the device?

Put this folder first on ``PYTHONPATH`` and set ``KV_CANARY_SYNC_CHECK=1``: the process that
serves turns on torch's CUDA sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) once the
canary's start-up is over (``CanaryRunner.on_serving_start``, after the graphs are captured), and
counts every synchronizing call torch reports by the Python line that made it: a line in a
``kv_canary`` module is the canary's (its first call is logged at once with its stack), any other
line is SGLang's own. Every 256 forwards the process logs ``KV canary sync check over N forwards:
canary C, elsewhere E`` with the canary lines seen. torch does not report every sync (a copy from
pageable host memory, ``Event.synchronize``): zero means none of the kinds it reports.

Used by ``test/registered/e2e/test_host_sync_e2e.py``; never imported by the package itself.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import traceback
import warnings


def _resolve(module_name: str, path: str):
    """(holder, attribute) of ``module:path``, or None where the installed code lacks it."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a module this SGLang does not have
        return None
    owner, _, attribute = path.rpartition(".")
    holder = getattr(module, owner, None) if owner else module
    if holder is None or not hasattr(holder, attribute):  # another version
        return None
    return holder, attribute



SYNC_CHECK_EVERY = 256  # forwards between two sync-check log lines
_SYNC_MESSAGE = "called a synchronizing CUDA operation"


class _SyncCheck:
    """Counts the synchronizing calls torch's sync debug mode reports, by calling line."""

    def __init__(self) -> None:
        self.canary: dict[str, int] = {}
        self.elsewhere = 0
        self.forwards = 0
        self._show = warnings.showwarning

    def start(self) -> None:
        import torch

        warnings.filterwarnings("always", message=f".*{_SYNC_MESSAGE}")
        warnings.showwarning = self._on_warning
        torch.cuda.set_sync_debug_mode("warn")
        logging.getLogger("kv_canary_sync_check").warning(
            "KV canary sync check: CUDA sync debug mode on"
        )

    def stop(self) -> None:
        """Sync debug mode off and the warning display restored (for a check in a test)."""
        import torch

        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if _SYNC_MESSAGE not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        if "kv_canary" not in filename:
            self.elsewhere += 1
            return None
        site = f"{filename}:{lineno}"
        if site not in self.canary:
            stack = "".join(traceback.format_stack(limit=12)[:-1])
            logging.getLogger("kv_canary_sync_check").warning(
                f"KV canary sync check: canary code synchronized at {site}:\n{stack}"
            )
        self.canary[site] = self.canary.get(site, 0) + 1
        return None

    def count_forward(self) -> None:
        self.forwards += 1
        if self.forwards % SYNC_CHECK_EVERY == 0:
            sites = ", ".join(f"{site} x{count}" for site, count in self.canary.items())
            logging.getLogger("kv_canary_sync_check").warning(
                f"KV canary sync check over {self.forwards} forwards: canary "
                f"{sum(self.canary.values())}, elsewhere {self.elsewhere}"
                + (f" ({sites})" if sites else "")
            )


def _install_sync_check() -> None:
    check = _SyncCheck()
    serving = _resolve("sglang.srt.kv_canary.runner.canary_runner", "CanaryRunner.on_serving_start")
    forward = _resolve("sglang.srt.model_executor.model_runner", "ModelRunner.forward")
    if serving is None or forward is None:  # not a process that serves
        return
    on_serving_start = getattr(*serving)
    model_forward = getattr(*forward)

    @functools.wraps(on_serving_start)
    def start_then_check(*args, **kwargs):
        result = on_serving_start(*args, **kwargs)
        check.start()
        return result

    @functools.wraps(model_forward)
    def counted(*args, **kwargs):
        try:
            return model_forward(*args, **kwargs)
        finally:
            check.count_forward()

    setattr(serving[0], serving[1], start_then_check)
    setattr(forward[0], forward[1], counted)


def sync_check_enabled(value: str) -> bool:
    """``KV_CANARY_SYNC_CHECK``: ``1`` on, ``0`` or empty off.

    Raises:
        ValueError: any other value, naming the variable and what is allowed.
    """
    if value not in ("", "0", "1"):
        raise ValueError(f"KV_CANARY_SYNC_CHECK={value!r} is invalid; allowed: 1 (on), 0 or "
                         "empty (off)")
    return value == "1"


if sync_check_enabled(os.environ.get("KV_CANARY_SYNC_CHECK", "")):
    _install_sync_check()
