"""After import-recipe: a spec editors validate (the schema modeline) and the commands from there, in order,
each one a command that names the deployment (issue 27)."""

from __future__ import annotations

from pathlib import Path

from rigsmith import spec as specmod
from rigsmith.project import Project
from tests.support.common import REPO
from tests.support.recipes import SEED_RECIPE, import_cli


def test_import_writes_the_schema_modeline_and_prints_the_commands_in_order(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    out = import_cli(tmp_path, str(SEED_RECIPE), "--name", "merlin")
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "deployments" / "merlin.yaml").read_text()
    assert text.startswith(specmod.MODELINE)
    schema = (REPO / "deployments" / specmod.MODELINE.split("$schema=", 1)[1].strip()).resolve()
    assert schema == REPO / "schema" / "deployment.schema.json" and schema.is_file()
    assert Project(tmp_path).load("merlin").name == "merlin"  # the comment stays out of the model
    lines = out.stdout.splitlines()
    start = lines.index("next, in order (after filling in what is named above, if anything):")
    steps = [ln.split(". ", 1)[1] for ln in lines[start + 1 :] if ln.startswith("  ")]
    assert (
        steps[0] == "invoke pin --deployment merlin"
        and steps[-1] == "invoke bench --compare --deployment merlin"
    )
    assert "invoke up --deployment merlin" in steps
    assert steps.index("invoke deploy --target podman --deployment merlin") < steps.index(
        "invoke up --deployment merlin"
    )
    assert lines[-1] == "`invoke next --deployment merlin` says where it stands at any time"
