"""A fake transformer-engine: only ``transformer_engine.pytorch.DotProductAttention``, on CPU."""

__version__ = "2.8.0"
