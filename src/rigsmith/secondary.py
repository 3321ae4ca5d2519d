"""Secondary Hub models (draft, tokenizer, LoRA adapters) and GGUF files: the spec each is pinned and fetched
as, and the argv word that names it. Pure: the spec and the lock's file list in, paths and words out. Where
each lives is decided in ``placement`` (below the spec models, which refuse what it refuses).

A secondary model is fetched like the main one, into a dedicated directory of its own, and mounted
read-only. One directory serves every ``secondary_models`` entry of the same repo (a draft model that is
also the tokenizer is fetched once). The default directory is a sibling of ``model.local_dir`` named
after the repo (``~/models/Qwen3-0.6B``), ``OWNER--NAME`` when that name is taken; it is mounted at
``/models/DIRNAME``. Both are overridable per entry (``local_dir``, ``container_path``).
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence

from rigsmith.spec import Deployment, ModelSpec
from rigsmith.spec.placement import CONTAINER_ROOT as CONTAINER_ROOT
from rigsmith.spec.placement import TOKENIZER_PATTERNS as TOKENIZER_PATTERNS
from rigsmith.spec.placement import Placement as Placement
from rigsmith.spec.placement import json_value, split_word
from rigsmith.spec.placement import named_repo as named_repo
from rigsmith.spec.placement import placement_problem as placement_problem
from rigsmith.spec.placement import placements as placements


def view(spec: Deployment, p: Placement) -> Deployment:
    """``spec`` with ``model`` the secondary repo at its placement (what pin, fetch-model and the drift
    check read for it)."""
    model = ModelSpec(
        repo=p.repo,
        revision=p.revision,
        local_dir=p.local_dir,
        container_path=p.container_path,
        allow_patterns=p.allow_patterns,
    )
    return spec.model_copy(update={"model": model, "secondary_models": ()})


# -- the argv word that names a secondary model -------------------------------------------------------


def pointed(word: str, role: str, path: str) -> str:
    """``word`` naming ``path`` instead of its repo (the form, flag prefix and other keys kept)."""
    prefix, value = split_word(word)
    conf = json_value(value)
    if conf is not None and role != "tokenizer":
        conf["model" if role == "speculative" else "path"] = path
        return prefix + json.dumps(conf)
    if role == "lora":
        return prefix + value.partition("=")[0] + "=" + path
    return prefix + path


def rewrite_args(spec: Deployment, args: Sequence[str], paths: Mapping[str, str]) -> tuple[str, ...]:
    """``args`` with each secondary model's word naming ``paths[repo]`` (a container or host path)."""
    out = list(args)
    for sm in spec.secondary_models:
        out[sm.arg] = pointed(out[sm.arg], sm.role, paths[sm.repo])
    return tuple(out)


# -- GGUF ------------------------------------------------------------------------------------------


def gguf_quant(spec: Deployment) -> str | None:
    """The quantization of a GGUF Hub reference (``REPO:QUANT`` as the model word), else None."""
    m, i = spec.model, spec.engine.model_arg
    if m.repo is None or i is None:
        return None
    value = split_word(spec.engine.args[i])[1]
    repo, colon, quant = value.rpartition(":")
    return quant if colon and repo == m.repo and quant else None


def gguf_files(spec: Deployment, files: Iterable[str]) -> list[str]:
    """The locked ``.gguf`` files the model's patterns fetch for its quantization (sorted)."""
    quant = (gguf_quant(spec) or "").lower()
    m = spec.model
    out = []
    for f in files:
        if not f.endswith(".gguf"):
            continue
        if m.allow_patterns and not any(fnmatch.fnmatchcase(f, p) for p in m.allow_patterns):
            continue
        if any(fnmatch.fnmatchcase(f, p) for p in m.ignore_patterns):
            continue
        if quant in posixpath.basename(f).lower() or quant in f.lower():
            out.append(f)
    return sorted(out)
