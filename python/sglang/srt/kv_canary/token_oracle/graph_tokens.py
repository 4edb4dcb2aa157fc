"""The oracle's next tokens of a replayed decode graph, handed to the sampler of that batch.

Everything the oracle's next token of a decode row depends on (the row's request ids and its
position) is already graph-resident in a decode CUDA graph, so the decode graphs compute their
rows' next tokens inside the graph (one small launch captured beside the model, no host work at
replay). The ``token_oracle`` sampler of the same batch then takes a copy of them instead of
launching the oracle from Python, whose argument checks and launch cost tens of µs per decode
step: on a small model, whose step is bound by the scheduler's Python, that is a visible share
of the step.

Hand-off (one :class:`GraphOracleTokens` per model runner's canary, shared with its sampler):

* :meth:`~GraphOracleTokens.offer`, when a decode graph that computes tokens is prepared for a
  replay: its token buffer, keyed by the identity of the replayed batch's ``SamplingBatchInfo``
  (the object ``ModelRunner.sample`` passes to the sampler);
* :meth:`~GraphOracleTokens.withdraw`, when any other graph is prepared (an EAGLE target-verify
  graph samples elsewhere);
* :meth:`~GraphOracleTokens.take`, in the sampler: a copy of the first ``rows`` tokens when its
  ``SamplingBatchInfo`` is the offered one (each offer is taken once), else None, and the
  sampler launches the oracle itself (eager forwards, a sampler called late for an earlier
  batch, a batch without sampling info).

The copy is enqueued on the current stream right after the replay, so it keeps this replay's
tokens when a later replay overwrites the buffer (SGLang keeps sampled tokens across steps).
"""

from __future__ import annotations

import torch


class GraphOracleTokens:
    """The one pending offer of graph-computed oracle tokens (see the module docstring)."""

    __slots__ = ("_sampling_info", "_tokens")

    def __init__(self) -> None:
        self._sampling_info: object | None = None
        self._tokens: torch.Tensor | None = None

    def offer(self, *, sampling_info: object, tokens: torch.Tensor) -> None:
        """A decode graph computing ``tokens`` (int32 ``[max_bs]``, graph-resident) is about to be
        replayed for the batch whose sampling info is ``sampling_info``."""
        self._sampling_info = sampling_info
        self._tokens = tokens

    def withdraw(self) -> None:
        """No offer stands (another graph is about to be replayed)."""
        self._sampling_info = None
        self._tokens = None

    def take(self, *, sampling_info: object, rows: int) -> torch.Tensor | None:
        """A new int32 ``[rows]`` copy of the offered tokens if ``sampling_info`` is the offered
        batch's and the graph holds ``rows`` rows, else None. Ends the offer either way. One
        device copy on the current stream, no host sync."""
        offered, tokens = self._sampling_info, self._tokens
        self.withdraw()
        if tokens is None or offered is not sampling_info or rows > tokens.shape[0]:
            return None
        return tokens[:rows].clone()
