"""Small models for the trace, the probe from a trace and ``kernel_lock.apply`` (issue 53): each
module's ``build()`` returns ``(model, args)`` or ``(model, args, kwargs)`` at a small size."""
