"""Exit codes and output (issue 24, point 8): each case the issue lists, and Unicode format
characters from a lock shown as escapes wherever C0/C1 controls are (show, explain, the job-start
lines, errors)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import unicodedata

import pytest

import kernel_lock
from kernel_lock.errors import LockFormatError
from kernel_probe import output
from tests.conftest import MINIMAL_LOCK, edited_lock, run_cli, write_sealed


def test_lock_for_inference_into_a_missing_folder_names_the_path(tmp_path, lock_file, capsys):
    out = tmp_path / "nonexistent-dir" / "x.toml"
    code, _, err = run_cli(["lock", "--for", "inference", lock_file, out], capsys)
    assert code == 5, err
    assert str(out) in err and "does not exist" in err and "unexpected" not in err
    assert not out.parent.exists()


@pytest.mark.parametrize("target", ["__main__.X", "mylib.__main__.X", "mylib._private.X"])
def test_a_main_or_private_candidate_is_a_usage_error_before_any_work(target, capsys, monkeypatch):
    import kernel_probe.isolation.worker

    def no_work(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(kernel_probe.isolation.worker.WorkerPool, "__init__", no_work)
    code, out, err = run_cli(["check", "--candidate", f"LayerNorm={target}"], capsys)
    assert code == 2, err
    assert "never imported" in err and "unexpected" not in err and "checking" not in out + err


@pytest.mark.parametrize("value", ["bad name!", "_private", "a..b", "x-y"])
def test_a_malformed_trust_variable_is_a_usage_error(value, lock_file, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK_TRUST", value)
    code, _, err = run_cli(["verify", lock_file], capsys)
    assert code == 2, err
    assert "KERNEL_LOCK_TRUST" in err


@pytest.mark.parametrize("shape", ["2x²", "2x٣", "2x1²", "²x2"])
def test_a_non_ascii_digit_in_a_shape_is_explained(shape, capsys):
    code, _, err = run_cli(["--shape", shape, "--check", "--out", "nowhere.toml"], capsys)
    assert code == 2, err
    assert "ROWSxHIDDEN" in err and "invalid literal" not in err


# ---- Unicode format characters -------------------------------------------------------------------
FORMAT = [
    chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp")
]
NAMED = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
NAMED += ["\u2028", "\u2029", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\ufeff", "\u2060"]


def test_every_format_character_is_escaped():
    assert set(NAMED) <= set(FORMAT)
    for ch in FORMAT:
        assert ch not in output.plain(f"a{ch}b"), hex(ord(ch))
        assert ch not in output.safe(f"a{ch}b"), hex(ord(ch))
    assert output.plain("a\u202eb") == "a\\u202eb"
    assert output.plain("é ü 中") == "é ü 中"  # letters are not format characters


def _hostile_lock(tmp_path, minimal_lock_text):
    lock = kernel_lock.loads(minimal_lock_text, emit_warnings=False)
    slot = lock.slots["LayerNorm"]
    from dataclasses import replace

    evil = "".join(NAMED)
    # free text only: a name (the implementation) with them is refused on read (test below)
    slot = replace(slot, reason=f"fast{evil}\u202eesrever", changes=(f"init{evil}",))
    lock = replace(lock, slots={**lock.slots, "LayerNorm": slot}, created_by=f"hand{evil}").sealed()
    path = tmp_path / "evil.toml"
    lock.dump(path)
    return path


@pytest.mark.parametrize("argv", [["show"], ["explain", "@", "LayerNorm"]])
def test_show_and_explain_escape_them(tmp_path, minimal_lock_text, capsys, argv):
    path = _hostile_lock(tmp_path, minimal_lock_text)
    argv = [a if a != "@" else path for a in argv] + ([path] if argv == ["show"] else [])
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert not set(NAMED) & set(out + err), [hex(ord(c)) for c in set(NAMED) & set(out + err)]
    assert "\\u202e" in out


def test_a_name_with_them_is_refused_on_read(tmp_path, minimal_lock_text, capsys):
    """An implementation, a device, a backend name: identifiers, so refused (exit 5), not shown."""
    for old, new in [
        ('implementation = "torch.layer_norm"', 'implementation = "torch.layer_norm\u202e"'),
        ("kwargs = { eps = 1e-6 }", 'kwargs = { eps = 1e-6 }\ndevices = ["cpu\\ny"]'),
    ]:
        path = tmp_path / "evil.toml"
        path.write_text(minimal_lock_text.replace(old, new, 1))
        code, out, err = run_cli(["show", path], capsys)
        assert code == 5 and "control character" in err and "\u202e" not in err, err


def test_errors_escape_them(tmp_path, minimal_lock_text, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(
        minimal_lock_text.replace(
            'created-by = "hand"', 'created-by = "hand"\nmode = "train\u202eing\u2028x"'
        )
    )
    code, out, err = run_cli(["verify", path], capsys)
    assert code == 5
    assert "\u202e" not in err and "\u2028" not in err and "\\u202e" in err


def test_the_job_start_lines_escape_them(tmp_path, minimal_lock_text, capsys, monkeypatch):
    """--check and reuse print the chosen implementations through output.info (plain lines)."""
    output.info("LayerNorm -> torch.layer_norm\u202e\u2066x")
    err = capsys.readouterr().err
    assert "\u202e" not in err and "\u2066" not in err and "\\u202e" in err


# ---- one vocabulary: exit codes and the common flags ---------------------------------------------
def test_every_error_class_names_its_exit_code_from_ExitCode():
    import re

    from kernel_lock.errors import ExitCode
    from tests.conftest import ROOT

    assignments = [
        (path.relative_to(ROOT), m.group(1))
        for package in ("kernel_lock", "kernel_probe")
        for path in sorted((ROOT / package).rglob("*.py"))
        for m in re.finditer(r"^\s+exit_code(?:: int)? = (.+)$", path.read_text(), re.M)
    ]
    assert len(assignments) >= 15  # the error classes of both packages
    assert [a for a in assignments if not re.fullmatch(r"ExitCode\.[A-Z_]+(  #.*)?", a[1])] == []
    from kernel_lock.portability import NotPortable
    from kernel_probe import errors

    classes = [
        NotPortable,
        *kernel_lock.LockError.__subclasses__(),
        *errors.ProbeError.__subclasses__(),
    ]
    assert all(isinstance(cls.exit_code, ExitCode) for cls in classes)


def test_exit_codes_keep_their_numbers_and_read_as_numbers():
    import json

    from kernel_lock.errors import EXIT_CODES, ExitCode

    assert [(c.name, c.value) for c in ExitCode] == [
        ("OK", 0),
        ("FAILURE", 1),
        ("USAGE", 2),
        ("MISMATCH", 3),
        ("PROFILE_UNMET", 4),
        ("BAD_INPUT", 5),
        ("LOCKS_DIFFER", 6),
    ]
    assert kernel_lock.ExitCode is ExitCode and kernel_lock.EXIT_CODES is EXIT_CODES
    assert (
        str(ExitCode.MISMATCH) == f"{ExitCode.MISMATCH}" == "3"
        and json.dumps(ExitCode.USAGE) == "2"
    )


def test_every_command_takes_debug_and_json_where_it_prints_json(capsys):
    from kernel_probe.cli import SUBCOMMANDS, build_subparser

    for name, sub in SUBCOMMANDS.items():
        parser, _ = build_subparser(name)
        flags = {o: a for a in parser._actions for o in a.option_strings}
        assert flags["--debug"].help == "show tracebacks and debug logs", name
        assert (flags["--json"].help if "--json" in flags else None) == sub.json, name
    assert SUBCOMMANDS["rehash"].json is None  # it prints one line on stderr
    for action in ("list", "show", "match"):  # profiles' own actions print JSON too
        code, out, err = run_cli(["profiles", action, "--help"], capsys)
        assert code == 0 and "--json" in out, action


def test_the_flags_are_declared_in_one_place():
    from tests.conftest import ROOT

    declared = [
        (path.relative_to(ROOT).as_posix(), flag)
        for path in sorted((ROOT / "kernel_probe").rglob("*.py"))
        for flag in ("--json", "--debug")
        if f'add_argument("{flag}"' in path.read_text()
    ]
    assert declared == [("kernel_probe/output.py", "--json"), ("kernel_probe/output.py", "--debug")]


# ---- errors as JSON, tables wider rather than cut (issue 16, point 4) ----------------------------
def test_wide_table_is_printed_wider_rather_than_cut(monkeypatch):
    from kernel_probe import output

    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        output.reset()
        t = output.table("T")
        t.add_column("id", no_wrap=True)
        t.add_column("note")
        t.add_row(
            "x" * 70 + ".end",
            "words that may wrap at spaces but never inside 'a_very_long_word_indeed'",
        )
        output.print_table(t)
    text = buf.getvalue()
    assert "x" * 70 + ".end" in text and "'a_very_long_word_indeed'" in text and "…" not in text


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--json", "--pin", "RMSNorm=nope"], 2),
        (["--json", "--precision", "fp8"], 2),
        (["verify", "/no/such/lock.toml", "--json"], 5),
        (["explain", "/no/such/lock.toml", "Layernorm", "--json"], 2),
    ],
)
def test_json_errors_are_json_on_stdout(argv, code, capsys, no_workers):
    got, out, err = run_cli(argv, capsys)
    assert got == code
    data = json.loads(out)
    assert data["ok"] is False and data["error"]["exit_code"] == code and data["error"]["problem"]
    assert err.strip()  # and the message for a person on stderr


# ---- markup and escape sequences in lock strings (hostile input, issue 14) -----------------------
@pytest.mark.parametrize(
    "value,shown",
    [
        ("[/bold] x", "[/bold] x"),
        ("[black on black]hidden", "[black on black]hidden"),
        ("\x1b[2J\x1b[31mred", "\\x1b[2J"),
    ],
)
@pytest.mark.parametrize("command", ["show", "explain", "diff", "verify"])
def test_strings_from_a_lock_are_printed_as_text(tmp_path, capsys, value, shown, command):
    escaped = value.replace("\x1b", "\\u001b")
    # a name with a control character is refused on read (issue 52): there, free text carries it
    name = 'implementation = "torch.layer_norm"'
    text = edited_lock(
        **{
            'created-by = "hand"': f'created-by = "{escaped}"',
            name: f'{name}\nreason = "{escaped}"'
            if "\x1b" in value
            else f'implementation = "{escaped}"',
        }
    )
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    argv = {
        "show": ["show", path],
        "explain": ["explain", path, "LayerNorm"],
        "diff": ["diff", path, tmp_path / "b.toml"],
        "verify": ["verify", path],
    }[command]
    write_sealed(tmp_path / "b.toml")
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "\x1b" not in out + err
    if command in ("show", "explain"):
        assert shown in out, out


# ---- messages and exit codes a new user meets (issue 37, point 8) --------------------------------
@pytest.mark.parametrize(
    "typo,near", [("verfiy", "verify"), ("expalin", "explain"), ("chek", "check")]
)
def test_a_mistyped_subcommand_says_did_you_mean(typo, near, capsys):
    code, out, err = run_cli([typo], capsys)
    assert code == 2 and f"did you mean {near!r}" in err
    assert "usage:" not in err and not out  # one line and the fix, not the whole usage


def test_a_word_that_is_no_subcommand_lists_them(capsys):
    code, _, err = run_cli(["frobnicate"], capsys)
    assert code == 2 and "is not a subcommand" in err and "verify" in err


def test_version_is_in_the_help_and_subcommand_help_names_the_codes_once(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0 and "--version" in out
    assert run_cli(["--version"], capsys)[1].startswith("kernel-probe ")
    code, out, _ = run_cli(["show", "--help"], capsys)
    from kernel_lock.errors import ExitCode

    assert code == 0 and "kernel-probe --help" in out
    # not the whole table again
    assert not any(f"  {c.value}  {c.meaning}" in out for c in ExitCode)


def test_a_missing_lock_named_by_kernel_lock_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK", str(tmp_path / "absent.toml"))
    code, _, err = run_cli(["show"], capsys)
    assert code == 5 and "$KERNEL_LOCK names this path" in err and "unset KERNEL_LOCK" in err


def test_explain_with_a_lock_and_no_slot_asks_for_the_slot(tmp_path, capsys, minimal_lock_text):
    path = write_sealed(tmp_path / "k.toml", minimal_lock_text)
    code, _, err = run_cli(["explain", path], capsys)
    assert code == 2 and "which slot?" in err and "unknown slot" not in err
    assert f"kernel-probe explain {path} SLOT" in err


def test_verify_on_a_missing_library_says_install_it_or_inference_mode(
    tmp_path, capsys, minimal_lock_text
):
    text = minimal_lock_text.replace(
        "kwargs = { eps = 1e-6 }\n",
        'kwargs = { eps = 1e-6 }\nrequires = [{ name = "transformer-engine", specifier = '
        '">=1.13" }]\n',
        1,
    )
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    code, _, err = run_cli(["verify", path, "--no-import"], capsys)
    assert code == 3 and "pip install 'transformer-engine>=1.13'" in err and "inference" in err
    assert "relax the field" not in err  # the match rule is not the cause of a missing library


# ---- env's own process ends without the interpreter's teardown (issue 37) ------------------------
def test_env_as_the_process_command_line_ends_without_the_teardown(monkeypatch, capsys):
    import logging

    from kernel_probe import cli

    ended, shut = [], []
    monkeypatch.setattr(cli.os, "_exit", ended.append)  # stubbed: main() goes on and returns
    monkeypatch.setattr(logging, "shutdown", lambda: shut.append(True))
    monkeypatch.setattr(sys, "argv", ["kernel-probe", "env", "--json", "--no-import-checks"])
    assert cli.main() == 0
    assert ended == [0] and shut == [True]  # logging flushed, then the process ends with the code
    # what it wrote is out
    assert json.loads(capsys.readouterr().out)["schema"] == "kernel-probe-env/1"
    ended.clear()
    # a caller gets the code
    assert cli.main(["env", "--json", "--no-import-checks"]) == 0 and ended == []
    monkeypatch.setattr(sys, "argv", ["kernel-probe", "show", "/no/such/lock.toml"])
    assert cli.main() != 0 and ended == []  # only a subcommand marked exit_now skips the teardown
    assert [name for name, sub in cli.SUBCOMMANDS.items() if sub.exit_now] == ["env"]


# ---- how the lock subcommands name and read a lock file (kernel_probe.output) --------------------
def test_the_default_lock_is_KERNEL_LOCK_else_the_file_here(monkeypatch):
    monkeypatch.delenv("KERNEL_LOCK", raising=False)
    assert output.default_lock_path() == output.DEFAULT_LOCK == "kernel-lock.toml"
    monkeypatch.setenv("KERNEL_LOCK", "/locks/site.toml")
    assert output.default_lock_path() == "/locks/site.toml"


def test_the_lock_argument_is_optional_and_says_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at hyphens too
    p = argparse.ArgumentParser()
    output.add_lock_argument(p, "lock file to re-seal")
    output.add_trust_argument(p)
    assert p.parse_args([]).lock is None and p.parse_args([]).trust == []
    args = p.parse_args(["a.toml", "--trust", "mylib", "--trust", "other"])
    assert args.lock == "a.toml" and args.trust == ["mylib", "other"]
    text = " ".join(p.format_help().split())
    assert "lock file to re-seal (default: $KERNEL_LOCK or ./kernel-lock.toml)" in text
    assert "$KERNEL_LOCK_TRUST" in text


def test_loading_sends_the_locks_warnings_to_stderr(tmp_path, capsys):
    output.reset()
    p = tmp_path / "k.toml"
    p.write_text(MINIMAL_LOCK.replace('"1.0"', '"1.99"'))
    lock = output.load_lock(str(p), check_targets=False)
    err = " ".join(capsys.readouterr().err.split())
    assert len(lock.warnings) == 2 and err.count("warning:") == 2
    assert "minor version 1.99 is newer" in err and "no digest" in err


def test_loading_strict_refuses_what_it_would_only_warn_about(tmp_path, capsys):
    p = tmp_path / "k.toml"
    kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False).sealed().dump(p)
    p.write_text(p.read_text().replace("eps = 1e-06", "eps = 1e-05"))  # a hand edit after sealing
    assert not output.load_lock(str(p)).intact
    with pytest.raises(LockFormatError, match="edited by hand"):
        output.load_lock(str(p), strict=True)


# ---- the lock commands default to $KERNEL_LOCK; a bad slot is a usage error (issue 16, point 7)
def test_lock_commands_default_to_KERNEL_LOCK(lock_file, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK", str(lock_file))
    monkeypatch.chdir(lock_file.parent.parent)  # no ./kernel-lock.toml here
    for argv in (["show"], ["explain", "LayerNorm"], ["rehash"], ["verify"]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0, (argv, err)
        assert str(lock_file) in out + err or argv == ["explain", "LayerNorm"], argv
    code, out, _ = run_cli(["explain", "LayerNorm"], capsys)
    # the $KERNEL_LOCK file's slot
    assert "LayerNorm -> torch.layer_norm (torch.nn.LayerNorm)" in out
