"""Issue 35's acceptance, held by the suite: published scripts (tests/importing/data/shell-scripts.json, each
with its source) end in their expected outcome, and every one imported launches exactly the argv plain bash
hands the launcher when it runs the text outside any jail with recording stubs (the oracle), given the
values rigsmith made placeholders (a blank the text leaves to fill, ``MODEL_PATH=""``, given its placeholder
by bash: ``oracle_blanks``). A documentation word the import makes a placeholder (``/path/to/…``) is
replaced after bash's argv is read, so the argv compared here still holds it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe
from rigsmith.importing.prompts import strip_prompts
from rigsmith.importing.recipe.command import script as scriptform
from tests.support.bashoracle import script_launches
from tests.support.recipes import HERE

SCRIPTS: list[dict[str, Any]] = [
    c for c in json.loads((HERE / "data" / "shell-scripts.json").read_text(encoding="utf-8")) if "raw" in c
]
IMPORTED = [c for c in SCRIPTS if "refused" not in c]


def _is_launch(argv: Sequence[str]) -> bool:
    """A vLLM launch as the oracle recorded it (a Python that runs another program is not one)."""
    name = PurePosixPath(argv[0]).name
    if name in ("vllm", "docker", "podman"):
        return True
    return name.startswith("python") and "-m" in argv[:-1] and argv[argv.index("-m") + 1].startswith("vllm")


def _served_args(argv: Sequence[str], image: str | None) -> list[str]:
    """The words after ``vllm serve`` / ``python -m MODULE`` (in a container, of its command)."""
    words = list(argv)
    if PurePosixPath(words[0]).name in ("docker", "podman"):
        assert image is not None
        words = words[words.index(image) + 1 :]
    if words[:2] == ["vllm", "serve"]:
        return words[2:]
    if words and PurePosixPath(words[0]).name.startswith("python"):
        return words[words.index("-m") + 2 :]
    return words  # the image's entrypoint serves


@pytest.mark.parametrize("case", SCRIPTS, ids=[c["id"] for c in SCRIPTS])
def test_a_published_script_ends_in_its_outcome(case: dict[str, Any]) -> None:
    try:
        dep = recipe.parse(case["raw"], source="t", sha256="0" * 64)
    except RecipeError as err:
        message = str(err)
        assert "Traceback" not in message and "@@rigsmith" not in message
        assert "refused" in case, message
        for fragment in case["refused"]:
            assert fragment in message
        return
    assert "refused" not in case, "imported, expected a refusal"
    assert list(dep.engine.args) == case["args"]
    assert sorted(dep.placeholders) == case.get("placeholders", [])
    notes = "\n".join(dep.notes)
    assert "@@rigsmith" not in notes
    for fragment in case.get("notes_contain", []):
        assert fragment in notes


@pytest.mark.parametrize("case", IMPORTED, ids=[c["id"] for c in IMPORTED])
def test_an_imported_script_launches_the_argv_bash_runs(case: dict[str, Any], tmp_path: Path) -> None:
    dep = recipe.parse(case["raw"], source="t", sha256="0" * 64)
    launch = scriptform.from_script(case["raw"], "t", accept=False)  # before secrets leave the argv
    assert launch.problems == []
    text, _ = strip_prompts(case["raw"])  # a pasted shell prompt is not the script's (said in a note)
    made = [*launch.made_placeholders, *dep.placeholders]  # a secret's placeholder leaves the spec
    ran = script_launches(text, tmp_path, made, case.get("oracle_outputs"), case.get("oracle_blanks", ()))
    (want,) = [argv for argv in ran if _is_launch(argv)]
    assert launch.args == _served_args(want, launch.image)
