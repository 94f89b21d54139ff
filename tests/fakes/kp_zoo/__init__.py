"""A zoo of fake kernels: correct ones the judge must accept, and subtly wrong ones it must reject.

Each class takes torch.nn's constructor convention (size first, eps=, bias=) so the probe can offer
it with `--candidate SLOT=kp_zoo.norms.Name`. The wrong ones each carry one bug real kernels have
had.
"""
