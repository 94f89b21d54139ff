"""Finding profiles (kernel_probe.profiles.discovery): the built-in site profiles are data read on first use.

Importing the command line, the probe and every profiles module parses nothing (a job start that names
no profile never pays for them); the first ``survey`` reads each built-in once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernel_probe.profiles import discovery

# In a fresh interpreter: every file opened under the built-in profiles directory, at import and on use.
_CODE = r"""
import json, os, sys
opened = []
def seen(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(seen)
import kernel_probe.cli, kernel_probe.probe.pipeline, kernel_probe.commands.profiles
from kernel_probe.profiles import autodetect, discovery, format, nodes, requirements, signals
from kernel_probe.cli import SUBCOMMANDS, build_subparser
for name in SUBCOMMANDS:
    build_subparser(name)  # every subcommand's flags and help texts, as `--help` builds them
sites = str(discovery.builtin_dir())
at_import = sorted(p for p in opened if p.startswith(sites))
found = discovery.available()
on_use = sorted({p for p in opened if p.startswith(sites)})
print(json.dumps({"at_import": at_import, "on_use": on_use, "found": sorted(found)}))
"""


def test_the_builtin_profiles_are_read_on_first_use_not_at_import():
    env = {k: v for k, v in os.environ.items() if k != discovery.ENV_VAR}
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["at_import"] == [], "importing kernel-probe read built-in profiles"
    shipped = sorted(str(p) for p in discovery.builtin_dir().glob("*.toml"))
    assert seen["on_use"] == shipped  # the hook sees the reads it is there to catch
    assert seen["found"] == sorted(os.path.basename(p)[: -len(".toml")] for p in shipped)


def test_a_survey_is_read_when_called(tmp_path, monkeypatch):
    """A profile written after import is found: nothing is cached at import time."""
    monkeypatch.delenv(discovery.ENV_VAR, raising=False)
    assert "mine" not in discovery.available([str(tmp_path)])
    text = (discovery.builtin_dir() / "cpu.toml").read_text().replace('name = "cpu"', 'name = "mine"')
    (tmp_path / "mine.toml").write_text(text)
    assert discovery.available([str(tmp_path)])["mine"].path == str(tmp_path / "mine.toml")
