"""The token history and the checks that need it.

* :mod:`.history`: each request row's ``origin_input_ids + output_ids`` on the device: a new
  owner's history is sent by the host, every sampled token is appended on the device.
* Verify-token: every verified slot's stored token against the history (positions the history
  does not know yet are skipped); the kernels index the history by request row, so forwards
  replayed from CUDA graphs check tokens exactly as eager ones do.
* :mod:`.write_expectations`: the write-input assert's expected tokens and positions (the
  oracle's tokens; prompt tokens fall back to the history inside the kernel).
"""
