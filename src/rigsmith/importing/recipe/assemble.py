"""Launch + Meta + notes → :class:`rigsmith.spec.Deployment` (model, GPUs, secrets, mounts)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from rigsmith import policy, yamldoc
from rigsmith import spec as specmod
from rigsmith.imageref import image_problem
from rigsmith.importing import multinode
from rigsmith.importing.recipe import docwords, raycluster
from rigsmith.importing.recipe.envtext import _ENV_TOKEN_RE, parse_env_text
from rigsmith.importing.recipe.envvars import env_var, merge_env, passthrough
from rigsmith.importing.recipe.exposure import listen_address
from rigsmith.importing.recipe.flags import flag_values, value_problems
from rigsmith.importing.recipe.gpus import (
    _gpus,
    _vendor,
    _visible_devices,
    device_notes,
    device_problems,
    parallel_gpus,
)
from rigsmith.importing.recipe.launch import Asked, Launch, Meta, _refuse
from rigsmith.importing.recipe.model import _expands, _Model, _model
from rigsmith.importing.recipe.mountkinds import file_mounts
from rigsmith.importing.recipe.notes import NoteFacts, note_facts
from rigsmith.importing.recipe.pathflags import RULE, Placed, flag_paths, place
from rigsmith.secretenv import is_secret_name

# -- Launch + Meta → Deployment ----------------------------------------------------------------------


#: The longest default deployment name: it is typed and repeated in every hint (`--deployment NAME`).
SHORT_NAME = 32


def slug(text: str, limit: int = SHORT_NAME) -> str:
    """``text`` as a deployment name matching spec.NAME_RE (lowercase), cut at the last word boundary
    (``-``, ``.``, ``_``) within ``limit`` characters (a word longer than that is cut inside)."""
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower())
    s = re.sub(r"-{2,}", "-", s).lstrip("-._")
    if len(s) > limit:
        cut = max(s.rfind(sep, 0, limit + 1) for sep in "-._")
        s = s[:cut] if cut > 0 else s[:limit]
    return s.rstrip("-._") or "recipe"


def _placeholders(texts: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for t in texts:
        for tok in specmod.PLACEHOLDER_RE.findall(t):
            out.setdefault(tok, None)
    return out


def _lift_secret_flags(launch: Launch, problems: list[str]) -> list[specmod.EnvVar]:
    """``--api-key VALUE`` / ``--hf-token VALUE`` in any spelling vLLM's parser accepts (``--api_key``,
    ``--api-key=V``, ``--api-ke V``; :func:`rigsmith.policy.secret_flag`): the value never enters the spec (it
    would be written into deployments/NAME.yaml and every artifact); vLLM reads the same secret from an
    environment variable, which every target passes by name. Removes the flag and its values from
    ``launch.args``; an ambiguous abbreviation is removed too and refused (vLLM refuses it)."""
    lifted: list[specmod.EnvVar] = []
    # Removing a flag and its values joins its neighbours (`--hf-token --hf-token S V`: the bare one now
    # takes V), so lift until nothing changes.
    while True:
        found = _lift_once(launch, problems)
        if not found:
            return lifted
        lifted += found


def _lift_once(launch: Launch, problems: list[str]) -> list[specmod.EnvVar]:
    lifted: list[specmod.EnvVar] = []
    keep: list[int] = []
    i = 0
    while i < len(launch.args):
        a = launch.args[i]
        match = policy.secret_flag(a)
        j = policy.secret_flag_span(launch.args, i)
        if match is None or (j == i + 1 and "=" not in a and not match.ambiguous):
            # Not a secret flag, or a bare --hf-token (vLLM: use the stored login), nothing secret.
            keep.append(i)
            i += 1
            continue
        spelled = a.split("=", 1)[0]
        if match.ambiguous:
            problems.append(
                f"args: {spelled} abbreviates {', '.join((match.flag, *match.ambiguous))}, which vLLM "
                "refuses as ambiguous (and it may carry a secret); write the full flag name"
            )
        var = match.variable
        launch.notes.append(
            f"{spelled} ({match.flag}) and its value were removed from the args (a secret is never stored in "
            f"the spec); vLLM reads it from {var}: export it (or use a 0600 env file / podman secret) before "
            "starting"
        )
        lifted.append(specmod.EnvVar(name=var, value="", secret=True, note=f"lifted from {match.flag}"))
        launch.secrets += [a.split("=", 1)[1]] if "=" in a else launch.args[i + 1 : j]
        i = j
    launch.args = [launch.args[k] for k in keep]
    launch.arg_expands = [launch.arg_expands[k] for k in keep if k < len(launch.arg_expands)]
    return lifted


#: Token shapes that are secrets wherever they appear (Hugging Face user tokens, OpenAI-style keys).
_TOKEN_SHAPE_RE = re.compile(r"(?<![A-Za-z0-9_-])(hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,})")


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every lifted secret, and every token-shaped word, replaced by ``<redacted>``: the
    recipe's comments and notes (kept verbatim) would otherwise carry what the args and env lost."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "<redacted>")
        return _TOKEN_SHAPE_RE.sub("<redacted>", value)
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secrets) for v in value]
    return value


def _read_only_mounts(launch: Launch, model_path: str | None) -> list[str]:
    """Mount the recipe's model and Hub-cache volumes read-only unless it wrote ``:rw``, and say so.

    The container serves the checkpoint rigsmith fetched and locked (or the one already on disk); a
    writable model or cache mount would let the engine, or anything running in it, change those files.
    ``model_path`` is the container path of a local model (None for a Hub model).
    """
    notes = []
    for i, m in enumerate(launch.mounts):
        if m.readonly or m.container in launch.writable:
            continue
        holds_model = model_path is not None and PurePosixPath(model_path).is_relative_to(m.container)
        cache = "huggingface" in PurePosixPath(m.container).parts
        if holds_model or cache:
            launch.mounts[i] = m.model_copy(update={"readonly": True})
            what = "holds the model" if holds_model else "is the Hub cache"
            notes.append(
                f"the volume {m.host}:{m.container} {what}, so it is mounted read-only (the recipe did not "
                f"write :rw); set mounts[{i}].readonly: false if the engine must write there"
            )
    return notes


def _environment(launch: Launch, meta: Meta, problems: list[str]) -> tuple[list[specmod.EnvVar], list[str]]:
    """The env the recipe sets (its env text, env map and command, secret flags lifted out) and the notes
    on it; what cannot be imported goes to ``problems``."""
    env_notes: list[str] = []
    env = list(launch.env)
    if meta.env_text:
        more, more_notes, more_problems = parse_env_text(meta.env_text)
        env = [*more, *env]
        env_notes += more_notes
        problems += more_problems
    if meta.env_map:
        for k, v in meta.env_map.items():
            if not specmod.ENV_NAME_RE.match(k):
                problems.append(f"env: {k!r} is not an environment variable name")
            else:
                env.append(passthrough(k, launch, "env") if v is None else env_var(k, v, None, launch, "env"))
    env = merge_env([*env, *_lift_secret_flags(launch, problems)], launch)
    problems += [
        f"the entrypoint holds {w.split('=', 1)[0]} ({sf.flag}), a secret flag; move it and its value to "
        f"the command (import then passes the secret as {sf.variable} by name) or remove it"
        for w in launch.subcommand
        if (sf := policy.secret_flag(w)) is not None
    ]
    return env, env_notes


def _asked_problems(asked: Asked, launch: Launch) -> list[str]:
    """The user's --name/--image, and an image the recipe leaves to a shell variable with no --image."""
    out = []
    if asked.name is not None and not specmod.NAME_RE.match(asked.name):
        out.append(
            f"--name {asked.name!r}: use lowercase letters, digits, '.', '_' or '-' (max 63), starting "
            "with a letter or digit"
        )
    image = asked.image
    if image is not None and (not image.strip() or any(ch.isspace() for ch in image)):
        out.append(f"--image {image!r}: not an image reference (e.g. localhost/vllm:1 or name@sha256:…)")
    if launch.image_expands and image is None:
        out.append(
            f"engine.image: the recipe's image {launch.image} is a shell variable whose value rigsmith "
            "cannot know; import again with --image REF (e.g. vllm/vllm-openai:v0.11.0) or write the image "
            "in the recipe"
        )
    return out


