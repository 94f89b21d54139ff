"""The built-in site profiles are package data: importlib.resources finds them in a checkout, and a
real ``pip install --target`` / ``--prefix`` finds them too (they used to be data files under
``sys.prefix``, invisible to both). An installation without them says so (exit 5) instead of listing
nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

import kernel_probe
from kernel_probe import sites
from kernel_probe.profiles import load_file
from tests.conftest import ROOT, run_cli

SHIPPED = sorted(
    p.stem for p in (ROOT / "kernel_probe" / "profiles" / sites.BUILTIN_PACKAGE_DIR).glob("*.toml")
)


# ---- (a) found through importlib.resources, every one parses -------------------------------------
def test_builtin_dir_is_package_data_found_through_importlib_resources():
    found = sites.builtin_dir()
    assert found == Path(str(files("kernel_probe") / "profiles" / sites.BUILTIN_PACKAGE_DIR))
    assert found.parent == Path(kernel_probe.__file__).parent / "profiles" and found.is_dir()
    assert {"lumi-g", "frontier", "cpu"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_builtin_profile_parses(name):
    prof = load_file(sites.builtin_dir() / f"{name}.toml")
    assert prof.name == name


def test_available_lists_every_builtin_from_the_package(monkeypatch):
    monkeypatch.delenv(sites.ENV_VAR, raising=False)
    surveyed = sites.survey()
    found, broken = surveyed.profiles, surveyed.broken
    assert not broken and sorted(found) == SHIPPED
    assert all(Path(p.path).parent == sites.builtin_dir() for p in found.values())


# ---- (b) a real install: --target and --prefix ---------------------------------------------------
@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    """The project copied out of the checkout: building writes build/ and *.egg-info next to
    pyproject.toml."""
    pytest.importorskip(
        "setuptools", reason="pip install --no-build-isolation needs setuptools in this environment"
    )
    src = tmp_path_factory.mktemp("src") / "kernel-probe"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("kernel_lock", "kernel_probe"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    return src


def _pip_install(source: Path, *where: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--ignore-installed",  # never uninstall this environment's own kernel-probe
            "--no-build-isolation",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "-q",
            *where,
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _list_profiles(site: Path, cwd: Path) -> list[str]:
    """``profiles list --json`` through the CLI, in a fresh interpreter that imports kernel_probe
    from ``site`` only."""
    code = (
        "import sys, kernel_probe; from kernel_probe.cli import main; print('imported from', "
        "kernel_probe.__file__, file=sys.stderr); sys.exit(main(['profiles', 'list', '--json']))"
    )
    env = {k: v for k, v in os.environ.items() if k != sites.ENV_VAR}
    env["PYTHONPATH"] = str(site)  # not the checkout, which conftest puts on PYTHONPATH
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported_from = Path(
        next(x for x in proc.stderr.splitlines() if x.startswith("imported from ")).split(" ", 2)[2]
    )
    assert imported_from.is_relative_to(site), (
        f"kernel_probe came from {imported_from}, not the install in {site}"
    )
    listed = json.loads(proc.stdout)
    assert all(Path(p["path"]).is_relative_to(site) for p in listed)
    return sorted(p["name"] for p in listed)


@pytest.mark.slow
def test_pip_install_target_finds_the_builtin_profiles(source_copy, tmp_path):
    target = tmp_path / "target"
    _pip_install(source_copy, "--target", str(target))
    assert (
        target / "kernel_probe" / "profiles" / sites.BUILTIN_PACKAGE_DIR / "lumi-g.toml"
    ).is_file()
    (tmp_path / "elsewhere").mkdir()
    assert _list_profiles(target, tmp_path / "elsewhere") == SHIPPED


@pytest.mark.slow
def test_pip_install_prefix_finds_the_builtin_profiles(source_copy, tmp_path):
    prefix = tmp_path / "prefix"
    _pip_install(source_copy, "--prefix", str(prefix))
    installed = sorted(prefix.glob("**/site-packages/kernel_probe"))
    assert len(installed) == 1, f"expected one kernel_probe under {prefix}, found {installed}"
    (tmp_path / "elsewhere").mkdir()
    assert _list_profiles(installed[0].parent, tmp_path / "elsewhere") == SHIPPED


# ---- (c) an installation without them: loud, exit 5 ----------------------------------------------
@pytest.fixture(params=["empty", "absent"])
def broken_install(request, tmp_path, monkeypatch) -> Path:
    where = tmp_path / "site_profiles"
    if request.param == "empty":
        where.mkdir()
    monkeypatch.setattr(sites, "builtin_dir", lambda: where)
    monkeypatch.delenv(sites.ENV_VAR, raising=False)
    return where


@pytest.mark.parametrize(
    "argv",
    [
        ["profiles", "list"],
        ["profiles", "list", "--json"],
        ["profiles", "show", "lumi-g"],
        ["profiles", "match", "lumi-g"],
        ["--profile", "lumi-g", "--out", "{tmp}/k.toml"],
        ["--profile", "auto", "--out", "{tmp}/k.toml"],
    ],
)
def test_missing_builtins_are_an_error_naming_where_it_looked(
    broken_install, argv, tmp_path, capsys
):
    code, out, err = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 5, out + err
    assert "no built-in site profiles" in err and str(broken_install) in err
    if "--json" in argv:  # the error as JSON on stdout, and nothing else
        assert json.loads(out)["error"]["exit_code"] == 5
    else:
        assert not out.strip()
    assert not (tmp_path / "k.toml").exists()


def test_missing_builtins_are_not_hidden_by_a_user_directory(broken_install, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy2(
        ROOT / "kernel_probe" / "profiles" / sites.BUILTIN_PACKAGE_DIR / "cpu.toml",
        mine / "cpu.toml",
    )
    code, _, err = run_cli(["profiles", "--profiles-dir", str(mine), "list"], capsys)
    assert code == 5 and str(broken_install) in err


def test_missing_builtins_error_is_an_input_file_error(broken_install):
    with pytest.raises(sites.BuiltinProfilesMissing) as info:
        sites.survey()
    assert info.value.exit_code == 5 and info.value.path == str(broken_install)
    assert "reinstall" in (info.value.fix or "")
