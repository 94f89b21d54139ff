"""``kernel-probe env``: exit codes, JSON that parses, a readable report on narrow and colourless
terminals."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from kernel_lock import fingerprint, host
from kernel_probe import cli, output
from kernel_probe.commands import env as envcmd
from kernel_probe.detect import libraries
from kernel_probe.detect.libraries import KnownLibrary
from kernel_probe.detect.report import SCHEMA, TOP_LEVEL_KEYS, detect
from tests.conftest import ROOT as TESTS_ROOT

ROOT = str(TESTS_ROOT)

# SGR parameters that set a colour (foreground, background, bright, 256/truecolour)
_COLOUR = re.compile(r"^(3[0-9]|4[0-9]|9[0-7]|10[0-7])$")


def colour_codes(text: str) -> list[str]:
    return [
        p
        for seq in re.findall(r"\x1b\[([0-9;]*)m", text)
        for p in seq.split(";")
        if _COLOUR.match(p)
    ]


@pytest.fixture(autouse=True)
def fresh_consoles():
    output.reset()
    yield
    output.reset()


def test_env_is_a_registered_subcommand():
    sub = cli.SUBCOMMANDS["env"]
    assert (sub.module, sub.add_arguments, sub.run) == ("env", "add_env_arguments", "run_env")


def test_every_subcommand_is_wired_to_functions_that_exist():
    import importlib

    for name, sub in cli.SUBCOMMANDS.items():
        module = importlib.import_module(f"kernel_probe.commands.{sub.module}")
        assert callable(getattr(module, sub.add_arguments)) and callable(
            getattr(module, sub.run)
        ), name


def test_env_json_without_import_checks_parses(capsys):
    assert cli.main(["env", "--json", "--no-import-checks"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert tuple(report) == TOP_LEVEL_KEYS and report["schema"] == SCHEMA
    assert report["import_checks"] == {"run": False, "timeout": 20.0}
    assert report["fingerprint"] == fingerprint.current()
    assert {lib["import"]["status"] for lib in report["libraries"].values()} <= {
        "skipped",
        "not-installed",
    }


def test_env_text_report_fits_60_columns_without_colour(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli.main(["env", "--no-import-checks"]) == 0
    out = capsys.readouterr().out
    for title in (
        "host",
        "torch",
        "accelerators",
        "triton",
        "kernel libraries",
        "site",
        "lock fingerprint",
    ):
        assert re.search(rf"^{title} ─", out, re.M), title
    assert max(len(line) for line in out.splitlines()) <= 60
    assert "\x1b[" not in out


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "1e9"])
def test_env_bad_timeout_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["env", "--timeout", value])
    assert exc.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_env_unknown_option_exits_2():
    with pytest.raises(SystemExit) as exc:
        cli.main(["env", "--no-such-option"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_env_json_from_a_real_process_is_clean():
    """Whatever torch logs goes to stderr; stdout is exactly one JSON document."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "env", "--json", "--no-import-checks"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == SCHEMA


def _rocm_torch():
    dev = SimpleNamespace(
        name="AMD Radeon Graphics",
        major=9,
        minor=0,
        gcnArchName="gfx90a:sramecc+:xnack-",
        total_memory=64 * 2**30,
        multi_processor_count=110,
    )
    return SimpleNamespace(
        __version__="2.7.1+rocm6.2.4",
        version=SimpleNamespace(cuda=None, hip="6.2.41133-dd7f95766"),
        cuda=SimpleNamespace(
            is_available=lambda: True,
            device_count=lambda: 8,
            get_device_properties=lambda i: dev,
            get_arch_list=lambda: ["gfx942"],
        ),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False)),
    )


