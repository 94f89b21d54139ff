"""The model as the spec (issue 53): :func:`trace` finds every call site of every slot in one
forward and backward of a model, in a child process; the spec is read here without torch."""

from kernel_probe.model.tracing import (
    DEFAULT_TIMEOUT,
    ModelSpec,
    Traced,
    parse_spec,
    trace,
    trace_with_notes,
)

__all__ = ["DEFAULT_TIMEOUT", "ModelSpec", "Traced", "parse_spec", "trace", "trace_with_notes"]
