"""Recipe form (d): a vLLM recipes YAML (``models/<org>/<repo>.yaml`` of https://github.com/vllm-project/recipes,
the source of https://recipes.vllm.ai and its JSON API).

The YAML holds no command: the site synthesises ``vllm serve`` from the recipe, one of its ``variants``
(checkpoint/precision) and a hardware profile (:mod:`.synth`). ``--variant NAME[@HARDWARE]`` picks
both; without ``@HARDWARE`` the profile is the one the site opens on for that variant (its JSON API's
``recommended_command``). With several variants and no ``--variant`` the import is refused, listing them.
The fields are checked against the schema its CONTRIBUTING.md documents (plus the keys its recipes use):
an unknown field is refused by its path. What the spec cannot carry (install steps, the guide, opt-in
features, strategies for several nodes) is listed in the notes.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from rigsmith import yamldoc
from rigsmith.errors import RecipeError
from rigsmith.importing.recipe.command.text import _from_shell
from rigsmith.importing.recipe.launch import Launch, Meta, _refuse, read_tree
from rigsmith.importing.recipe.vllmrecipes import schema as vllmschema
from rigsmith.importing.recipe.vllmrecipes import synth as vllmsynth
from rigsmith.importing.recipe.vllmrecipes.taxonomy import GPU_BRANDS, HARDWARE

#: The keys as YAML may write them: plain, or quoted ('model', "model") by a writer that quotes every string.
_RECIPE_RE = re.compile(r"""^(["']?)model\1:\s*$.*^(["']?)variants\2:\s*$""", re.M | re.S)


def looks_like(text: str) -> bool:
    """Top-level ``model:`` and ``variants:`` blocks: read as a vLLM recipes YAML."""
    return _RECIPE_RE.search(text) is not None


def load(text: str, source: str) -> dict[str, Any] | None:
    """The recipe mapping, or None when the YAML is not a vLLM recipe (then it is read as another form)."""
    data = read_tree(
        yamldoc.load_yaml_12,
        text,
        source,
        "has top-level model: and variants: blocks, so it is read as a vLLM recipes YAML, but it",
        "fix the YAML (a copy of models/ORG/REPO.yaml from vllm-project/recipes imports as it is)",
    )
    return data if is_recipe(data) else None


def is_recipe(data: Any) -> bool:
    """A mapping with ``meta``, ``model`` (with ``model_id``) and ``variants``: a vLLM recipes YAML."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("model"), dict)
        and "model_id" in data["model"]
        and "variants" in data
        and "meta" in data
    )


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pick(data: dict[str, Any], asked: str | None, source: str) -> tuple[str, str | None]:
    """``--variant NAME[@HARDWARE]`` → (variant, hardware profile or None), or a refusal naming the field."""
    variants = [str(k) for k in data["variants"]]
    listing = ", ".join(variants)
    if asked is None:
        if len(variants) == 1:
            return variants[0], None
        raise RecipeError(
            f"{source}: this vLLM recipe has {len(variants)} variants ({listing}); rigsmith imports one "
            "deployment per variant and does not choose for you",
            hint=f"import again with --variant NAME (one of {listing}), optionally NAME@HARDWARE for a "
            "recipes-site hardware profile (e.g. default@rtx_4090_2x)",
        )
    name, at, hw = asked.partition("@")
    problems = []
    if at and not hw:
        problems.append(f"--variant {asked}: nothing after '@'; write NAME@HARDWARE, or NAME alone")
    if name not in variants:
        problems.append(f"--variant {asked}: the recipe has no variant {name!r} (variants: {listing})")
    if hw and hw not in HARDWARE:
        problems.append(
            f"--variant {asked}: {hw!r} is not a recipes-site hardware profile ({', '.join(HARDWARE)})"
        )
    elif hw and name in variants and (why := vllmsynth.hardware_problem(data, data["variants"][name], hw)):
        problems.append(f"--variant {asked}: the recipes site does not offer {hw} for this variant: {why}")
    if problems:
        raise _refuse_variant(source, problems)
    return name, hw or None


def _refuse_variant(source: str, problems: list[str]) -> RecipeError:
    return RecipeError(
        _refuse(source, problems).message,
        hint="pick another --variant NAME@HARDWARE: the recipe's variants and the recipes-site hardware "
        "profiles (taxonomy.yaml) it offers, as the site's command builder lists them",
    )


def from_recipe(data: dict[str, Any], source: str, variant: str | None) -> tuple[Launch, Meta]:
    """The recipe YAML → the launch the site shows for the asked variant, and its meta."""
    problems = vllmschema.problems(data)
    tasks = _as_dict(data.get("meta")).get("tasks")
    if not problems and isinstance(tasks, list) and "omni" in tasks:
        raise RecipeError(
            f"{source}: meta.tasks holds omni: this recipe is served by vllm-omni (vllm serve --omni, its "
            "image and its own server), which rigsmith does not deploy",
            hint="import a recipe the site serves with plain vllm serve (meta.tasks text, multimodal or "
            "embedding)",
        )
    if problems:
        raise _refuse(source, problems)
    vkey, hw_id = _pick(data, variant, source)
    try:
        synth = vllmsynth.synthesize(data, vkey, hw_id)
    except vllmsynth.Unsynthesizable as err:
        raise _refuse_variant(source, [f"--variant {variant or vkey}: {err}"]) from None
    hw = HARDWARE[synth.hardware]
    if hw.brand not in GPU_BRANDS:
        raise _refuse_variant(
            source,
            [
                f"--variant {variant or vkey}: hardware profile {synth.hardware} is {hw.brand} "
                f"{hw.generation}; rigsmith deploys on NVIDIA or AMD GPUs: pick one of those profiles"
            ],
        )
    launch = _from_shell(shlex.join(synth.argv))
    launch.image = synth.image
    launch.notes = [*_notes(data, synth), *launch.notes]
    meta = _as_dict(data.get("meta"))
    model_id = str(data["model"]["model_id"])
    return launch, Meta(
        title=str(meta.get("title") or model_id) + f" ({vkey} on {synth.hardware})",
        recipe_id=model_id if vkey == "default" else f"{model_id}-{vkey}",
        env_map=dict(synth.env) or None,
    )


def _notes(data: dict[str, Any], synth: vllmsynth.Synth) -> list[str]:
    """What the recipe says that the spec keeps only as words, and what it says that is not imported."""
    meta, model = _as_dict(data.get("meta")), data["model"]
    hw = HARDWARE[synth.hardware]
    features = _as_dict(data.get("features"))
    off = [k for k in features if k not in synth.features]
    variant = _as_dict(_as_dict(data["variants"]).get(synth.variant))
    out = [
        f"vLLM recipe: variant {synth.variant} on the recipes-site hardware profile {synth.hardware} "
        f"({hw.gpu_count} x {hw.brand} {hw.generation}, {hw.vram_gb} GB) as {synth.strategy}; argv, env "
        "and image are what the site's command builder and JSON API give for that choice (another: "
        f"--variant {synth.variant}@PROFILE)",
        *[f"recipe {k}: {meta[k]}" for k in ("description", "performance_headline") if meta.get(k)],
        *([f"variant {synth.variant}: {variant['description']}"] if variant.get("description") else []),
        f"features on (the site's defaults): {', '.join(synth.features) or 'none'}",
    ]
    for k in off:
        out.append(f"opt-in feature {k} not enabled: {_feature_text(features[k])}")
    need = variant.get("vram_minimum_gb")
    if isinstance(need, int | float) and need > hw.vram_gb:
        out.append(
            f"the recipe says variant {synth.variant} needs {need} GB; {synth.hardware} has {hw.vram_gb} GB"
        )
    version = model.get("min_vllm_version")
    if version:
        nightly = " (nightly build required)" if model.get("nightly_required") is True else ""
        out.append(f"the recipe needs vLLM >= {version}{nightly}; the image {synth.image} must provide it")
    for dep in data.get("dependencies") or []:
        d = _as_dict(dep)
        out.append(
            f"not imported: install step `{d.get('command')}`" + (f" ({d['note']})" if d.get("note") else "")
        )
    if data.get("hardware_notes"):
        out.append(f"recipe hardware_notes: {data['hardware_notes']}")
    guide = data.get("guide")
    if isinstance(guide, str) and guide.strip():
        out.append(
            f"not imported: the recipe's guide ({guide.count(chr(10)) + 1} lines of Markdown); read it there"
        )
    return out


def _feature_text(feature: Any) -> str:
    f = _as_dict(feature)
    args = f.get("args")
    if isinstance(args, list):
        return f"{f.get('description', '')} (adds {shlex.join(map(vllmsynth.js_str, args))})".strip()
    modes = ", ".join(map(str, _as_dict(f.get("modes"))))
    return f"{f.get('description', '')} (modes: {modes})".strip()
