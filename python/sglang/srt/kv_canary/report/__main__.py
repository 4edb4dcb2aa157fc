"""``python -m sglang.srt.kv_canary.report FILE [--plot OUT.png] [--top N]``: the summary of a
report file (``SGLANG_KV_CANARY_REPORT_PATH``), and a chart of its violations over steps.

Exit status: 0 on success; 2 on bad usage, a file that cannot be read or holds a line that is
not a report object (the error names the line), or ``--plot`` without matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sglang.srt.kv_canary.report.plot import PlotUnavailableError, load_pyplot, plot_violations
from sglang.srt.kv_canary.report.reading import ReportFormatError, read_report
from sglang.srt.kv_canary.report.summary import format_summary, summarize

PROGRAM = "python -m sglang.srt.kv_canary.report"
EXIT_OK = 0
EXIT_BAD_INPUT = 2  # as argparse's usage errors


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Summarize a KV canary report file (SGLANG_KV_CANARY_REPORT_PATH): "
                    "violation rows by reason, check and request, first and last step.",
    )
    parser.add_argument("file", help="the JSON-lines report file")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="also write a chart of violations over steps by reason "
                             "(needs matplotlib)")
    parser.add_argument("--top", metavar="N", type=int, default=20,
                        help="requests listed in the by-request table (0: all; default 20)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        if args.plot is not None:
            load_pyplot()  # before reading: a missing matplotlib fails at once
        contents = read_report(args.file)
        print(format_summary(summarize(contents), max_requests=max(args.top, 0)))
        if args.plot is not None:
            plot_violations(contents, out=args.plot)
            print(f"plot written to {args.plot}")
    except (ReportFormatError, PlotUnavailableError) as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # the plot's output file
        print(f"{PROGRAM}: error: cannot write {args.plot}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
