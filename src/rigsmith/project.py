"""The checkout as the user's homelab config repo: where specs, lock and generated files live."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rigsmith import writer
from rigsmith.errors import RigsmithError

if TYPE_CHECKING:
    from rigsmith import spec as specmod

TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")


#: Where a default deployment may be named, as the error for an ambiguous bare command lists them.
DEFAULT_HOW = (
    "set a default: `rigsmith: {deployment: NAME}` in invoke.yaml at the checkout's root, "
    "or RIGSMITH_DEPLOYMENT=NAME in the environment"
)


class _Under:
    """A read-only attribute: ``root / name`` of the instance (a fixed place in the checkout)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Project, owner: type[Project] | None = None) -> Path:
        return obj.root / self.name


@dataclass(frozen=True)
class Project:
    """Paths of one rigsmith checkout, and the deployment bare commands act on (``default``, named in
    ``default_source``) when there are several."""

    root: Path
    default: str | None = None
    default_source: str | None = None

    # The checkout's layout: each a path under ``root``.
    deployments = _Under("deployments")
    images = _Under("images")
    templates = _Under("templates")
    lock_path = _Under("rigsmith.lock")

    def spec_path(self, name: str) -> Path:
        return self.deployments / f"{name}.yaml"

    def deployment_names(self) -> list[str]:
        return sorted(p.stem for p in self.deployments.glob("*.yaml"))

    def resolve_name(self, name: str | None) -> str:
        """The deployment a task acts on: the one named, else the default, else the only one there is."""
        names = self.deployment_names()
        if not name and self.default:
            if self.default not in names:
                raise RigsmithError(
                    f"{self.default_source or 'the default deployment'} names {self.default!r}, which is not "
                    f"in {self.deployments}",
                    hint=f"known: {', '.join(names) or 'none'}; fix the default or pass --deployment NAME",
                )
            return self.default
        if name:
            if name not in names:
                raise RigsmithError(
                    f"no deployment {name!r} in {self.deployments}",
                    hint=f"known: {', '.join(names) or 'none'}; "
                    "import one with `invoke import-recipe SOURCE`",
                )
            return name
        if len(names) == 1:
            return names[0]
        if not names:
            raise RigsmithError(
                f"no deployment in {self.deployments}",
                hint="import one with `invoke import-recipe SOURCE`",
            )
        raise RigsmithError(
            f"{len(names)} deployments in {self.deployments} and no default; say which one",
            hint=f"pass --deployment NAME (one of: {', '.join(names)}), or {DEFAULT_HOW}",
        )

    def load(self, name: str | None) -> specmod.Deployment:
        """Load and validate the named (or only) deployment (every bad file is one SpecError: see
        :func:`rigsmith.spec.load`)."""
        from rigsmith import spec as specmod  # pydantic: 94 ms (-X importtime) a task reading no spec skips

        return specmod.load(self.spec_path(self.resolve_name(name)))


#: Where ``import-recipe`` records the deployment it wrote last, so that bare commands act on it.
NEWEST_IMPORT = Path(".rigsmith") / "newest-import.json"


def record_import(root: Path, name: str, over: str | None) -> None:
    """Remember ``name`` as the newest import, and the invoke.yaml default it was imported over (``over``):
    bare commands act on it until invoke.yaml names another deployment or another import comes."""
    text = json.dumps({"deployment": name, "invoke_yaml_default": over}, sort_keys=True) + "\n"
    path = root / NEWEST_IMPORT
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # an unchanged record is not touched
        writer.write_one(path, text)


def newest_import(root: Path, configured: str | None) -> str | None:
    """The newest import bare commands act on: the deployment ``import-recipe`` wrote last, while it still
    exists and invoke.yaml's default (``configured``) is the one it was imported over — a default set in
    invoke.yaml after the import is the user's later choice and wins. None when there is none."""
    try:
        data = json.loads((root / NEWEST_IMPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # none recorded, or a damaged record: the configured default, as before any import
    name = data.get("deployment") if isinstance(data, dict) else None
    if not isinstance(name, str) or data.get("invoke_yaml_default") != configured:
        return None
    return name if (root / "deployments" / f"{name}.yaml").is_file() else None


#: The files that, beside deployments/, mark a project's root (:func:`find_root`).
PROJECT_FILES = ("tasks.py", "pyproject.toml", "invoke.yaml")


def find_root(start: Path | None = None) -> Path:
    """The nearest directory upward holding deployments/ and a project file beside it (a checkout's
    tasks.py or pyproject.toml, a project's invoke.yaml), else ``start``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "deployments").is_dir() and any((d / f).is_file() for f in PROJECT_FILES):
            return d
    return here
