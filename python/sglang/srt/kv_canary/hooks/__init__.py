"""Hook adapters, one module per SGLang component (targets in :mod:`..hook_targets`).

Each adapter is a few lines: find the model runner's canary (:func:`..runner.canary_runner.
runner_of`) and call the method that handles the event. No state lives here.
"""
