"""Raises a non-ImportError while importing (a broken installation)."""

raise RuntimeError("CUDA driver initialization failed: this library is broken here")
