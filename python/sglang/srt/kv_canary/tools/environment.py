"""The environment of the processes the tools start (servers, the CPU self-check).

The one place of the package that copies ``os.environ``: a child process inherits this
process's environment, with ``SGLANG_KV_CANARY_*`` variables kept only when asked, plus
explicit overrides. Configuration itself is read only by :mod:`sglang.srt.kv_canary.config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CANARY_ENV_PREFIX = "SGLANG_KV_CANARY_"


def child_environment(*, overrides: Mapping[str, str], inherit_canary_env: bool) -> dict[str, str]:
    """This process's environment (canary variables only if ``inherit_canary_env``) updated
    with ``overrides``."""
    environment = {
        name: value for name, value in os.environ.items()
        if inherit_canary_env or not name.startswith(CANARY_ENV_PREFIX)
    }
    environment.update(overrides)
    return environment
