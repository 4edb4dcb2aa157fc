"""CPU self-check of the KV canary: ``python -m sglang.srt.kv_canary.selfcheck``.

Runs the canary's runtime path (the same classes and hooks a server uses) over SGLang's own pools
on the CPU with the torch reference kernels (or the Triton kernels under ``TRITON_INTERPRET=1``),
through a mixed workload, once clean and once per fault, and prints what caught what. Exits 1 when
a fault is missed or a clean run reports a violation.
"""
