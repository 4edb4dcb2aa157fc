"""``python -m sglang.srt.kv_canary.burnin``: see :mod:`sglang.srt.kv_canary.burnin`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sglang.srt.kv_canary.burnin.cli import parse_config
from sglang.srt.kv_canary.burnin.exit_codes import ExitCode
from sglang.srt.kv_canary.burnin.session import PREFIX, run_burnin


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), run the burn-in; its exit code."""
    config = parse_config(sys.argv[1:] if argv is None else argv)
    try:
        return int(run_burnin(config))
    except KeyboardInterrupt:
        print(f"{PREFIX} interrupted", file=sys.stderr, flush=True)
        return int(ExitCode.FAILURE)


if __name__ == "__main__":
    raise SystemExit(main())
