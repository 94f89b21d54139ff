"""A module that must never be imported by a lock that does not trust it."""

import os

os.environ["KP_EVIL_IMPORTED"] = "1"


class Evil:  # not even an nn.Module
    pass
