"""``invoke import-recipe``: load a recipe (file or http(s) URL), parse it, write ``deployments/NAME.yaml``.

The HTTP adapter only translates: timeouts, a streamed size limit, and tenacity retries on transient
failures alone (connect errors, timeouts, 5xx, 429) — never on other 4xx. Parsing is
:mod:`rigsmith.importing.recipe` (pure); writing is :mod:`rigsmith.writer` (consent, diff, atomic).
"""

# Over 500 lines (600), left whole: the fetch (deadline, size cap, retries), the three-way re-import and the
# consent steps (mounts, the proposed image) are one write path; the merge engine itself is rigsmith.merge.

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)

from rigsmith import policy, writer
from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, ConsentError, RecipeError, SpecError
from rigsmith.importing import answers as answersmod
from rigsmith.importing import proposal as proposalmod
from rigsmith.importing import recipe as recipemod
from rigsmith.importing import reimport
from rigsmith.importing.recipe.mountkinds import host_files
from rigsmith.merge import Conflict, Resolve, merge3
from rigsmith.project import Project

#: Largest recipe accepted (a recipe is a page of text; anything bigger is not one).
MAX_BYTES = 1024 * 1024
ATTEMPTS = 4
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class HttpOptions:
    """How recipes are fetched over HTTP (tests shorten the waits)."""

    timeout: float = 15.0
    connect_timeout: float = 5.0
    #: Whole fetch, every attempt and wait included: the timeouts above hold per read, so a server that
    #: sends a byte a second would otherwise never time out.
    deadline: float = 30.0
    max_bytes: int = MAX_BYTES
    attempts: int = ATTEMPTS
    wait_max: float = 8.0


