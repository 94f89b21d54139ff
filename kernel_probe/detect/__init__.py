"""What this machine is, as plain data (facts only; no verdicts, no rendering): ``host`` (OS, CPU,
memory, site), ``accelerators`` (torch's build and devices), ``libraries`` and ``triton`` (from
metadata), ``importcheck`` (their imports, in children); ``report`` gathers them."""
