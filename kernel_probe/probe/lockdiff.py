"""What changed between two locks: top-level keys, environment fields and slot choices."""

from __future__ import annotations

from typing import Any

import kernel_lock


def lock_differences(
    a: kernel_lock.KernelLock, b: kernel_lock.KernelLock
) -> dict[str, list[dict[str, Any]]]:
    """What differs between locks ``a`` and ``b``: fingerprint fields and libraries, and each slot's
    implementation, target and kwargs."""
    env = []
    for name in sorted(set(a.environment.fields) | set(b.environment.fields)):
        x, y = a.environment.fields.get(name), b.environment.fields.get(name)
        if (x and x.value) != (y and y.value) or (x and x.match) != (y and y.match):
            env.append(
                {"field": name, "a": x.to_dict() if x else None, "b": y.to_dict() if y else None}
            )
    for name in sorted(set(a.environment.libraries) | set(b.environment.libraries)):
        x, y = a.environment.libraries.get(name), b.environment.libraries.get(name)
        if (x and x.value) != (y and y.value):
            env.append(
                {
                    "field": f"libraries.{name}",
                    "a": x.to_dict() if x else None,
                    "b": y.to_dict() if y else None,
                }
            )
    slots = []
    for name in kernel_lock.SLOTS:
        sx, sy = a.slots.get(name), b.slots.get(name)
        for key in ("implementation", "target", "kwargs"):
            vx = getattr(sx, key) if sx else None
            vy = getattr(sy, key) if sy else None
            if vx != vy:
                slots.append(
                    {
                        "slot": name,
                        "key": key,
                        "a": dict(vx) if key == "kwargs" and vx is not None else vx,
                        "b": dict(vy) if key == "kwargs" and vy is not None else vy,
                    }
                )
    top = []
    for key in ("precision", "mode", "lock_version"):
        if getattr(a, key) != getattr(b, key):
            top.append({"key": key.replace("_", "-"), "a": getattr(a, key), "b": getattr(b, key)})
    # the profile is part of a lock's identity: the same name with another digest is another policy
    for key in ("name", "digest"):
        x, y = dict(a.profile).get(key), dict(b.profile).get(key)
        if x != y and not (
            key == "digest" and dict(a.profile).get("name") != dict(b.profile).get("name")
        ):
            top.append({"key": "profile" if key == "name" else "profile-digest", "a": x, "b": y})
    return {"lock": top, "environment": env, "slots": slots}
