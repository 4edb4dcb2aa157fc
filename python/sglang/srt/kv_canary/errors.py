"""Errors every layer of the canary raises (the ground floor: no imports of the package)."""

from __future__ import annotations


class CanaryUnsupportedError(RuntimeError):
    """The configuration is one the KV canary cannot check; the message says what to change.

    Raised at start-up (flags, pools, prefix caches), so nothing is ever left silently unchecked:
    a configuration the canary does not cover fails before serving instead of serving without
    protection.
    """

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = tuple(reasons)
        super().__init__(
            "KV canary (SGLANG_KV_CANARY_ON_VIOLATION or _MODE is log, abort or raise) cannot "
            "protect this server: "
            + "; ".join(reasons)
            + ". Change the flags above, or unset SGLANG_KV_CANARY_MODE to serve without the "
            "canary."
        )


def refuse_unless_supported(reasons: list[str]) -> None:
    """Raise :class:`CanaryUnsupportedError` when there is any reason."""
    if reasons:
        raise CanaryUnsupportedError(reasons)
