"""``invoke import-recipe``: load a recipe (file or http(s) URL), parse it, write ``deployments/NAME.yaml``.

The HTTP adapter only translates: timeouts, a streamed size limit, and tenacity retries on transient
failures alone (connect errors, timeouts, 5xx, 429) — never on other 4xx. Parsing is
:mod:`rigsmith.recipe` (pure); writing is :mod:`rigsmith.writer` (consent, diff, atomic).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from rigsmith import spec as specmod
from rigsmith import writer
from rigsmith.errors import AdapterError, ConsentError, RecipeError, SpecError
from rigsmith.importing import recipe as recipemod
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


def fetch_url(url: str, options: HttpOptions = HttpOptions()) -> Fetched:
    """GET ``url`` with retries on transient failures only; refuse more than ``options.max_bytes``."""
    timeout = httpx.Timeout(options.timeout, connect=min(options.connect_timeout, options.timeout))
    max_bytes, attempts = options.max_bytes, options.attempts

    def once() -> bytes:
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
            declared = resp.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise _too_big(url, max_bytes, f"it declares {int(declared)} bytes")
            chunks: list[bytes] = []
            total = 0
            for chunk in resp.iter_bytes():
                total += len(chunk)
                if total > max_bytes:
                    raise _too_big(url, max_bytes, "it sent more")
                chunks.append(chunk)
            return b"".join(chunks)

    retrying = Retrying(
        stop=stop_after_attempt(attempts),
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
        yes: change an existing file without asking.
        dry_run: print what would be written; write nothing.
        confirm: asks the user; None means there is no terminal.
        echo: where messages go.
        http: timeouts, size limit and retries for URLs (and the size limit for files).
        resolve: settle every conflict with the user's value ("ours") or upstream's ("theirs").
    """
    fetched = load_source(source, http=http)
    text = decode(fetched)
    upstream = recipemod.parse(text, source=fetched.source, sha256=fetched.sha256, name=name, image=image)
    path = project.spec_path(upstream.name)
    base_path = base_path_of(path)
    dep = merge_spec(path, base_path, upstream, resolve=resolve, confirm=confirm, echo=echo)
    content = specmod.dump(dep)
    if path.exists() and specmod.to_data(dep, defaults=True) == _full(_read_data(path, "your spec")):
        content = path.read_text(encoding="utf-8")  # nothing to take: the user's file stays byte for byte
    artifact = writer.Artifact(path, content)
    if dry_run:
        outcome = writer.plan([artifact])[0]
        rel = path.relative_to(project.root) if path.is_relative_to(project.root) else path
        echo(f"{outcome.status:>9}  {rel}  (dry run: nothing written)")
        if outcome.status in ("update", "conflict"):
            echo(outcome.diff(project.root))
        elif outcome.status == "create":
            echo(content)
        return dep
    writer.write([artifact], yes=yes, confirm=confirm, echo=echo, root=project.root)
    # The base is rigsmith's record of what the import said (not the user's file): written after the
    # spec, so an interrupted run leaves an older base, which only makes the next merge ask more.
    writer.write_one(base_path, specmod.dump(upstream))
    for line in next_steps(dep):
        echo(line)
    return dep


#: Lists of mappings in a spec merged entry by entry (the field that names an entry); other lists
#: (``engine.args``, patterns) are one value each.
SPEC_LIST_KEYS = {
    "env": "name",
    "mounts": "container",
    "model.config_patches": "key",
    "benchmarks": "name",
}


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
    resolve: Resolve | None = None,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] = print,
) -> specmod.Deployment:
    """The spec to write: ``upstream`` as is for a new file, else merged into the user's current file.

    Raises:
        ConsentError: conflicts with no ``resolve`` and no terminal to ask (nothing is written).
    """
    if not path.exists():
        return upstream
    ours = _full(_read_data(path, "your spec"))
    base = _full(_read_data(base_path, "the recorded base")) if base_path.exists() else None
    theirs = _full(specmod.to_data(upstream))
    merged = merge3(base, ours, theirs, keyed=SPEC_LIST_KEYS.get, resolve=resolve)
    if merged.conflicts and resolve is None:
        if confirm is None:
            why = (
                " (no record of the last import in deployments/.base/, so no field can be told apart)"
                if base is None
                else ""
            )
            raise ConsentError(
                f"{path}: you and the recipe changed the same fields{why}: "
                f"{'; '.join(c.describe() for c in merged.conflicts)}. Nothing was written; re-run with "
                "--ours to keep your values or --theirs to take the recipe's (other changes merge either way)"
            )
        merged = merge3(base, ours, theirs, keyed=SPEC_LIST_KEYS.get, resolve=_asker(confirm, echo))
    value = merged.value
    if merged.taken:
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
    return _without_secret_values(dep, echo)


def _asker(confirm: Callable[[str], bool], echo: Callable[[str], None]) -> Callable[[Conflict], Resolve]:
    def ask(c: Conflict) -> Resolve:
        echo(f"conflict {c.describe()}")
        return "theirs" if confirm(f"take upstream's value for {c.path}?") else "ours"

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
            "no container image: the recipe runs vLLM outside a container; re-import with --image REF, pass "
            f"`invoke deploy --image REF`, or set engine.image / engine.build in deployments/{dep.name}.yaml"
        )
    return out