@dataclass(frozen=True)
class Fetched:
    """A recipe's bytes and where they came from."""

    data: bytes
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class _Transient(Exception):
    """A response worth retrying (5xx, 429)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _scheme(source: str) -> str:
    try:
        return urlsplit(source).scheme
    except ValueError:
        return source.split(":", 1)[0] if "://" in source else ""


def is_url(source: str) -> bool:
    """True for http(s) URLs."""
    return _scheme(source) in ("http", "https")


class _OutOfTime(Exception):
    """The overall deadline passed (checked between reads, and by the watchdog around the attempts)."""


def fetch_url(url: str, options: HttpOptions = HttpOptions()) -> Fetched:
    """GET ``url`` with retries on transient failures only, within ``options.deadline`` seconds in all;
    refuse more than ``options.max_bytes``."""
    deadline = time.monotonic() + options.deadline
    result: list[Fetched] = []
    failure: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        try:
            result.append(_fetch(url, options, deadline, stop))
        except BaseException as err:  # handed to the caller's thread, re-raised there
            failure.append(err)

    # A daemon thread, because one read can block for up to options.timeout (a server that dribbles its
    # headers a byte at a time blocks for ever): the caller gets its answer at the deadline, and the
    # worker stops at its next read (``stop``) or with the process.
    worker = threading.Thread(target=work, name=f"fetch {url}", daemon=True)
    worker.start()
    worker.join(options.deadline + 0.5)
    stop.set()
    if worker.is_alive() or (failure and isinstance(failure[0], _OutOfTime)):
        raise AdapterError(
            f"GET {url} gave up: no complete answer within {options.deadline:g} s (the server is too slow "
            "or never finishes)",
            hint="download the recipe another way and import the file",
        )
    if failure:
        raise failure[0]
    return result[0]


def _fetch(url: str, options: HttpOptions, deadline: float, stop: threading.Event) -> Fetched:
    timeout = httpx.Timeout(options.timeout, connect=min(options.connect_timeout, options.timeout))
    max_bytes, attempts = options.max_bytes, options.attempts

    def once() -> bytes:
        if stop.is_set() or time.monotonic() > deadline:
            raise _OutOfTime
        with (
            httpx.Client(timeout=timeout, follow_redirects=True) as client,
            client.stream("GET", url, headers={"Accept": "application/json, text/plain, */*"}) as resp,
        ):
            if resp.status_code in _TRANSIENT_STATUS:
                raise _Transient(resp.status_code)
            if resp.status_code >= 400:
                raise AdapterError(
                    f"GET {url} failed: HTTP {resp.status_code} {resp.reason_phrase}",
                    hint="check the URL (this is not retried: the server says the request itself is wrong)",
                )
            declared = specmod.ascii_int(resp.headers.get("content-length") or "")
            if declared is not None and declared > max_bytes:
                raise _too_big(url, max_bytes, f"it declares {declared} bytes")
            chunks: list[bytes] = []
            total = 0
            for chunk in resp.iter_bytes():
                if stop.is_set() or time.monotonic() > deadline:
                    raise _OutOfTime
                total += len(chunk)
                if total > max_bytes:
                    raise _too_big(url, max_bytes, "it sent more")
                chunks.append(chunk)
            return b"".join(chunks)

    retrying = Retrying(
        stop=stop_after_attempt(attempts) | stop_before_delay(options.deadline),
        wait=wait_exponential_jitter(multiplier=0.5, max=options.wait_max, jitter=0.5),
        retry=retry_if_exception_type(
            (
                _Transient,
                httpx.ConnectError,
                httpx.TimeoutException,
                httpx.ReadError,
                httpx.RemoteProtocolError,
            )
        ),
        reraise=True,
    )
    try:
        data = retrying(once)
    except _Transient as err:
        raise AdapterError(
            f"GET {url} failed: HTTP {err.status} after {attempts} attempt(s)",
            hint="the server is failing or rate-limiting; try again later, or download the recipe and "
            "import the file",
        ) from None
    except httpx.TimeoutException:
        raise AdapterError(
            f"GET {url} timed out after {attempts} attempt(s)",
            hint="check the network, or download the recipe and import the file",
        ) from None
    except httpx.InvalidURL as err:
        raise RecipeError(f"{url}: not a valid URL ({err})", hint="check the URL") from None
    except httpx.HTTPError as err:
        raise AdapterError(
            f"GET {url} failed after {attempts} attempt(s): {type(err).__name__}: {err}",
            hint="check the URL and the network, or download the recipe and import the file",
        ) from None
    return Fetched(data, url)


def _too_big(source: str, max_bytes: int, why: str) -> RecipeError:
    return RecipeError(
        f"{source}: refused, larger than {max_bytes} bytes ({why}); a recipe is a page of text",
        hint="point at the recipe itself (its JSON or the command text), not a page or an archive",
    )


def load_source(source: str, *, root: Path | None = None, http: HttpOptions = HttpOptions()) -> Fetched:
    """The bytes of SOURCE: an http(s) URL or a file path (relative to ``root`` if given)."""
    if is_url(source):
        return fetch_url(source, http)
    scheme = _scheme(source)
    if scheme and len(scheme) > 1:
        raise RecipeError(
            f"{source}: unsupported scheme {scheme!r}", hint="use an http(s) URL or a file path"
        )
    path = Path(source).expanduser()
    if root is not None and not path.is_absolute():
        path = root / path
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise RecipeError(f"{source}: not a file", hint="pass a recipe file or an http(s) URL")
        if size > http.max_bytes:
            raise _too_big(source, http.max_bytes, f"the file has {size} bytes")
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"{source}: no such file", hint="pass a recipe file or an http(s) URL") from None
    except OSError as err:
        raise RecipeError(f"{source}: cannot read: {err.strerror}") from None
    return Fetched(data, source)


def decode(fetched: Fetched) -> str:
    """The recipe text: UTF-8 (a BOM is dropped), or RecipeError."""
    try:
        return fetched.data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise RecipeError(
            f"{fetched.source}: not UTF-8 text (at byte {err.start})",
            hint="a recipe is JSON, compose YAML or command text in UTF-8",
        ) from None


def _consented(spec_path: Path) -> dict[str, str]:
    """Host path → the consent the user's current spec records for it (a re-import does not ask again)."""
    if not spec_path.exists():
        return {}
    data = _read_data(spec_path, "your spec")
    mounts = data.get("mounts") if isinstance(data, dict) else None
    return {
        m["host"]: m["consent"]
        for m in (mounts if isinstance(mounts, list) else [])
        if isinstance(m, dict) and isinstance(m.get("host"), str) and isinstance(m.get("consent"), str)
    }


