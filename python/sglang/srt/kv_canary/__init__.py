"""KV canary for SGLang 0.5.12.post1: a runtime detector of KV-cache corruption.

Activated through the ``sglang.srt.plugins`` entry point ``kv_canary``
(:func:`sglang.srt.kv_canary.plugin.activate`). Importing this package imports nothing heavy.
"""
