"""Fault injection for self-tests: prove that each check fires (and the others stay silent).

Off by default; enabled per kind by ``SGLANG_KV_CANARY_PERTURB_*_PROB``. Faults are drawn with a
seeded generator (``SGLANG_KV_CANARY_PERTURB_SEED``), only after
``SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS`` forward steps, on the host and outside any CUDA graph.
Choices use the batch's CPU-side lengths; device tensors are indexed with device tensors, so
injecting never synchronizes with the device.

Transient faults (``req_to_token``, ``real_kv_used``, ``input_ids``, ``seq_lens``) are injected
before the forward and undone right after it (stream-ordered): a corruption of exactly one
forward, and the allocator, the radix cache and SGLang's idle memory checks stay consistent. (An
``input_ids`` fault restores the batch's tensor; what the model stored from the wrong token
stays: that is the fault the token checks must see.) ``lost_write`` acts inside an eager forward
and is undone before its post launch: the model's K/V write of one token goes to slot 0 while
the canary saw the intended slot. Persistent faults (``real_kv_post_forward``
after a forward, ``real_kv_unused_cache`` when a radix sweep pass starts) flip K/V bytes and keep
them flipped, as a real stray write would.
"""
