"""Recipe form (c): a compose file with one vLLM service."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

import yaml

from rigsmith import spec as specmod
from rigsmith import yamldoc
from rigsmith.digits import ascii_digits
from rigsmith.errors import RecipeError
from rigsmith.importing import shellwords
from rigsmith.importing.recipe.command.bashc import is_shell_c, script_argv
from rigsmith.importing.recipe.command.containeropts import device_node, set_shm, volume, whole_number
from rigsmith.importing.recipe.compose import env as composeenv
from rigsmith.importing.recipe.envvars import env_var, merge_env, passthrough
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _COMPOSE_VAR_RE, _SELF_REF_RE, _SERVICES_RE
from rigsmith.secretenv import is_secret_name

# -- format (c): compose -----------------------------------------------------------------------------


def _compose_data(text: str, source: str) -> dict[str, Any] | None:
    """The compose mapping if ``text`` is YAML with ``services``, else None (then it is shell text)."""
    if not _SERVICES_RE.search(text):
        return None
    try:
        data = yamldoc.load_yaml(text)
    except yaml.YAMLError as err:
        raise RecipeError(
            f"{source}: has a `services:` line, so it is read as a compose file, but it is "
            + yamldoc.yaml_problem(err),
            hint="fix the YAML, or import the vllm serve command on its own",
        ) from None
    except RecursionError:
        raise RecipeError(
            f"{source}: the compose file is nested more than {yamldoc.MAX_DEPTH} levels deep",
            hint="a compose file with one vLLM service is a few levels deep; import the service itself",
        ) from None
    if not (isinstance(data, dict) and isinstance(data.get("services"), dict)):
        return None
    problem = yamldoc.tree_problem(data)
    if problem:
        raise RecipeError(
            f"{source}: the compose file {problem}", hint="import a compose file with plain values"
        )
    return data


def _runs_vllm(svc: Any) -> bool:
    if not isinstance(svc, dict):
        return False
    blob = json.dumps([svc.get("image"), svc.get("entrypoint"), svc.get("command")])
    return "vllm" in blob.lower()


def _unescape(value: str) -> str:
    return value.replace("$$", "$")


def _interpolations(value: Any, path: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        for m in _COMPOSE_VAR_RE.finditer(value):
            yield path, m.group(0)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _interpolations(v, f"{path}.{k}")
    elif isinstance(value, list):
        for idx, v in enumerate(value):
            yield from _interpolations(v, f"{path}[{idx}]")


def _compose_env_ref(env: Any, path: str, where: str) -> bool:
    """Whether the environment entry at ``path`` is exactly one variable reference (``${VAR}``/``$VAR``)."""
    key = path.removeprefix(f"{where}.environment")
    if isinstance(env, dict) and key.startswith("."):
        value = env.get(key[1:])
    elif isinstance(env, list) and key.startswith("[") and key.endswith("]") and ascii_digits(key[1:-1]):
        value = str(env[int(key[1:-1])]).partition("=")[2]
    else:
        return False
    return isinstance(value, str) and bool(_SELF_REF_RE.fullmatch(value))


#: The service keys rigsmith imports; any other becomes a note (each target sets its own).
SERVICE_KEYS = (
    "image",
    "command",
    "entrypoint",
    "environment",
    "devices",
    "deploy",
    "shm_size",
    "ulimits",
    "stop_grace_period",
    "volumes",
    "ports",
    "network_mode",
)


def _pick_service(services: dict[str, Any], service: str | None, launch: Launch) -> str | None:
    """The service to import: ``--service NAME``, else the one service that runs vLLM."""
    if service is not None:
        if service not in services:
            launch.problems.append(
                f"--service {service}: the file has no such service (it has: {', '.join(map(str, services))})"
            )
            return None
        return service
    vllm = [str(name) for name, svc in services.items() if _runs_vllm(svc)]
    if len(vllm) == 1:
        return vllm[0]
    if vllm:
        launch.problems.append(
            f"services: {len(vllm)} services run vLLM ({', '.join(vllm)}); rigsmith imports one deployment "
            "per service: pick one with --service NAME (and import again with another name for the next)"
        )
    else:
        launch.problems.append("services: no service runs vLLM; import a file with a vLLM service")
    return None


def _from_compose(
    data: dict[str, Any], env: composeenv.ComposeEnv | None = None, service: str | None = None
) -> Launch:
    launch = Launch()
    services = data["services"]
    name = _pick_service(services, service, launch)
    if name is None:
        return launch
    where = f"services.{name}"
    svc: dict[str, Any] = services[name]
    if env is not None:
        values, origin = env.lookup()
        interp = composeenv.Interpolation(values, origin)
        svc = composeenv.interpolate(svc, interp, where)
        launch.problems += interp.problems
        launch.notes += composeenv.notes_for(interp)
        launch.secret_refs |= interp.references
        if launch.problems:
            return launch
    entry_list = _refusals(svc, where, launch)
    if launch.problems:
        return launch
    image = svc.get("image")
    if not isinstance(image, str) or not image:
        launch.problems.append(f"{where}.image: missing; the service must name its image")
        return launch
    launch.image = image
    # an interpolated variable nobody sets: the image is unknown until the user names it (--image)
    launch.image_expands = bool(specmod.PLACEHOLDER_RE.search(image))
    full = _argv(svc, where, entry_list, launch)
    if full is None:
        return launch
    launch.args = full
    launch.arg_expands = [False] * len(full)
    _service_settings(svc, where, launch)
    return launch


def _refusals(svc: dict[str, Any], where: str, launch: Launch) -> list[str] | None:
    """What rigsmith will not import from the service (a shell entrypoint, interpolation) into
    ``launch.problems``; the entrypoint's words."""
    entry = svc.get("entrypoint")
    entry_list = _compose_words(entry, f"{where}.entrypoint", launch) if entry is not None else None
    # `NAME: ${VAR}` in environment is the shell's `-e NAME=$VAR`: read from the host at run time.
    seen = [
        (p, v)
        for p, v in _interpolations(svc, where)
        if not (p.startswith(f"{where}.environment") and _compose_env_ref(svc.get("environment"), p, where))
    ]
    if seen:
        shown = "; ".join(f"{p}: {v}" for p, v in seen[:6]) + (
            f"; … {len(seen) - 6} more" if len(seen) > 6 else ""
        )
        secret = sorted(
            {n for _, v in seen if is_secret_name(n := v.strip("${}").split(":", 1)[0].split("-", 1)[0])}
        )
        launch.problems.append(
            f"compose interpolation is not imported (rigsmith would have to guess each value): {shown}. "
            "Replace each ${VAR:-default} with the value you run"
            + (
                f"; a secret ({', '.join(secret)}) is never written into a file: pass it only under "
                "environment: as NAME: ${NAME}, which rigsmith reads from the host at run time"
                if secret
                else ""
            )
        )
    return entry_list


