"""Adapters on ``sglang.srt.server_args`` (CLI process, before any model runner exists)."""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.config import ENV_PREFIX, LAUNCH_FLAGS

_FLAG_HELP = {
    "MODE": "none, log, abort or raise (the same setting as --kv-canary-on-violation)",
    "ON_VIOLATION": "log, abort or raise: what a violation does (turns the canary on)",
    "REAL_DATA": "none, partial or all",
    "SWEEP_INTERVAL": "an integer >= 0",
    "REPORT_PATH": "a JSON-lines file the scheduler appends every violation to",
}


def register_oracle_backend_choice(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``ServerArgs.add_cli_args``: ``--sampling-backend token_oracle`` parses."""
    from sglang.srt.kv_canary.token_oracle.sampler import register_oracle_backend_choice

    register_oracle_backend_choice()


def default_to_oracle_backend(result: None, parser: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ServerArgs.add_cli_args(parser)``, the token oracle on: ``--sampling-backend``
    defaults to ``token_oracle`` (another backend given on the command line is still refused at
    start-up, as the oracle needs its own)."""
    from sglang.srt.kv_canary.token_oracle.sampler import TOKEN_ORACLE_BACKEND

    parser.set_defaults(sampling_backend=TOKEN_ORACLE_BACKEND)


def add_launch_flags(parser: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ServerArgs.add_cli_args(parser)``: the canary's flags, in their own group. The
    plugin read them from the command line already (:func:`..config.flags_from_argv`); argparse
    only has to accept them, and SGLang's ``ServerArgs`` ignores what it does not declare."""
    group = parser.add_argument_group(
        "KV canary", "each flag stands for its SGLANG_KV_CANARY_* variable (both set: equal)"
    )
    for flag, suffix in LAUNCH_FLAGS.items():
        group.add_argument(flag, metavar="VALUE", default=None,
                           help=f"{_FLAG_HELP[suffix]}; the same as {ENV_PREFIX}{suffix}")
