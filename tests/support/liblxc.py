"""liblxc as the consumer of the lxc target's pct.conf: the conf as liblxc reads it, run with lxc-execute."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.targets import conf_pairs

#: The word that precedes a file mount's host path in the lxc target's pre-start hook.
FILE_CHECK_WORD = "rigsmith-file-check"


def liblxc_config(
    conf: str, rootfs: Path, fake: Path, memlock: str | None, extra: tuple[str, ...] = ()
) -> tuple[str, dict[str, Path]]:
    """Proxmox `lxc.key: value` (and mpN/devN, as PVE expands them) → liblxc `lxc.key = value`, host paths
    pointed at test stand-ins under ``fake``: device nodes made with mknod, dirs made, a file mount's file
    made empty unless the conf's pre-start hook checks it (then the hook makes it, as on the PVE host).
    ``extra`` lines (e.g. ``lxc.idmap``) go after the rootfs, as PVE's generated config has them."""
    lines = [
        f"lxc.rootfs.path = dir:{rootfs}",
        "lxc.net.0.type = empty",
        "lxc.autodev = 1",
        "lxc.mount.auto = proc:mixed sys:ro",
        *extra,
    ]
    targets: dict[str, Path] = {}

    def stand_in(host: str, kind: str) -> Path:
        if host in targets:
            return targets[host]
        p = fake / host.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dev" and not p.exists():
            os.mknod(p, 0o666 | 0o020000, os.makedev(1, 3))  # a char device like /dev/null
        elif kind == "file":
            p.touch()
        elif kind == "dir":
            p.mkdir(exist_ok=True)
        targets[host] = p
        return p

    for key, value in conf_pairs(conf):
        hooked = re.search(rf"\s{FILE_CHECK_WORD}\s+(\S+)", value) if key == "lxc.hook.pre-start" else None
        if key == "lxc.prlimit.memlock":
            lines.append(f"{key} = {memlock or value}")
        elif hooked:
            host = hooked.group(1)
            path = stand_in(host, "hooked")
            lines.append(f"{key} = {value.replace(f' {host} ', f' {path} ')}")
        elif key == "lxc.mount.entry":
            src, dst, *rest = value.split()
            if src.startswith("/"):
                src = str(stand_in(src, "dev" if src.startswith("/dev/") else "file"))
            lines.append(f"{key} = {' '.join([src, dst, *rest])}")
        elif key.startswith("lxc."):
            lines.append(f"{key} = {value}")
        elif re.fullmatch(r"mp\d+", key):
            host, *opts = value.split(",")
            mp = next(o[3:] for o in opts if o.startswith("mp="))
            ro = ",ro" if "ro=1" in opts else ""
            lines.append(
                f"lxc.mount.entry = {stand_in(host, 'dir')} {mp.lstrip('/')} none bind,create=dir{ro} 0 0"
            )
        elif re.fullmatch(r"dev\d+", key):
            host = value.split(",")[0]
            lines.append(
                f"lxc.mount.entry = {stand_in(host, 'dev')} {host.lstrip('/')} none bind,create=file 0 0"
            )
    return "\n".join(lines) + "\n", targets


def lxc_execute(
    lxcpath: Path, name: str, config: str, script: str, log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``lxc-execute`` of ``sh -c script`` in a container of this config; ``log`` takes liblxc's DEBUG log
    (where liblxc puts a hook's output)."""
    (lxcpath / name).mkdir(parents=True, exist_ok=True)
    (lxcpath / name / "config").write_text(config)
    logging = ["-o", str(log), "-l", "DEBUG"] if log else []
    return subprocess.run(
        ["lxc-execute", "-P", str(lxcpath), "-n", name, *logging, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
