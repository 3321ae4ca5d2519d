"""invoke import-recipe."""

# rigsmith's areas load inside the tasks: importing them here costs every command ~1 s (cli/__init__.py).

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from rigsmith.cli.wiring import configured_default, confirm, echo, project, prompt, side, user_errors
from rigsmith.errors import shown_lines
from rigsmith.project import record_import


@task(
    help={
        "source": "recipe to import: an http(s) URL or a file (recipe JSON, command text, compose file or "
        "a vLLM recipes YAML)",
        "name": "deployment name, i.e. deployments/NAME.yaml (default: from the recipe id, title or model)",
        "image": "container image to run when the recipe names none (seed 003 runs vLLM from a venv)",
        "yes": "change an existing deployments/NAME.yaml without asking; import a text bash would break on "
        "(a comment after a '\\' continuation) as its author meant, recorded in the spec's notes",
        "dry_run": "print what would be written; write nothing",
        "ours": "re-import: where you and the recipe changed the same field, keep your value",
        "theirs": "re-import: where you and the recipe changed the same field, take the recipe's value",
        "allow_mount": "consent to the recipe's mount of this dangerous host path (/, a home, a socket, "
        "/etc, a dot-directory…); repeatable",
        "source_repo": "git URL of the source tree the recipe's notes clone (the proposed image's tree.repo)",
        "service": "compose file with several vLLM services: the service to import",
        "env_file": "compose file: interpolate ${VAR} from this KEY=value file instead of the .env beside it "
        "(the process environment still wins, as in compose)",
        "variant": "vLLM recipes YAML: the variant to import, NAME or NAME@HARDWARE (a recipes-site hardware "
        "profile such as rtx_4090_2x; default: the profile the site opens on)",
        "answers": "a YAML file of the values typed at the import's questions (host paths, the port behind "
        "a proxy, shorthand a record leaves open) and of placeholders and mounts; see docs/guide.md",
    },
    iterable=["allow_mount"],
)
@user_errors
def import_recipe(
    c: Context,
    source: str,
    name: str | None = None,
    image: str | None = None,
    yes: bool = False,
    dry_run: bool = False,
    ours: bool = False,
    theirs: bool = False,
    allow_mount: list[str] | None = None,
    source_repo: str | None = None,
    service: str | None = None,
    env_file: str | None = None,
    variant: str | None = None,
    answers: str | None = None,
) -> None:
    """Import a published vLLM recipe into deployments/NAME.yaml (a re-import merges into your edits)."""
    resolve = side(ours, theirs)
    from rigsmith.importing import importer

    def say(msg: object) -> None:
        echo(shown_lines(str(msg)))  # what import prints quotes the recipe (a dry run's text, a proposal)

    dep = importer.import_recipe(
        project(c),
        source,
        name=name,
        image=image,
        yes=yes,
        dry_run=dry_run,
        confirm=confirm(),
        echo=say,
        resolve=resolve,
        allow_mount=tuple(allow_mount or ()),
        source_repo=source_repo,
        service=service,
        env_file=env_file,
        variant=variant,
        answers_file=answers,
        ask=prompt(),
    )
    if not dry_run:
        from rigsmith.operating.lifecycle.nextcommand import after_import

        configured = configured_default(c)
        record_import(project(c).root, dep.name, configured)
        for line in after_import(dep, project(c), configured):
            say(line)
