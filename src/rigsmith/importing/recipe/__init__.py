"""Recipe import, the pure part: recipe text → :class:`rigsmith.spec.Deployment`.

Three formats (``parse`` picks one): (a) the recipe JSON (``title``/``command``/``env``/``notes``),
(b) raw command text — ``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``, ``docker run`` /
``podman run`` — with continuations, comments, ``VAR=value`` prefixes and ``export`` lines, (c) a compose
file holding one vLLM service. The argv is kept exactly as a POSIX shell parses it (see
:mod:`rigsmith.importing.shellwords`); whatever a shell would read differently from what the author meant is
refused with a reason that names the line or field. Facts the notes state in prose (Hub repo, size,
GPUs, shm, memlock, stop grace, readiness, config patches) are read with the regex table
``NOTE_FACTS``; the notes themselves are kept verbatim.

The package holds one module per concern: ``tables`` (option grammar, GPU names, note facts as data),
``launch`` (the intermediate model every form parses into), one module per form (``jsonform``,
``shellform``, ``composeform``), the grammars of the env string (``envtext``) and the notes (``notes``),
flag checks (``flags``) and ``assemble`` (launch → spec). This module picks the form.

Decisions (each is a corpus case in tests/importing/corpus_expected.yaml):

- A comment that ends in ``\\``, a ``\\`` followed by a space, two commands, shell control flow, shell
  operators (``;``, ``&``, ``|``, ``&&``) and a missing space that glues two words: refused.
- Blank lines after a ``\\`` (a web-paste artifact): accepted, joined, and said so in ``notes``.
- ``$VAR``, ``$(…)`` and backticks are never expanded; they are kept literally and listed in ``notes``.
  ``-e NAME=$NAME`` / ``NAME=$NAME`` is a pass-through from the host environment.
- ``<name>`` tokens are placeholders: kept in the value, listed in ``placeholders`` with no value, so
  ``deploy`` refuses until the user fills each one.
- The model is a Hub repo (``owner/name``), a path the notes tie to one (``hf download REPO --local-dir
  DIR``), or a local checkpoint: ``model.repo: null``, ``model.local_dir`` the path, never downloaded.
  An absolute or ``~/`` path is that directory; ``./x`` and a bare name that is not ``owner/name``
  (``Qwen2.5-VL-32B-Instruct``) are a directory relative to where the recipe ran, because vLLM opens a
  local directory of that name before it asks the Hub — imported as ``./NAME`` with a note, and
  ``deploy``/``fetch-model`` refuse it until the user writes the absolute path. In a ``docker run`` /
  compose recipe the path is inside the container: the bind mount that holds it gives the host directory
  (``$(pwd)``/``$PWD`` as ``.``); no such mount, or a mount whose host side is ``$VAR``, is refused.
  ``<placeholder>``, ``~user/…`` and ``$VAR`` are refused; a documentation word (``/path/to/…`` as the
  model, a flag's path or a volume's host side; the model ``...``) is a placeholder to fill (``docwords``).
- Compose ``${VAR:-default}`` interpolation is refused (rigsmith would have to guess the value); ``$$``
  is compose's escape for a literal ``$``.
- GPUs: explicit device ids win (``--gpus device=2,3``, CDI ``--device``, or ``CUDA_VISIBLE_DEVICES`` /
  ``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` when the container would see every GPU: those pick
  the CDI devices and the variable is renumbered ``0..N-1`` for the container), then a count in the notes,
  then the product of the flags that multiply GPUs (:mod:`rigsmith.importing.vllmflags`: TP × PP ×
  prefill context parallel × data parallel local, else data parallel); CDI names ``nvidia.com/gpu=…``
  (``amd.com/gpu`` when the env is ROCm's). ``--gpus all`` and ``VENDOR=all`` are pinned to
  ``VENDOR=0..N-1`` so every target carries the same explicit devices.
- The model is the first positional (options before it are skipped by their arity), or ``--model``. A GGUF
  Hub reference ``owner/repo:QUANT`` is the repo with a ``*QUANT*.gguf`` file pattern. A ``docker run``
  volume whose container path *is* the model becomes the model mount. Secondary Hub models (a
  ``--speculative-config`` draft, ``--tokenizer``, ``--lora-modules``) are listed in ``secondary_models``.
- A JSON flag given in the ``key=value,…`` form of older vLLM releases is passed through with a note.
- ``docker run IMAGE /bin/bash``, ``--entrypoint /bin/bash``, a Kubernetes manifest or a kubectl call is
  refused in one paragraph as "not a serving command"; an image from ``$VAR`` is refused at import.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing.recipe import cardform
from rigsmith.importing.recipe.assemble import build, slug
from rigsmith.importing.recipe.command.script import from_script
from rigsmith.importing.recipe.compose.env import ComposeEnv
from rigsmith.importing.recipe.compose.form import _compose_data, _from_compose
from rigsmith.importing.recipe.envtext import parse_env_text
from rigsmith.importing.recipe.flags import canonical_flag, flag_values
from rigsmith.importing.recipe.jsonform import _from_json, load_json
from rigsmith.importing.recipe.launch import Asked, Launch, Meta, _provenance, _refuse
from rigsmith.importing.recipe.notes import NoteFacts, note_facts
from rigsmith.importing.recipe.record import spec as recordspec
from rigsmith.importing.recipe.record.ask import Answer, Ask, Reading, no_answer
from rigsmith.importing.recipe.tables import _KUBE_RE
from rigsmith.importing.recipe.vllmrecipes import apiform as vllmapi
from rigsmith.importing.recipe.vllmrecipes import yamlform as vllmrecipe

# -- entry point -------------------------------------------------------------------------------------


def parse(
    text: str,
    *,
    source: str,
    sha256: str,
    name: str | None = None,
    image: str | None = None,
    accept: bool = False,
    compose_env: ComposeEnv | None = None,
    service: str | None = None,
    variant: str | None = None,
    answer: Answer = no_answer,
) -> specmod.Deployment:
    """Recipe text (any of the three formats) → a validated Deployment, or RecipeError with every reason.

    Args:
        text: the recipe as fetched (decoded).
        source: where it came from (URL or path), recorded in provenance and used in messages.
        sha256: hex digest of the fetched bytes.
        name: deployment name (default: from the recipe id, title or model).
        image: container image to use when the recipe names none (or to replace the one it names).
        accept: take the author's evident intent where bash would break on the text (``--yes``); each
            such step is recorded in the spec's notes.
        compose_env: the variables a compose file is interpolated with (process environment, env file);
            None interpolates with nothing set (every ``${VAR}`` without a default is a placeholder).
        service: the compose service to import (``--service``), when the file has several.
        variant: a vLLM recipes YAML's variant, ``NAME[@HARDWARE]`` (``--variant``).
        answer: answers the questions a record leaves open (``--answers FILE``, the terminal); see
            :mod:`.record.ask`.
    """
    _refuse_nul(text, source)
    stripped = text.lstrip("\ufeff \t\r\n")
    recipe: dict[str, Any] | None = None
    reading: Reading | None = None
    if stripped.startswith("{") and vllmapi.is_api(api := load_json(text, source)):
        recipe = api
        launch, meta = vllmapi.from_api(api, source, variant)
    elif stripped.startswith("{"):
        launch, meta = _from_json(text, source, accept)
    elif cardform.is_card(text):
        fields, card_notes, card_problems = cardform.card_fields(text)
        if card_problems:
            raise _refuse(source, card_problems)
        launch, meta = _from_json(json.dumps(fields), source, accept)
        launch.notes = [*card_notes, *launch.notes]
    else:
        _refuse_kube(text, source)
        data = _compose_data(text, source)
        recipe = vllmrecipe.load(text, source) if data is None and vllmrecipe.looks_like(text) else None
        if recipe is not None:
            launch, meta = vllmrecipe.from_recipe(recipe, source, variant)
        elif data is not None:
            launch = _from_compose(data, compose_env or ComposeEnv(), service)
            meta = Meta()
        elif cardform.is_record(text):
            launch, meta, reading = recordspec.launch_of(text, source, accept, answer)
            name = name or slug((reading.repo or "record").rsplit("/", 1)[-1])  # a title is too long
        else:
            launch = from_script(text, source, accept)
            meta = Meta()
    if variant is not None and recipe is None:
        raise RecipeError(
            f"{source}: --variant {variant} picks a variant of a vLLM recipes YAML (models/ORG/REPO.yaml of "
            "vllm-project/recipes), and this is not one",
            hint="leave out --variant, or import the recipe's YAML",
        )
    launch.problems += _modelscope(launch, meta)
    meta = dataclasses.replace(meta, provenance=_provenance(source, sha256, meta))
    dep = build(launch, meta, source=source, asked=Asked(name, image))
    return dep if reading is None else recordspec.apply(dep, reading, source)


def _refuse_nul(text: str, source: str) -> None:
    """A NUL in the text: refused naming its line and column."""
    if "\x00" in text:
        at = text.index("\x00")
        line = text.count("\n", 0, at) + 1
        raise _refuse(
            source,
            [
                f"line {line} column {at - (text.rfind(chr(10), 0, at) + 1) + 1}: a NUL character, which "
                "no shell, unit file or YAML reader carries; remove it"
            ],
        )


def _refuse_kube(text: str, source: str) -> None:
    """A Kubernetes manifest or a kubectl/helm call: refused as not a serving command."""
    manifest = _KUBE_RE.search(text)
    if manifest is not None:
        raise _refuse(
            source,
            [
                f"line {text.count(chr(10), 0, manifest.start()) + 1}: this is not a serving command but "
                f"a Kubernetes manifest or a {manifest.group('tool') or 'kubectl'} call "
                "(rigsmith renders those itself: `--target kube`); import the vllm serve, python -m "
                "vllm.entrypoints.openai.api_server, docker run or compose text that its container runs"
            ],
        )


_MODELSCOPE_RE = re.compile(r"(?:^|\s)VLLM_USE_MODELSCOPE=['\"]?(?:1|[Tt]rue|TRUE|yes)\b")


def _modelscope(launch: Launch, meta: Meta) -> list[str]:
    """VLLM_USE_MODELSCOPE makes vLLM fetch the model id from ModelScope, not the Hugging Face Hub that
    rigsmith pins and verifies against: the id would be pinned as the wrong repo, so it is refused."""
    values = [e.value for e in launch.env if e.name == "VLLM_USE_MODELSCOPE"]
    values += [v or "" for k, v in (meta.env_map or {}).items() if k == "VLLM_USE_MODELSCOPE"]
    on = any(v.strip().lower() in ("1", "true", "yes") for v in values)
    if not on and not _MODELSCOPE_RE.search(meta.env_text or ""):
        return []
    return [
        "env VLLM_USE_MODELSCOPE is set: vLLM then downloads the model id from ModelScope, not from the "
        "Hugging Face Hub that rigsmith pins and verifies; the same id on the Hub may be another model or "
        "none. Import the Hub repo id of the model instead (without VLLM_USE_MODELSCOPE), or the "
        "checkpoint's directory if you downloaded it from ModelScope yourself"
    ]


__all__ = [
    "Answer",
    "Ask",
    "ComposeEnv",
    "Launch",
    "Meta",
    "NoteFacts",
    "build",
    "canonical_flag",
    "flag_values",
    "note_facts",
    "parse",
    "parse_env_text",
    "slug",
]
