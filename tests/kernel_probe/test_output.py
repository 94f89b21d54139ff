"""kernel_probe.output: the consoles, JSON printing, the shared --json/--debug flags, and text made
safe.

(Unicode format characters across the whole code space, and a table printed wider rather than cut,
are tested with the CLI in tests/kernel_probe/test_cli.py.)"""

from __future__ import annotations

import argparse
import json

import pytest

from kernel_probe import output


@pytest.fixture(autouse=True)
def fresh_consoles(monkeypatch):
    """Consoles made for this test's captured streams, plain (no colour, no terminal), 80
    columns."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    output.reset()
    yield
    output.reset()


# ---- text made safe ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, shown",
    [
        ("plain text", "plain text"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # a terminal sequence is shown, never sent
        ("a\tb", "a\\tb"),
        ("bell\x07", "bell\\x07"),
        ("del\x7f", "del\\x7f"),
        ("c1\x9b", "c1\\x9b"),  # the C1 CSI
        ("soft\u00adhyphen", "soft\\xadhyphen"),
        ("rtl\u202eoverride", "rtl\\u202eoverride"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("bom\ufeff", "bom\\ufeff"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("é ü 中 λ", "é ü 中 λ"),  # letters pass
        (42, "42"),
        (None, "None"),
    ],
)
def test_plain_shows_controls_as_escapes(value, shown):
    assert output.plain(value) == shown


def test_plain_keeps_lines():
    assert output.plain("one\x1b\ntwo\u2028") == "one\\x1b\ntwo\\u2028"


@pytest.mark.parametrize(
    "value, shown",
    [
        ("[/bold]", "\\[/bold]"),  # rich markup in a lock is printed, not interpreted
        ("[red]x[/red]", "\\[red]x\\[/red]"),
        ("list[int]", "list\\[int]"),
        ("\x1b[1m[b]", "\\x1b[1m\\[b]"),  # the control escaped; "[1m" is no tag, "[b]" is one
        ("a\nb", "a\\nb"),  # one value is one line on a console
        ("no markup", "no markup"),
    ],
)
def test_safe_escapes_markup_and_controls(value, shown):
    assert output.safe(value) == shown


@pytest.mark.parametrize("value", ["[/bold]", "[red]x[/red]", "\x1b[31mred", "a[b]c"])
def test_safe_text_prints_as_itself(value, capsys):
    output.console().print(output.safe(value))
    assert capsys.readouterr().out == output.plain(value) + "\n"


# ---- messages ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "say, prefix",
    [(output.error, "error: "), (output.warn, "warning: "), (output.info, "")],
)
def test_messages_go_to_stderr_line_by_line(say, prefix, capsys):
    say("cannot read [b]x.toml[/b]\x1b[2J\n  fix: run it again")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"{prefix}cannot read [b]x.toml[/b]\\x1b[2J\n  fix: run it again\n"


def test_info_does_not_need_rich(capsys, monkeypatch):
    """The warm path of a job start prints one line and must not pay for importing rich."""
    monkeypatch.setattr(
        output, "console", lambda *_a, **_k: pytest.fail("info() used a rich console")
    )
    output.info("LayerNorm -> torch.layer_norm")
    assert capsys.readouterr().err == "LayerNorm -> torch.layer_norm\n"


# ---- JSON --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [
        {"b": 1, "a": [1, 2, {"c": None}]},  # key order kept, not sorted
        [],
        "text with \u202e",
        {"long": "x" * 500},  # never wrapped
    ],
)
def test_print_json_writes_one_document_on_stdout(data, capsys):
    output.print_json(data)
    out, err = capsys.readouterr()
    assert err == "" and out.endswith("\n")
    assert json.loads(out) == data
    if isinstance(data, dict):
        assert list(json.loads(out)) == list(data)


def test_print_json_writes_what_json_cannot_as_text(capsys, tmp_path):
    output.print_json({"path": tmp_path, "codes": {3}})
    assert json.loads(capsys.readouterr().out) == {"path": str(tmp_path), "codes": "{3}"}


# ---- the shared flags --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, json_on, debug_on",
    [
        ([], False, False),
        (["--json"], True, False),
        (["--debug"], False, True),
        (["--debug", "--json"], True, True),
    ],
)
def test_flags_as_argparse_parents(argv, json_on, debug_on):
    parser = argparse.ArgumentParser(
        parents=[output.json_flag("print the report as JSON"), output.debug_flag()]
    )
    args = parser.parse_args(argv)
    assert (args.json, args.debug) == (json_on, debug_on)
    assert "print the report as JSON" in parser.format_help()
    assert "show tracebacks and debug logs" in parser.format_help()


def test_flag_parents_add_no_help_of_their_own():
    for parent in (output.json_flag(), output.debug_flag()):
        assert not any("-h" in action.option_strings for action in parent._actions)


# ---- consoles and tables -----------------------------------------------------------------------
def test_one_console_per_stream_until_reset():
    out, err = output.console(), output.console(stderr=True)
    assert out is output.console() and err is output.console(stderr=True) and out is not err
    assert err.stderr and not out.stderr
    output.reset()
    assert output.console() is not out


def test_console_does_not_wrap_or_highlight(capsys):
    output.console().print("0x1f 12 'quoted' " + "word " * 40)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out


def test_table_defaults_and_overrides():
    from rich import box

    t = output.table("Title")
    assert (t.title, t.box, t.show_edge, t.pad_edge, t.title_justify) == (
        "Title",
        box.SIMPLE_HEAD,
        False,
        False,
        "left",
    )
    assert output.table(box=box.ASCII, show_edge=True).box is box.ASCII
    assert output.table(show_edge=True).show_edge is True


def test_print_table_restores_the_console_width(capsys):
    t = output.table()
    t.add_column("id", no_wrap=True)
    t.add_row("y" * 120)
    con = output.console()
    width = con.width
    output.print_table(t)
    assert con.width == width
    assert "y" * 120 in capsys.readouterr().out


def test_print_table_wraps_at_spaces_never_inside_a_word(capsys):
    t = output.table()
    t.add_column("id", no_wrap=True)
    t.add_column("note")
    t.add_row("a" * 40, " ".join(["short"] * 20 + ["unbreakable_identifier_of_thirty"]))
    output.print_table(t, stderr=True)
    out, err = capsys.readouterr()
    assert out == "" and "unbreakable_identifier_of_thirty" in err
    assert max(len(line) for line in err.splitlines()) <= 80  # it fits: wrapped, not widened