def _network(launch: Launch, notes: list[str], listen: str | None) -> dict[str, Any]:
    """``--host``/``--port``; the exposure decision (``listen``) is where the server listens."""
    network: dict[str, Any] = {} if listen is None else {"listen": listen}
    hosts = flag_values(launch.args, "--host")
    ports = flag_values(launch.args, "--port")
    if hosts or listen:
        network["host"] = listen or hosts[-1][1]
    if ports:
        if (port := specmod.ascii_int(ports[-1][1])) is not None:
            network["port"] = port
        else:
            notes.append(f"--port {ports[-1][1]} is not a number; network.port stays 8000 until you set it")
    return network


def _resources(launch: Launch, facts: NoteFacts, gpus: specmod.GpuSpec) -> dict[str, Any]:
    """What the command says (shm, memlock, stop grace) over what the notes say."""
    optional = {
        "shm_size": launch.shm_size or facts.shm_size,
        "memlock": launch.memlock if launch.memlock is not None else facts.memlock,
        "stop_grace_seconds": launch.stop_grace or facts.stop_grace,
    }
    return {
        "gpus": gpus.model_dump(),
        "host_ram_gib": facts.host_ram_gib,
        "disk_gib": facts.disk_gib,
        **{k: v for k, v in optional.items() if v},
    }


