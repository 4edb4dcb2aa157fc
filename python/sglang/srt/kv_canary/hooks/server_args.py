"""Adapters on ``sglang.srt.server_args`` (CLI process, before any model runner exists)."""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.token_oracle.sampler import register_oracle_backend_choice as _register


def register_oracle_backend_choice(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``ServerArgs.add_cli_args``: ``--sampling-backend token_oracle`` parses."""
    _register()
