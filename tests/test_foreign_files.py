"""A file from outside that is not what it should be is one paragraph naming the file, the line and the
field — never PyYAML's "<unicode string>" — and an unknown field gets the nearest known one (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import RecipeError, SpecError
from rigsmith.importing.recipe.compose import form as composeform
from rigsmith.project import Project
from rigsmith.spec import loads
from tests.support.common import invoke_cli


def test_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    (tmp_path / "deployments" / "bad.yaml").write_text("name: bad\nmodel: [unclosed\n")
    with pytest.raises(SpecError) as err:
        Project(tmp_path).load("bad")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'deployments' / 'bad.yaml'}: 1 problem(s)")
    assert "not valid YAML at line 3, column 1: did not find expected ',' or ']'" in msg
    assert "(while parsing a flow sequence at line 2, column 8)" in msg
    assert "<unicode string>" not in msg and len(msg.splitlines()) == 2

    out = invoke_cli(tmp_path, "status", "--deployment", "bad")
    assert out.returncode == 1 and "line 3, column 1" in out.stderr and "Traceback" not in out.stderr


def test_a_compose_recipe_with_broken_yaml_says_where() -> None:
    with pytest.raises(RecipeError) as err:
        composeform._compose_data("services:\n  vllm: {image: x\n", "compose.yaml")
    assert "<unicode string>" not in str(err.value) and "at line 3, column 1" in str(err.value)


def test_unknown_spec_fields_get_the_nearest_known_one() -> None:
    with pytest.raises(SpecError) as err:
        loads("name: t\nmodle: {}\nresources: {gpus: {cont: 2}}\nengine: {args: [], imagee: x}\n")
    problems = dict(err.value.problems)
    assert problems["modle"].endswith("(unknown field; did you mean 'model'?)")
    assert problems["resources.gpus.cont"].endswith("(unknown field; did you mean 'count'?)")
    assert problems["engine.imagee"].endswith("(unknown field; did you mean 'image'?)")
    with pytest.raises(SpecError) as far:
        loads("name: t\nzzzzzz: 1\n")
    assert "check the spelling against schema/deployment.schema.json" in dict(far.value.problems)["zzzzzz"]
