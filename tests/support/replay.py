"""A Host that replays captured probe outputs from tests/operating/data/<case>/ (see case.yaml there)."""

from __future__ import annotations

from collections.abc import Sequence

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