def mount_consent(
    dep: specmod.Deployment,
    allow: Sequence[str] = (),
    confirm: Callable[[str], bool] | None = None,
    recorded: Mapping[str, str] | None = None,
) -> specmod.Deployment:
    """``dep`` with consent recorded on each dangerous mount (``--allow-mount HOST``, a consent the user's
    spec already records for that host path, or a yes at the prompt), or ConsentError naming every mount
    still without it. The model directory is never allowed."""
    model = [msg for fld, msg in policy.dangerous_mounts(dep) if fld == "model.local_dir"]
    if model:
        source = dep.provenance.source if dep.provenance else dep.name
        raise RecipeError(
            f"{source}: refused: model.local_dir {model[0]}",
            hint="import a recipe whose model is a Hub repo id (owner/name) or the checkpoint's directory",
        )
    mounts = list(dep.mounts)
    refused = []
    for i, m in enumerate(mounts):
        why = policy.dangerous_host_path(m.host)
        if why is None or m.consent:
            continue
        mode = "read-only" if m.readonly else "read-write"
        if recorded and m.host in recorded:
            reason = recorded[m.host]
        elif m.host in allow:
            reason = "allowed with --allow-mount at import"
        elif confirm is not None and confirm(
            f"The recipe mounts the host path {m.host!r} ({why}) {mode} at {m.container} in its container. "
            "Allow it?"
        ):
            reason = "accepted at the import-recipe prompt"
        else:
            refused.append(f"{m.host!r} ({why}, {mode} at {m.container})")
            continue
        mounts[i] = m.model_copy(update={"consent": reason})
    if refused:
        raise ConsentError(
            f"refused: the recipe mounts {'; '.join(refused)} into its container, which hands it that part "
            "of the host; nothing was written",
            hint="remove the mount from the recipe, or consent per mount: --allow-mount HOST (or answer the "
            "prompt in a terminal); deploy reads the consent from mounts[N].consent in the spec",
        )
    return dep.model_copy(update={"mounts": tuple(mounts)})


def compose_env(source: str, env_file: str | None, environ: Mapping[str, str]) -> recipemod.ComposeEnv:
    """What a compose recipe is interpolated with: ``environ`` over ``--env-file FILE``, or over the
    ``.env`` beside a local recipe file (compose's own defaults and precedence)."""
    if env_file is not None:
        path, name = Path(env_file).expanduser(), f"--env-file {env_file}"
        try:
            text: str | None = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(
                f"--env-file {env_file}: cannot read it ({err})", hint="pass a readable KEY=value file"
            ) from None
    elif not is_url(source) and (beside := Path(source).expanduser().parent / ".env").is_file():
        name = f"the .env beside {source}"
        try:
            text = beside.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(
                f"{beside}: cannot read the .env beside the compose file ({err})",
                hint="fix or remove it, or pass --env-file FILE",
            ) from None
    else:
        text, name = None, ""
    return recipemod.ComposeEnv(process=dict(environ), file_text=text, file_name=name or None)


