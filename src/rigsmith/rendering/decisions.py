"""Where the container command differs from the recipe's argv by what the spec and lock say. Pure; the plan
applies them, so every target carries the same argv.

- a GGUF Hub reference (``REPO:QUANT``): the model word names the one ``.gguf`` file the lock lists.

- ``network.listen`` (import's exposure decision, importing/recipe/exposure.py): with host networking vLLM's
  bind address is the exposure, so ``--host`` is replaced (or added).
- the served name: vLLM serves a model under its model argument; rewritten to the mounted copy, clients
  that call the recipe's id would get 404, so ``--served-model-name <the recipe's word>`` is added when the
  args set none (import notes it).

``served`` (the spec with its rewritten args) and ``command`` (the argv the container runs) apply them.
"""

from __future__ import annotations

from rigsmith import secondary, userhome
from rigsmith import spec as specmod
from rigsmith.errors import LockError
from rigsmith.rendering import optins
from rigsmith.resolving.lock import lock as lockmod

#: vLLM's flag naming the model's served names (argparse takes the underscore spelling too).
SERVED_FLAGS = ("--served-model-name", "--served_model_name")


def listen_args(spec: specmod.Deployment, args: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` with ``--host`` set to ``network.listen`` when the spec decided one. A recipe opt-in that sets
    --host (seed 003's HOST) is applied after this and wins."""
    if spec.network.listen is None:
        return args
    return optins.with_flag(args, "--host", spec.network.listen)


def _flag_value(word: str) -> str:
    """A model word's value: ``--model=V`` → V, else the word."""
    flag, eq, value = word.partition("=")
    return value if eq and flag.startswith("-") else word


def served_name(spec: specmod.Deployment) -> str | None:
    """The name the recipe's vLLM served the model under (its model argument as written) when the args
    set no ``--served-model-name``; None when they do or there is no model argument."""
    i = spec.engine.model_arg
    if i is None or any(a.split("=", 1)[0] in SERVED_FLAGS for a in spec.engine.args):
        return None
    return _flag_value(spec.engine.args[i])


def keep_served_name(written: specmod.Deployment, command: tuple[str, ...]) -> tuple[str, ...]:
    """``command`` (subcommand + args, the model word mapped) with the recipe's served name kept."""
    served, i = served_name(written), written.engine.model_arg
    if served is None or i is None:
        return command
    served = written.fill(served)
    if _flag_value(command[len(written.engine.subcommand) + i]) == served:
        return command
    return (*command, "--served-model-name", served)


def gguf_path(spec: specmod.Deployment, lock: lockmod.Lock | None, base: str) -> str:
    """Where the model word points: ``base`` (the model dir), or for a GGUF Hub reference (``REPO:QUANT``)
    the one ``.gguf`` file of that quantization inside it, found in the lock's file list.

    Without a lock (``validate`` checking a spec alone) the directory stands in.

    Raises:
        LockError: the lock has no entry for the model yet, or no single file matches the quantization.
    """
    quant = secondary.gguf_quant(spec)
    if quant is None or lock is None:
        return base
    entry = lock.models.get(spec.name)
    if entry is None:
        raise LockError(
            f"{spec.name}: the model {spec.model.repo}:{quant} is a GGUF file of a Hub repo, and which file "
            "is known only once the repo is pinned; rigsmith.lock has no entry for it yet",
            hint=f"run `invoke pin --deployment {spec.name}` (or `invoke fetch-model`), then deploy again",
        )
    files = secondary.gguf_files(spec, entry.files)
    if len(files) != 1:
        found = ", ".join(files[:6]) if files else "none"
        raise LockError(
            f"{spec.name}: {len(files)} .gguf files of {entry.repo}@{entry.commit[:12]} match the "
            f"quantization {quant} and model.allow_patterns ({found}); vLLM loads one GGUF file",
            hint="narrow model.allow_patterns to the one .gguf file to serve (a split GGUF must be merged "
            "first, e.g. with llama-gguf-split --merge)",
        )
    return base.rstrip("/") + "/" + files[0]


def served(
    spec: specmod.Deployment, placed: list[secondary.Placement], home: str
) -> tuple[specmod.Deployment, optins.Applied, str]:
    """The spec with the argv it serves (each secondary model's word naming its mounted copy, the listen
    address set, the opt-ins applied), what the opt-ins did, and the address vLLM listens on."""
    venv = spec.engine.runtime == "venv"
    # Each secondary model's word names its mounted copy (host path for a venv), like the model word.
    where = {p.repo: userhome.expand(p.local_dir, home) if venv else p.container_path for p in placed}
    args = listen_args(spec, secondary.rewrite_args(spec, spec.engine.args, where))
    opted = optins.apply(spec, args)
    listen = spec.network.host
    if opted.args != spec.engine.args:
        engine = spec.engine.model_copy(update={"args": opted.args})
        listen = engine.flag_value("--host") or listen
        spec = spec.model_copy(update={"engine": engine})
    return spec, opted, listen


def command(
    spec: specmod.Deployment, written: specmod.Deployment, lock: lockmod.Lock | None, home: str
) -> tuple[str, ...]:
    """``spec``'s served argv (subcommand + args), placeholders filled, its model word naming the model as it
    runs (its mounted dir, a venv's host dir, or the GGUF file in it), the recipe's served name kept
    (``written``: the spec as the user wrote it)."""
    venv = spec.engine.runtime == "venv"
    model_dir = userhome.expand(spec.model.local_dir, home) if venv else spec.model.container_path
    model_path = gguf_path(written, lock, model_dir)
    argv = tuple(spec.fill(a) for a in spec.engine.argv_with_model(model_path))
    return keep_served_name(written, argv)
