"""How foreign words reach the terminal (rigsmith.errors.shown, shown_lines) and what a failed command's
error quotes of it: invisible and reordering characters written out, the message's own layout kept, the
tail of stderr line by line (issue 39's mutation sample)."""

from __future__ import annotations

import pytest

from rigsmith.errors import LISTED, CommandError, RecipeError, RigsmithError, SpecError, shown, shown_lines


@pytest.mark.parametrize(
    ("char", "written"),
    [
        ("\u200b", r"\u200b"),  # ZERO WIDTH SPACE: two names that look the same
        ("\u202e", r"\u202e"),  # RIGHT-TO-LEFT OVERRIDE: "txt.exe" shown as "exe.txt"
        ("\u2066", r"\u2066"),  # LEFT-TO-RIGHT ISOLATE
        ("\x1b", r"\x1b"),  # ESC: a terminal sequence
        ("\x9b", r"\x9b"),  # the one-byte CSI
        ("\r", r"\r"),  # a carriage return that would overwrite the line
        ("\n", r"\n"),  # a line break that would forge a line of rigsmith's own
    ],
)
def test_an_invisible_or_control_character_is_shown_as_its_escape(char: str, written: str) -> None:
    assert shown(f"model{char}.txt") == f"model{written}.txt"


def test_printable_text_in_any_script_is_shown_as_it_is() -> None:
    text = "Qwen3 模型 é ü — «ok» 100% ~/a b\tc"
    assert shown(text) == text.replace("\t", r"\t")


def test_a_message_keeps_its_own_lines_and_escapes_everything_else() -> None:
    assert shown_lines("first\nsecond\u202e\rthird") == "first\nsecond\\u202e\\rthird"
    err = RecipeError("bad value 'a\x1b[2J'\nsecond line", hint="use \u2066this\u2069")
    assert str(err) == "bad value 'a\\x1b[2J'\nsecond line\n  hint: use \\u2066this\\u2069"


def test_a_failed_command_quotes_the_last_15_lines_of_its_stderr_one_per_line() -> None:
    stderr = "".join(f"line {i}\n" for i in range(1, 21)) + "\n"
    err = CommandError(["podman", "run", "a b"], 125, stderr, hint="see podman's log")
    lines = str(err).splitlines()
    assert lines[0] == "command failed (exit 125): podman run 'a b'"
    assert lines[1:-1] == [f"  | line {i}" for i in range(6, 21)]
    assert lines[-1] == "  hint: see podman's log"
    assert err.code == 125 and err.argv == ["podman", "run", "a b"]


def test_a_failed_commands_stderr_is_escaped_and_an_empty_one_adds_no_line() -> None:
    err = CommandError(["x"], 2, "boom\x1b]0;owned\x07\nerror: forged\r")
    assert str(err).splitlines() == [
        "command failed (exit 2): x",
        "  | boom\\x1b]0;owned\\x07",
        "  | error: forged",
    ]
    assert str(CommandError(["x"], 1, " \n\n")) == "command failed (exit 1): x"
    assert isinstance(err, RigsmithError)


@pytest.mark.parametrize("count", [LISTED, LISTED + 1, 4096])
def test_an_error_lists_twenty_problems_and_counts_the_rest(count: int) -> None:
    # a text repeating one mistake (a doubled `--port x`) got a 528 KB message of 4,096 lines
    err = SpecError("x.yaml", [(f"args[{i}]", "bad") for i in range(count)])
    lines = err.message.splitlines()
    assert lines[0] == f"x.yaml: {count} problem(s) in the deployment spec"
    assert lines[1 : LISTED + 1] == [f"  args[{i}]: bad" for i in range(LISTED)]
    assert lines[LISTED + 1 :] == ([] if count == LISTED else [f"  … and {count - LISTED} more"])
    assert LISTED == 20
