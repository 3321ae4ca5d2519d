"""Values of container options that ``docker run`` and compose share (``--device``/``devices:``, ``--gpus``,
``--shm-size``/``shm_size``, ``-v``/``volumes:``, whole numbers), each read into the Launch or noted."""

from __future__ import annotations

import re

from pydantic import ValidationError

from rigsmith import spec as specmod
from rigsmith.importing.recipe.launch import Launch


def device_node(val: str, launch: Launch, where: str) -> None:
    """A ``--device``/``devices:`` entry that is a device node: ROCm's (``/dev/kfd``, ``/dev/dri``) say the
    GPUs are AMD's (CDI ``amd.com/gpu``), whatever the env says; any other is noted, not imported."""
    node = val.split(":", 1)[0]
    if node in ("/dev/kfd", "/dev/dri") or node.startswith("/dev/dri/"):
        launch.gpu_vendor = "amd.com/gpu"
        launch.notes.append(
            f"{where} {val}: ROCm's device node; the GPUs are passed as amd.com/gpu CDI devices"
        )
    else:
        launch.notes.append(f"{where} {val}: a device node, not a CDI name; not imported (add a mount)")


def gpus_request(val: str, launch: Launch, where: str) -> None:
    v = val.strip().strip("\"'")
    if v == "all":
        launch.gpus_all = f"{where} {val}"
        return
    count = specmod.ascii_int(v)
    if count is not None:
        launch.gpu_count = count
        return
    if v.startswith("device="):
        ids = [x.strip() for x in v.removeprefix("device=").split(",") if x.strip()]
        if ids and all(re.fullmatch(r"[A-Za-z0-9_.:-]+", x) for x in ids):
            launch.gpu_indices = ids
            return
    launch.problems.append(f"{where} {val!r}: not a GPU request rigsmith understands (all, N or device=I,J)")


def set_shm(val: str, launch: Launch, where: str) -> None:
    m = specmod.SIZE_RE.match(str(val).strip())
    if not m:
        launch.problems.append(f"{where} {val!r}: not a size (write it like 8g)")
        return
    launch.shm_size = f"{m.group(1)}{m.group(2).lower()}"


def whole_number(val: str, launch: Launch, where: str) -> int | None:
    n = specmod.ascii_int(val)
    if n is None:
        launch.problems.append(f"{where} {val!r}: not a whole number (write it in ASCII digits 0-9)")
    return n


def volume(val: str, launch: Launch, where: str) -> None:
    parts = val.split(":")
    if len(parts) < 2:
        launch.notes.append(f"{where} {val}: anonymous volume, not imported")
        return
    host, container = parts[0], parts[1]
    opts = parts[2].split(",") if len(parts) > 2 else []
    home = re.match(r"^(\$HOME|\$\{HOME\})(/|$)", host)
    if home:
        # `$HOME/x` and `~/x` name the same directory; the spec's mounts understand `~/`.
        launch.notes.append(f"{where} {val}: {home.group(1)} written as ~ in the mount")
        host = "~" + host[len(home.group(1)) :]
    made = any(host == t or host.startswith(t + "/") for t in launch.made_placeholders)
    if not made and not host.startswith(("/", "~", "./", "../", "$")) and host not in (".", ".."):
        launch.notes.append(f"{where} {val}: named volume, not imported (use a host directory)")
        return
    try:
        launch.mounts.append(specmod.Mount(host=host, container=container, readonly="ro" in opts))
        if "rw" in opts:
            launch.writable.add(container)
    except ValidationError as err:
        for path, msg in specmod.problems_from(err):
            launch.problems.append(f"{where} {val!r}: {path}: {msg}")
    if made:
        launch.notes.append(
            f"{where} {val}: the host path is a placeholder (a variable the text never sets); fill it "
            "before deploy"
        )
    if "$" in host:
        launch.notes.append(
            f"{where} {val}: the host path holds shell syntax, kept literally; set a real path"
        )
