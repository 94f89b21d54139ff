"""A library that forks a long-lived process when it is imported (a daemon, a compile server) that
inherits the importing process's descriptors. The pid of that process is written to
$KP_FORKS_PIDFILE."""

import os
import time

import torch

_pid = os.fork()
if _pid == 0:  # the grandchild: holds every inherited descriptor, lives ten minutes
    try:
        time.sleep(600)
    finally:
        os._exit(0)
if os.environ.get("KP_FORKS_PIDFILE"):
    with open(os.environ["KP_FORKS_PIDFILE"], "a") as fh:
        fh.write(f"{_pid}\n")


class Norm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm under another name: nothing wrong with it but its import."""
