"""A Host that replays captured probe outputs from tests/operating/data/<case>/ (see case.yaml there)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import yaml

from rigsmith.operating import probes
from rigsmith.operating.probes import CmdResult
from tests.support.common import REPO

DATA = REPO / "tests" / "operating" / "data"
CASES = (
    "h200x2-nvlink-idle",
    "h200x2-nvlink-holding",
    "3x3090-squatter",
    "4x3090-idle",
    "no-driver",
    "h200-1gpu-idle",
    "h200-1gpu-holding",
    "2xh200-nvlink-ansi",
)


class ReplayHost:
    """Answers probe commands and file reads from one captured case; anything not captured is absent."""

    def __init__(self, case: str) -> None:
        self.dir = DATA / case
        self.meta = yaml.safe_load((self.dir / "case.yaml").read_text())
        self.ran: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str]) -> CmdResult:
        self.ran.append(tuple(argv))
        name = next((n for n, a in probes.COMMANDS.items() if tuple(argv) == a), None)
        f = self.dir / "cmd" / f"{name}.txt"
        if name is None or not f.exists():
            return CmdResult(127, "", f"{argv[0]}: command not found")
        code = int(self.meta.get("codes", {}).get(name, 0))
        text = f.read_text()
        return CmdResult(code, text if code == 0 or name == "memlock" else "", "" if code == 0 else text)

    def read(self, path: str) -> str | None:
        f = self.dir / "files" / path.lstrip("/")
        return f.read_text() if f.is_file() else None

    def listdir(self, path: str) -> list[str]:
        d = self.dir / "files" / path.lstrip("/")
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def statvfs(self, path: str) -> tuple[int, int] | None:
        v = (self.meta.get("statvfs") or {}).get(path)
        return (int(v[0]), int(v[1])) if v else None

    def tree_bytes(self, path: str) -> int:
        return int((self.meta.get("tree_bytes") or {}).get(path, 0))

    def size(self, path: str) -> int | None:
        """Sizes listed under ``sizes:`` in case.yaml, else files captured under files/."""
        sizes = self.meta.get("sizes") or {}
        if path in sizes:
            return int(sizes[path])
        f = self.dir / "files" / path.lstrip("/")
        return f.stat().st_size if f.is_file() else None


SMI = """#!/bin/sh
d='{d}'
case "$1" in
  -L) cat "$d/gpu_list.txt" ;;
  --query-gpu=*) cat "$d/gpus.txt" ;;
  --query-compute-apps=*) cat "$d/apps.txt" ;;
  topo) if [ "$2" = -m ]; then f=topo.txt; else f=p2p.txt; fi; [ -f "$d/$f" ] || exit 3; cat "$d/$f" ;;
  *) exit 2 ;;
esac
"""


def stand_in(
    tmp: Path, case: str | None = None, cards: list[tuple[str, int]] = (), held: dict[int, int] | None = None
) -> str:
    """A directory holding an `nvidia-smi` that prints ``case``'s captures, or ``cards`` (name, MiB) with
    ``held`` MiB on some of them by a foreign process; the PATH to run under."""
    held = held or {}
    d = tmp / "smi"
    d.mkdir()
    if case is not None:
        for f in (DATA / case / "cmd").glob("*.txt"):
            shutil.copy(f, d / f.name)
    else:
        uuid = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(len(cards))]
        (d / "gpu_list.txt").write_text(
            "".join(f"GPU {i}: {n} (UUID: {uuid[i]})\n" for i, (n, _) in enumerate(cards))
        )
        (d / "gpus.txt").write_text(
            "".join(
                f"{i}, {uuid[i]}, {n}, {mib}, {held.get(i, 0) + 1}, 575.64.05, 00000000:{i + 1:02X}:00.0\n"
                for i, (n, mib) in enumerate(cards)
            )
        )
        (d / "apps.txt").write_text(
            "".join(f"{4000 + i}, /opt/ComfyUI/venv/bin/python, {uuid[i]}, {m}\n" for i, m in held.items())
        )
    (d / "nvidia-smi").write_text(SMI.format(d=d))
    (d / "nvidia-smi").chmod(0o755)
    return f"{d}:/usr/bin:/bin"
