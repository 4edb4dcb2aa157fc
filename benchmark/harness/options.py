"""Command-line helpers the scripts share: lists of names and bounded numbers, each refused with
a message that names the option, the value and what is allowed (argparse turns the
``argparse.ArgumentTypeError`` into exit status 2 with that message)."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Callable, Sequence

from .results import RESULTS_DIR


def names(*, option: str, allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type`` for a comma-separated list of ``allowed`` names: the names in the
    order given, repeats dropped; an empty list or an unknown name is refused."""

    def parse(value: str) -> tuple[str, ...]:
        chosen = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
        if not chosen or any(name not in allowed for name in chosen):
            raise argparse.ArgumentTypeError(
                f"{option}={value!r} is invalid; allowed: a comma-separated list of "
                + ", ".join(allowed))
        return chosen

    return parse


def integer(*, option: str, minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer >= ``minimum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(
                f"{option}={value!r} is invalid; allowed: an integer >= {minimum}")
        return number

    return parse


def seconds(*, option: str) -> Callable[[str], float]:
    """An argparse ``type`` for a number of seconds > 0."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if not number > 0:
            raise argparse.ArgumentTypeError(f"{option}={value!r} is invalid; allowed: a "
                                             "number of seconds > 0")
        return number

    return parse


def add_result_arguments(parser: argparse.ArgumentParser, *, result_sets: str) -> None:
    """``--out`` (the folder of the result sets named ``result_sets``, by default
    ``benchmark/results``) and ``--machine-label`` (what the result sets call this machine)."""
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR,
                        help=f"folder of the result set {result_sets} (default "
                             "benchmark/results)")
    parser.add_argument("--machine-label", default="",
                        help="what to call this machine in the result set")
