"""The three-way merge engine: user edits kept, upstream changes taken, conflicts exactly where both moved."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rigsmith.merge import MISSING, merge3

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
