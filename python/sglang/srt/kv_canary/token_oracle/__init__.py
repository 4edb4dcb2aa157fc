"""The deterministic token oracle and its ``token_oracle`` sampling backend (SPEC §4)."""
