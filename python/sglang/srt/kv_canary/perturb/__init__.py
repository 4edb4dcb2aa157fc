"""Fault injection for self-tests: prove that each check fires (and the others stay silent).

Off by default; enabled per kind by ``SGLANG_KV_CANARY_PERTURB_*_PROB``. Faults are drawn with a
seeded generator (``SGLANG_KV_CANARY_PERTURB_SEED``), only after
``SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS`` forward steps, on the host before the forward and
outside any CUDA graph. Choices use the batch's CPU-side lengths; the device tensors are indexed
with device tensors, so injecting never synchronizes with the device. Each fault is undone right
after its forward (stream-ordered), so it is a transient corruption of exactly one forward: the
allocator, the radix cache and SGLang's idle memory checks stay consistent. (An ``input_ids``
fault restores the batch's tensor; what the model stored from the wrong token stays: that is
the fault the token checks must see.)
"""
