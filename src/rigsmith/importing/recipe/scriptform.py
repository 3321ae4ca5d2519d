"""Recipe form (b) as pasted: a script evaluated into its one command (:mod:`rigsmith.importing.shelleval`)
before the shell form reads it (a record with no command at all is :mod:`.recordspec`'s)."""

from __future__ import annotations

from rigsmith.errors import RecipeError
from rigsmith.importing import shelleval
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.shellform import _from_shell


def from_script(text: str, source: str, accept: bool) -> Launch:
    """Shell text: evaluated (:mod:`rigsmith.importing.shelleval`) into the one command it runs, then read
    as that command. Steps beyond bash need ``accept``; without it they are refused, saying what it takes."""
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
