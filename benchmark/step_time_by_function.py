"""Where a configuration's added step time goes, function by function, from the host timers of an
earlier ``bench_server_overhead.py --host-timers N --out FILE.json`` run (no server, no GPU).

For every workload and every server whose configuration has a baseline in the run (``all-checks``
against ``off``; the baseline's server of the same run: ``all-checks#2`` against ``off#2``), it
prints each timed function's host time per forward, mean µs per call × calls per forward, from
the last timer line each server logged while the workload ran, side by side with the difference,
and under them the step time the client measured (ms per decode step, median of the rounds, in
µs). Functions called ``--min-calls`` to ``--max-calls`` times per forward in either server are
listed (default 0.5 to 1.5: once per step; the scheduler's idle passes and the eager-only
functions are left out), the per-forward-mode copies (``NAME[DECODE]``) too only with
``--modes``.

Read it with the nesting in mind (time SGLang's own per-step functions with
``KV_CANARY_HOST_TIMERS_EXTRA``, e.g. ``sglang.srt.managers.scheduler:Scheduler.run_batch``):

* a timer includes what runs inside it: ``Scheduler.run_batch`` holds
  ``TpModelWorker.forward_batch_generation``, which holds ``ForwardBatch.init_new`` (its canary
  hook ``CanaryRunner.on_init_new`` included), the canary's ``run_forward`` and the sampler;
* the timers wrap SGLang's functions before the plugin's ``HookRegistry`` hooks wrap them again,
  so a hooked function's timer leaves its hook out: ``ModelRunner.forward`` is timed without
  ``CanaryRunner.run_forward``'s own work (the upload, the poll, the counter label), and
  ``CudaGraphRunner.replay_prepare`` without ``on_decode_replay`` (which ``replay`` holds).

Usage: ``python benchmark/step_time_by_function.py FILE.json [--model tiny]
[--workloads bs1,decode64] [--min-calls 0.5] [--max-calls 1.5] [--modes]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from server_overhead_table import ConfigResult, TimedFunction, timer_entries  # noqa: E402


def parse_timer_line(line: str) -> dict[str, TimedFunction]:
    """The entries of one host-timer line by name (:func:`server_overhead_table.timer_entries`,
    strict: a malformed entry raises ``ValueError``)."""
    return timer_entries(line, strict=True)


def pairs_of(results: Sequence[ConfigResult],
             baselines: Mapping[str, str | None]) -> list[tuple[ConfigResult, ConfigResult]]:
    """``(server, its baseline's server of the same run)`` for every server whose configuration
    has a baseline in ``results`` (the baseline's first server when it has none of that run)."""
    by_label = {result.label: result for result in results}
    pairs = []
    for result in results:
        baseline = baselines.get(result.config)
        if baseline is None:
            continue
        label = baseline if result.run == 1 else f"{baseline}#{result.run}"
        partner = by_label.get(label) or by_label.get(baseline)
        if partner is not None:
            pairs.append((result, partner))
    return pairs


def _step_us(result: ConfigResult, workload: str) -> float | None:
    measured = result.workloads.get(workload)
    if measured is None or not measured.rounds:
        return None
    return 1e3 * statistics.median(timing.step_ms for timing in measured.rounds)


def pair_table(*, workload: str, server: ConfigResult, baseline: ConfigResult,
               min_calls: float, max_calls: float, modes: bool) -> list[str]:
    """The lines of one pair's table on ``workload`` (none when either server logged no timer
    line during it)."""
    lines = []
    mine, theirs = (
        parse_timer_line(result.workloads[workload].host_timers)
        if workload in result.workloads else {}
        for result in (server, baseline)
    )
    if not mine or not theirs:
        return lines
    names = list(theirs) + [name for name in mine if name not in theirs]
    width = max(len(name) for name in names + ["client step (median of rounds)"])
    lines.append(f"{workload}: {server.label} against {baseline.label}, µs per forward "
                 "(mean per call x calls per forward)")
    lines.append(f"  {'function':<{width}} {baseline.label:>12} {server.label:>14} {'added':>10}")
    for name in names:
        if "[" in name and not modes:
            continue
        ours, base = mine.get(name), theirs.get(name)
        calls = [entry.calls_per_forward for entry in (ours, base) if entry is not None]
        if not any(min_calls <= value <= max_calls for value in calls):
            continue
        ours_us = 0.0 if ours is None else ours.per_forward_us
        base_us = 0.0 if base is None else base.per_forward_us
        lines.append(f"  {name:<{width}} {base_us:>12.1f} {ours_us:>14.1f} "
                     f"{ours_us - base_us:>+10.1f}")
    steps = (_step_us(server, workload), _step_us(baseline, workload))
    if None not in steps:
        lines.append(f"  {'client step (median of rounds)':<{width}} {steps[1]:>12.1f} "
                     f"{steps[0]:>14.1f} {steps[0] - steps[1]:>+10.1f}")
    return lines


def report(data: Mapping[str, object], *, model: str | None, workloads: Sequence[str] | None,
           min_calls: float, max_calls: float, modes: bool) -> str:
    """Every pair's table of every chosen model and workload of one ``--out`` document.

    Raises:
        KeyError / ValueError: the document is not a ``bench_server_overhead.py --out`` file,
            or it has no model ``model``.
    """
    baselines = {name: config["baseline"] for name, config in data["configs"].items()}
    chosen = data["options"]["workloads"] if workloads is None else workloads
    models = data["models"] if model is None else {model: data["models"][model]}
    blocks = []
    for name, model_data in models.items():
        results = [ConfigResult.from_json(item) for item in model_data["results"]]
        for workload in chosen:
            for server, baseline in pairs_of(results, baselines):
                table = pair_table(workload=workload, server=server, baseline=baseline,
                                   min_calls=min_calls, max_calls=max_calls, modes=modes)
                if table:
                    blocks.append(f"[{name}] " + "\n".join(table))
    return "\n\n".join(blocks) if blocks else "no pair of servers with host-timer lines"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=pathlib.Path, help="a bench_server_overhead.py --out file")
    parser.add_argument("--model", default=None, help="one model of the file (default: all)")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated workloads (default: the run's)")
    parser.add_argument("--min-calls", type=float, default=0.5,
                        help="least calls per forward of a listed function (default 0.5)")
    parser.add_argument("--max-calls", type=float, default=1.5,
                        help="most calls per forward of a listed function (default 1.5)")
    parser.add_argument("--modes", action="store_true",
                        help="also list the per-forward-mode copies (NAME[DECODE], ...)")
    options = parser.parse_args(argv)
    if not 0 <= options.min_calls <= options.max_calls:
        parser.error(f"--min-calls={options.min_calls} --max-calls={options.max_calls} are "
                     "invalid; allowed: 0 <= --min-calls <= --max-calls")
    workloads = None if options.workloads is None else [
        name for name in options.workloads.split(",") if name]
    try:
        data = json.loads(options.file.read_text(encoding="utf-8"))
        text = report(data, model=options.model, workloads=workloads,
                      min_calls=options.min_calls, max_calls=options.max_calls,
                      modes=options.modes)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"{options.file}: not a bench_server_overhead.py --out file with that model: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
