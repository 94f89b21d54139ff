"""A library that sets torch's default device when imported (``torch.set_default_device``): a mode
on torch's function-mode stack from then on, which every later torch call in its process goes
through (about 40 % more time for a small LayerNorm step on a CPU), whatever it is judged on."""

import torch

torch.set_default_device("cpu")


class DefaultDeviceLayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm, from a library that left a mode on torch's stack."""