def import_recipe(
    project: Project,
    source: str,
    name: str | None = None,
    image: str | None = None,
    yes: bool = False,
    dry_run: bool = False,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] = print,
    http: HttpOptions = HttpOptions(),
    resolve: Resolve | None = None,
    allow_mount: Sequence[str] = (),
    source_repo: str | None = None,
    service: str | None = None,
    env_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    variant: str | None = None,
    answers_file: str | None = None,
    ask: Callable[[recipemod.Ask], str | None] | None = None,
) -> specmod.Deployment:
    """Import SOURCE into ``deployments/NAME.yaml`` (asking before changing an existing file).

    An existing spec is the user's: the new import is merged into it three-way against what the last
    import wrote (``deployments/.base/NAME.yaml``), so the user's edits stay and upstream changes come in;
    a field both changed is a conflict that needs ``resolve`` or an answer at the prompt.

    Args:
        project: the checkout.
        source: http(s) URL or file path of the recipe.
        name: deployment name (default: from the recipe id, title or model).
        image: container image when the recipe names none (or to replace it).
        yes: change an existing file without asking, and import a text where bash would break on it the
            way its author evidently meant (each such step is recorded in the spec's notes).
        dry_run: print what would be written; write nothing.
        confirm: asks the user; None means there is no terminal.
        echo: where messages go.
        http: timeouts, size limit and retries for URLs (and the size limit for files).
        allow_mount: host paths of dangerous mounts (/, a home, a socket, /etc…) the user consents to.
        resolve: settle every conflict with the user's value ("ours") or upstream's ("theirs").
        source_repo: git URL of the source tree the notes clone (the proposed image's tree.repo).
        service: the compose service to import when the file has several vLLM services.
        variant: a vLLM recipes YAML's variant and hardware profile to import, ``NAME[@HARDWARE]``.
        env_file: the env file a compose file is interpolated with (instead of the .env beside it).
        environ: the process environment compose interpolation reads (default: this process's).
        answers_file: ``--answers FILE``: the values typed at the questions (:mod:`.answers`).
        ask: asks one question at the terminal (the user's words, or the default on Enter); None: no
            terminal, so an unanswered question keeps its default or leaves a placeholder.
    """
    given = _answers(answers_file)
    name, image = name or (given.name if given else None), image or (given.image if given else None)
    text = decode(fetched := load_source(source, http=http))
    how: dict[str, Any] = {
        "accept": yes,
        "compose_env": compose_env(source, env_file, os.environ if environ is None else environ),
        "service": service,
        "variant": variant,
    }
    upstream = _parsed(text, fetched, name, image, how, given, answers_file, ask if yes else None)
    upstream = upstream if name else _own_name(project, upstream, fetched.source, echo)
    path = project.spec_path(upstream.name)
    base_path = base_path_of(path)
    flags, flags_record = reimport.user_flags(image, base_path, path.exists())
    mine = _valid_spec(path)  # a broken file goes through the merge, which says how to start afresh
    unchanged_recipe = reimport.same_recipe(base_path, upstream, flags, allow_mount, source_repo)
    if mine and not yes and given is None and unchanged_recipe:  # an answers file is the user's side too
        echo(_UNCHANGED.format(rel=_rel_to(path, project.root)))
        return mine
    # The recipe's side (and the base) is what the recipe alone says; flags and answers are the user's.
    own = reimport.recipe_own(
        text, source=fetched.source, sha256=fetched.sha256, upstream=upstream, image=image, **how
    )
    upstream, own = (_local_facts(d) for d in (upstream, own))
    upstream, image_file, in_image = _proposed_image(project, upstream, fetched.source, source_repo, echo)
    if image is None:
        own = upstream
    upstream = _consent(upstream, allow_mount, path, dry_run, confirm, echo)
    merge = {"flags": flags, "resolve": resolve, "confirm": confirm, "echo": echo}
    dep, unchanged = _user_side(path, base_path, own, upstream, in_image, **merge)
    out = _Written(path, base_path, own, flags_record, image_file)
    return _write(out, dep, unchanged, project.root, dry_run, yes, confirm, echo)


def _parsed(
    text: str,
    fetched: Fetched,
    name: str | None,
    image: str | None,
    how: dict[str, Any],
    given: answersmod.Answers | None,
    answers_file: str | None,
    ask: Callable[[recipemod.Ask], str | None] | None,
) -> specmod.Deployment:
    """The recipe parsed, its questions answered by the answers file and the terminal (``how`` gets the
    answerer, for the re-import's parse of the recipe alone); an answer no question took is an error."""
    asked: list[str] = []
    # The terminal asks only once the user confirmed the import (--yes); the file answers either way.
    how["answer"] = _answerer(given, ask, asked)
    upstream = recipemod.parse(
        text, source=fetched.source, sha256=fetched.sha256, name=name, image=image, **how
    )
    if given is not None:
        answersmod.unused(given, asked, upstream, f"--answers {answers_file}")
        upstream = answersmod.apply(given, upstream, asked)
    return upstream


