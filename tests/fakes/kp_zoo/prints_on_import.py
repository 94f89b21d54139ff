"""Prints to stdout on import (must not corrupt the worker protocol); otherwise correct."""

print("hello from a chatty library")
print('{"fake": "protocol line"}')

from .norms import GoodLayerNorm as ChattyLayerNorm  # noqa: E402,F401
