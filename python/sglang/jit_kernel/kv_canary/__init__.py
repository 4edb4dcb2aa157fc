"""Triton kernels of the KV canary, each with a plain-torch reference beside it."""
