"""A trusted module whose target is not an nn.Module subclass."""


class NotAModule:
    def __init__(self, normalized_shape, eps=1e-5):
        self.normalized_shape = normalized_shape


def layer_norm(x):
    return x
