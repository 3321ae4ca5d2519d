"""Recipe form (e): a file of the vLLM recipes JSON API (https://recipes.vllm.ai, written by
vllm-project/recipes' ``scripts/build-recipes-api.mjs``): a recipe (``/<hf_id>.json``, whose
``recommended_command`` is the site's default rendering) or one rendering (``/<hf_id>/hw/<hardware>.json``,
``…/strategies/<strategy>.json``). A rendering already holds the argv, env and image the site synthesised;
it is taken as it stands. Renderings for several nodes (``multi_node``, ``pd_cluster``, ``kv_store_lb``) are
refused; the recipe YAML and ``--variant`` choose another.
"""

from __future__ import annotations

import shlex
from typing import Any

from rigsmith import spec as specmod
from rigsmith.importing.recipe.command.text import _from_shell
from rigsmith.importing.recipe.launch import Launch, Meta, _refuse
from rigsmith.importing.recipe.vllmrecipes.synth import js_str


def is_api(data: Any) -> bool:
    """A JSON API recipe (``hf_id`` + ``recommended_command``) or one rendering (``deploy_type`` +
    ``docker_image`` + ``argv`` or ``head_argv``/``vllm_argv``)."""
    if not isinstance(data, dict):
        return False
    if "hf_id" in data and "recommended_command" in data:
        return True
    return "deploy_type" in data and "docker_image" in data and "hardware" in data


def from_api(data: dict[str, Any], source: str, variant: str | None) -> tuple[Launch, Meta]:
    """The rendering's argv, env and image as a launch (a recipe file: its ``recommended_command``)."""
    rendering: Any = data.get("recommended_command", data)
    meta: dict[str, Any] = data["meta"] if isinstance(data.get("meta"), dict) else {}
    problems = []
    if variant is not None:
        problems.append(
            f"--variant {variant}: a JSON API file holds the rendering the site chose; import the rendering "
            "of the variant and hardware you want (/<hf_id>/hw/<hardware>.json) or the recipe's YAML with "
            "--variant"
        )
    if not isinstance(rendering, dict):
        problems.append("recommended_command: must be the site's rendering (an object); this one is not")
        raise _refuse(source, problems)
    kind = rendering.get("deploy_type")
    argv: Any = rendering.get("argv")
    env, image = rendering.get("env") or {}, rendering.get("docker_image")
    if kind != "single_node":
        problems.append(
            f"deploy_type: {kind!r}; rigsmith imports one node's rendering (single_node) from the JSON API: "
            "import the recipe's YAML with --variant NAME@HARDWARE for hardware on which it runs on one node"
        )
    elif not (isinstance(argv, list) and argv[:2] == ["vllm", "serve"] and len(argv) > 2):
        problems.append("argv: must be the rendering's command, a list starting vllm serve MODEL")
    elif any(isinstance(a, dict | list) or a is None for a in argv):
        problems.append("argv: must hold only words (text, numbers)")
    if not isinstance(env, dict) or any(isinstance(v, dict | list) or v is None for v in env.values()):
        problems.append("env: must map variable names to values")
    if not isinstance(image, str) or not image:
        problems.append("docker_image: must be the image reference the rendering runs")
    hf_id = data.get("hf_id")
    if hf_id is not None and not (isinstance(hf_id, str) and specmod.hub_repo_id(hf_id)):
        problems.append(f"hf_id: {hf_id!r} is not a Hugging Face repo id (owner/name)")
    if problems:
        raise _refuse(source, problems)
    launch = _from_shell(shlex.join(map(js_str, argv)))
    launch.image = image
    where = ", ".join(f"{k} {rendering[k]}" for k in ("variant", "hardware", "strategy") if rendering.get(k))
    launch.notes = [f"vLLM recipes JSON API rendering ({where}): argv, env and image as the file gives them"]
    launch.notes += [f"recipe {k}: {meta[k]}" for k in ("description", "performance_headline") if meta.get(k)]
    hf_id = hf_id or (argv[2] if isinstance(argv[2], str) else None)
    title = meta.get("title") or hf_id
    return launch, Meta(
        title=f"{title} ({where})" if title else None,
        recipe_id=hf_id if isinstance(hf_id, str) else None,
        env_map={str(k): js_str(v) for k, v in env.items()} or None,
    )
