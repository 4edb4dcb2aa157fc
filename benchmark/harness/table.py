"""The side-by-side text table every benchmark prints, and how its cells show a spread.

A table has a header row and rows of strings; the leading ``label_columns`` are left-aligned
(names), the rest right-aligned (figures). :func:`value_cell` shows a measured figure as its
median and half its interquartile range in percent (``10.31 ±3.2%``), :func:`ratio_cell` a ratio
as its median and half its interquartile range (``1.002 ±0.012``); see :mod:`.stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .stats import Spread

MISSING = "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    """A header and rows of cells; every row has one cell per header column."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    label_columns: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "header", tuple(self.header))
        object.__setattr__(self, "rows", tuple(tuple(row) for row in self.rows))
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"a table row has {len(row)} cells, the header "
                                 f"{len(self.header)}: {row!r}")
        if not 0 <= self.label_columns <= len(self.header):
            raise ValueError(f"label_columns={self.label_columns!r} is invalid; allowed: "
                             f"0..{len(self.header)}")

    def render(self, *, indent: str = "") -> str:
        """The table as aligned lines (two spaces between columns; no trailing spaces)."""
        lines = [self.header, *self.rows]
        widths = [max(len(line[index]) for line in lines) for index in range(len(self.header))]

        def line(cells: Sequence[str]) -> str:
            parts = [cell.ljust(width) if index < self.label_columns else cell.rjust(width)
                     for index, (cell, width) in enumerate(zip(cells, widths))]
            return (indent + "  ".join(parts)).rstrip()

        return "\n".join(line(cells) for cells in lines)


def value_cell(figure: Spread | None, *, digits: int) -> str:
    """``median ±half-IQR%`` with ``digits`` decimals; :data:`MISSING` for None."""
    if figure is None:
        return MISSING
    return f"{figure.median:.{digits}f} ±{100 * figure.relative_half_width:.1f}%"


def ratio_cell(figure: Spread | None) -> str:
    """``median ±half-IQR`` of a ratio, three decimals; :data:`MISSING` for None."""
    if figure is None:
        return MISSING
    return f"{figure.median:.3f} ±{figure.half_width:.3f}"