def _argv(svc: dict[str, Any], where: str, entry_list: list[str] | None, launch: Launch) -> list[str] | None:
    """The arguments after ``vllm serve`` (the executable and subcommand set on ``launch``), or None when
    the service runs nothing importable (the reason in ``launch.problems``)."""
    image = launch.image
    command = svc.get("command")
    cmd = _compose_words(command, f"{where}.command", launch) if command is not None else []
    if isinstance(command, list):
        for idx, item in enumerate(cmd):
            if item.startswith("--") and " " in item and "=" not in item.split(" ", 1)[0]:
                launch.problems.append(
                    f"{where}.command[{idx}]: {item!r} is ONE argument containing a space (a YAML list item "
                    "is passed whole), which vLLM rejects; split it into two items"
                )
    if entry_list and is_shell_c([*entry_list, *cmd]):
        # `entrypoint: [bash, -c, SCRIPT, …]`: the one command the script runs (command: are its "$@")
        got = script_argv([*entry_list, *cmd], f"{where}.entrypoint", launch)
        if got is None:
            return None
        argv, env = got
        launch.env += [env_var(k, v, None, launch, f"{where}.entrypoint") for k, v in env]
        module = len(argv) > 2 and argv[1] == "-m" and PurePosixPath(argv[0]).name.startswith("python")
        entry_list, cmd = argv[: 3 if module else 1], argv[3 if module else 1 :]
    if entry_list == []:
        # `entrypoint: []` clears the image's entrypoint: the command's first word is the executable.
        if not cmd:
            launch.problems.append(
                f"{where}: entrypoint is [] and command is empty, so nothing would run; "
                "write the vllm serve command under command:"
            )
            return None
        entry_list, cmd = cmd[:1], cmd[1:]
    if entry_list and any(c.isspace() for c in entry_list[0]):
        launch.problems.append(
            f"{where}: the executable {entry_list[0]!r} contains whitespace (a YAML list item is passed "
            "whole, so no such program exists); split it into one item per word"
        )
        return None
    full = [*(entry_list or []), *cmd]
    if entry_list:
        exe = entry_list[0]
        if PurePosixPath(exe).name == "vllm" and full[1:2] == ["serve"]:
            launch.recipe_executable, launch.executable, launch.subcommand = exe, "vllm", ("serve",)
            full = full[2:]
        else:
            launch.recipe_executable = launch.executable = exe
            launch.subcommand = tuple(entry_list[1:])
            full = cmd
    elif full and PurePosixPath(full[0]).name == "vllm" and full[1:2] == ["serve"]:
        launch.recipe_executable = full[0]
        full = full[2:]
    else:
        launch.recipe_executable = f"{image} (image entrypoint)"
        launch.notes.append(
            f"{where}: the image's entrypoint is taken to be `vllm serve` (as in vllm/vllm-openai); "
            "command holds its arguments"
        )
    return full