@dataclass(frozen=True)
class _Written:
    """What an import writes: the spec at ``path``, the base beside it (``own``, with its flag record)
    and the proposed image's file."""

    path: Path
    base_path: Path
    own: specmod.Deployment
    flags_record: str | None
    image_file: Sequence[writer.Artifact]


def _write(
    out: _Written,
    dep: specmod.Deployment,
    unchanged: bool,
    root: Path,
    dry_run: bool,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    echo: Callable[[str], None],
) -> specmod.Deployment:
    """The spec (and the proposed image's file) written, or shown for --dry-run; then the base and the next
    steps. The base is rigsmith's record of what the import said (not the user's file): written after the
    spec, so an interrupted run leaves an older base, which only makes the next merge ask more."""
    # nothing to take: the user's file stays byte for byte (comments and all)
    path = out.path
    content = path.read_text(encoding="utf-8") if unchanged else specmod.MODELINE + specmod.dump(dep)
    artifacts = [writer.Artifact(path, content), *out.image_file]
    if dry_run:
        _show_dry_run(artifacts, root, echo)
        return dep
    writer.write(artifacts, yes=yes, confirm=confirm, echo=echo, root=root)
    reimport.write_base(out.base_path, out.own, out.flags_record)
    for line in next_steps(dep):
        echo(line)
    return dep


def _answers(path: str | None) -> answersmod.Answers | None:
    """The answers file at ``path`` (None: none given)."""
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RecipeError(
            f"--answers {path}: cannot read it ({err})", hint="pass a readable YAML file"
        ) from None
    return answersmod.load(text, f"--answers {path}")


def _answerer(
    given: answersmod.Answers | None,
    ask: Callable[[recipemod.Ask], str | None] | None,
    asked: list[str],
) -> Callable[[recipemod.Ask], str | None]:
    """Answers a question from the answers file, else at the terminal, else not at all; records its key.
    The same question asked twice (the recipe's own side of a re-import) is answered the same way."""
    seen: dict[str, str | None] = {}

    def answer(q: recipemod.Ask) -> str | None:
        if q.key in seen:
            return seen[q.key]
        asked.append(q.key)
        got = given.answer(q) if given is not None else None
        if got is None and ask is not None:
            got = ask(q)
        seen[q.key] = got
        return got

    return answer


def _user_side(
    path: Path,
    base_path: Path,
    own: specmod.Deployment,
    upstream: specmod.Deployment,
    in_image: dict[str, str],
    **merge: Any,
) -> tuple[specmod.Deployment, bool]:
    """(the spec to write, whether the user's file stays as it is): ``upstream`` merged three-way into the
    user's file (``merge``: flags, resolve, confirm, echo), then the placeholders the proposed image's tree
    provides filled where they are empty (``in_image``)."""
    if path.exists():
        theirs = reimport.with_consents(own, upstream)
        dep, unchanged = merge_spec(path, base_path, theirs, mine=merge.pop("flags"), **merge)
    else:
        dep, unchanged = upstream, False
    filled = proposalmod.fill_in_image(dep, in_image)
    for m in (m for m in filled.mounts if m not in dep.mounts):
        merge["echo"](f"mounts: {m.host} → {m.container} ({m.note}); create it before `invoke up`")
    return filled, unchanged and filled == dep


def _own_name(
    project: Project, dep: specmod.Deployment, source: str, echo: Callable[[str], None]
) -> specmod.Deployment:
    """``dep`` under a name no other recipe's deployment has: the name derived from the recipe, else with
    ``-2``, ``-3``, … (a short name is shared by recipes of one model for other rigs; a re-import of the
    same source keeps merging into its own file, and ``--name`` picks one on purpose)."""
    candidates = [dep.name, *(f"{dep.name}-{i}" for i in range(2, 100))]
    for candidate in candidates:
        path = project.spec_path(candidate)
        if not path.exists():
            break
        existing = _valid_spec(path)
        if existing is None or existing.provenance is None or existing.provenance.source == source:
            break  # the user's broken file goes through the merge; a hand-written or same-source spec too
    if candidate != dep.name:
        echo(f"deployments/{dep.name}.yaml holds another recipe's deployment: importing as {candidate} "
             f"(--name NAME chooses)")  # fmt: skip
    return dep.model_copy(update={"name": candidate})


