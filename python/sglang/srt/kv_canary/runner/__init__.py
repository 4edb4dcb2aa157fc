"""The canary of one model runner: its owner object and everything it holds."""