def _listed(svc: dict[str, Any], key: str, where: str, launch: Launch) -> list[Any]:
    """``svc[key]`` when it is a list (the compose spec's only form), else a problem and nothing."""
    value = svc.get(key)
    if value is None or isinstance(value, list):
        return value or []
    launch.problems.append(f"{where}.{key}: {json.dumps(value)} is not a list; write one entry a line (- …)")
    return []


def _service_settings(svc: dict[str, Any], where: str, launch: Launch) -> None:
    """env, devices, GPUs, shm, memlock, stop grace and volumes; every other key becomes a note."""
    _compose_env(svc.get("environment"), f"{where}.environment", launch)
    for idx, dev in enumerate(_listed(svc, "devices", where, launch)):
        if isinstance(dev, str) and specmod.CDI_RE.match(dev):
            launch.gpu_cdi = [*(launch.gpu_cdi or []), dev]
        elif isinstance(dev, str) and dev.startswith("/dev/"):
            device_node(dev, launch, f"{where}.devices[{idx}]")
        else:
            launch.notes.append(f"{where}.devices[{idx}] {dev!r}: not a CDI name; not imported")
    _compose_gpus(svc.get("deploy"), f"{where}.deploy", launch)
    if "shm_size" in svc:
        set_shm(str(svc["shm_size"]), launch, f"{where}.shm_size")
    ulimits = svc.get("ulimits") or {}
    if isinstance(ulimits, dict) and "memlock" in ulimits:
        ml = ulimits["memlock"]
        soft = ml.get("soft") if isinstance(ml, dict) else ml
        launch.memlock = (
            "unlimited"
            if str(soft) in ("-1", "unlimited")
            else whole_number(str(soft), launch, f"{where}.ulimits")
        )
    if "stop_grace_period" in svc:
        launch.stop_grace = _duration(str(svc["stop_grace_period"]), launch, f"{where}.stop_grace_period")
    _compose_ports(svc, where, launch)
    for idx, vol in enumerate(_listed(svc, "volumes", where, launch)):
        if isinstance(vol, str):
            volume(vol, launch, f"{where}.volumes[{idx}]")
        else:
            launch.notes.append(f"{where}.volumes[{idx}]: long syntax not imported: {json.dumps(vol)}")
    dropped = sorted(set(svc) - set(SERVICE_KEYS))
    if dropped:
        launch.notes.append(
            f"{where}: keys not imported (rigsmith sets them per target): "
            + ", ".join(f"{k}: {json.dumps(svc[k], ensure_ascii=False)}" for k in dropped)
        )


