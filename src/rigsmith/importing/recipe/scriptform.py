"""Recipe form (b) as pasted: a script evaluated into its one command (:mod:`rigsmith.importing.shelleval`)
before the shell form reads it, or a record with no command at all (:mod:`.cardform`)."""

from __future__ import annotations

from rigsmith.errors import RecipeError
from rigsmith.importing import shelleval
from rigsmith.importing.recipe import cardform
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.shellform import _from_shell


def _from_record(text: str, source: str, accept: bool) -> Launch:
    """A text with no launch command (a record, notes): one paragraph saying so, with the command its
    lines describe when they name a model and vLLM flags — imported only when the user confirms it."""
    proposal = cardform.propose(text)
    what = (
        f"{source}: this text has no launch command: no line runs vllm serve, python -m "
        "vllm.entrypoints.openai.api_server, docker run or podman run (it reads like a record or notes)"
    )
    if proposal is None or len(proposal.argv) <= 3:
        raise RecipeError(
            what + "; nor do its lines name a model (Model: owner/name) and vLLM flags to build one from",
            hint="import the command the record ran (its script or compose file), or write it into the text",
        )
    if not accept:
        skipped = f"; not proposed: {'; '.join(proposal.skipped)}" if proposal.skipped else ""
        raise RecipeError(
            f"{what}. Its lines name a model and vLLM flags ({', '.join(proposal.sources)}){skipped}; the "
            f"command they describe is:\n    {proposal.text}\nCheck it against the record; --yes imports "
            "exactly that command (the spec's notes record that it was proposed from the text)",
            hint="re-run with --yes to import the proposed command, or import the record's own command",
        )
    launch = _from_shell(proposal.text)
    launch.notes = [
        f"the text has no launch command; imported with --yes the command proposed from its lines "
        f"({', '.join(proposal.sources)}): {proposal.text}",
        *([f"named in the text but not proposed: {'; '.join(proposal.skipped)}"] if proposal.skipped else []),
        *launch.notes,
    ]
    return launch


def from_script(text: str, source: str, accept: bool) -> Launch:
    """Shell text: evaluated (:mod:`rigsmith.importing.shelleval`) into the one command it runs, then read
    as that command. Steps beyond bash need ``accept``; without it they are refused, saying what it takes."""
    if cardform.is_record(text):
        return _from_record(text, source, accept)
    ev = shelleval.evaluate(text, accept=accept)
    if ev.asks and not accept:
        raise RecipeError(
            "\n".join(
                [f"{source}: cannot import this recipe as bash would run it ({len(ev.asks)} question(s))"]
                + [f"  - {a}" for a in ev.asks + ev.problems]
            ),
            hint="re-run with --yes to import it as described (the spec's notes record each step), or fix "
            "the text",
        )
    if not ev.changed:
        launch = _from_shell(text)
        if ev.problems:  # outside the subset: named by the evaluator, in one paragraph
            launch.problems = list(ev.problems)
        return launch
    launch = _from_shell(ev.text)
    launch.problems = [*ev.problems, *launch.problems]
    launch.notes = [*ev.notes, *launch.notes]
    launch.made_placeholders = ev.placeholders
    return launch
