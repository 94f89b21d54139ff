"""A library whose forward forks a long-lived process (a compile pool, a multiprocessing helper)
that keeps the worker's pipes open. The pid of that process is written to $KP_FORKS_PIDFILE."""

import os
import time

import torch

_started = False


class ForkingLayerNorm(torch.nn.LayerNorm):
    def forward(self, x):
        global _started
        if not _started:
            _started = True
            pid = os.fork()
            if pid == 0:  # the grandchild: holds every inherited descriptor, lives ten minutes
                try:
                    time.sleep(600)
                finally:
                    os._exit(0)
            path = os.environ.get("KP_FORKS_PIDFILE")
            if path:
                with open(path, "a") as fh:
                    fh.write(f"{pid}\n")
        return super().forward(x)