def _consent(
    dep: specmod.Deployment,
    allow_mount: Sequence[str],
    path: Path,
    dry_run: bool,
    confirm: Callable[[str], bool] | None,
    echo: Callable[[str], None],
) -> specmod.Deployment:
    """``dep`` with the user's consent to its dangerous mounts recorded (asked, or given by --allow-mount)."""
    try:
        return mount_consent(dep, allow_mount, None if dry_run else confirm, _consented(path))
    except ConsentError as err:
        if not dry_run:
            raise
        # A dry run asks nothing and writes nothing: it says what a real import would need.
        echo(f"consent needed (dry run): {err.message}; {err.hint}")
        return dep


_UNCHANGED = (
    "the recipe has not changed since the last import; {rel} stays as it is (nothing written; --yes "
    "re-derives what your filled placeholders change, such as the proposed image's tree)"
)


def _valid_spec(path: Path) -> specmod.Deployment | None:
    """The user's spec at ``path`` when it exists and is valid, else None."""
    try:
        return specmod.from_data(_read_data(path, "your spec"), str(path)) if path.exists() else None
    except SpecError:
        return None


def _show_dry_run(artifacts: Sequence[writer.Artifact], root: Path, echo: Callable[[str], None]) -> None:
    """What a real import would write, file by file (diffs for changes, the text for new files)."""
    writer.refuse_secrets(artifacts)  # it prints what it would write
    for outcome in writer.plan(artifacts):
        echo(f"{outcome.status:>9}  {_rel_to(outcome.artifact.path, root)}  (dry run: nothing written)")
        if outcome.status in ("update", "conflict"):
            echo(outcome.diff(root))
        elif outcome.status == "create":
            echo(outcome.artifact.content)


def _local_facts(dep: specmod.Deployment) -> specmod.Deployment:
    """``dep`` with what this checkout and host add: the recipe's script switches, file mounts."""
    dep = proposalmod.mark_script_switches(dep)
    return host_files(dep, {m.host: _is_file(m.host) for m in dep.mounts})


def _rel_to(path: Path, root: Path) -> Path:
    return path.relative_to(root) if path.is_relative_to(root) else path


def _is_file(host: str) -> bool:
    """Whether ``host`` (``~/`` is the importing user's home) is a regular file on this host."""
    try:
        return Path(host).expanduser().is_file()
    except (OSError, RuntimeError, ValueError):
        return False


def _user_engine(spec_path: Path) -> tuple[bool, dict[str, str]]:
    """Whether the user's spec (if any) runs an image of its own (engine.image), and its placeholders."""
    try:
        data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False, {}
    if not isinstance(data, dict):
        return False, {}
    engine, filled = data.get("engine"), data.get("placeholders")
    own = isinstance(engine, dict) and bool(engine.get("image"))
    values = {str(k): v for k, v in filled.items() if isinstance(v, str)} if isinstance(filled, dict) else {}
    return own, values


