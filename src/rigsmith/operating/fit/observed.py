"""What the engine itself reported after a real boot, kept beside the fit estimate for the same inputs.

``invoke wait`` records vLLM's own "GPU KV cache size: N tokens" in ``.rigsmith/observed.jsonl``, keyed by
the model commit and the exact argv and env the engine ran with; ``invoke fit`` shows the last such number
next to its estimate, so the estimator can be checked against this rig, not only against the recipe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from rigsmith.resolving.lock.lock import Lock
from rigsmith.spec import Deployment

RECORD = Path(".rigsmith") / "observed.jsonl"


@dataclass(frozen=True)
class Observed:
    """One boot's numbers and the inputs they belong to."""

    deployment: str
    repo: str | None
    commit: str | None
    inputs_sha256: str  # argv + active env: a change to either makes an older number incomparable
    kv_cache_tokens: int
    time: str | None = None  # UTC, when ``wait`` saw it (older records have none)


def inputs_key(spec: Deployment, lock: Lock) -> tuple[str | None, str]:
    """(model commit, sha256 of the engine inputs) that a recorded number is valid for."""
    locked = lock.models.get(spec.name)
    commit = locked.commit if locked else spec.model.revision
    env = sorted((e.name, e.value) for e in spec.env if e.active and not e.secret)
    blob = json.dumps([list(spec.engine.args), env], ensure_ascii=False).encode()
    return commit, hashlib.sha256(blob).hexdigest()


def record(root: Path, spec: Deployment, lock: Lock, kv_cache_tokens: int) -> Path:
    """Append one observation; returns the file."""
    commit, key = inputs_key(spec, lock)
    path = root / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = json.dumps(asdict(Observed(spec.name, spec.model.repo, commit, key, kv_cache_tokens, when)))
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    return path


def last(root: Path, spec: Deployment, lock: Lock) -> Observed | None:
    """The newest observation for these exact inputs (a malformed line is skipped, not fatal)."""
    path = root / RECORD
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    commit, key = inputs_key(spec, lock)
    for raw in reversed(lines):
        try:
            obs = Observed(**json.loads(raw))
        except (ValueError, TypeError):
            continue
        if obs.repo == spec.model.repo and obs.commit == commit and obs.inputs_sha256 == key:
            return obs
    return None
