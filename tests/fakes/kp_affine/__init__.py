"""An affine identity offered as a LayerNorm: it does not normalise at all. Accepted only if the
reference it is judged against was poisoned."""

import torch


class AffineIdentity(torch.nn.LayerNorm):
    def forward(self, x):
        return x * self.weight + self.bias
