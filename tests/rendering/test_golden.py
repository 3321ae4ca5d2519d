"""Golden files for every target and both seed deployments: exact file set, exact text.

Refresh with `pytest tests/rendering/test_golden.py --update-golden` and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.project import Project
from rigsmith.rendering.targets import LxcOptions
from tests.support.common import GOLDEN, GOLDEN_SUFFIX, compare_tree
from tests.support.targets import SEEDS, as_venv, render_seed

#: (case directory, target, deploy options); the case directory is tests/golden/<deployment>/<case>/.
CASES: list[tuple[str, str, dict[str, object]]] = [
    ("podman", "podman", {}),
    ("quadlet", "quadlet", {}),
    ("quadlet@5.4.2", "quadlet", {"podman_version": "5.4.2"}),
    ("quadlet@4.6.0", "quadlet", {"podman_version": "4.6.0"}),
    ("compose", "compose", {}),
    ("lxc", "lxc", {}),
    ("lxc@pve7.4", "lxc", {"lxc": LxcOptions(pve_version="7.4", uvm_major=509, vmid=201)}),
    ("kube", "kube", {}),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("case", "target", "options"), CASES, ids=[c[0] for c in CASES])
def test_rendered_artifacts_match_golden_files(
    seed_project: Project,
    tmp_path: Path,
    update_golden: bool,
    seed: str,
    case: str,
    target: str,
    options: dict[str, object],
) -> None:
    files = render_seed(seed_project, target, seed, tmp_path / "out", **options)
    compare_tree(files, GOLDEN / seed / case, update_golden)


#: Venv variants (engine.runtime: venv, no image): only the lxc target can run one.
VENV_CASES: list[tuple[str, str, str]] = [("flash-next-merlin-4x3090", "lxc@venv", "lxc")]


@pytest.mark.parametrize(("seed", "case", "target"), VENV_CASES, ids=[f"{c[0]}/{c[1]}" for c in VENV_CASES])
def test_venv_variant_artifacts_match_golden_files(
    seed_project: Project, tmp_path: Path, update_golden: bool, seed: str, case: str, target: str
) -> None:
    files = render_seed(as_venv(seed_project, seed), target, seed, tmp_path / "out")
    compare_tree(files, GOLDEN / seed / case, update_golden)


def test_every_registered_target_has_a_golden_case() -> None:
    from rigsmith.project import TARGETS
    from rigsmith.rendering.targets import renderers

    assert set(renderers()) == set(TARGETS)
    assert {c[1] for c in CASES} == set(TARGETS)


def test_secret_values_never_reach_a_generated_file(tmp_path: Path) -> None:
    from tests.support.common import standin_deployment, write_project

    secret = "hf_SeCrEt_VaLuE_123"
    data = standin_deployment(
        tmp_path,
        name="secretive",
        env=[{"name": "HF_TOKEN", "value": secret, "secret": True}, {"name": "PLAIN", "value": "1"}],
    )
    data["resources"]["gpus"]["cdi_devices"] = ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]  # type: ignore[index]
    project = write_project(tmp_path, data)
    for target in ("podman", "quadlet", "compose", "lxc", "kube"):
        files = render_seed(project, target, "secretive", tmp_path / "out")
        text = "\n".join(files.values())
        assert secret not in text, target
        assert "HF_TOKEN" in text and "PLAIN" in text, target


def test_every_golden_file_is_stored_as_data() -> None:
    """A file under tests/golden without the suffix would be read by tools as project source."""
    files = [p for p in GOLDEN.rglob("*") if p.is_file()]
    stray = [str(p.relative_to(GOLDEN)) for p in files if p.suffix != GOLDEN_SUFFIX]
    assert stray == []
