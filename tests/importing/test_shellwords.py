"""The scanner splits words exactly like a POSIX shell (no expansion) and names the published quirks."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith.importing import shellwords

_ARG = st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)


@given(st.lists(_ARG, min_size=1, max_size=12))
@settings(max_examples=400, deadline=None)
def test_split_of_shlex_join_gives_the_argv_back(argv: list[str]) -> None:
    assert shellwords.split(shlex.join(argv)) == argv


@given(st.lists(_ARG, min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_backslash_continued_lines_give_the_same_argv(argv: list[str]) -> None:
    text = " \\\n    ".join(shlex.quote(a) for a in argv)
    assert shellwords.split(text) == argv


def test_double_quotes_drop_the_backslash_before_dollar_as_posix_does() -> None:
    # shlex.split keeps the backslash here; bash and dash do not.
    assert shellwords.split(r'echo "a\$b" "c\"d" "e\xf"') == ["echo", "a$b", 'c"d', r"e\xf"]


def test_nothing_is_expanded_and_expansions_are_marked() -> None:
    script = shellwords.scan("run \"$HOME/x\" $(pwd) `id` '$lit'")
    words = script.commands[0].words
    assert [w.text for w in words] == ["run", "$HOME/x", "$(pwd)", "`id`", "$lit"]
    assert [w.expands for w in words] == [False, True, True, True, False]


def test_placeholder_is_a_word_not_a_redirection() -> None:
    script = shellwords.scan("vllm serve m --max-model-len <n_of_tokens> # up to 131072")
    assert script.problems == []
    assert script.commands[0].argv[-1] == "<n_of_tokens>"
    assert script.commands[0].comment == "up to 131072"


def test_redirection_and_operators_are_problems() -> None:
    problems = shellwords.scan("vllm serve m > log").problems
    assert any("redirection" in p for p in problems)
    problems = shellwords.scan("vllm serve m && echo ok | tee x").problems
    assert any("'&&'" in p for p in problems) and any("'|'" in p for p in problems)


def test_missing_space_before_continuation_that_glues_words_is_a_problem() -> None:
    problems = shellwords.scan("vllm serve org/model\\\n--port 8000").problems
    assert len(problems) == 1 and "glues them into one word ('org/model--port')" in problems[0]
    # the next line indented: bash still separates the words (corpus case 35)
    assert shellwords.scan("vllm serve org/model\\\n  --port 8000").problems == []


def test_crlf_line_ends_count_as_lf_outside_quotes_only() -> None:
    assert shellwords.split("vllm serve m \\\r\n  --port 1\r\n") == ["vllm", "serve", "m", "--port", "1"]
    assert shellwords.split("a 'x\r\ny'") == ["a", "x\r\ny"]


def test_unclosed_quote_is_a_problem() -> None:
    assert "never closed" in shellwords.scan("vllm serve 'abc").problems[0]


def test_a_nested_command_substitution_is_one_word_up_to_its_own_close() -> None:
    script = shellwords.scan("vllm serve $(dirname $(pwd) x)/m --port 1")
    assert script.problems == []
    assert [(w.text, w.expands) for w in script.commands[0].words] == [
        ("vllm", False),
        ("serve", False),
        ("$(dirname $(pwd) x)/m", True),
        ("--port", False),
        ("1", False),
    ]


def test_a_substitution_over_lines_counts_them_for_later_messages() -> None:
    script = shellwords.scan("vllm serve $(cat\nmodel.txt) \\\n  --x 1 > log\n")
    assert [w.text for w in script.commands[0].words][:3] == ["vllm", "serve", "$(cat\nmodel.txt)"]
    assert len(script.problems) == 1 and script.problems[0].startswith("line 3: '>' is a shell redirection")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("vllm serve m \\\n  --a 'x\ny' \\\n  --b \"unclosed", 4),  # a quoted newline counts too
        ('vllm serve m --a "x\\\ny" &&\n', 2),  # a continuation inside double quotes
        ('vllm serve m --a "x\ny" | tee\n', 2),  # a newline inside double quotes
        ("vllm serve m \\\n\n\n  --port 1 | tee\n", 4),  # blank lines after a continuation
        ("vllm serve m \\\r\n  --port 1 ; echo\r\n", 2),  # CRLF line ends
    ],
    ids=[
        "quoted-newline",
        "continued-in-quotes",
        "double-quoted-newline",
        "blank-after-continuation",
        "crlf",
    ],
)
def test_problems_name_the_line_they_are_on(text: str, line: int) -> None:
    problems = shellwords.scan(text).problems
    assert len(problems) == 1 and problems[0].startswith(f"line {line}: "), problems


def test_crlf_continuations_comments_and_blank_lines_read_as_with_lf() -> None:
    lf = "# start it\nvllm serve m \\\n\n  --port 1  # the port\n"
    crlf = lf.replace("\n", "\r\n")
    a, b = shellwords.scan(lf), shellwords.scan(crlf)
    assert (
        [c.argv for c in b.commands]
        == [c.argv for c in a.commands]
        == [["vllm", "serve", "m", "--port", "1"]]
    )
    assert b.comments == a.comments == [(1, "start it")]
    assert b.commands[0].comment == a.commands[0].comment == "the port"
    assert b.notes == a.notes and "line(s) 2" in a.notes[0]
    assert b.problems == a.problems == []


def test_a_backslash_then_space_then_crlf_is_a_problem_as_with_lf() -> None:
    for end in ("\n", "\r\n"):
        problems = shellwords.scan(f"vllm serve m \\ {end}  --port 1{end}").problems
        assert len(problems) == 1 and "followed by a space (then the end of the line)" in problems[0], end


def test_split_takes_exactly_one_command() -> None:
    assert shellwords.split("vllm serve a/b --port 8000") == ["vllm", "serve", "a/b", "--port", "8000"]
    with pytest.raises(ValueError, match="chains another command"):
        shellwords.split("vllm serve a/b; vllm serve c/d")


def test_a_comment_is_kept_whole_without_its_hash() -> None:
    assert shellwords.scan("#tp2 on the 3090s\nvllm serve a/b\n").comments == [(1, "tp2 on the 3090s")]