def _readiness(facts: NoteFacts) -> dict[str, Any]:
    log_lines = [x for x in facts.log_lines if "KV cache" not in x]
    return {
        **({"log_lines": log_lines} if log_lines else {}),
        "kv_cache_tokens": facts.kv_tokens,
        **({"startup_seconds": facts.startup} if facts.startup else {}),
        "warm_startup_seconds": facts.warm,
    }


def _scrub_secrets(data: dict[str, Any], launch: Launch, meta: Meta) -> None:
    """Secret values the recipe showed are cut from the free text (description, notes, env notes, title)."""
    secrets = [*launch.secrets]
    if meta.env_text:
        secrets += [v for n, v in _ENV_TOKEN_RE.findall(meta.env_text) if is_secret_name(n)]
    # Free text only: the argv and values are exact (and already secret-free), a short key could be a word.
    scrub = sorted({v for v in secrets if len(v) >= 4 and "$" not in v}, key=len, reverse=True)
    for key in ("description", "notes", "env_notes"):
        data[key] = _scrub(data[key], scrub)
    for e in data["env"]:
        e["note"] = _scrub(e["note"], scrub)
    data["provenance"] = meta.provenance.model_dump() if meta.provenance else None
    if data["provenance"]:
        data["provenance"]["title"] = _scrub(data["provenance"]["title"], scrub)


def _argv_notes(launch: Launch, model: _Model) -> list[str]:
    """What the user should know about the argv as imported: shell syntax kept literally, the model
    argument replaced by the mount, relative paths, read-only mounts."""
    notes = []
    repo, model_idx = model.repo, model.arg
    for i, a in enumerate(launch.args):
        if _expands(launch, i):
            notes.append(f"args[{i}] {a!r} holds shell syntax that a shell would expand; kept literally")
    model_value = flag_values([launch.args[model_idx]], "--model") or [(model_idx, launch.args[model_idx])]
    if repo is not None and model_value[0][1] == repo and not specmod.PLACEHOLDER_RE.fullmatch(repo):
        notes.append(
            f"the model argument {repo} is replaced by the downloaded copy at model.container_path ({repo} "
            f"is a Hub repo id by rigsmith's rule: {RULE}; for a directory of that name write ./{repo})"
        )
    if repo is None:
        notes.append(
            "model.repo is null: the checkpoint is already on disk at model.local_dir, mounted read-only at "
            "model.container_path; rigsmith downloads, pins and verifies nothing for it"
        )
    if model.note:
        notes.append(model.note)
    said = {fp.arg for fp in flag_paths(launch.args)}  # pathflags says where each of those is
    for i, a in enumerate(launch.args):
        if a.startswith("./") and i != model_idx and i not in said:
            notes.append(
                f"args[{i}] {a!r} is a path relative to where the recipe ran; mount it and fix the path"
            )
    return notes + _read_only_mounts(launch, model_value[0][1] if repo is None else None)


