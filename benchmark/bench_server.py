"""What the KV canary costs a real SGLang server: every configuration side by side on one GPU.

For each model (``tiny``, a 4-layer Llama; ``8b``, the Qwen3-8B shape; ``tiny-swa``, a 4-layer
GPT-OSS served on SGLang's hybrid sliding-window pool; dummy weights; ``harness/models.py``) one
``python -m sglang.launch_server`` per configuration (``stock`` SGLang with its default flags,
``off``: the plugin loaded and nothing enabled, ``off+flags``: off with the flags the canary
needs, ``canary``: ``SGLANG_KV_CANARY_MODE=log``, ``all-checks``: every check; see
``harness/configs.py``). Every server of every model starts at once; then each model's servers
are measured in interleaved rounds (every configuration's round k within seconds of the others')
and stopped. Workloads (``harness/workloads.py``): time to first token at batch 1 (``ttft1``) and
of 64 prompts arriving together (``ttft64``), decode throughput at batch 1 and 64 (``decode1``,
``decode64``), prompt tokens per second of a prefill-heavy batch (``prefill``).

Prints and writes, per model, ``OUT/server-MODEL.txt`` (the ratios to stock paired by round,
with their spread; the canary's own cost over ``off+flags``; the targets; every server's status)
and ``OUT/server-MODEL.json`` (every round, the command lines, the machine). The whole run, the
servers' start-ups included, ends within ``--time-budget-s``. A canary server that logged a
violation or did not start its canary, a server that failed, or a ``tiny-swa`` server without
a sliding-window pool is reported as a PROBLEM line and the exit status is 1.

The default run measures ``tiny`` and ``8b``; ``tiny-swa`` is opt-in, on its own
(``--models tiny-swa``, the whole budget for its five servers): beside the other ten servers it
would slow every start-up and leave each model less measuring time within the default budget.

Usage (a GPU host with sglang 0.5.12.post1 and this package installed)::

    python benchmark/bench_server.py [--models tiny,8b | tiny-swa] [--configs stock,off,...]
        [--workloads ttft1,...] [--max-rounds 20] [--time-budget-s 540] [--out DIR]
        [--log-dir DIR] [--machine-args '--attention-backend triton ...'] [--no-pause-idle]
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
import tempfile
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import options  # noqa: E402
from harness.configs import CONFIGS  # noqa: E402
from harness.models import DEFAULT_MODELS, MODELS  # noqa: E402
from harness.results import machine, write_result_set  # noqa: E402
from harness.server_report import ModelReport, format_report, report_json  # noqa: E402
from harness.server_run import ServerRun, run_servers  # noqa: E402
from harness.servers import COMMON_ARGS, MACHINE_ARGS  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402

DEFAULT_TIME_BUDGET_S = 540.0
DEFAULT_MAX_ROUNDS = 20


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options; a bad value exits with status 2, naming the option, the value and what is
    allowed."""
    parser = argparse.ArgumentParser(prog="bench_server.py", description=__doc__.split("\n\n")[0])
    opt_in = [name for name in MODELS if name not in DEFAULT_MODELS]
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        type=options.names(option="--models", allowed=tuple(MODELS)),
                        help=f"comma-separated, in run order (default {','.join(DEFAULT_MODELS)}"
                             f"; also {','.join(opt_in)}, best on its own)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        type=options.names(option="--configs", allowed=tuple(CONFIGS)),
                        help=f"comma-separated; stock is every ratio's baseline (default "
                             f"{','.join(CONFIGS)})")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        type=options.names(option="--workloads", allowed=tuple(WORKLOADS)),
                        help=f"comma-separated (default {','.join(WORKLOADS)})")
    parser.add_argument("--max-rounds", default=DEFAULT_MAX_ROUNDS,
                        type=options.integer(option="--max-rounds", minimum=1),
                        help="measured rounds per workload at most; fewer when the time budget "
                             f"ends first (default {DEFAULT_MAX_ROUNDS})")
    parser.add_argument("--time-budget-s", default=DEFAULT_TIME_BUDGET_S,
                        type=options.seconds(option="--time-budget-s"),
                        help="the whole run, server start-ups included, ends within this many "
                             f"seconds (default {DEFAULT_TIME_BUDGET_S:.0f})")
    options.add_result_arguments(parser, result_sets="server-MODEL.{json,txt}")
    parser.add_argument("--log-dir", type=pathlib.Path, default=None,
                        help="folder of the server logs (default: a new temporary folder)")
    parser.add_argument("--machine-args", default=shlex.join(MACHINE_ARGS), type=shlex.split,
                        help="flags every server gets in place of SGLang defaults this machine "
                             f"cannot run (default '{shlex.join(MACHINE_ARGS)}'; '' for "
                             "SGLang's own defaults)")
    parser.add_argument("--pause-idle", action=argparse.BooleanOptionalAction, default=True,
                        help="keep every server paused (SIGSTOP) but the one being measured: "
                             "idle SGLang schedulers poll without pause (default: on)")
    parser.add_argument("--server-module", default="sglang.launch_server",
                        help=argparse.SUPPRESS)  # a stand-in server in tests
    namespace = parser.parse_args(argv)
    if "stock" not in namespace.configs:
        parser.error(f"--configs={','.join(namespace.configs)!r} is invalid; allowed: a list "
                     "that names stock (every ratio's baseline)")
    return namespace


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every server ran as configured, 1 when a PROBLEM was found."""
    args = parse_args(argv)
    log_dir = args.log_dir or pathlib.Path(tempfile.mkdtemp(prefix="kv_canary_bench_logs_"))
    run = ServerRun(models=args.models, configs=args.configs, workloads=args.workloads,
                    max_rounds=args.max_rounds, time_budget_s=args.time_budget_s,
                    machine_args=tuple(args.machine_args), log_dir=log_dir,
                    pause_idle=args.pause_idle, server_module=args.server_module)
    description = machine(label=args.machine_label)

    def write(report: ModelReport) -> None:
        flags = (*report.model.server_args, *COMMON_ARGS, *run.machine_args)
        text = format_report(report, machine=description, flags=flags)
        paths = write_result_set(out_dir=args.out, name=f"server-{report.model.name}",
                                 document=report_json(report, machine=description,
                                                      options=run.to_json()), text=text)
        print(f"\n{text}\n(written: {', '.join(map(str, paths))})\n", flush=True)

    reports = run_servers(run, on_model=write,
                          say=lambda line: print(line, flush=True))
    return 1 if any(report.problems for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
