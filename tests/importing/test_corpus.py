"""Every case of the corpus (tests/importing/data/vllm-commands.json, a verbatim copy of shared/corpus):
imported with its argv exact, or refused with a reason.

The expected outcome per case is data (corpus_expected.yaml). Where bash can parse the published text
the way the author meant, bash itself is the oracle for the argv: the text runs under ``bash`` with
stub functions for the launchers that print their argv, and the spec must hold exactly that argv.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe
from rigsmith.spec import Deployment
from tests.support.bashoracle import bash_argv
from tests.support.recipes import corpus, expected, filled_as_user

CASES = corpus()
EXPECTED = expected()


def _import(case: dict[str, Any]) -> Deployment:
    sha = hashlib.sha256(case["raw"].encode()).hexdigest()
    return recipe.parse(case["raw"], source=f"corpus:{case['id']}", sha256=sha)


def test_expected_outcomes_cover_exactly_the_corpus() -> None:
    assert len(CASES) == 73
    assert sorted(EXPECTED) == sorted(c["id"] for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_case(case: dict[str, Any]) -> None:
    want = EXPECTED[case["id"]]
    if want["outcome"] == "refused":
        with pytest.raises(RecipeError) as err:
            _import(case)
        message = str(err.value)
        for fragment in want["reason"]:
            assert fragment in message
        assert "Traceback" not in message
        return
    dep = _import(case)
    eng = dep.engine
    assert eng.model_arg is not None and eng.model_arg == want["model_arg"]
    assert dep.model.repo == want.get("repo", case["model"]), "the corpus' own model field"
    if "local_dir" in want:
        assert dep.model.local_dir == want["local_dir"]
    if dep.model.repo is not None:
        assert eng.args[eng.model_arg] in (case["model"], dep.model.repo, dep.model.local_dir)
    model_word = eng.container_argv(dep.model)[len(eng.subcommand) + eng.model_arg]
    assert model_word == want.get("container_argv_model", dep.model.container_path)
    assert eng.executable == want.get("executable", "vllm")
    assert list(eng.subcommand) == want.get("subcommand", ["serve"])
    assert eng.image == want.get("image")
    env = want.get("env", "corpus")
    assert {e.name: e.value for e in dep.env} == (case["env"] if env == "corpus" else env)
    gpus = dep.resources.gpus
    assert gpus.count == want["gpus"]
    vendor = want.get("vendor", "nvidia.com/gpu")
    assert list(gpus.cdi_devices) == want.get("cdi", [f"{vendor}={i}" for i in range(want["gpus"])])
    assert sorted(dep.placeholders) == sorted(want.get("placeholders", []))
    assert all(v is None for v in dep.placeholders.values())
    assert dep.unfilled_placeholders() == sorted(want.get("placeholders", []))
    if "shm_size" in want:
        assert dep.resources.shm_size == want["shm_size"]
    if "mounts" in want:
        assert len(dep.mounts) == want["mounts"]
    notes = "\n".join(dep.notes)
    for fragment in want.get("notes_contain", []):
        assert fragment in notes
    if "args" in want:
        assert list(eng.args) == want["args"]
    assert want.get("args") is not None or "oracle_skip" not in want


_ORACLE = [
    c for c in CASES if EXPECTED[c["id"]]["outcome"] == "imported" and "oracle_skip" not in EXPECTED[c["id"]]
]


@pytest.mark.parametrize("case", _ORACLE, ids=[c["id"] for c in _ORACLE])
def test_imported_argv_is_what_bash_parses(case: dict[str, Any], tmp_path: Path) -> None:
    shell_argv = bash_argv(case["raw"], tmp_path)
    eng = _import(case).engine
    if shell_argv[0] in ("docker", "podman"):
        image = eng.image
        assert image is not None
        shell_args = shell_argv[shell_argv.index(image) + 1 :]
    else:
        shell_args = shell_argv[1 + len(eng.subcommand) :]
        assert shell_argv[0] == eng.recipe_executable
    assert list(eng.args) == shell_args


_IMPORTED = [c for c in CASES if EXPECTED[c["id"]]["outcome"] == "imported"]


@pytest.mark.parametrize("case", _IMPORTED, ids=[c["id"] for c in _IMPORTED])
def test_imported_case_renders_the_podman_target_once_filled(case: dict[str, Any], tmp_path: Path) -> None:
    from rigsmith import secondary, userhome
    from rigsmith import spec as specmod
    from rigsmith.project import Project
    from rigsmith.rendering import decisions, deploy, optins

    dep = _import(case)
    filled = filled_as_user(dep)
    project = Project(tmp_path)
    project.spec_path(dep.name).parent.mkdir()
    project.spec_path(dep.name).write_text(specmod.dump(filled), encoding="utf-8")
    filled = project.load(dep.name)  # as rigsmith reads it (a model placeholder is then the filled model)
    refused = EXPECTED[case["id"]].get("deploy_refused")
    if refused is not None:
        # Imported as published, but deploy's model-directory policy refuses the host path (issue 10).
        from rigsmith.errors import SpecError

        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, "podman", deployment=dep.name)
        assert refused in str(err.value)
        return
    if secondary.gguf_quant(filled):
        # Which .gguf file the REPO:QUANT reference means is known once the repo is pinned: deploy says so.
        from rigsmith.errors import LockError

        with pytest.raises(LockError) as lerr:
            deploy.artifacts(project, "podman", deployment=dep.name)
        assert "invoke pin" in str(lerr.value) + str(lerr.value.hint)
        return
    plan, files = deploy.artifacts(project, "podman", deployment=dep.name)
    # Each secondary Hub model's word names its read-only mount, like the model word.
    placed = {p.repo: p.container_path for p in secondary.placements(filled)}
    args = secondary.rewrite_args(filled, filled.engine.args, placed)
    engine = filled.engine.model_copy(update={"args": args})
    want = tuple(filled.fill(a) for a in engine.container_argv(filled.model))
    if filled.network.listen is not None:  # the exposure decision (issue 24): --host replaced or added
        sub = len(filled.engine.subcommand)
        want = (*want[:sub], *optins.with_flag(want[sub:], "--host", filled.network.listen))
    served = decisions.served_name(filled)
    if served is not None and filled.engine.model_arg is not None:
        word = want[len(filled.engine.subcommand) + filled.engine.model_arg]
        if word.split("=", 1)[-1] != served:  # the model word was rewritten: the recipe's name is kept
            want = (*want, "--served-model-name", filled.fill(served))
    assert plan.command == want
    mounted = {(m.host, m.container, m.readonly) for m in plan.mounts}
    for p in secondary.placements(filled):
        assert (userhome.expand(p.local_dir, userhome.invoking_home()), p.container_path, True) in mounted
    assert plan.devices == dep.resources.gpus.cdi_devices
    assert files


def test_imported_specs_match_golden(update_golden: bool) -> None:
    """The generated artifact of import-recipe is deployments/NAME.yaml: one golden file per imported case."""
    from rigsmith import spec as specmod
    from tests.support.common import GOLDEN, compare_tree
    from tests.support.recipes import SEED_RECIPE

    actual = {f"{c['id']}.yaml": specmod.dump(_import(c)) for c in _IMPORTED}
    seed = SEED_RECIPE.read_bytes()
    dep = recipe.parse(
        seed.decode(), source="examples/recipes/" + SEED_RECIPE.name, sha256=hashlib.sha256(seed).hexdigest()
    )
    actual["seed-003-recipe.yaml"] = specmod.dump(dep)
    compare_tree(actual, GOLDEN / "recipes" / "imported", update_golden)
