"""The three-way merge engine: user edits kept, upstream changes taken, conflicts exactly where both moved."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rigsmith.merge import MISSING, argv_items, merge3

scalars = st.one_of(
    st.integers(-3, 3), st.text("ab", max_size=2), st.none(), st.lists(st.integers(0, 2), max_size=2)
)
KEYS = [f"k{i}" for i in range(8)]


def _edit(data: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    for k, v in edits.items():
        if v is MISSING:
            out.pop(k, None)
        else:
            out[k] = v
    return out


edits = st.dictionaries(st.sampled_from(KEYS), st.one_of(scalars, st.just(MISSING)), max_size=5)


@given(st.dictionaries(st.sampled_from(KEYS), scalars, max_size=8), edits, edits)
def test_merge_keeps_user_edits_takes_upstream_and_conflicts_only_where_both_moved(
    base: dict[str, Any], user: dict[str, Any], upstream: dict[str, Any]
) -> None:
    ours, theirs = _edit(base, user), _edit(base, upstream)
    m = merge3(base, ours, theirs)
    both = {
        k
        for k in KEYS
        if ours.get(k, MISSING) != base.get(k, MISSING)
        and theirs.get(k, MISSING) != base.get(k, MISSING)
        and ours.get(k, MISSING) != theirs.get(k, MISSING)
    }
    assert {c.path for c in m.conflicts} == both
    for k in KEYS:
        o, t, b = ours.get(k, MISSING), theirs.get(k, MISSING), base.get(k, MISSING)
        got = m.value.get(k, MISSING)
        if k in both:
            assert got == o  # unresolved conflicts keep the user's value
        elif o != b:
            assert got == o  # every user edit kept
        else:
            assert got == t  # every upstream change applied
    theirs_wins = merge3(base, ours, theirs, resolve="theirs").value
    assert all(theirs_wins.get(k, MISSING) == theirs.get(k, MISSING) for k in both)


def test_lists_of_mappings_merge_by_key_and_argv_is_one_value() -> None:
    base = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], "args": ["--x", "1"]}
    ours = {"env": [{"name": "A", "value": "mine"}, {"name": "B", "value": "2"}], "args": ["--x", "1"]}
    theirs = {
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "up"}, {"name": "C", "value": "3"}],
        "args": ["--x", "2"],
    }
    m = merge3(base, ours, theirs, keyed=lambda p: "name" if p == "env" else None)
    assert m.conflicts == ()
    assert m.value == {
        "env": [{"name": "A", "value": "mine"}, {"name": "B", "value": "up"}, {"name": "C", "value": "3"}],
        "args": ["--x", "2"],
    }
    both = merge3(
        base, {**ours, "args": ["--x", "9"]}, theirs, keyed=lambda p: "name" if p == "env" else None
    )
    assert [c.path for c in both.conflicts] == ["args"]
    assert (
        both.conflicts[0].describe() == "args: yours ['--x', '9'], upstream ['--x', '2'] (was ['--x', '1'])"
    )


def test_nested_conflict_is_one_field_and_no_base_makes_every_difference_a_conflict() -> None:
    base = {"model": {"repo": "a", "local_dir": "/m"}}
    m = merge3(
        base, {"model": {"repo": "a", "local_dir": "/mine"}}, {"model": {"repo": "b", "local_dir": "/up"}}
    )
    assert [c.path for c in m.conflicts] == ["model.local_dir"]
    assert m.value == {"model": {"repo": "b", "local_dir": "/mine"}}
    none = merge3(None, {"a": 1, "b": 2, "u": 0}, {"a": 1, "b": 3, "n": 0})
    assert [c.path for c in none.conflicts] == ["b"]
    assert none.value == {"a": 1, "b": 2, "u": 0, "n": 0}


ENV = {"keyed": lambda p: "name" if p == "env" else None}


def _env(*pairs: tuple[Any, Any]) -> list[Any]:
    return [{"name": n, "value": v} for n, v in pairs]


def test_keyed_lists_merge_entry_by_entry_and_say_which_entries_moved() -> None:
    base = {"env": _env(("A", "1"), ("B", "2"), ("D", "4"))}
    ours = {"env": _env(("A", "mine"), ("B", "2"), ("D", "4"))}
    theirs = {"env": _env(("A", "1"), ("B", "2"))}  # D removed upstream
    m = merge3(base, ours, theirs, **ENV)
    assert m.value == {"env": _env(("A", "mine"), ("B", "2"))}
    assert (m.conflicts, m.kept, m.taken) == ((), ("env[A]",), ("env[D]",))


def test_a_keyed_list_missing_from_the_base_merges_by_key() -> None:
    m = merge3({}, {"env": _env(("A", "1"))}, {"env": _env(("B", "2"))}, **ENV)
    assert m.conflicts == ()
    assert m.value == {"env": _env(("A", "1"), ("B", "2"))}


@pytest.mark.parametrize(
    "odd",
    [
        _env(("A", "1"), ("A", "2")),  # the same name twice: no entry to merge it with
        [*_env(("A", "1")), "B=2"],  # an item that is not a mapping
        [*_env(("A", "1")), {"value": "2"}],  # a mapping without the key
        [*_env(("A", "1")), {"name": 7, "value": "2"}],  # a key that is not a string
    ],
    ids=["duplicate", "not-a-mapping", "no-key", "non-string-key"],
)
def test_a_keyed_list_that_cannot_be_keyed_is_one_value(odd: list[Any]) -> None:
    base = {"env": _env(("A", "1"))}
    theirs = {"env": _env(("A", "1"), ("C", "3"))}
    m = merge3(base, {"env": odd}, theirs, **ENV)
    assert [c.path for c in m.conflicts] == ["env"]
    assert m.value == {"env": odd}
    assert merge3(base, {"env": odd}, theirs, resolve="theirs", **ENV).value == theirs


def test_a_mapping_against_a_scalar_is_one_conflict_not_a_merge() -> None:
    base = {"model": "a"}
    m = merge3(base, {"model": {"repo": "a"}}, {"model": "b"})
    assert [(c.path, c.ours, c.theirs) for c in m.conflicts] == [("model", {"repo": "a"}, "b")]
    m = merge3(base, {"model": "b"}, {"model": {"repo": "a"}})
    assert [(c.path, c.ours, c.theirs) for c in m.conflicts] == [("model", "b", {"repo": "a"})]


def test_two_mappings_over_a_scalar_base_merge_key_by_key_as_if_the_base_were_empty() -> None:
    m = merge3({"model": "a"}, {"model": {"repo": "r", "x": 1}}, {"model": {"repo": "r", "y": 2}})
    assert m.conflicts == ()
    assert m.value == {"model": {"repo": "r", "x": 1, "y": 2}}
    m = merge3({"model": "a"}, {"model": {"repo": "mine"}}, {"model": {"repo": "up"}})
    assert [c.path for c in m.conflicts] == ["model.repo"]


def test_a_conflict_settled_by_a_function_is_asked_once_per_field() -> None:
    asked: list[str] = []

    def pick(c: Any) -> Any:
        asked.append(c.path)
        return "theirs" if c.path == "a" else "ours"

    m = merge3({"a": 0, "b": 0}, {"a": 1, "b": 1}, {"a": 2, "b": 2}, resolve=pick)
    assert asked == ["a", "b"] and m.value == {"a": 2, "b": 1}
    assert [c.describe() for c in m.conflicts] == [
        "a: yours 1, upstream 2 (was 0)",
        "b: yours 1, upstream 2 (was 0)",
    ]
    gone = merge3({"a": 0}, {}, {"a": 2})
    assert gone.conflicts[0].describe() == "a: yours <not set>, upstream 2 (was 0)"


def test_an_argv_merges_flag_by_flag_and_a_conflict_is_one_flag() -> None:
    base = {"args": ["M", "--a", "1", "--max-num-seqs", "8", "--bare", "--names", "x", "y"]}
    ours = {"args": ["M", "--a", "2", "--max-num-seqs", "6", "--bare", "--names", "x", "y"]}
    theirs = {"args": ["M", "--a", "1", "--max-num-seqs", "16", "--names", "x", "z", "--c=3"]}
    m = merge3(base, ours, theirs, argv=("args",))
    assert [c.describe() for c in m.conflicts] == ["args --max-num-seqs: yours 6 · upstream 16 · was 8"]
    # the user's --a kept, upstream's dropped --bare, changed --names and added --c=3 taken; the words
    # before the first flag stay first
    assert m.value == {"args": ["M", "--a", "2", "--max-num-seqs", "6", "--names", "x", "z", "--c=3"]}
    assert m.kept == ("args --a",)
    assert set(m.taken) == {"args --bare", "args --names", "args --c"}
    up = merge3(base, ours, theirs, argv=("args",), resolve="theirs")
    assert up.value["args"][3:5] == ["--max-num-seqs", "16"] and up.value["args"][1:3] == ["--a", "2"]
    # without argv the list is one value: one conflict carrying the three whole lists
    assert [c.path for c in merge3(base, ours, theirs).conflicts] == ["args"]


def test_argv_items_name_bare_equals_repeated_and_absent_flags() -> None:
    assert argv_items(["M", "--x=1", "--x", "2", "-v", "--n", "-1"]) == {
        "#0": ["M"],
        "--x": ["--x=1"],
        "--x (2)": ["--x", "2"],
        "-v": ["-v"],
        "--n": ["--n", "-1"],
    }
    assert argv_items(["a", 3]) is None
    m = merge3({"a": ["--on"]}, {"a": []}, {"a": ["--on=1"]}, argv=("a",))
    assert [c.describe() for c in m.conflicts] == ["a --on: yours not set · upstream 1 · was set"]
    long = merge3({"a": "x" * 200}, {"a": "y" * 200}, {"a": "z" * 200})
    line = long.conflicts[0].describe(limit=20)
    assert len(line) < 100 and "…" in line