def _proposed_image(
    project: Project,
    dep: specmod.Deployment,
    source: str,
    source_repo: str | None,
    echo: Callable[[str], None],
) -> tuple[specmod.Deployment, list[writer.Artifact], dict[str, str]]:
    """When the notes build the engine from a source tree (and no image was given): the spec linked to
    ``images/<name>/image.yaml``, that file (values the user filled in an existing one are kept; a
    change to it goes through the writer's consent like the spec's) and the placeholders' places in it."""
    own_image, filled = _user_engine(project.spec_path(dep.name))
    if dep.engine.image or dep.engine.build or own_image:
        return dep, [], {}  # the recipe or the user names the image: nothing to propose
    try:
        proposed = proposalmod.propose(dep, source_repo=source_repo, filled=filled)
    except ValueError as err:
        raise RecipeError(
            f"--source-repo: {err}", hint="pass the repository's https:// or git:// URL"
        ) from None
    if proposed is None:
        return dep, [], {}
    image_path = project.images / proposed.name / "image.yaml"
    existing_text = image_path.read_text(encoding="utf-8") if image_path.is_file() else None
    try:
        existing = yaml.safe_load(existing_text) if existing_text else None
    except yaml.YAMLError:
        existing = None
    proposed = proposalmod.keep_filled(proposed, existing)
    text = existing_text if existing == proposed.data and existing_text else proposed.text(source)
    echo(f"engine image proposed from the recipe's notes: images/{proposed.name}/image.yaml (engine.build)")
    if proposed.to_fill:
        echo(f"fill in images/{proposed.name}/image.yaml before `invoke pin`: {', '.join(proposed.to_fill)}")
    if proposed.placeholders:
        where = ", ".join(f"{t}: {v}" for t, v in proposed.placeholders.items())
        echo(
            f"the tree is in the image at {proposed.data['tree']['dest']}: placeholders set to it ({where}; "
            f"`placeholders:` in deployments/{dep.name}.yaml)"
        )
    return proposalmod.link(dep, proposed), [writer.Artifact(image_path, text)], proposed.placeholders


#: Lists of mappings in a spec merged entry by entry (the field that names an entry); other lists
#: (``engine.args``, patterns) are one value each.
SPEC_LIST_KEYS = {
    "env": "name",
    "mounts": "container",
    "model.config_patches": "key",
    "benchmarks": "name",
}
SPEC_ARGV = ("engine.args",)  # merged flag by flag (merge.argv_items)


def base_path_of(spec_path: Path) -> Path:
    """Where the last import of ``deployments/NAME.yaml`` is recorded (committed beside it)."""
    return spec_path.parent / ".base" / spec_path.name


def _read_data(path: Path, what: str) -> object:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecError(str(path), [("(file)", f"cannot read {what}: {err}")]) from None


def _full(data: object) -> object:
    """Spec data with every default spelled out, so "not written" and "written as the default" compare
    equal; data that is not a valid spec is merged as it is (its problems are reported after the merge)."""
    try:
        return specmod.to_data(specmod.Deployment.model_validate(data), defaults=True)
    except ValueError:
        return data


def merge_spec(
    path: Path,
    base_path: Path,
    upstream: specmod.Deployment,
    *,
    mine: Mapping[str, Any] | None = None,
    resolve: Resolve | None = None,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] = print,
) -> tuple[specmod.Deployment, bool]:
    """The spec to write: ``upstream`` as is for a new file, else merged into the user's current file;
    and whether that is what the user's file already says (then it is left as it is). ``mine``: fields
    the user set with flags on this import (dotted paths), applied to the user's side before the merge.

    Raises:
        ConsentError: conflicts with no ``resolve`` and no terminal to ask (nothing is written).
    """
    if not path.exists():
        return upstream, False
    file_data = _full(_read_data(path, "your spec"))
    ours = reimport.overlay(file_data, mine or {})
    base = _full(_read_data(base_path, "the recorded base")) if base_path.exists() else None
    theirs = _full(specmod.to_data(upstream))
    merged = merge3(base, ours, theirs, keyed=SPEC_LIST_KEYS.get, resolve=resolve, argv=SPEC_ARGV)
    if merged.conflicts and resolve is None:
        if confirm is None:
            why = (
                " (no record of the last import in deployments/.base/, so no field can be told apart)"
                if base is None
                else ""
            )
            raise ConsentError(
                f"{path}: you and the recipe changed the same fields{why}; nothing was written:\n"
                + "".join(f"  - {c.describe()}\n" for c in merged.conflicts)
                + "re-run with --ours to keep your values or --theirs to take the recipe's (other changes "
                "merge either way)"
            )
        merged = merge3(base, ours, theirs, keyed=SPEC_LIST_KEYS.get, resolve=_asker(confirm), argv=SPEC_ARGV)
    value = reimport.args_indexes_kept(merged.value, ours, theirs)
    if merged.taken == ("",):  # the file was as the last import wrote it: the new import replaces it whole
        echo(f"{path.name} was as the last import wrote it; the new import replaces it")
    elif merged.taken:
        echo(f"upstream changes merged into {path.name}: {', '.join(merged.taken)}")
    if merged.kept == ("",):
        echo(f"the recipe has not changed since the last import; {path.name} stays as you left it")
    elif merged.kept:
        echo(f"your edits kept: {', '.join(merged.kept)}")
    try:
        dep = specmod.from_data(value, str(path))
    except SpecError as err:
        raise SpecError(
            str(path),
            [
                *err.problems,
                (
                    "(re-import)",
                    "your file merged with the new import is not a valid spec; fix your file, or delete it "
                    f"and {base_path} to import afresh",
                ),
            ],
        ) from None
    dep = _without_secret_values(dep, echo)
    return dep, specmod.to_data(dep, defaults=True) == file_data


