"""Deploy refuses an env path (through a placeholder) that neither a mount nor the built image provides."""

from __future__ import annotations

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.rendering.plan import make
from rigsmith.resolving.lock.lock import Lock, LockedBuild
from tests.support.common import REPO

SHIPPED = REPO / "deployments" / "flash-next-merlin-4x3090.yaml"
PATH = "deployments/flash-next-merlin-4x3090.yaml"


def _built(provides: list[str] | None) -> tuple[specmod.Deployment, Lock]:
    """The shipped seed-003 spec without its hand-added mount, running a built image."""
    spec = specmod.load(SHIPPED)
    engine = spec.engine.model_copy(update={"image": None, "build": "merlin"})
    spec = spec.model_copy(update={"engine": engine, "mounts": ()})
    build = LockedBuild(
        ref="localhost/rigsmith/merlin",
        image_id="sha256:" + "1" * 64,
        base="b@sha256:" + "2" * 64,
        provides=provides,
    )
    return spec, Lock(builds={"merlin": build})


def test_the_tree_in_the_built_image_provides_the_paths_the_env_names() -> None:
    spec, lock = _built(["/opt/merlin"])
    plan = make(spec, lock, spec_path=PATH)
    assert [(p.name, p.path, p.provider) for p in plan.env_paths] == [
        ("VLLM_QSA_KV_SCALES", "/opt/merlin/scales/qsa_kv_scales_262k.json", "image"),
        ("VLLM_CACHE_ROOT", "/opt/merlin/.vllm-cache-v2.5", "image"),
        ("PYTHONPATH", "/opt/merlin/vllm-v2.5", "image"),
    ]


def test_a_built_image_without_the_tree_is_refused_naming_the_variable_and_its_note() -> None:
    spec, lock = _built(["/opt/elsewhere"])
    with pytest.raises(SpecError) as err:
        make(spec, lock, spec_path=PATH).check_env_paths()
    msg = str(err.value)
    assert "env.VLLM_QSA_KV_SCALES: /opt/merlin/scales/qsa_kv_scales_262k.json (from <repo>)" in msg
    assert "nor in the built image" in msg and "(required — without it FP8 KV runs at scale 1.0)" in msg


def test_the_shipped_spec_with_its_mount_still_plans_and_a_disabled_or_plain_env_is_not_checked() -> None:
    spec = specmod.load(SHIPPED)
    plan = make(spec, Lock(), spec_path=PATH)
    assert {p.provider for p in plan.env_paths} == {"mount"}
    env = tuple(e.model_copy(update={"enabled": False}) if e.value.startswith("<") else e for e in spec.env)
    bare = spec.model_copy(update={"env": env, "mounts": ()})
    assert make(bare, Lock(), spec_path=PATH).env_paths == ()
