"""The report of an earlier ``bench_server_overhead.py --out FILE.json`` run, printed again from
the file alone (no server, no GPU): per model, the per-workload tables, target verdicts, pairs
and notes, computed by this checkout's code from the rounds the file recorded. A figure a later
version of the benchmark prints (the pairs, say) is then reproducible from an older run's file.

Usage: ``python benchmark/server_overhead_report.py FILE.json [FILE.json ...]``
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_server_overhead import MODELS, format_model_report, with_eagle  # noqa: E402
from server_overhead_table import ConfigResult  # noqa: E402
from server_workloads import WORKLOADS_BY_NAME  # noqa: E402

_DRAFT_PLACEHOLDER = pathlib.Path("<eagle draft>")


def report_from_json(data: Mapping[str, object]) -> str:
    """The printed report of every model of one ``--out`` document.

    Raises:
        KeyError / ValueError: the document is not a ``bench_server_overhead.py --out`` file
            (or names a model or workload this checkout does not know).
    """
    options = data["options"]
    workloads = [WORKLOADS_BY_NAME[name] for name in options["workloads"]]
    rounds_by_model = dict(options.get("repeats_by_model", ()))  # --repeats MODEL=N
    blocks = []
    for name, model_data in data["models"].items():
        model = MODELS[name]
        if options.get("eagle_steps"):
            model = with_eagle(model, draft_dir=_DRAFT_PLACEHOLDER, steps=options["eagle_steps"])
        results = [ConfigResult.from_json(item) for item in model_data["results"]]
        blocks.append(format_model_report(model=model, workloads=workloads, results=results,
                                          repeats=rounds_by_model.get(name, options["repeats"]),
                                          together=name in options.get("together", ())))
    return "\n\n".join(blocks)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report of each file; 2 (with the reason) for a missing or unreadable file."""
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths or any(path.startswith("-") for path in paths):
        print("usage: python benchmark/server_overhead_report.py FILE.json [FILE.json ...]",
              file=sys.stderr)
        return 2
    for path in paths:
        try:
            data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
            text = report_from_json(data)
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"{path}: not a bench_server_overhead.py --out file: "
                  f"{type(error).__name__}: {error}", file=sys.stderr)
            return 2
        print(f"# {path}\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
