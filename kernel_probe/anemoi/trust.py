"""What check-config and ``export --config`` may import for a config: the allow-list, and the
caller's trust."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

# A config names modules: its entries' ``_target_`` (imported to check a signature) and ``pkg://``
# search paths (imported by Hydra while composing). The rules are the lock's
# (kernel_lock.trust.check_target): a private or ``__main__`` module is never imported (importing a
# ``__main__`` runs it), and a module outside the allow-list and the caller's trust is not imported.
# The allow-list for config entries adds anemoi-models (the library the config is for:
# AutocastLayerNorm is anemoi's own default).
CONFIG_ROOTS = ("anemoi.models",)
# pkg:// search paths composition may import: Hydra's own, and anemoi-training's packaged presets
SEARCH_ROOTS = ("hydra.conf", "anemoi.training")
OWN_TARGETS_FLAG = "--import-config-targets"


@dataclass(frozen=True)
class Trust:
    """What the caller trusts this checker to import for a config: ``modules`` (``--trust``,
    ``$KERNEL_LOCK_TRUST``) and, with ``own_targets`` (``--import-config-targets``), every public
    module the config's own entries name."""

    modules: tuple[str, ...] = ()
    own_targets: bool = False

    @classmethod
    def granted(cls, trust: Sequence[str] = (), *, own_targets: bool = False) -> Trust:
        """The caller's trust: ``trust`` (``--trust``) plus ``$KERNEL_LOCK_TRUST``, and
        ``own_targets``."""
        from kernel_lock.trust import granted_trust

        return cls(granted_trust(trust), own_targets)

    def refusal(self, target: str) -> tuple[str, str, str] | None:
        """None if ``target`` (and any kernel a generic adapter wraps) may be imported, else
        (severity, problem, fix): ``__main__`` and private modules never; others not without
        trust."""
        from kernel_lock import registry
        from kernel_lock.registry import generic_kernel

        names = [target]
        inner = generic_kernel(target)
        if inner is not None:
            names.append(inner)
        for name in names:
            if any(part.startswith("_") for part in name.split(".")):
                return (
                    "error",
                    f"{name!r} has a private or __main__ component: it is never imported "
                    "(importing a module's "
                    "__main__ runs it), and anemoi would import it when it builds the model",
                    "name a public class, e.g. torch.nn.LayerNorm",
                )
        if self.own_targets:
            return None
        roots = (*registry.allowed_roots(), *CONFIG_ROOTS, *self.modules)
        for name in names:
            if not any(name == r or name.startswith(r + ".") for r in roots):
                top = name.split(".")[0]
                return (
                    "warning",
                    f"not checked: module not trusted ({name!r} is outside the import allow-list "
                    "and the modules you trust; nothing was imported, so its import, signature "
                    "and semantics are unknown)",
                    f"if you trust it, `--trust {top}` (or $KERNEL_LOCK_TRUST={top}), or "
                    f"{OWN_TARGETS_FLAG} to let "
                    "check-config import every module this config's entries name",
                )
        return None

    def search_roots(self) -> tuple[str, ...]:
        """The packages Hydra may import for a ``pkg://`` search path while composing."""
        return (*SEARCH_ROOTS, *self.modules)


NO_TRUST = Trust()  # the allow-list alone


def add_config_trust_argument(p: argparse.ArgumentParser) -> None:
    """The ``--import-config-targets`` flag of the commands that read a config."""
    p.add_argument(
        OWN_TARGETS_FLAG,
        action="store_true",
        help="import every public module the config's own layer_kernels entries name (default: "
        "only the import allow-list, anemoi-models and --trust; an entry outside them is reported "
        "as not checked). A `__main__` or private module is never imported",
    )


def config_trust(args: argparse.Namespace) -> Trust:
    """The :class:`Trust` a command's ``--trust`` and ``--import-config-targets`` grant."""
    return Trust.granted(args.trust, own_targets=args.import_config_targets)