def merge_user_change(path: Path, read: str, changed: specmod.Deployment) -> specmod.Deployment:
    """A change the user asked rigsmith to make (``invoke fit --apply N``) merged into their spec three-way:
    base = the file as it was read (``read``), ours = the file now, theirs = ``changed``. The base of the
    last import (deployments/.base/) is left as it is, so a re-import of the same recipe sees the change
    as the user's edit and keeps it.

    Raises:
        ConsentError: the file changed since it was read, in the same fields (nothing is written).
    """
    try:
        base = _full(yaml.safe_load(read))
    except yaml.YAMLError as err:
        raise SpecError(str(path), [("(file)", f"cannot read your spec: {err}")]) from None
    ours, theirs = _full(_read_data(path, "your spec")), _full(specmod.to_data(changed))
    merged = merge3(base, ours, theirs, keyed=SPEC_LIST_KEYS.get, argv=SPEC_ARGV)
    if merged.conflicts:
        raise ConsentError(
            f"{path} changed while rigsmith was working on it, in the fields it changes: "
            f"{'; '.join(c.describe() for c in merged.conflicts)}. Nothing was written",
            hint="run the command again",
        )
    return specmod.from_data(reimport.args_indexes_kept(merged.value, ours, theirs), str(path))


def _asker(confirm: Callable[[str], bool]) -> Callable[[Conflict], Resolve]:
    """One line per conflict: the field, the three values (each cut to a readable length), the question."""

    def ask(c: Conflict) -> Resolve:
        return "theirs" if confirm(f"conflict {c.describe(limit=60)} — take upstream's value?") else "ours"

    return ask


def _without_secret_values(dep: specmod.Deployment, echo: Callable[[str], None]) -> specmod.Deployment:
    leaked = [e.name for e in dep.env if e.secret and e.value]
    if not leaked:
        return dep
    echo(f"secret values not kept in the spec: {', '.join(leaked)} (passed by name at run time)")
    env = tuple(e.model_copy(update={"value": ""}) if e.secret else e for e in dep.env)
    return dep.model_copy(update={"env": env})


def next_steps(dep: specmod.Deployment) -> list[str]:
    """What deploy will refuse until the user acts, each with the fix."""
    out = []
    missing = [t for t, v in dep.placeholders.items() if not v]
    if missing:
        out.append(
            f"fill in before deploy: {', '.join(missing)} — set `placeholders:` in "
            f"deployments/{dep.name}.yaml"
        )
    local_dir = dep.model.local_dir
    if dep.model.repo is None and not local_dir.startswith(("/", "~")):
        out.append(
            f"set model.local_dir to the checkpoint's absolute path in deployments/{dep.name}.yaml: "
            f"{local_dir!r} is relative to where the recipe ran"
        )
    elif dep.model.repo is None:
        out.append(
            f"local model: the checkpoint must already be in {local_dir} (model.repo is null, so "
            "fetch-model and pin download nothing)"
        )
    if dep.engine.image is None and dep.engine.build is None:
        out.append(
            f"no container image ({dep.why_no_image()}); set engine.build to an images/NAME definition "
            f"(then `invoke build --deployment {dep.name}`) or engine.image in deployments/{dep.name}.yaml, "
            "re-import with --image REF, or pass `invoke deploy --target podman --image REF`"
        )
    return out
