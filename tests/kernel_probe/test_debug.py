"""``--debug`` adds detail and changes nothing else (issue 57, point 5): for every command of a
table, with and without ``--debug``, the same stdout, the same exit code and the same files; with
it, a failure's traceback on stderr. Before: ``--json --pin LayerNorm=liger.layer_norm --debug``
printed nothing on stdout and exited 1 (the error was re-raised) where without it the documented
JSON and exit 3 came."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernel_probe.commands import locks
from kernel_probe.probe import derive
from tests.conftest import run_cli, write_sealed
from tests.kernel_probe.test_json_failures import CASES, _argv, minimal

ROOT = Path(__file__).resolve().parents[2]


def _twice(argv: list[str], capsys, files: tuple[Path, ...] = ()):
    """(code, stdout, stderr, the files' bytes) without and then with --debug, each run on the
    same files as they were before the first."""
    before = {f: f.read_bytes() for f in files if f.exists()}
    runs = []
    for extra in ([], ["--debug"]):
        for f in files:
            if f in before:
                f.write_bytes(before[f])
            else:
                f.unlink(missing_ok=True)
        code, out, err = run_cli([*argv, *extra], capsys)
        runs.append((code, out, err, {f: f.read_bytes() for f in files if f.exists()}))
    return runs


@pytest.mark.parametrize("name,args,code", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_json_failure_is_the_same_with_debug(
    name, args, code, tmp_path, capsys, no_workers, monkeypatch
):
    monkeypatch.delenv("KERNEL_LOCK", raising=False)
    plain, debug = _twice(_argv(name, args, tmp_path), capsys)
    assert plain[0] == debug[0] == code, debug[2]
    assert plain[1] == debug[1] and plain[1]


def test_a_pin_that_cannot_run_here_is_exit_3_and_its_json_with_debug(tmp_path, capsys, no_workers):
    """The issue's own example: the candidate is refused here (liger runs on GPUs only; where it
    is not installed the refusal is the same exit code) before any worker starts."""
    argv = ["--json", "--pin", "LayerNorm=liger.layer_norm", "--out", str(tmp_path / "a.toml")]
    plain, debug = _twice(argv, capsys)
    assert plain[0] == debug[0] == 3, debug[2]
    assert plain[1] == debug[1] and '"exit_code": 3' in plain[1]
    assert "Traceback" not in plain[2] and "Traceback" in debug[2]  # the detail --debug adds
    assert not (tmp_path / "a.toml").exists()


@pytest.mark.parametrize("raised,code", [(RuntimeError("boom"), 1), (KeyboardInterrupt(), 1)])
def test_a_bug_or_an_interrupt_is_the_same_with_debug(raised, code, tmp_path, capsys, monkeypatch):
    def run_show(_args):
        raise raised

    monkeypatch.setattr(locks, "run_show", run_show)
    plain, debug = _twice(["show", str(write_sealed(tmp_path / "k.toml")), "--json"], capsys)
    assert plain[0] == debug[0] == code
    assert plain[1] == debug[1]
    assert "Traceback" not in plain[2] and "Traceback" in debug[2]


@pytest.mark.parametrize(
    "argv,code",
    [
        (["show", "{k}", "--json"], 0),
        (["explain", "{k}", "LayerNorm", "--json"], 0),
        (["verify", "{k}", "--no-import", "--json"], 0),
        (["rehash", "{k}"], 0),
        (["lock", "--for", "inference", "{k}", "{out}", "--json"], 0),
        (["--out", "{k}", "--check", "--shape", "64x32", "--json"], 3),
        (["--precison", "bf16"], 2),
    ],
)
def test_what_a_command_prints_and_writes_is_the_same_with_debug(
    argv, code, tmp_path, capsys, no_workers, monkeypatch
):
    # one clock for both runs: a derived lock's created-at could otherwise cross a second between
    # them under load (its digest with it)
    monkeypatch.setattr(derive, "now", lambda: "2026-12-01T00:00:00Z")
    k, out = minimal(tmp_path), tmp_path / "out.toml"
    k.write_text(k.read_text().replace("\n", "\n# a hand edit rehash seals\n", 1))
    argv = [a.format(k=k, out=out) for a in argv]
    plain, debug = _twice(argv, capsys, (k, out))
    assert plain[0] == debug[0] == code, debug[2]
    assert plain[1] == debug[1]
    assert plain[3] == debug[3]  # the lock and the derived lock, byte for byte


def test_debug_is_read_only_where_it_adds_detail():
    """``args.debug`` decides the log level and the traceback in kernel_probe/cli.py, nothing else:
    no command can behave otherwise under --debug."""
    readers = [
        (str(p.relative_to(ROOT)), n)
        for p in sorted((ROOT / "kernel_probe").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.debug\b(?!\()", line)
    ]
    assert len(readers) == 2 and {path for path, _ in readers} == {"kernel_probe/cli.py"}, readers
