"""The lock file as a reader sees it: the schema of its tables, the document they make, the
canonical TOML it is written in, the typed getters every reader uses, and the vocabulary they share
(slots, versions, activations, gates, the BLAS and graph-attention tables).

Nothing here imports torch or starts a process. The package imports none of its modules: each is
imported where it is used (``import kernel_lock`` needs ``schema``, ``document`` and what they
import).
"""

__all__ = [
    "activations",
    "blas",
    "document",
    "gating",
    "graph_attention",
    "reading",
    "schema",
    "slots",
    "toml",
    "versions",
]
