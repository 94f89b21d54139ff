"""The child side of one reading of a config in ``kernel-probe check-config``: anemoi-training's
schema, then the config's entries, in one process.

Each part needs torch and anemoi-models imported (the schema through anemoi-training, the entries
through their targets), which is most of a child's time; one child for both pays it once. The
schema runs first, before any entry's target is imported, so nothing an entry imports can change
the schema's verdict, and with its address space capped as in a child of its own
(``kernel_probe.anemoi.reading.COMPOSE_MEMORY``); the cap is lifted again before the entries, whose
libraries run uncapped as everywhere else. The entries run as in their own child
(``kernel_probe.anemoi.entry_checks.check_entries``), as ``anemoi-training train`` imports them:
after anemoi-training.

Where this child fails in any way (the schema raised, or ran out of its capped memory, an entry's
import crashed or hung), the parent (``kernel_probe.anemoi.pipelines.check_config``) runs each
part again in a child of its own, exactly as when it is asked alone: the failure is put down to the
part that caused it, and no entry is judged in a process where a failed import of the schema's
left modules half-imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["check"]


def check(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ConfigCheckRequest`` -> its ``ConfigCheckReply`` (as JSON). Whatever raises fails the
    child (its caller then asks each part alone)."""
    from kernel_probe.anemoi.entry_checks import check_entries
    from kernel_probe.anemoi.schema import validate
    from kernel_probe.isolation.protocol import (
        ConfigCheckReply,
        ConfigCheckRequest,
        EntryCheckReply,
        SchemaReply,
    )

    request = ConfigCheckRequest.from_json(payload)
    schema: SchemaReply | None = None
    if request.schema is not None:
        with _address_space(request.schema_memory):
            schema = SchemaReply.from_json(validate(request.schema.to_json()))
    entries = check_entries([e.to_json() for e in request.entries])
    return ConfigCheckReply(
        schema=schema, entries=tuple(EntryCheckReply.from_json(e) for e in entries)
    ).to_json()


@contextlib.contextmanager
def _address_space(limit: int) -> Iterator[None]:
    """This process's address space capped at ``limit`` bytes (0: not capped) while the block
    runs: the soft limit only, so it can be lifted again."""
    if not limit:
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    capped = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (capped, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
