"""Proxy registration: a llama-swap model entry and the seed's "proxy family" entry for a deployment.

llama-swap (config.example.yaml) runs ``cmd`` in the foreground and routes requests for the model ID to
``proxy`` once ``checkEndpoint`` answers 200; ``cmdStop`` stops it. rigsmith's run.sh detaches, so the
entry starts the deployment and then ``podman wait``s on its container. With ``proxy.backend_managed:
false`` (seeds/000: "proxy will NOT kill/restart it") the entry only waits on the running container and its
stop is a no-op. Paths go through llama-swap's ``${env.RIGSMITH_ROOT}`` macro so the output stays
host-independent (and deterministic for golden tests).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from rigsmith.operating.lifecycle.wait import timeout_for
from rigsmith.render import banner, escape_line_breaks, yaml_text
from rigsmith.rendering.plan import local_url
from rigsmith.spec import Deployment
from rigsmith.writer import BANNER_MARK, Artifact

ROOT_MACRO = "${env.RIGSMITH_ROOT}"


def served_names(spec: Deployment) -> list[str]:
    """Every ``--served-model-name`` value (vLLM takes several), else the deployment name."""
    args = list(spec.engine.args)
    names: list[str] = []
    for i, a in enumerate(args):
        if a == "--served-model-name":
            for v in args[i + 1 :]:
                if v.startswith("-"):
                    break
                names.append(v)
        elif a.startswith("--served-model-name="):
            names.append(a.split("=", 1)[1])
    return names or [spec.name]


def _endpoint(spec: Deployment) -> str:
    return local_url(spec.network.host, spec.network.port)


def _commands(spec: Deployment, target: str) -> tuple[str, str]:
    """(cmd, cmdStop) as llama-swap command strings (it splits them POSIX-shell style)."""
    name = spec.name
    managed = spec.proxy.backend_managed if spec.proxy else True
    if not managed:
        return shlex.join(["podman", "wait", name]), "true"
    if target == "quadlet":
        unit = f"{name}.service"
        argv = ["/bin/sh", "-c", 'systemctl start "$0" && exec podman wait "$1"', unit, name]
        return shlex.join(argv), shlex.join(["systemctl", "stop", unit])
    run = f"{ROOT_MACRO}/podman/{name}/run.sh"
    stop = f"{ROOT_MACRO}/podman/{name}/stop.sh"
    start = shlex.join(["/bin/sh", "-c", '"$0" && exec podman wait "$1"']) + f" {run} {shlex.quote(name)}"
    return start, stop


def llama_swap_entry(spec: Deployment, target: str = "podman") -> dict[str, Any]:
    """The ``models:`` mapping for llama-swap (one model ID: the first served name)."""
    names = served_names(spec)
    cmd, stop = _commands(spec, target)
    entry: dict[str, Any] = {
        "name": spec.name,
        "cmd": cmd,
        "cmdStop": stop,
        "proxy": _endpoint(spec),
        "checkEndpoint": spec.readiness.health_path,
        "ttl": 0,
    }
    if spec.description:
        entry["description"] = spec.description
    return {"models": {names[0]: entry}}


def family_entry(spec: Deployment) -> dict[str, Any]:
    """The seed's multi-proxy family record: family name, backend URL, who manages the backend."""
    p = spec.proxy
    names = served_names(spec)
    return {
        "generated_by": f"{BANNER_MARK} — do not edit; edit deployments/{spec.name}.yaml and re-run: "
        f"invoke proxy-entry --deployment {spec.name}",
        "family": (p.family if p and p.family else names[0]),
        "proxy_port": p.port if p else None,
        "backend": _endpoint(spec),
        "backend_managed": p.backend_managed if p else False,
        "models": names,
        "health": spec.readiness.health_path,
        "ready_log_lines": list(spec.readiness.log_lines),
        "kv_cache_tokens": spec.readiness.kv_cache_tokens,
        "startup_timeout_s": int(timeout_for(spec)),
    }


def _comment_word(text: str) -> str:
    """A recipe value shown in a YAML comment: bare when plain, else JSON-quoted, so a line break in it
    cannot end the comment and add keys (a model with its own ``cmd``) to llama-swap's config."""
    if re.fullmatch(r"[\w.:/@+-]+", text):
        return text
    return escape_line_breaks(json.dumps(text, ensure_ascii=False))


def render(spec: Deployment, target: str = "podman") -> dict[str, str]:
    """File name → text for proxy/NAME/."""
    cmd = f"invoke proxy-entry --deployment {spec.name} --target {target}"
    src = f"deployments/{spec.name}.yaml"
    extra = served_names(spec)[1:]
    notes = [
        "# Merge into llama-swap's config.yaml under `models:`. Export RIGSMITH_ROOT (this checkout) for it.",
        f"# First boot can take {int(timeout_for(spec))} s: set llama-swap's global healthCheckTimeout to at "
        "least that.",
    ]
    if extra:
        shown = ", ".join(_comment_word(n) for n in extra)
        notes.append(f"# vLLM also serves: {shown} (add them as llama-swap aliases if you use them).")
    # The targets' emitter: a served name with NEL/U+2028 is double-quoted (PyYAML's default single quotes
    # fold it into a space), a name like `1e5` stays a string.
    swap = yaml_text(llama_swap_entry(spec, target))
    family = json.dumps(family_entry(spec), indent=2, ensure_ascii=False) + "\n"
    return {
        "llama-swap.yaml": banner(cmd, src) + "\n".join(notes) + "\n" + swap,
        "family.json": family,
    }


def artifacts(spec: Deployment, root: Path, target: str = "podman") -> list[Artifact]:
    """Artifacts under ROOT/proxy/NAME/ for the writer."""
    base = root / "proxy" / spec.name
    return [Artifact(base / n, text) for n, text in render(spec, target).items()]
