"""The engine image a recipe's notes describe, proposed as ``images/<name>/image.yaml``. Pure.

Seed 003 runs vLLM from a checkout: "git clone --branch v2.5.1 (repo @ 28cbb72), fetch the v2.5.1 source
bundle + the unchanged-since-v2.2.0 compiled-ops tarball from the repo's releases … TREE=./vllm-v2.5".
:func:`propose` reads that into a source-tree image: the ref (and the commit the recipe names for it), the
release assets by name (their URLs left empty to fill — notes never carry them), the tree's Python
directory from ``TREE``, and the placeholders the tree provides (``<repo>`` is the tree's root in the
image, ``<vllm tree>`` its vLLM directory). The notes are untrusted text: every value taken from them is
matched against a narrow pattern, and what does not match is left for the user to fill.

The URL checks here are shared with ``resolving.image.image`` (which validates image.yaml), as importing comes
first in the flow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from rigsmith.spec import NAME_RE, Deployment, Mount, from_data, to_data

#: Git URL schemes a tree may come from (no ext::/fd:: transports, no option-looking values).
GIT_SCHEMES = ("https://", "http://", "git://", "ssh://", "file://")
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")

#: Where the proposed tree goes when the repository's name is not known.
DEFAULT_DEST = "/opt/src"
#: The base proposed for a vLLM source tree; its tag is the user's to choose, pin locks the digest.
DEFAULT_BASE = {"name": "vllm/vllm-openai", "tag": "latest"}
#: Env names a recipe uses for its vLLM tree, relative to the checkout (seed 003: TREE=./vllm-v2.5).
TREE_ENV_NAMES = ("TREE", "VLLM_TREE", "VLLM_SRC")
#: Words dropped from an asset phrase to name it ("the v2.5.1 source bundle" → source-bundle).
_ASSET_FILLER = {"the", "a", "an", "tarball", "archive", "release", "asset"}

_CLONE_RE = re.compile(r"\bgit clone\b(?P<rest>[^()\n]{0,300})")
_BRANCH_RE = re.compile(r"(?:--branch|-b)[ =](?P<ref>[A-Za-z0-9][A-Za-z0-9._/+-]{0,100})")
_URL_RE = re.compile(r"(?P<url>(?:https|http|git|ssh)://[A-Za-z0-9._~:/?#\[\]@!$&'*+,;=%-]{1,300})")
_AT_RE = re.compile(r"\brepo @ (?P<sha>[0-9a-f]{7,40})\b")
_FETCH_RE = re.compile(r"\bfetch (?P<what>[^;()\n]{1,300}?) from the repo'?s releases\b")
_VERSIONISH = re.compile(r"\d+\.\d+")
_REF_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")


def check_git_url(v: str) -> str:
    """Refuse a git URL that is not one of :data:`GIT_SCHEMES` (ext::, options, whitespace)."""
    if not v.startswith(GIT_SCHEMES) or any(c.isspace() or ord(c) < 32 for c in v):
        raise ValueError(f"{v!r}: a git URL must start with {', '.join(GIT_SCHEMES)} and hold no spaces")
    return v


def check_asset_url(v: str) -> str:
    """https, or http to a loopback host only (an asset's first download is what pin trusts); no
    credentials in the URL (they would be written into image.yaml and the lock)."""
    if any(c.isspace() or ord(c) < 32 for c in v):
        raise ValueError(f"{v!r}: a URL holds no spaces or control characters")
    scheme, sep, rest = v.partition("://")
    authority = rest.split("/", 1)[0]
    host = authority.rsplit(":", 1)[0] if not authority.endswith("]") else authority
    if not sep or scheme not in ("https", "http") or not authority:
        raise ValueError(f"{v!r}: an asset URL must be https://HOST/…")
    if "@" in authority:
        raise ValueError(f"{v!r}: no credentials in an asset URL (they would be written into the lock)")
    if scheme == "http" and host not in _LOOPBACK:
        raise ValueError(f"{v!r}: plain http only to a loopback host; use https")
    return v


@dataclass(frozen=True)
class Proposal:
    """A proposed image definition and the placeholders its tree provides."""

    name: str
    data: dict[str, Any]  # image.yaml content
    placeholders: dict[str, str] = field(default_factory=dict)  # token → path in the image

    @property
    def to_fill(self) -> list[str]:
        """image.yaml fields still empty (pin refuses them)."""
        tree = self.data["tree"]
        out = ["tree.repo"] if not tree.get("repo") else []
        return out + [
            f"tree.assets[{i}].url" for i, a in enumerate(tree.get("assets", [])) if not a.get("url")
        ]

    def text(self, source: str) -> str:
        """image.yaml as written: a header saying where it came from and what to fill, then the data."""
        head = [
            "# yaml-language-server: $schema=../../schema/image.schema.json",
            f"# Proposed by `invoke import-recipe` from the notes of {_one_line(source)}.",
            "# The engine is built from the recipe's source tree: `invoke pin` locks the ref's commit and",
            "# each asset's sha256; `invoke build` copies exactly that commit (and the verified assets) into",
            "# the image.",
        ]
        if self.to_fill:
            head.append(f"# Fill in before `invoke pin`: {', '.join(self.to_fill)}.")
        head.append("# base: the image the tree runs on; choose its tag (pin locks the digest).")
        return (
            "\n".join(head) + "\n" + yaml.safe_dump(self.data, sort_keys=False, allow_unicode=True, width=110)
        )


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


def _asset_name(phrase: str) -> str | None:
    words = [w for w in re.split(r"[\s]+", phrase.lower()) if w and w not in _ASSET_FILLER]
    words = [w for w in words if not _VERSIONISH.search(w)]
    name = re.sub(r"[^a-z0-9._-]+", "-", "-".join(words)).strip("-._")[:60]
    return name if name and NAME_RE.match(name) else None


def _assets(notes: str) -> list[dict[str, Any]]:
    m = _FETCH_RE.search(notes)
    if not m:
        return []
    out: list[dict[str, Any]] = []
    for phrase in re.split(r"\s+\+\s+|\s+and\s+|,\s*", m["what"]):
        phrase = phrase.strip()
        name = _asset_name(phrase)
        if name and name not in {a["name"] for a in out}:
            out.append({"name": name, "url": None, "unpack": ".", "note": f"the recipe: {phrase!r}"})
    return out


def _tree_rel(dep: Deployment) -> str | None:
    for e in dep.env:
        if e.name in TREE_ENV_NAMES and e.value.startswith("./"):
            rel = PurePosixPath(e.value)
            if ".." not in rel.parts and len(str(rel)) < 200 and _REF_OK.match(str(rel)):
                return str(rel)
    return None


def _dest(repo: str | None, filled: dict[str, str]) -> str:
    for token, value in filled.items():
        # A root placeholder the user already pointed at a container path: the tree goes there.
        if value and "repo" in token.lower() and value.startswith("/") and ".." not in value.split("/"):
            return value.rstrip("/") or DEFAULT_DEST
    if repo:
        last = repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git").lower()
        if NAME_RE.match(last):
            return f"/opt/{last}"
    return DEFAULT_DEST


def propose(
    dep: Deployment, *, source_repo: str | None = None, filled: dict[str, str] | None = None
) -> Proposal | None:
    """The image the notes of ``dep`` describe, or None when they clone no repository.

    Args:
        dep: the imported spec (its notes, env and placeholders).
        source_repo: the repository's git URL (``--source-repo``); else a URL the clone names, else empty.
        filled: placeholder values the user already wrote (a ``<repo>`` path is where the tree goes).
    """
    notes = "\n".join(dep.notes)
    clone = _CLONE_RE.search(notes)
    if clone is None:
        return None
    branch = _BRANCH_RE.search(clone["rest"])
    at = _AT_RE.search(notes)
    ref = branch["ref"] if branch else (at["sha"] if at else None)
    if ref is None or ".." in ref or ref.endswith((".lock", "/", ".")):
        return None
    repo = source_repo
    if repo is None:
        url = _URL_RE.search(clone["rest"])
        repo = url["url"].rstrip(".,;") if url else None
    if repo is not None:
        check_git_url(repo)
    dest = _dest(repo, filled or {})
    rel = _tree_rel(dep)
    tree: dict[str, Any] = {"repo": repo, "ref": ref}
    if at and at["sha"] != ref:
        tree["commit"] = at["sha"]
    tree.update(dest=dest, install="pythonpath", pythonpath=rel or ".")
    assets = _assets(notes)
    if assets:
        tree["assets"] = assets
    tree["note"] = f"the recipe: {clone.group(0)[:200].strip()}"
    data: dict[str, Any] = {
        "version": 1,
        "description": f"{dep.description or dep.name} — engine built from the recipe's source tree"[:300],
        "base": dict(DEFAULT_BASE),
        "tree": tree,
    }
    placeholders: dict[str, str] = {}
    for token in dep.placeholders:
        words = token.strip("<>").lower().split()
        used_as_path = any(e.value.startswith(token) for e in dep.env)
        if not used_as_path:
            continue
        if "tree" in words and rel:
            placeholders[token] = str(PurePosixPath(dest) / rel)
        elif "repo" in words:
            placeholders[token] = dest
    return Proposal(dep.name, data, placeholders)


def keep_filled(proposed: Proposal, existing: Any) -> Proposal:
    """``proposed`` with the values the user filled in an earlier image.yaml kept: base, tree.repo, and
    each same-named asset's url/sha256 (a re-import never empties what the user wrote)."""
    if not isinstance(existing, dict):
        return proposed
    data = dict(proposed.data)
    if isinstance(existing.get("base"), dict):
        data["base"] = existing["base"]
    found = existing.get("tree")
    old_tree: dict[str, Any] = found if isinstance(found, dict) else {}
    tree = dict(data["tree"])
    if tree.get("repo") is None and old_tree.get("repo"):
        tree["repo"] = old_tree["repo"]
    old_assets = {a.get("name"): a for a in old_tree.get("assets") or [] if isinstance(a, dict)}
    assets = []
    for a in tree.get("assets", []):
        old = old_assets.get(a["name"], {})
        assets.append({**a, **{k: old[k] for k in ("url", "sha256") if old.get(k)}})
    if assets:
        tree["assets"] = assets
    data["tree"] = tree
    return Proposal(proposed.name, data, proposed.placeholders)


def link(dep: Deployment, proposal: Proposal) -> Deployment:
    """``dep`` building the proposed image (``engine.build``). Its placeholders stay empty on the recipe's
    side of a re-import; :func:`fill_in_image` sets them on the user's."""
    data = to_data(dep)
    data["engine"]["build"] = proposal.name
    return from_data(data, f"deployments/{dep.name}.yaml")


#: Env vars naming a cache the engine writes and reads back at every start (compiled graphs, kernels).
CACHE_ENV = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def fill_in_image(dep: Deployment, places: dict[str, str]) -> Deployment:
    """``dep`` with each empty placeholder the proposed tree provides set to its place in the image
    (:attr:`Proposal.placeholders`), as the user would fill it, and a host directory mounted over each
    cache (:data:`CACHE_ENV`) that lands inside the image: the image's copy lives in a container layer
    that every new container starts without, so every start would compile again as on a first boot.
    Written into the spec, not into the recorded base, so a re-import keeps it (or the user's own
    values) like any other edit."""
    empty = {t: v for t, v in places.items() if t in dep.placeholders and dep.placeholders[t] is None}
    if not empty:
        return dep
    dep = dep.model_copy(update={"placeholders": {**dep.placeholders, **empty}})
    inside = tuple(v.rstrip("/") + "/" for v in places.values())
    mounted = {m.container.rstrip("/") for m in dep.mounts}
    caches = [
        (e.name, path)
        for e in dep.env
        if e.name in CACHE_ENV and (path := dep.fill(e.value).rstrip("/")).startswith(inside)
        and path not in mounted
    ]  # fmt: skip
    if not caches:
        return dep
    home = PurePosixPath(dep.model.local_dir).parent / "rigsmith-cache" / dep.name
    mounts = [
        Mount(
            host=str(home / var.lower()),
            container=path,
            note=f"{var}: kept on the host (in the image it would start empty in every new container)",
        )
        for var, path in caches
    ]
    return dep.model_copy(update={"mounts": (*dep.mounts, *mounts)})


#: Env prefixes the engine (vLLM, PyTorch, NCCL, CUDA, the Hub libraries) reads itself.
ENGINE_ENV_PREFIXES = (
    "VLLM_", "NCCL_", "CUDA_", "HF_", "HUGGING", "TORCH", "PYTORCH_", "OMP_", "PYTHON", "TRANSFORMERS_",
    "NVIDIA_", "LD_", "TRITON_", "TOKENIZERS_", "MKL_", "CUBLAS", "CUDNN",
)  # fmt: skip
#: Opt-ins the plan translates into engine flags (rendering.optins.EFFECTS): not script switches.
TRANSLATED_OPT_INS = ("HOST",)
_SCRIPT_RE = re.compile(r"(?<![\w./-])(?:\./)?(?P<script>scripts/[A-Za-z0-9._-]{1,80}\.sh)\b")


def mark_script_switches(dep: Deployment) -> Deployment:
    """Mark the opt-in switches only the recipe's own script reads (``read_by``): seed 003's notes run
    ``scripts/serve-v2.5.sh``, whose AUTO_TOPO and COUNTERS no engine reads. Variables the engine reads
    (by prefix) and opt-ins rigsmith translates itself (HOST) stay unmarked."""
    found = _SCRIPT_RE.search("\n".join([*dep.notes, *dep.env_notes]))
    if found is None:
        return dep
    script = found["script"]
    env = tuple(
        e.model_copy(update={"read_by": script})
        if e.opt_in
        and e.read_by is None
        and not e.name.startswith(ENGINE_ENV_PREFIXES)
        and e.name not in TRANSLATED_OPT_INS
        else e
        for e in dep.env
    )
    return dep if env == dep.env else dep.model_copy(update={"env": env})
