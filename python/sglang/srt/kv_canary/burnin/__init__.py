"""The burn-in: qualify a deployment's SGLang flags with the KV canary before production.

``python -m sglang.srt.kv_canary.burnin --url URL [--server-log PATH] ...`` drives a running
server; ``python -m sglang.srt.kv_canary.burnin --model-path DIR ... -- SGLANG_FLAGS...`` starts
one (``python -m sglang.launch_server``) and owns its log. Either way it sends a seeded, valid
but adversarial request mix (:mod:`.workload`) for ``--duration-s`` seconds or ``--max-tokens``
tokens, prints a progress line to stderr, then a summary (requests, tokens, the canary's stats,
violations by reason, health checks) to stdout, and exits 0 (clean), 1 (violations) or 2
(server failure or bad input).

Modules: :mod:`.cli` (arguments -> :class:`~.cli.BurninConfig`), :mod:`.workload` (the request
mix as data), :mod:`.client` (HTTP calls), :mod:`.target` (the server: attached or started, and
what it says about itself), :mod:`.driver` (runs the mix), :mod:`.server_log` (what the canary
logged), :mod:`.summary` (the report and the exit code), :mod:`.session` (all of it in order).

A client tool: nothing here runs inside a server, and the plugin never imports this package.
"""