def _served_note(launch: Launch, model: _Model, container_path: str) -> list[str]:
    """vLLM serves the model under its model argument; every target rewrites that word to the mounted copy,
    so the plan adds the recipe's word as --served-model-name (rendering/decisions.py): say so."""
    arg = launch.args[model.arg]
    word = arg.split("=", 1)[1] if "=" in arg and arg.startswith("-") else arg
    if word == container_path or flag_values(launch.args, "--served-model-name"):
        return []
    return [
        f"decision: the model argument {word} is rewritten to {container_path} (the mounted copy) and the "
        f"recipe set no --served-model-name, so every target adds --served-model-name {word}: clients still "
        f"call the model {word}"
    ]


def _add_flag_mounts(launch: Launch, placed: Placed, model: _Model, container_path: str, source: str) -> None:
    """The flags' paths mounted (``pathflags``): each once, and none where the model or another mount is
    already mounted from elsewhere (podman refuses two mounts at one path)."""
    taken = {container_path: model.local_dir, **{m.container: m.host for m in launch.mounts}}
    clashes = []
    for m in placed.mounts:
        if m.container not in taken:
            taken[m.container] = m.host
            launch.mounts.append(m)
        elif taken[m.container] != m.host:
            clashes.append(
                f"{m.note}: {m.container} is already where {taken[m.container]} is mounted; give the flag "
                "a path of its own"
            )
    if clashes:
        raise _refuse(source, clashes)


def _cluster(launch: Launch, vendor: str) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """The ``cluster`` section of a multi-node block (data-parallel ranks or a Ray cluster), its placeholder
    tokens and notes; None for one command."""
    if launch.node_args:
        # The RPC port every node is given is the cluster's: a placeholder there is written as it.
        if token := multinode.port_token(launch.node_args):
            launch.args = multinode.supply_port(launch.args, token, multinode.rpc_port(launch.node_args))
        return multinode.cluster_data(launch.node_args, vendor)
    if launch.ray_nodes:
        return raycluster.cluster_data(launch, vendor)
    return None, [], []


def _runs_image(launch: Launch, asked: Asked, problems: list[str]) -> str | None:
    """The image the container runs (``--image`` first), checked as deploy checks it: import never writes
    a spec whose image deploy refuses (``docker_image: --privileged`` would be a podman flag)."""
    runs = asked.image or (None if launch.image_expands else launch.image)
    if runs and (why := image_problem(runs)):
        problems.append(f"{'--image' if asked.image else 'engine.image'}: {why}")
    return runs


def _default_name(launch: Launch, meta: Meta, repo: str | None, basename: str) -> str:
    """The deployment's name when the user gives none: the recipe's id or title, else the model's name (a
    documentation word's last part names the model the text means: /path/to/Qwen2.5-3B-Instruct)."""
    word = PurePosixPath(launch.documentation.get(repo or "", "")).name.strip(".…")  # not the word '...'
    return slug(meta.recipe_id or meta.title or word or PurePosixPath(repo or basename).name)


