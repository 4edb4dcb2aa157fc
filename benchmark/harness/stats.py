"""Medians and spreads of repeated measurements, and ratios paired by round.

Every figure a benchmark prints is a :class:`Spread`: the median of its samples with their
quartiles (and lowest and highest sample in the JSON). The "±" printed beside a median is half
the interquartile range: no distribution is assumed, one stray sample (a garbage collection, a
compile) does not widen it, and half of the samples lie within it. A ratio of two configurations
is taken per round (round ``k`` of one over round ``k`` of the other, measured seconds apart) and
those ratios are summarized the same way (:func:`paired_ratios`), so drift of the machine over a
run cancels out of each pair.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """The median of ``samples`` values, their first and third quartiles (inclusive method: they
    never leave the measured range) and the lowest and highest of them (one unit)."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    samples: int

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"Spread.samples={self.samples!r} is invalid; allowed: >= 1")
        if not self.low <= self.q1 <= self.median <= self.q3 <= self.high:
            raise ValueError(f"Spread needs low <= q1 <= median <= q3 <= high, got {self.low!r}, "
                             f"{self.q1!r}, {self.median!r}, {self.q3!r}, {self.high!r}")

    @property
    def half_width(self) -> float:
        """Half the interquartile range, in the unit of the median: the "±" of a figure."""
        return (self.q3 - self.q1) / 2

    @property
    def relative_half_width(self) -> float:
        """:attr:`half_width` over the median's magnitude (0.0 for a zero median)."""
        return self.half_width / abs(self.median) if self.median else 0.0

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies within ``median ± half_width`` (the printed interval)."""
        return abs(value - self.median) <= self.half_width

    def scaled(self, factor: float) -> Spread:
        """Every figure multiplied by ``factor`` > 0 (a change of unit, a per-launch share)."""
        if not factor > 0:
            raise ValueError(f"factor={factor!r} is invalid; allowed: > 0")
        return Spread(median=self.median * factor, q1=self.q1 * factor, q3=self.q3 * factor,
                      low=self.low * factor, high=self.high * factor, samples=self.samples)

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "low": self.low,
                "high": self.high, "samples": self.samples}


def spread(values: Sequence[float]) -> Spread:
    """The :class:`Spread` of ``values``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("spread() needs at least one value")
    median = statistics.median(values)
    if len(values) > 1:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = median
    return Spread(median=median, q1=q1, q3=q3, low=min(values), high=max(values),
                  samples=len(values))


def paired_ratios(*, numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """The :class:`Spread` of ``numerators[k] / denominators[k]`` over every ``k``.

    Raises:
        ValueError: the sequences are empty or differ in length, or a denominator is 0.
    """
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(f"paired_ratios() needs two sequences of one length >= 1, got "
                         f"{len(numerators)} and {len(denominators)} values")
    if any(denominator == 0 for denominator in denominators):
        raise ValueError("paired_ratios() needs non-zero denominators")
    return spread([mine / theirs for mine, theirs in zip(numerators, denominators)])
