"""Tools for running the KV canary against a real SGLang server: a tiny offline model
(:mod:`.tiny_model`), a managed ``python -m sglang.launch_server`` subprocess (:mod:`.server`)
and the parser of the canary's server-log lines (:mod:`.canary_log`).

Used by the end-to-end tests and by ``python -m sglang.srt.kv_canary.demo``; nothing here runs
inside a server. :mod:`.environment` is the one place of the package that copies
``os.environ`` (to build the environment of the processes the tools start).
"""