def build(launch: Launch, meta: Meta, *, source: str, asked: Asked) -> specmod.Deployment:
    """Assemble and validate the Deployment; every problem found so far (and here) in one RecipeError."""
    name, image = asked.name, asked.image
    docwords.fill(launch)
    problems = list(launch.problems)
    notes: list[str] = []
    env, env_notes = _environment(launch, meta, problems)
    facts = note_facts(meta.notes_text or "")
    problems += value_problems(launch.args, launch.notes)
    # Every problem at once: the model is checked even when the text had others, unless the launch
    # command itself was not understood (then its args are not vLLM's).
    model_problems: list[str] = []
    model = _model(launch, facts, model_problems) if launch.args or not launch.problems else None
    problems += [p for p in model_problems if not (launch.problems and "names no model" in p)]
    problems += _asked_problems(asked, launch)
    listen = listen_address(launch, notes, problems)
    env = _visible_devices(env, launch, problems)
    runs = _runs_image(launch, asked, problems)
    device_problems(launch, runs, problems)
    vendor = launch.gpu_vendor or _vendor(env, runs)
    gpus = _gpus(launch, facts, vendor, problems)
    placed = place(launch, model.arg, notes, problems) if model is not None else Placed([], [])
    if problems or model is None or gpus is None:
        raise _refuse(source, problems or ["no model"])
    repo, local_dir, model_idx = model.repo, model.local_dir, model.arg
    notes += _argv_notes(launch, model)
    basename = PurePosixPath(local_dir.rstrip("/")).name or PurePosixPath(repo or "model").name
    container_path = model.container_path or f"/models/{basename}"
    notes += _served_note(launch, model, container_path)
    if model.container_path is not None:
        # The recipe's own volume is the model mount (`-v /srv/m:/models/m ... --model /models/m`).
        launch.mounts = [m for m in launch.mounts if m.container.rstrip("/") != model.container_path]
    _add_flag_mounts(launch, placed, model, container_path, source)
    final_image = image or launch.image
    if image and launch.image and image != launch.image:
        notes.append(f"the recipe's image {launch.image} was replaced by --image {image}")
    network = _network(launch, notes, listen)
    revision = flag_values(launch.args, "--revision")
    device_notes(launch, gpus, parallel_gpus(launch), notes)
    cluster, node_tokens, cluster_notes = _cluster(launch, vendor)
    notes += cluster_notes
    mounts = file_mounts(launch.mounts, facts, notes)
    hosts = [m.host for m in mounts]  # a volume's host side may be a placeholder (docwords, compose)
    all_notes = [*([meta.notes_text] if meta.notes_text else []), *launch.notes, *notes]
    data: dict[str, Any] = {
        "name": name or _default_name(launch, meta, repo, basename),
        "description": meta.title,
        "model": {
            "repo": repo,
            "revision": revision[-1][1] if revision else (facts.revision if repo == facts.repo else None),
            "local_dir": local_dir,
            "container_path": container_path,
            "allow_patterns": list(model.allow_patterns),
            "size_bytes": facts.size_bytes,
            "config_patches": [p.model_dump(exclude_defaults=True) for p in facts.patches],
        },
        "secondary_models": placed.secondary,
        "engine": {
            "image": final_image,
            "recipe_executable": launch.recipe_executable,
            "executable": launch.executable,
            "subcommand": list(launch.subcommand),
            "args": launch.args,
            "model_arg": model_idx,
        },
        "env": [e.model_dump() for e in env],
        "env_notes": env_notes,
        "placeholders": _placeholders([*launch.args, *(e.value for e in env), *node_tokens, *hosts]),
        "resources": _resources(launch, facts, gpus),
        "readiness": _readiness(facts),
        "network": network,
        "mounts": [m.model_dump() for m in mounts],
        "notes": all_notes,
        **({"cluster": cluster} if cluster else {}),
    }
    return _validated(data, launch, meta, source)


def _validated(data: dict[str, Any], launch: Launch, meta: Meta, source: str) -> specmod.Deployment:
    """The assembled spec with no secret value in it, checked for NULs and validated."""
    _scrub_secrets(data, launch, meta)
    nul = yamldoc.nul_paths(data)
    if nul:
        # A JSON "\u0000" or a YAML "\0" escape: the raw text had none.
        raise _refuse(
            source, [f"{p}: holds a NUL character, which no target can carry; remove it" for p in nul]
        )
    try:
        return specmod.Deployment.model_validate(data)
    except ValidationError as err:
        raise _refuse(source, [f"{p}: {m}" for p, m in specmod.problems_from(err)]) from None