def test_rendering_a_simulated_rocm_node_on_a_narrow_colour_terminal(monkeypatch):
    monkeypatch.setattr(host, "nvml_devices", lambda: None)
    report = detect(import_checks=False, torch=_rocm_torch(), nvml=lambda: None)
    monkeypatch.setenv("NO_COLOR", "1")
    from rich.console import Console

    buf = io.StringIO()
    envcmd.render(report, Console(file=buf, width=60, force_terminal=True))
    text = buf.getvalue()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert colour_codes(text) == []
    assert max(len(line) for line in plain.splitlines()) <= 60
    assert "rocm:7" in plain and "gfx90a" in plain and "sm_90" not in plain
    assert "generic device name" in plain
    assert "torch build does not cover it" in plain  # torch here was built for gfx942 only
    monkeypatch.delenv("NO_COLOR")
    buf = io.StringIO()
    envcmd.render(report, Console(file=buf, width=60, force_terminal=True))
    assert colour_codes(buf.getvalue())  # the same report in colour: the check above can fail


@pytest.mark.slow
def test_env_reports_broken_libraries_and_still_prints_json(tmp_path, monkeypatch, capsys):
    fakes = {
        "fake_abort": "import os\nos.abort()\n",
        "fake_hang": "import time\ntime.sleep(1000)\n",
        "fake_raise": "raise ImportError('libcudart.so.12: cannot open shared object file')\n",
        "fake_print": "print('{not json')\n",
    }
    for name, source in fakes.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    table = libraries.known_libraries() + tuple(KnownLibrary(n, (n,), n, n) for n in fakes)
    monkeypatch.setattr(libraries, "known_libraries", lambda: table)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )

    assert cli.main(["env", "--json", "--timeout", "3"]) == 0
    # fake_print's stray output did not reach our stdout
    report = json.loads(capsys.readouterr().out)
    got = {n: report["libraries"][n]["import"] for n in fakes}
    assert got["fake_abort"]["status"] == "crashed" and "SIGABRT" in got["fake_abort"]["reason"]
    assert got["fake_hang"]["status"] == "timeout" and "3 s" in got["fake_hang"]["reason"]
    assert got["fake_raise"]["status"] == "error" and "libcudart" in got["fake_raise"]["reason"]
    assert got["fake_print"]["status"] == "ok" and got["fake_print"]["stdout"] == "{not json"

    monkeypatch.setenv("COLUMNS", "60")
    output.reset()
    assert cli.main(["env", "--timeout", "3"]) == 0
    out = capsys.readouterr().out
    assert "crashed" in out and "timeout" in out and "printed to stdout on import" in out
    assert max(len(line) for line in out.splitlines()) <= 60


@pytest.mark.slow
def test_env_json_with_import_checks_reports_liger(capsys):
    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        pytest.skip("liger-kernel is not installed here")
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    liger = report["libraries"]["liger-kernel"]
    assert liger["installed"] and liger["version"] == version
    assert liger["import"]["status"] == "ok", liger["import"]
    assert report["import_checks"]["run"] is True


NAMED = ("libraries", "torch.environment", "site.slurm", "triton.distributions", "fingerprint")


def _keys(value, path=""):
    """Every key of the report, except those that are names (libraries, distributions,
    variables)."""
    if isinstance(value, dict):
        named = path in NAMED or path.endswith(".distributions")
        for key, child in value.items():
            if not named:
                yield key
            yield from _keys(child, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item, path + "[]")


def test_every_json_key_is_documented(monkeypatch):
    monkeypatch.setattr(host, "nvml_devices", lambda: None)
    with open(os.path.join(ROOT, "docs", "env.md"), encoding="utf-8") as fh:
        doc = fh.read()
    report = detect(import_checks=False)
    report["libraries"]["liger-kernel"]["import"] = {  # a child's optional keys too
        "status": "error",
        "reason": "x",
        "seconds": 1.0,
        "import_seconds": 0.5,
        "file": "f",
        "module_version": "1",
        "where": "w",
        "stdout": "s",
        "stderr": "e",
    }
    report["triton"]["import"] = dict(report["libraries"]["liger-kernel"]["import"])
    rocm = detect(import_checks=False, torch=_rocm_torch(), nvml=lambda: None)
    missing = sorted(
        {
            key
            for r in (report, rocm)
            for key in _keys(r)
            if not re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", doc)
        }
    )
    assert missing == []
    # documented by reference to FIELDS
    assert set(report["fingerprint"]) == set(fingerprint.FIELDS)
