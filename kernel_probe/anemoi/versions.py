"""anemoi's declared torch pin (``torch<2.11``) against the torch installed here, which kernel-probe
overrides (docs/anemoi.md): a note for ``env`` and ``check-config``, never an error."""

from __future__ import annotations

from importlib import metadata

# the distributions whose pins matter here: the three kernel-probe installs and tests
DISTRIBUTIONS = ("anemoi-models", "anemoi-graphs", "anemoi-training")
DOCS = "docs/anemoi.md#anemoi-and-torch-versions"


def torch_pin_notes(torch_version: str | None = None) -> list[str]:
    """The note, in one sentence, if an installed anemoi distribution's torch requirement does not
    accept ``torch_version`` (None: the installed torch's); else []."""
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
