"""Abort mode (``SGLANG_KV_CANARY_ON_VIOLATION=abort``): the requests a violation touched are
finished with an error, the radix-cache nodes holding a reported slot are evicted, and serving
goes on. ``controller`` decides, ``requests`` finishes requests, ``quarantine`` heals the cache,
``inbox`` collects the rows, ``records`` describes what was done (report file, metrics)."""
