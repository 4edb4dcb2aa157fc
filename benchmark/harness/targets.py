"""Performance targets (SPEC section 12) and their verdicts on measured ratios.

A target bounds one configuration's ratio to stock SGLang on one workload: at most a bound (time
to first token), at least a bound (throughput), or 1.000 within the measured spread (canary
off costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .stats import Spread

Bound = Literal["at_most", "at_least", "no_cost"]
_SYMBOL = {"at_most": "<=", "at_least": ">=", "no_cost": "=="}


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """``config``'s ratio to stock on ``workload``: ``<= bound``, ``>= bound``, or (``no_cost``)
    an interval ``median ± half the interquartile range`` that holds 1.0."""

    config: str
    workload: str
    bound: float
    kind: Bound

    def __post_init__(self) -> None:
        if self.kind not in _SYMBOL:
            raise ValueError(f"Target.kind={self.kind!r} is invalid; allowed: "
                             + ", ".join(_SYMBOL))
        if self.kind == "no_cost" and self.bound != 1.0:
            raise ValueError(f"a no_cost target has bound 1.0, got {self.bound!r}")

    def describe(self) -> str:
        return f"{self.config} {self.workload} {_SYMBOL[self.kind]} {self.bound:g}x"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A target checked on a ratio (``ratio`` None: not measured)."""

    target: Target
    ratio: Spread | None

    @property
    def met(self) -> bool | None:
        """Whether the median meets the bound (``no_cost``: whether the interval holds 1.0);
        None when not measured."""
        if self.ratio is None:
            return None
        if self.target.kind == "no_cost":
            return self.ratio.contains(1.0)
        if self.target.kind == "at_most":
            return self.ratio.median <= self.target.bound
        return self.ratio.median >= self.target.bound

    @property
    def within_noise(self) -> bool:
        """Whether the bound lies inside the ratio's interval (the verdict could go either
        way on another run)."""
        return (self.ratio is not None and self.target.kind != "no_cost"
                and self.ratio.contains(self.target.bound))

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.target.describe()}: not measured"
        state = "met" if self.met else "MISSED"
        noise = " (within noise)" if self.within_noise else ""
        return (f"{self.target.describe()}: {self.ratio.median:.3f} "
                f"±{self.ratio.half_width:.3f} {state}{noise}")

    def to_json(self) -> dict[str, object]:
        return {"target": self.target.describe(), "ratio": None if self.ratio is None
                else self.ratio.to_json(), "met": self.met, "within_noise": self.within_noise}
