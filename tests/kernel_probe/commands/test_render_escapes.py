"""Every renderer escapes (issue 52): a crafted value in any field a renderer writes (a YAML value,
a YAML or TOML comment) cannot add a key or a line; a name with a control character is refused on
read before any renderer sees it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import yaml

from kernel_lock import toml
from kernel_lock.anemoi import Exported
from kernel_probe import output
from kernel_probe.commands import anemoi, profiles
from tests.conftest import edited_lock, run_cli, write_sealed

# each ends a line and starts a key in YAML or TOML, or a comment's line in a terminal
EVIL = ["x\ninjected: 1", "x\r\ninjected = 1", "x\u2028injected: 1", "x\x85injected: 1"]
ATTENTION = """
[slots.Attention]
implementation = "torch.sdpa.math"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false, backend = "math" }
"""


def _attention_lock(backend: str) -> str:
    return edited_lock() + ATTENTION.replace('backend = "math"', f"backend = {json.dumps(backend)}")


@pytest.mark.parametrize("evil", EVIL)
def test_an_sdpa_backend_with_a_newline_is_refused_on_read(tmp_path, capsys, evil):
    path = tmp_path / "k.toml"
    path.write_text(_attention_lock(evil))
    for argv in (["export", path, "--mode", "inference"], ["rehash", path], ["show", path]):
        code, out, err = run_cli(argv, capsys)
        assert code == 5, (argv, err)
        assert "'slots.Attention.kwargs.backend'" in err and "control character" in err, err
        assert "injected" not in out


def test_a_real_backend_still_exports(tmp_path, capsys):
    path = write_sealed(tmp_path / "k.toml", _attention_lock("math"))
    code, out, err = run_cli(["export", path, "--mode", "inference"], capsys)
    assert code == 0, err
    assert "SDPA's math backend" in out and set(yaml.safe_load(out)) == {
        "layer_kernels",
        "processor",
    }


YAML_BREAKS = "\r\n|[\n\r\x85\u2028\u2029]"  # PyYAML's line breaks; TOML's are \n and \r\n


def _comments_only(
    text: str, parsed_keys: set[str], expected: set[str], breaks: str = YAML_BREAKS
) -> None:
    """The keys are those expected; no line was added."""
    assert parsed_keys == expected, parsed_keys
    lines = re.split(breaks, text)
    assert not any(line.lstrip().startswith("injected") for line in lines), text


@pytest.mark.parametrize("evil", EVIL)
def test_the_exported_yaml_keeps_every_crafted_value_in_its_place(tmp_path, capsys, evil):
    """The lock's path (a header comment), entry notes, keys and values, the components' notes and
    values: each crafted, the YAML parses to exactly the entries given."""
    entries = [Exported(f"Key{evil}", {"_target_": f"a.B{evil}", "eps": evil}, note=f"n{evil}")]
    text = anemoi.render_yaml(entries, path=f"/p/{evil}.toml", mode=evil, digest=evil)
    parsed = yaml.safe_load(text)
    assert parsed == {"layer_kernels": {e.key: e.entry for e in entries}}
    _comments_only(text, set(parsed), {"layer_kernels"})
    graph = anemoi._component(anemoi._GRAPH_WHERE, evil, f"note{evil}")
    assert yaml.safe_load(graph) == {"graph_attention_backend": evil}
    options = anemoi.render_attention({"attention_implementation": evil}, f"note{evil}")
    assert yaml.safe_load(options) == {"processor": {"attention_implementation": evil}}
    # end to end: the lock's path is the header's first comment
    folder = tmp_path / evil.replace("\x85", "\n")
    folder.mkdir()
    path = write_sealed(folder / "k.toml")
    code, out, err = run_cli(["export", path, "--mode", "inference"], capsys)
    assert code == 0, err
    _comments_only(out, set(yaml.safe_load(out)), {"layer_kernels"})


@pytest.mark.parametrize("evil", EVIL)
def test_the_overlay_keeps_every_crafted_value_in_its_place(evil):
    finding = SimpleNamespace(severity="error", where=f"w{evil}", problem=f"p{evil}")
    config = SimpleNamespace(
        path=f"c{evil}.yaml",
        overrides=[f"model={evil}"],
        composed=True,
        model_choice=lambda: f"model: {evil}",
        shape=f"overlay{evil}",
        findings=[finding],
    )
    overlay = {"model": {"layer_kernels": {"LayerNorm": {"_target_": evil}}}}
    result = SimpleNamespace(
        config=config, notes=[(f"w{evil}", f"n{evil}")], overlay=lambda: overlay
    )
    text = anemoi.render_overlay(result, path=f"l{evil}.toml", mode="training", digest=evil)
    assert yaml.safe_load(text) == overlay
    _comments_only(text, set(yaml.safe_load(text)), {"model"})


@pytest.mark.parametrize("evil", EVIL)
def test_a_rendered_profile_keeps_its_path_in_a_comment(evil):
    document = {"name": "p", "description": evil, "require": {"device-name": [evil]}}
    prof = SimpleNamespace(
        document=document,
        default_strictness="error",
        warn_groups=(),
        path=f"/profiles/{evil}.toml",
        digest=f"sha256:{evil}",
    )
    text = profiles.rendered(prof)
    parsed = toml.loads(text)
    assert parsed == {**document, "strictness": {"default": "error", "warn": []}}
    keys = {"name", "description", "require", "strictness"}
    _comments_only(text, set(parsed), keys, breaks="\r?\n")


@pytest.mark.parametrize("evil", [*EVIL, "\x1b[2Jx", "a\u202eb"])
def test_one_escaping_function_per_format(evil):
    """Comments (YAML and TOML) and the terminal escape the same characters, one line each."""
    for text in (output.comment(evil), output.plain(evil.replace("\n", "")), output.safe(evil)):
        assert not output.CONTROL.search(text), repr(text)
    assert output.comment(evil).startswith("# ") and len(output.comment(evil).splitlines()) == 1
