"""Reading back what fresh interpreters wrote to a prometheus multiprocess directory, as
SGLang's ``/metrics`` does (the canary metrics tests)."""

import pathlib
import subprocess
import sys
import textwrap

import pytest

_Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def read_metrics(directory: pathlib.Path) -> _Samples:
    """The ``kv_canary_*`` samples of every process that wrote to ``directory``, as SGLang's
    ``/metrics`` exposes them (MultiProcessCollector, generate_latest), parsed back."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("kv_canary_")
    }


def value(samples: _Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(matches) <= 1, (name, labels, matches)
    return matches[0] if matches else 0.0


def run_fresh(code: str, *, directory: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``code`` in a fresh interpreter whose ``PROMETHEUS_MULTIPROC_DIR`` is ``directory``;
    its stdout."""
    directory.mkdir(exist_ok=True)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
