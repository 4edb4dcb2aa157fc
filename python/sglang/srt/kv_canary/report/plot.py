"""The ``--plot`` of the report tool: violation rows per step, one line per reason (matplotlib,
an optional dependency: imported only here, only when asked for)."""

from __future__ import annotations

import os
from collections import Counter
from types import ModuleType

from sglang.srt.kv_canary.report.reading import ReportContents


MAX_DENSE_STEPS = 200_000  # a longer span of steps is drawn as points, not every step


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def load_pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend.

    Raises:
        PlotUnavailableError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed here: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def plot_violations(contents: ReportContents, *, out: str | os.PathLike[str]) -> None:
    """Write a chart of the violation rows per step, one line per reason label (a row with
    several reasons counts under each; steps without rows at 0, or, over more than
    :data:`MAX_DENSE_STEPS` steps, only the steps with rows as points), to ``out`` (the format
    follows its suffix).

    Raises:
        PlotUnavailableError: matplotlib is not installed.
        OSError: ``out`` cannot be written.
    """
    pyplot = load_pyplot()
    per_reason: dict[str, Counter[int]] = {}
    for row in contents.violations:
        for reason in row["reasons"]:
            per_reason.setdefault(reason, Counter())[row["step"]] += 1
    figure, axes = pyplot.subplots(figsize=(10, 4))
    try:
        if per_reason:
            every = [step for counts in per_reason.values() for step in counts]
            first, last = min(every), max(every)
            for reason in sorted(per_reason):
                counts = per_reason[reason]
                if last - first < MAX_DENSE_STEPS:  # every step in between, 0 where none
                    steps = range(first, last + 1)
                    axes.plot(steps, [counts[step] for step in steps], drawstyle="steps-mid",
                              linewidth=1.0, alpha=0.8, label=reason)
                else:  # too many steps to draw each: the steps with rows, as points
                    steps = sorted(counts)
                    axes.plot(steps, [counts[step] for step in steps], linestyle="none",
                              marker=".", alpha=0.8, label=reason)
            axes.yaxis.get_major_locator().set_params(integer=True)
            axes.set_ylim(bottom=0)
            axes.legend(loc="upper left", fontsize="small")
        else:
            axes.text(0.5, 0.5, "no violation rows", ha="center", va="center",
                      transform=axes.transAxes)
        axes.set_xlabel("step")
        axes.set_ylabel("violation rows")
        axes.set_title(f"KV canary violations by reason: {os.path.basename(contents.path)}")
        figure.tight_layout()
        figure.savefig(os.fspath(out))
    finally:
        pyplot.close(figure)
