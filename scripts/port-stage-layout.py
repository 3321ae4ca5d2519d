#!/usr/bin/env python3
"""One-off: port Python files written against the flat layout to the stage packages (issue 9).

Rewrites import lines only: ``rigsmith.<module>`` → ``rigsmith.<stage>.<module>`` (``ops`` → ``operating``),
``from rigsmith import a, b`` split per package, ``python -m rigsmith.ops.X`` strings, and helpers imported
from conftest files or moved test modules → ``tests.support.*``. Run ``ruff check --fix --select I`` after.

    python3 scripts/port-stage-layout.py $(git ls-files '*.py' | grep -v ^tests/golden)

Delete this file once the branches written before the move are merged.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

STAGE = {
    **dict.fromkeys(("shellwords", "recipe", "importer"), "importing"),
    **dict.fromkeys(
        ("hub", "registry", "modelfiles", "modelfetch", "image", "build", "engine", "lock"), "resolving"
    ),
    **dict.fromkeys(("plan", "deploy", "targets"), "rendering"),
    "verify": "operating",
}
DOTTED = re.compile(r"\brigsmith\.(ops|" + "|".join(STAGE) + r")\b")
FROM_PKG = re.compile(r"^(\s*)from rigsmith import ([^()#\n]+?)(\s*#.*)?$")

#: names the root conftest held → the support module they live in now
COMMON = set(
    [
        "REPO",
        "GOLDEN",
        "FAKE_VENDOR",
        "FAKE_GPUS",
        "STANDIN_IMAGE",
        "HOST_MEMLOCK",
        "GOLDEN_BUILD_DIGEST",
        "require",
        "compare_tree",
        "make_seed_project",
        "run_script",
        "standin_deployment",
        "write_project",
        "prepare_host_dirs",
    ]
)
PODMAN = set(
    [
        "Podman",
        "CONTAINERS_CONF",
        "FAKE_CDI_SPEC",
        "RECORDER",
        "Recording",
        "parse_recording",
        "import_busybox_image",
    ]
)
TEST_MODULES = {
    "tests.targets.conftest": "targets",
    "tests.images.conftest": "images",
    "tests.models.conftest": "models",
    "tests.recipes.conftest": "recipes",
    "tests.ops.conftest": "ops",
    "tests.images.services": "services",
    "tests.models.hubserver": "hubserver",
    "tests.targets.facts": "facts",
    "tests.ops.replay": "replay",
}
#: helpers that lived in test modules and moved to tests.support.targets, with their new names
MOVED_HELPERS = {
    "HOSTILE": "HOSTILE",
    "_up": "compose_up",
    "_conf_pairs": "conf_pairs",
    "_fake_ct": "fake_ct",
}


def _dotted(m: re.Match[str]) -> str:
    name = m.group(1)
    return "rigsmith.operating" if name == "ops" else f"rigsmith.{STAGE[name]}.{name}"


def src_line(line: str) -> str:
    m = FROM_PKG.match(line)
    if m:
        indent, names, comment = m.group(1), m.group(2), m.group(3) or ""
        groups: dict[str, list[str]] = {}
        for item in (n.strip() for n in names.split(",")):
            base = item.split(" as ")[0].strip()
            if base == "ops":
                groups.setdefault("rigsmith", []).append(item.replace("ops", "operating", 1))
            else:
                groups.setdefault(f"rigsmith.{STAGE[base]}" if base in STAGE else "rigsmith", []).append(item)
        return "\n".join(
            f"{indent}from {mod} import {', '.join(ns)}{comment}" for mod, ns in sorted(groups.items())
        )
    if re.match(r"^\s*(from|import) rigsmith\.", line) or "-m rigsmith" in line or '"rigsmith.ops.' in line:
        return DOTTED.sub(_dotted, line)
    return line


def _test_home(module: str, name: str) -> tuple[str, str] | None:
    if module == "tests.conftest":
        if name in COMMON:
            return "tests.support.common", name
        if name in PODMAN:
            return "tests.support.podman", name
        return None
    if module == "tests.models.conftest" and name == "ROOT":
        return "tests.support.common", "REPO as ROOT"
    if module in ("tests.images.conftest", "tests.recipes.conftest") and name == "REPO":
        return "tests.support.common", "REPO"
    if module in TEST_MODULES:
        return f"tests.support.{TEST_MODULES[module]}", name
    if module in ("tests.images", "tests.models", "tests.targets", "tests.ops") and name in set(
        TEST_MODULES.values()
    ):
        return "tests.support", name
    if module.startswith("tests.targets.test_") and name in MOVED_HELPERS:
        return "tests.support.targets", MOVED_HELPERS[name]
    if module.startswith("tests.targets.test_"):
        return module.replace("tests.targets.", "tests.rendering.", 1), name
    return None


def test_imports(text: str) -> str:
    lines = text.split("\n")
    edits = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests")):
            continue
        groups: dict[str, list[str]] = {}
        for a in node.names:
            home = _test_home(node.module, a.name)
            mod, name = home or (node.module, a.name)
            alias = a.asname or (a.name if name.split(" as ")[0] != a.name else None)
            if alias and " as " not in name and alias != name:
                name = f"{name} as {alias}"
            groups.setdefault(mod, []).append(name)
        if list(groups) == [node.module]:
            continue
        last = lines[node.end_lineno - 1]  # type: ignore[index]
        comment = "  " + last[last.index("#") :] if "#" in last and not last.strip().startswith("#") else ""
        new = [f"{' ' * node.col_offset}from {m} import {', '.join(ns)}{comment}" for m, ns in groups.items()]
        edits.append((node.lineno - 1, node.end_lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8")
        new = test_imports("\n".join(src_line(line) for line in text.split("\n")))
        new = new.replace('"tests.models.hubserver"', '"tests.support.hubserver"')
        if new != text:
            path.write_text(new, encoding="utf-8")
            print("ported", path)


if __name__ == "__main__":
    main(sys.argv[1:])
