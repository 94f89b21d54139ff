"""How many of anemoi-training's own configs check-config runs anemoi-training's schema on, and the
"false oks": configs check-config called ok (exit 0) that anemoi-training's schema rejects.

"Before" is check-config's verdict without the schema's findings (what it said before it ran the
schema); "after" is its verdict now. Reads the configs from the installed anemoi-training (the 25
model presets under config/model/, the experiment overlays config/*.yaml) plus the two user mistakes
issue 25 names (a layer_kernels block at the config root, and at model.model.layer_kernels), written
as overlays over the packaged presets.

    python benchmarks/anemoi_schema_oks.py
"""

from __future__ import annotations

import importlib.resources
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kernel_lock.files import write_file
from kernel_probe.anemoi.pipelines import check_configs

SCHEMA_KINDS = ("schema", "preset")


def user_mistakes(tmp: Path) -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.anemoi_build import write_overlay

    out = []
    for name, extra in (
        ("root_block", {"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm"}}}),
        (
            "model_model_block",
            {
                "model": {
                    "model": {"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm"}}}
                }
            },
        ),
    ):
        path = write_overlay(tmp / f"{name}.yaml", "gnn")
        body = yaml.safe_load(path.read_text())
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(body.get(key), dict):
                body[key].update(value)
            else:
                body[key] = value
        write_file(path, yaml.safe_dump(body, sort_keys=False))
        out.append(path)
    return out


def main() -> int:
    root = Path(str(importlib.resources.files("anemoi.training") / "config"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = (
            sorted((root / "model").glob("*.yaml"))
            + sorted(root.glob("*.yaml"))
            + user_mistakes(Path(tmp))
        )
        rows = []
        start = time.perf_counter()
        for path, result in zip(paths, check_configs(paths), strict=True):  # one child for all
            before = [
                f for f in result.findings if f.severity == "error" and f.kind not in SCHEMA_KINDS
            ]
            schema = [
                f for f in result.findings if f.severity == "error" and f.kind in SCHEMA_KINDS
            ]
            rows.append((path, result.schema, 0 if not before else 5, result.exit_code, schema))
        seconds = time.perf_counter() - start
    checked = [r for r in rows if r[1].startswith("checked")]
    print(f"{'config':<52} {'before':>6} {'after':>5}  schema errors (kind: path)")
    for path, status, before, after, schema in rows:
        name = f"{path.parent.name}/{path.name}" if path.parent.name == "model" else path.name
        shown = "; ".join(f"{f.kind}: {f.where}" for f in schema) or (
            "-" if status.startswith("checked") else status
        )
        print(f"{name:<52} {before:>6} {after:>5}  {shown}")
    false_before = [r for r in rows if r[2] == 0 and r[4]]
    false_after = [r for r in rows if r[3] == 0 and r[4]]
    print(f"\nconfigs: {len(rows)}; checked with anemoi-training's schema: {len(checked)}")
    print(
        f"false oks (exit 0, schema rejects): before {len(false_before)}, after {len(false_after)}"
    )
    print(
        "  of which the preset's own: "
        f"{sum(all(f.kind == 'preset' for f in r[4]) for r in false_before)}"
    )
    print(f"({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
