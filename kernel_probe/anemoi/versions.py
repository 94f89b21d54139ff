"""anemoi's declared torch pin against the torch installed here: anemoi-models, anemoi-graphs and
anemoi-training require ``torch<2.11``, and kernel-probe runs and tests them on a newer torch with
that pin overridden (``.ci/anemoi-install``; docs/anemoi.md). Where that is so on this machine,
``kernel-probe env`` and ``check-config`` say it in a note, never as an error. Metadata only: no
anemoi import, no torch import."""

from __future__ import annotations

from importlib import metadata

# the distributions whose pins matter here: the three kernel-probe installs and tests
DISTRIBUTIONS = ("anemoi-models", "anemoi-graphs", "anemoi-training")
DOCS = "docs/anemoi.md#anemoi-and-torch-versions"


def torch_pin_notes(torch_version: str | None = None) -> list[str]:
    """The note, if the installed anemoi distributions' torch requirements do not accept
    ``torch_version`` (None: the installed torch distribution's): each such distribution with its
    requirement, in one sentence. [] when they all accept it, when none is installed, or when the
    torch version is unknown."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    try:
        torch_version = torch_version or metadata.version("torch")
        torch = Version(torch_version)
    except (metadata.PackageNotFoundError, InvalidVersion):
        return []
    unmet = []
    for name in DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or ():
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            applies = req.marker is None or req.marker.evaluate({"extra": ""})
            if req.name == "torch" and applies and not req.specifier.contains(torch, True):
                unmet.append(f"{name} {dist.version} requires torch{req.specifier}")
    if not unmet:
        return []
    return [
        f"{'; '.join(unmet)}: this torch is {torch_version}, installed with that pin overridden, "
        f"as kernel-probe runs and tests anemoi (not an error; {DOCS})"
    ]
