"""The deterministic token oracle, per-request ids and the ``token_oracle`` sampling backend."""
