"""The top-level package of a fake flash-attn-4 install: the kernels are in ``flash_attn.cute``."""

__version__ = "4.0.0b36"