def _compose_ports(svc: dict[str, Any], where: str, launch: Launch) -> None:
    """``ports:`` (short ``[IP:]HOST:CONTAINER`` or long ``{host_ip, published, target}``) and
    ``network_mode``: who can reach the API (assemble decides what that means for the targets)."""
    launch.published = []
    for idx, port in enumerate(svc.get("ports") or []):
        if isinstance(port, dict):
            ip, host, target = port.get("host_ip", ""), port.get("published", ""), port.get("target", "")
            launch.published.append(f"{'[' + ip + ']' if ':' in str(ip) else ip}:{host}:{target}")
        elif isinstance(port, str | int) and not isinstance(port, bool):
            launch.published.append(str(port))
        else:
            launch.problems.append(f"{where}.ports[{idx}]: {port!r} is not a port mapping")
    mode = svc.get("network_mode")
    launch.network = str(mode) if mode is not None else None


def _compose_words(value: Any, where: str, launch: Launch) -> list[str]:
    if isinstance(value, list):
        out = []
        for idx, item in enumerate(value):
            if isinstance(item, str | int | float) and not isinstance(item, bool):
                out.append(_unescape(str(item)))
            else:
                launch.problems.append(f"{where}[{idx}]: must be a string, got {type(item).__name__}")
        return out
    if isinstance(value, str):
        script = shellwords.scan(_unescape(value))
        for p in script.problems:
            launch.problems.append(f"{where}: {p}")
        words = [w for c in script.commands for w in c.argv]
        return words
    launch.problems.append(f"{where}: must be a list or a string, got {type(value).__name__}")
    return []


def _compose_env(value: Any, where: str, launch: Launch) -> None:
    items: list[tuple[str, str | None]] = []
    if isinstance(value, list):
        for item in value:
            text = str(item)
            k, eq, v = text.partition("=")
            items.append((k, v if eq else None))
    elif isinstance(value, dict):
        items = [(str(k), None if v is None else str(v)) for k, v in value.items()]
    elif value is not None:
        launch.problems.append(f"{where}: must be a list or a mapping")
    service_env: list[specmod.EnvVar] = []
    for k, val in items:
        if not specmod.ENV_NAME_RE.match(k):
            launch.problems.append(f"{where}: {k!r} is not an environment variable name")
        elif val is None:
            service_env.append(passthrough(k, launch, where))
        else:
            service_env.append(env_var(k, _unescape(val), None, launch, where))
    # what an entrypoint script exports (already in launch.env) is set after the service's environment
    launch.env = merge_env([*service_env, *launch.env], launch)


def _compose_gpus(deploy: Any, where: str, launch: Launch) -> None:
    try:
        devices = deploy["resources"]["reservations"]["devices"]
    except (TypeError, KeyError):
        return
    for idx, dev in enumerate(devices or []):
        if not isinstance(dev, dict):
            continue
        ids = dev.get("device_ids")
        if dev.get("driver") == "cdi" and ids:
            launch.gpu_cdi = [*(launch.gpu_cdi or []), *map(str, ids)]
        elif ids:
            launch.gpu_indices = [str(x) for x in ids]
        elif isinstance(dev.get("count"), int):
            launch.gpu_count = dev["count"]
        elif dev.get("count") == "all":
            launch.gpus_all = f"{where}.resources.reservations.devices[{idx}].count: all"
        elif dev.get("count") is not None:
            launch.problems.append(f"{where}.resources.reservations.devices[{idx}].count: {dev['count']!r}")


def _duration(text: str, launch: Launch, where: str) -> int | None:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not m or not any(m.groups()):
        launch.problems.append(f"{where} {text!r}: not a duration (write it like 70s or 1m30s)")
        return None
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)
