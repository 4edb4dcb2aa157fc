"""Token checks (SPEC §6, §7): the checks that know which token each slot must hold.

* Token history: each request's ``origin_input_ids + output_ids``, snapshotted at
  ``ForwardBatch.init_new`` (:mod:`.history_hooks`, incremental) and scattered into a persistent
  device pool shaped like ``req_to_token`` before every forward (``CanaryRuntime.run_step``,
  outside graphs). Maintained whenever verify-token or the write-input assert is on.
* Verify-token: every verified slot's stored token against the history (positions the history
  does not know yet are skipped). The kernels index the history by pool row, so forwards
  replayed from CUDA graphs check tokens exactly as eager ones do.
* Write-input assert: every written token against the token oracle's prediction (decode rows,
  computed inside the captured forward, and the generated tokens of extend rows) or, where the
  oracle predicts nothing (prompt tokens), against the history; positions against the oracle
  manager's. Off for EAGLE draft decode.

:mod:`.checks` holds one runner's token checks (snapshot, refresh, per-forward inputs),
:mod:`.history_hooks` the ``init_new`` hook, :mod:`.sizing` the bounds of their memory.
"""
