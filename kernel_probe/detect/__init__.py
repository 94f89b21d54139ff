"""The detection layer: what this machine is, as plain data (facts only; no verdicts, no rendering).

One module per part: ``host``, ``torchbuild``, ``accelerators``, ``triton``, ``libraries``,
``site``; ``importcheck`` runs the child-process imports; ``report`` gathers them all
(``kernel-probe env``).
"""
