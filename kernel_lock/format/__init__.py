"""The lock file as a reader sees it: the schema of its tables, the document they make, the
canonical TOML it is written in, the typed getters every reader uses, versions and the
graph-attention table. What each slot is, and its own keys, is ``kernel_lock.slots``'.

Nothing here imports torch or starts a process. The package imports none of its modules: each is
imported where it is used (``import kernel_lock`` needs ``schema``, ``document`` and what they
import).
"""

__all__ = [
    "document",
    "graph_attention",
    "reading",
    "schema",
    "tables",
    "toml",
    "versions",
]
