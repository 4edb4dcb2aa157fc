"""The ``sglang.srt.plugins`` entry point of the KV canary.

SGLang's loader calls :func:`activate` in the CLI process, in ``Engine.__init__`` and in every
scheduler process, then applies the registered hooks. With no ``SGLANG_KV_CANARY_*`` feature
enabled it returns at once: no hook is registered and nothing beyond :mod:`.config` is imported.

SGLang's loader catches ``Exception`` from plugin functions and only logs it, which would leave a
server running without its canary. Configuration and hook-target errors are therefore raised as
:class:`CanaryStartupError`, a ``SystemExit``: ``launch_server`` stops in the CLI process, before
any model is loaded, with a short message.
"""

from __future__ import annotations

import sys

from sglang.srt.kv_canary.config import CanaryConfigError, load_config_from_environment

_ORACLE_BACKEND = "token_oracle"


class CanaryStartupError(SystemExit):
    """Stops the process with a one-line reason (a SystemExit passes SGLang's loader)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"[kv_canary] start-up refused: {reason}")


def _argv_requests_oracle_backend(argv: list[str]) -> bool:
    for index, argument in enumerate(argv):
        if argument == f"--sampling-backend={_ORACLE_BACKEND}":
            return True
        if argument == "--sampling-backend" and argv[index + 1 : index + 2] == [_ORACLE_BACKEND]:
            return True
    return False


def activate() -> None:
    """Build the configuration; register the hooks of the enabled features, or nothing."""
    try:
        config = load_config_from_environment()
    except CanaryConfigError as exc:
        raise CanaryStartupError(str(exc)) from None

    if not config.enable_token_oracle and _argv_requests_oracle_backend(sys.argv):
        raise CanaryStartupError(
            f"--sampling-backend {_ORACLE_BACKEND} needs SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1"
        )
    if not config.anything_enabled:
        return

    from sglang.srt.kv_canary.hook_targets import HookTargetError, register_hooks

    try:
        register_hooks(config)
    except HookTargetError as exc:
        raise CanaryStartupError(str(exc)) from None
