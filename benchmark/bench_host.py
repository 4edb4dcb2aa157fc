"""Host (CPU) cost per forward of the KV canary's hooks, on the one simulator of a serving loop.

On a small model a server's forward is bound by the scheduler's Python, so every microsecond
the canary's hooks add per forward shows in throughput and time to first token. This drives the
self-check's simulated server (``sglang.srt.kv_canary.selfcheck.simulation``; SGLang's CPU pools,
real ``ForwardBatch`` objects) with the canary installed as a server installs it, through the
hook adapters a server registers (``ForwardBatch.init_new``, ``ModelRunner.forward`` with the
canary's wrapper of ``model.forward``, ``ModelRunner.sample``), and times their host work per
unit (``harness/host_modes.py``): a steady decode step at batch 1 and 64, an extend forward of
16 x 512 fresh tokens, a whole batch-1 request (prefill and one decode step). Kernel launches
are stubbed, left out and counted (``harness/simulated.py``); a decode step leaves out the
in-model launches' host work, which a server's CUDA graph replay does not run (the JSON keeps
it, ``in_model_us``).

Configurations (``harness/configs.py``): the canary configurations of the server benchmark, their
``SGLANG_KV_CANARY_*`` variables parsed by the package's own configuration layer. Rounds are
interleaved: each round times every configuration in turn, ``units_per_round`` units each; a
round's figure is the median over its units; the table gives the median over rounds ± half their
range, and each configuration's ratio to the first, paired by round.

Writes ``OUT/host.json`` and ``OUT/host.txt``. Runs on any machine (no GPU): compare figures of
one machine; name it with ``--machine-label``.

Usage: ``python benchmark/bench_host.py [--modes decode1,decode64,prefill,request1]
[--configs canary,all-checks] [--rounds 7] [--out DIR] [--machine-label TEXT]``
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import options  # noqa: E402
from harness.configs import CANARY_CONFIGS, CONFIGS  # noqa: E402
from harness.host_modes import MODES  # noqa: E402
from harness.host_rounds import measure_mode  # noqa: E402
from harness.results import describe_machine, machine, write_result_set  # noqa: E402
from harness.stats import paired_ratios, spread  # noqa: E402
from harness.table import Table, ratio_cell, value_cell  # noqa: E402


DEFAULT_ROUNDS = 7


def _series(measured: Mapping[str, list[dict[str, float]]], name: str) -> list[float]:
    return [figures["server_us"] for figures in measured[name]]


def format_text(*, results: Mapping[str, Mapping[str, list[dict[str, float]]]],
                configs: Sequence[str], rounds: int, description: Mapping[str, object]) -> str:
    """The short text of the result set."""
    first = configs[0]
    header = ["mode", "unit", *(f"{name} µs" for name in configs),
              *(f"{name} x {first}" for name in configs[1:]), "launches"]
    rows = []
    for mode_name, measured in results.items():
        mode = MODES[mode_name]
        values = [value_cell(spread(_series(measured, name)), digits=1) for name in configs]
        ratios = [ratio_cell(paired_ratios(numerators=_series(measured, name),
                                           denominators=_series(measured, first)))
                  for name in configs[1:]]
        launches = " / ".join(f"{statistics.median(f['launches'] for f in measured[name]):g}"
                              for name in configs)
        rows.append((mode_name, mode.unit, *values, *ratios, launches))
    return "\n".join([
        "host: the canary's host work in µs per unit on the CPU simulator of a serving loop, "
        "kernel launches stubbed and left out (counted: launches, per configuration)",
        f"machine: {describe_machine(description)}",
        "configurations: " + "; ".join(f"{name} = {CONFIGS[name].summary}" for name in configs),
        f"{rounds} rounds, interleaved; a round's figure is the median over its units; median "
        "over rounds ± half their interquartile range; ratios paired by round",
        "decode steps leave out the in-model launches' host work (a server replays them in a "
        "CUDA graph; JSON in_model_us) and SGLang's graph-replay hooks, which the simulator "
        "does not run; the radix sweep needs SGLang's radix cache, which the simulator has "
        "not",
        "",
        Table(header=tuple(header), rows=tuple(rows), label_columns=2).render(indent="  "),
    ] + [f"  {name}: {MODES[name].summary}" for name in results])


def report_json(*, results: Mapping[str, Mapping[str, list[dict[str, float]]]],
                configs: Sequence[str], rounds: int,
                description: Mapping[str, object]) -> dict[str, object]:
    """Every figure of the result set, the settings and the machine."""

    return {
        "benchmark": "host",
        "machine": dict(description),
        "rounds": rounds,
        "configs": {name: CONFIGS[name].to_json() for name in configs},
        "modes": {
            mode_name: {
                "summary": MODES[mode_name].summary, "unit": MODES[mode_name].unit,
                "units_per_round": MODES[mode_name].units_per_round,
                "configs": {name: {"rounds": measured[name],
                                   "server_us": spread(_series(measured, name)).to_json()}
                            for name in configs},
                "ratios": {f"{name} x {configs[0]}": paired_ratios(
                    numerators=_series(measured, name),
                    denominators=_series(measured, configs[0])).to_json()
                    for name in configs[1:]},
            }
            for mode_name, measured in results.items()
        },
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_host.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES),
                        type=options.names(option="--modes", allowed=tuple(MODES)),
                        help=f"comma-separated (default {','.join(MODES)})")
    parser.add_argument("--configs", default=",".join(CANARY_CONFIGS),
                        type=options.names(option="--configs", allowed=CANARY_CONFIGS),
                        help="comma-separated; ratios are to the first (default "
                             f"{','.join(CANARY_CONFIGS)})")
    parser.add_argument("--rounds", default=DEFAULT_ROUNDS,
                        type=options.integer(option="--rounds", minimum=1),
                        help=f"interleaved rounds per mode (default {DEFAULT_ROUNDS})")
    options.add_result_arguments(parser, result_sets="host.{json,txt}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    description = machine(label=args.machine_label)
    quiet = logging.getLogger("sglang")  # the canary's start-up lines and memory notes
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        results = {name: measure_mode(MODES[name], configs=args.configs, rounds=args.rounds)
                   for name in args.modes}
    finally:
        quiet.setLevel(level)
    text = format_text(results=results, configs=args.configs, rounds=args.rounds,
                       description=description)
    paths = write_result_set(out_dir=args.out, name="host", text=text,
                             document=report_json(results=results, configs=args.configs,
                                                  rounds=args.rounds, description=description))
    print(f"{text}\n(written: {', '.join(map(str, paths))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
