"""One result set per benchmark: ``NAME.json`` (every number, the settings, the machine) and
``NAME.txt`` (the short table the script printed), written side by side into one folder.

``benchmark/results/`` holds the current set the README cites: ``kernels``, ``host``,
``server-tiny`` and ``server-8b``. :func:`machine` describes where a run happened, so a figure
is never read without its machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "results"
_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_PACKAGES = ("sglang", "sglang-kv-canary", "torch", "triton")


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _checkout() -> str:
    """The checkout's commit (``+changes`` when its working tree differs), or ``unknown``."""
    git = shutil.which("git")
    if git is None:
        return "unknown"
    try:
        commit = subprocess.run([git, "-C", str(_REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True)
        status = subprocess.run([git, "-C", str(_REPO_ROOT), "status", "--porcelain",
                                 "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit.stdout.strip() + ("+changes" if status.stdout.strip() else "")


def nvidia_smi(*, query: str) -> list[str]:
    """One line per GPU of ``nvidia-smi --query-gpu=QUERY --format=csv,noheader``; empty where
    there is no ``nvidia-smi`` or it fails. Touches no CUDA state of this process."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        answer = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in answer.stdout.splitlines() if line.strip()]


def machine(*, label: str = "") -> dict[str, object]:
    """Where this process runs: ``label`` (what the person running it calls the machine), CPU
    model and count, the GPUs ``nvidia-smi`` lists, Python and package versions, the checkout."""
    return {
        "label": label,
        "cpu": _cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": nvidia_smi(query="name,memory.total,driver_version"),
        "python": platform.python_version(),
        "packages": {package: _version(package) for package in _PACKAGES},
        "checkout": _checkout(),
    }


def describe_machine(description: Mapping[str, object]) -> str:
    """One line of :func:`machine`'s description, for the head of a text table."""
    packages = description["packages"]
    assert isinstance(packages, Mapping)
    gpus = description["gpus"]
    gpu = "; ".join(gpus) if isinstance(gpus, list) and gpus else "no GPU"
    label = f"{description['label']}: " if description["label"] else ""
    return (f"{label}{description['cpu']} ({description['cpus']} CPUs), {gpu}; "
            + ", ".join(f"{name} {version}" for name, version in packages.items())
            + f"; checkout {description['checkout']}")


def write_result_set(*, out_dir: pathlib.Path, name: str, document: Mapping[str, object],
                     text: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Write ``out_dir/NAME.json`` (``document``, indented) and ``out_dir/NAME.txt`` (``text``);
    the two paths. ``out_dir`` is created.

    Raises:
        ValueError: ``name`` is not lower-case letters, digits and dashes.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"result set name {name!r} is invalid; allowed: lower-case letters, "
                         "digits and '-', starting with a letter or digit")
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, text_path = out_dir / f"{name}.json", out_dir / f"{name}.txt"
    json_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    text_path.write_text(text.rstrip() + "\n", encoding="utf-8")
    return json_path, text_path
