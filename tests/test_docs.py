"""The docs cannot drift from the code: docs/commands.md is Invoke's own help, regenerated and compared; every
relative link in README.md and docs/ names a file that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_command_reference_is_invokes_own_help() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-commands-doc.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_every_relative_link_in_the_docs_resolves() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert broken == []
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 130
