"""anemoi's torch pin, said where a user meets anemoi (issue 57, point 7): anemoi-models,
anemoi-graphs and anemoi-training declare ``torch<2.11``; this project runs and tests them on torch
2.13 with that pin overridden. Where they are installed on a torch the pin does not accept,
``kernel-probe env`` and ``check-config`` say so in a note, never an error (exit codes unchanged).
Before: only .ci/anemoi-install said so."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import pytest

from kernel_probe.anemoi import versions
from kernel_probe.anemoi.versions import torch_pin_notes
from tests.conftest import run_cli

ANEMOI = {  # as anemoi-models 0.19.0 and anemoi-training 0.17.1 declare them
    "anemoi-models": ("0.19.0", ["torch<2.11,>=2.3", "torch-dct>=0.1.6; extra == 'spectral'"]),
    "anemoi-training": ("0.17.1", ["torch<2.11,>=2.2", "torchvision>=0.18"]),
}


@pytest.fixture
def installed(monkeypatch):
    """Which anemoi distributions are installed (name -> (version, requires)), as metadata says."""
    table: dict[str, tuple[str, list[str]]] = dict(ANEMOI)
    real = versions.metadata.distribution

    def distribution(name):
        if name not in versions.DISTRIBUTIONS:
            return real(name)  # torch's own version
        if name not in table:
            raise versions.metadata.PackageNotFoundError(name)
        version, requires = table[name]
        return SimpleNamespace(version=version, requires=requires)

    monkeypatch.setattr(versions.metadata, "distribution", distribution)
    return table


def test_a_torch_the_pin_refuses_is_one_note_naming_each_requirement(installed):
    (note,) = torch_pin_notes("2.13.0+cpu")
    assert note.startswith(
        "anemoi-models 0.19.0 requires torch<2.11,>=2.3; anemoi-training 0.17.1 requires "
        "torch<2.11,>=2.2: this torch is 2.13.0+cpu, installed with that pin overridden"
    )
    assert "not an error" in note and versions.DOCS in note
    assert versions.DOCS.endswith("#anemoi-and-torch-versions")  # tests/test_doc_links.py: exists


@pytest.mark.parametrize("torch", ["2.10.1", "2.4.0+cu124", "not a version"])
def test_no_note_where_the_pin_accepts_torch_or_its_version_is_unknown(installed, torch):
    assert torch_pin_notes(torch) == []


def test_no_note_without_anemoi(installed):
    installed.clear()
    assert torch_pin_notes("2.13.0") == []


def test_env_says_it_under_torch_as_a_note(installed, capsys):
    from rich.console import Console

    from kernel_probe.commands.env import render

    code, out, err = run_cli(["env", "--json", "--no-import-checks"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["torch"]["notes"] == torch_pin_notes(report["torch"]["version"]) != []
    console = Console(width=100, record=True)
    render(report, console)
    shown = " ".join(console.export_text().split())
    assert "note anemoi-models 0.19.0 requires torch<2.11" in shown, shown


@pytest.mark.slow
def test_check_config_says_it_and_exits_as_without_it(installed, tmp_path, capsys):
    config = tmp_path / "model.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            model:
              layer_kernels:
                LayerNorm: {_target_: torch.nn.LayerNorm}
            """
        )
    )
    argv = ["check-config", str(config), "--no-schema", "--no-compose"]
    code, out, err = run_cli([*argv, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 == data["exit_code"], err
    assert data["torch_pin"] == torch_pin_notes() and len(data["torch_pin"]) == 1
    assert not [f for f in data["findings"] if "pin" in f["problem"]]  # a note, not a finding
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and "note:" in out and "installed with that pin overridden" in out
