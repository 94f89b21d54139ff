"""kernel_probe.detect.importcheck (the cache): an import check's clean answer is kept per
installation and node, reused (and said to be) while nothing it depends on changed, and asked again
otherwise.

Each test that asks starts a child (a second or less); a reused answer starts none."""

from __future__ import annotations

import json
import os
import time

import pytest

from kernel_probe.detect import importcheck
from kernel_probe.detect.importcheck import ImportCache
from kernel_probe.isolation import child as child_mod


@pytest.fixture
def lib(tmp_path):
    """A clean library (imports, prints nothing) and one that raises, in a folder of their own."""
    root = tmp_path / "libs"
    for name, source in {
        "fake_clean": "value = 1\n",
        "fake_raise": "raise RuntimeError('no GPU')\n",
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(source)
    return root


@pytest.fixture
def children(monkeypatch):
    """Counts the children started for import checks."""
    started = []
    real = child_mod.run_function

    def counting(*a, **k):
        started.append(a)
        return real(*a, **k)

    monkeypatch.setattr(importcheck, "run_function", counting)
    return started


def _check(module, lib, cache):
    return importcheck.check_import(module, timeout=30, extra_paths=[str(lib)], cache=cache)


def test_a_clean_answer_is_reused_and_says_so(lib, tmp_path, children):
    cache = ImportCache(tmp_path / "cache")
    first = _check("fake_clean", lib, cache)
    assert first["status"] == "ok" and "cached" not in first and len(children) == 1
    again = _check("fake_clean", lib, ImportCache(tmp_path / "cache"))
    assert len(children) == 1, "the kept answer was not reused"
    assert again["status"] == "ok" and again["file"] == first["file"]
    # when it was asked, not a fresh check
    assert time.strptime(again["cached"], "%Y-%m-%dT%H:%M:%SZ")
    folder = tmp_path / "cache" / "imports"
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    assert [oct(os.stat(f).st_mode & 0o777) for f in folder.iterdir()] == ["0o600"]


def test_a_raised_import_is_kept_too_with_its_reason(lib, tmp_path, children):
    _check("fake_raise", lib, ImportCache(tmp_path / "c"))
    again = _check("fake_raise", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 1 and again["status"] == "error" and "no GPU" in again["reason"]


def test_an_edited_library_file_is_asked_again(lib, tmp_path, children):
    _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    init = lib / "fake_clean" / "__init__.py"
    init.write_text("raise ImportError('broken by an upgrade')\n")
    os.utime(init, ns=(time.time_ns(), time.time_ns() + 10**9))
    again = _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 2 and again["status"] == "error" and "cached" not in again


def test_an_edited_dependency_is_asked_again_and_every_loaded_file_is_reported(
    lib, tmp_path, children
):
    """Issue 52: the key held only the library's own package, so a dependency edited (another
    top-level package the import loaded) kept a cached "ok"."""
    (lib / "fake_dep").mkdir()
    (lib / "fake_dep" / "__init__.py").write_text("value = 2\n")
    (lib / "fake_user").mkdir()
    (lib / "fake_user" / "__init__.py").write_text("import fake_dep\n")
    first = importcheck.check_import(
        "fake_user", timeout=30, extra_paths=[str(lib)], cache=ImportCache(tmp_path / "c")
    )
    [kept] = (tmp_path / "c" / "imports").iterdir()
    files = {f for f, _, _ in json.loads(kept.read_text())["reply"]["loaded"]}
    dep = lib / "fake_dep" / "__init__.py"
    assert {str(dep), str(lib / "fake_user" / "__init__.py")} <= files
    assert first["status"] == "ok" and "loaded" not in first  # kept, not shown
    _check("fake_user", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 1, "the unchanged answer was not reused"
    dep.write_text("raise ImportError('the dependency broke')\n")
    os.utime(dep, ns=(time.time_ns(), time.time_ns() + 10**9))
    again = _check("fake_user", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 2 and again["status"] == "error" and "cached" not in again


def test_the_refusal_of_the_folder_names_the_variable_that_chooses_it(lib, tmp_path):
    """Issue 52: it told the user to set $KERNEL_PROBE_NODE_DIR, which does not move this folder."""
    (tmp_path / "c").mkdir()
    os.chmod(tmp_path / "c", 0o777)
    cache = ImportCache(tmp_path / "c")
    _check("fake_clean", lib, cache)
    assert "$KERNEL_PROBE_CACHE_DIR" in cache.problem and "NODE_DIR" not in cache.problem
    assert importcheck.cache_folder({importcheck.CACHE_DIR_ENV: "/a"}).as_posix() == "/a"


def test_a_newly_installed_package_on_the_path_is_asked_again(lib, tmp_path, children):
    _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    (lib / "other_pkg").mkdir()  # an install changes the folder itself
    os.utime(lib, ns=(time.time_ns(), time.time_ns() + 10**9))
    _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 2


def test_a_variable_that_steers_devices_changes_the_key(lib, tmp_path, children):
    request = importcheck.ImportCheckRequest(module="fake_clean")
    key = importcheck.cache_key(request, child_source="x", extra_paths=[str(lib)], env={})
    assert key == importcheck.cache_key(
        request, child_source="x", extra_paths=[str(lib)], env={"HOME": "/x"}
    )
    for var in (
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH",
        "TRITON_INTERPRET",
    ):
        other = importcheck.cache_key(
            request, child_source="x", extra_paths=[str(lib)], env={var: "1"}
        )
        assert other != key, var
    assert importcheck.cache_key(request, child_source="y", extra_paths=[str(lib)], env={}) != key


def test_fresh_asks_again_and_keeps_the_new_answer(lib, tmp_path, children):
    _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    fresh = _check("fake_clean", lib, ImportCache(tmp_path / "c", read=False))
    assert len(children) == 2 and "cached" not in fresh
    _check("fake_clean", lib, ImportCache(tmp_path / "c"))
    assert len(children) == 2


def test_what_printed_or_crashed_is_never_kept(fakes, tmp_path, children):
    for module in ("fake_print", "fake_exit"):
        importcheck.check_import(
            module, timeout=30, extra_paths=[str(fakes)], cache=ImportCache(tmp_path / "c")
        )
        importcheck.check_import(
            module, timeout=30, extra_paths=[str(fakes)], cache=ImportCache(tmp_path / "c")
        )
    assert len(children) == 4
    assert list((tmp_path / "c" / "imports").iterdir()) == []


def _kept(tmp_path):
    """A cache holding one clean answer under a made-up key, written by ImportCache.store (no
    child)."""
    cache = ImportCache(tmp_path / "c")
    (tmp_path / "fake.py").write_text("value = 1\n")
    st = os.stat(tmp_path / "fake.py")
    reply = {"ok": True, "file": "/x/fake/__init__.py", "version": "1.0", "seconds": 0.5}
    reply["loaded"] = [[str(tmp_path / "fake.py"), st.st_mtime_ns, st.st_size]]
    cache.store(
        "k" * 64, child_mod.ChildResult(status="ok", value=reply, returncode=0, seconds=0.7)
    )
    return cache


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: "not json",
        lambda e: json.dumps({**e, "reply": {"ok": "yes", "surprise": 1}}),
        lambda e: json.dumps({**e, "asked": "yesterday"}),
        lambda e: json.dumps({**e, "asked": e["asked"] - importcheck.MAX_AGE - 60}),
        lambda e: json.dumps({**e, "asked": e["asked"] + 3600}),
        lambda e: json.dumps({**e, "key": "0" * 64}),
        lambda e: json.dumps({**e, "format": "kernel-probe-import-cache/0"}),
        lambda e: json.dumps({**e, "extra": True}),
        lambda e: json.dumps({**e, "reply": {**e["reply"], "loaded": []}}),
        lambda e: json.dumps({**e, "reply": {**e["reply"], "loaded": [["/x", 1, "2"]]}}),
        lambda e: json.dumps({**e, "reply": {**e["reply"], "loaded": [[1, 1, 1]]}}),
    ],
    ids=[
        "not-json",
        "bad-reply",
        "bad-time",
        "too-old",
        "future",
        "other-key",
        "old-format",
        "unknown-key",
        "no-files-loaded",
        "bad-stamp",
        "bad-path",
    ],
)
def test_a_damaged_or_stale_answer_is_not_believed(tmp_path, damage):
    cache = _kept(tmp_path)
    found = cache.load("k" * 64)
    assert (
        found is not None
        and found[0].value["file"] == "/x/fake/__init__.py"
        and found[0].seconds == 0.7
    )
    [kept] = (tmp_path / "c" / "imports").iterdir()
    kept.write_text(damage(json.loads(kept.read_text())))
    assert cache.load("k" * 64) is None


def test_a_kept_answer_that_is_not_a_regular_file_is_not_read(tmp_path):
    cache = _kept(tmp_path)
    [kept] = (tmp_path / "c" / "imports").iterdir()
    kept.unlink()
    os.mkfifo(kept)  # reading would block forever
    assert cache.load("k" * 64) is None


def test_an_unusable_folder_turns_the_cache_off_with_a_note(lib, tmp_path, children):
    (tmp_path / "c").mkdir(mode=0o777)
    os.chmod(tmp_path / "c", 0o777)  # world-writable, not sticky: someone else could plant answers
    cache = ImportCache(tmp_path / "c")
    assert _check("fake_clean", lib, cache)["status"] == "ok"
    assert "cache is off" in cache.problem and not (tmp_path / "c" / "imports").exists()


def test_the_folder_follows_the_variables(tmp_path):
    assert importcheck.cache_folder({"KERNEL_PROBE_CACHE_DIR": "/a"}).as_posix() == "/a"
    assert importcheck.cache_folder({"XDG_CACHE_HOME": "/b"}).as_posix() == "/b/kernel-probe"
    assert importcheck.cache_folder({}).as_posix().endswith("/.cache/kernel-probe")


def test_env_reports_the_cache_and_reuses_it(lib, tmp_path, children, monkeypatch):
    from kernel_probe.detect import report
    from kernel_probe.detect.libraries import KnownLibrary

    # libraries only
    monkeypatch.setattr(report, "triton_request", lambda *_a, **_k: None)
    table = [
        KnownLibrary(
            name="fake", distributions=("fake-clean",), module="fake_clean", check="fake_clean"
        )
    ]
    first = report.detect(table=table, extra_paths=[str(lib)], cache=ImportCache(tmp_path / "c"))
    second = report.detect(table=table, extra_paths=[str(lib)], cache=ImportCache(tmp_path / "c"))
    assert len(children) == 1
    assert first["import_checks"]["cache"] == {
        "folder": str(tmp_path / "c"),
        "read": True,
        "reused": 0,
        "on": True,
    }
    assert second["import_checks"]["cache"]["reused"] == 1
    assert "cached" not in first["libraries"]["fake"]["import"]
    assert second["libraries"]["fake"]["import"]["cached"]
    assert second["libraries"]["fake"]["import"]["status"] == "ok"


def test_env_text_says_an_answer_was_kept():
    from kernel_probe.commands.env import _status

    assert "cached answer of 2026-12-02T01:03:07Z" in _status(
        {"status": "ok", "seconds": 4.2, "cached": "2026-12-02T01:03:07Z"}
    )
    assert "cached" not in _status({"status": "ok", "seconds": 4.2})
