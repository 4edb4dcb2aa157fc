"""The ``sglang.srt.plugins`` entry point of the KV canary.

SGLang's loader calls :func:`activate` in the CLI process, in ``Engine.__init__`` and in every
scheduler process, then applies the registered hooks. With no ``SGLANG_KV_CANARY_*`` feature
enabled and no canary flag on the command line it returns at once: no hook is registered and
nothing beyond :mod:`.config` is imported. A canary flag alone, or ``--help``, registers the one
hook that makes ``launch_server``'s parser accept the flags.

SGLang's loader catches ``Exception`` from plugin functions and only logs it, which would leave a
server running without its canary. Every failure here is therefore raised as
:class:`CanaryStartupError`, a ``SystemExit``: ``launch_server`` stops in the CLI process, before
any model is loaded, with a short message. Registration is all or nothing (see
:mod:`.hook_registration`), and ``ModelRunner.initialize`` checks again that every hook the
configuration needs is in place.
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
    """Build the configuration; register the hooks of the enabled features, or nothing.

    Raises:
        CanaryStartupError: invalid configuration, a missing hook target, an adapter that cannot
            be imported, or any other failure while registering.
    """
    try:
        config = load_config_from_environment(argv=sys.argv[1:])
    except CanaryConfigError as exc:
        raise CanaryStartupError(str(exc)) from None

    if not config.enable_token_oracle and _argv_requests_oracle_backend(sys.argv):
        raise CanaryStartupError(
            f"--sampling-backend {_ORACLE_BACKEND} needs SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1"
        )
    if not config.anything_enabled and not config.launch_flags:
        return

    try:
        from sglang.srt.kv_canary.hook_registration import register_hooks

        register_hooks(config)
    except Exception as exc:  # noqa: BLE001 - anything here would leave the server unchecked
        raise CanaryStartupError(f"{type(exc).__name__}: {exc}") from exc
