"""A record's reading (:mod:`.form`) as the launch the spec is built from, and the fields laid over
the built spec. Pure."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing.recipe.command.text import _from_shell
from rigsmith.importing.recipe.launch import Launch, Meta, _refuse
from rigsmith.importing.recipe.record import form as recordform
from rigsmith.importing.recipe.record.ask import Answer, Reading


def launch_of(text: str, source: str, accept: bool, answer: Answer) -> tuple[Launch, Meta, Reading]:
    """A text with no launch command, read as a record: one paragraph saying so with the command its lines
    describe (imported only when the user confirms it, ``--yes``), or the launch, its title and the
    reading."""
    reading = recordform.read(text, answer)
    what = (
        f"{source}: this text has no launch command: no line runs vllm serve, python -m "
        "vllm.entrypoints.openai.api_server, docker run or podman run (it reads like a record or notes)"
    )
    if reading.repo is None or len(reading.argv) <= 1:
        raise RecipeError(
            what + "; nor do its lines name a model (Model: owner/name) and vLLM flags to build one from",
            hint="import the command the record ran (its script or compose file), or write it into the text",
        )
    cmd = recordform.command(reading)
    if not accept:
        asks = ", ".join(a.key for a, _ in reading.asked)
        raise RecipeError(
            f"{what}. Read as a record, item by item, the command its lines describe is:\n    {cmd}\n"
            "Check it "
            "against the record; --yes imports it, every other item of the record becoming a spec field, a "
            f"note or an entry of not_taken (its questions: {asks}; --answers FILE answers them)",
            hint="re-run with --yes to import the record, or import the record's own command",
        )
    if reading.problems:
        raise _refuse(source, reading.problems)
    launch = _from_shell(cmd)
    launch.env = [*reading.env, *launch.env]
    launch.notes = [
        "read as a record with no launch command (imported with --yes): each item is a spec field, a note "
        f"below or an entry of not_taken; the command its lines describe: {cmd}",
        *reading.notes,
        *launch.notes,
    ]
    return launch, Meta(title=reading.title), reading


def apply(dep: specmod.Deployment, reading: Reading, source: str) -> specmod.Deployment:
    """``dep`` with the reading's fields laid over it (``resources.gpus`` merged, mounts added), its
    placeholders, env notes and not_taken list."""
    data: dict[str, Any] = specmod.to_data(dep)
    for path, value in reading.fields.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = {**node[last], **value}
        elif isinstance(value, list) and isinstance(node.get(last), list):
            node[last] = [*node[last], *value]
        else:
            node[last] = value
    data["placeholders"] = {**reading.placeholders, **data.get("placeholders", {})}
    data["env_notes"] = [*reading.env_notes, *data.get("env_notes", [])]
    data["not_taken"] = reading.not_taken
    try:
        return specmod.Deployment.model_validate(data)
    except ValidationError as err:
        raise _refuse(source, [f"{p}: {m}" for p, m in specmod.problems_from(err)]) from None
