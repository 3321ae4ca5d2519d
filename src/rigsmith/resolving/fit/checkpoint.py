"""A checkpoint's config.json and safetensors headers, without its weights (the adapter under ``invoke fit``).

From the Hub: huggingface_hub's ``parse_safetensors_file_metadata`` reads each header with range requests
(the first 100 kB, then the rest of the header if it is longer); config.json is a small plain download, and
so is the shard index when the shard files alone do not say which to load. From a directory (a local
checkpoint, or a complete download): the first 8 bytes of each file are the header length, then the JSON
header (``parse_local_safetensors_file_metadata``). Either way a bounded window of headers (``rows``) is in
memory at a time, whatever the checkpoint's size.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from huggingface_hub import HfApi
from huggingface_hub.errors import SafetensorsParsingError
from huggingface_hub.utils import SafetensorsFileMetadata

from rigsmith import confine
from rigsmith.errors import AdapterError
from rigsmith.resolving.fit.fit import Estimate, FitError, ModelShape, engine_inputs, estimate
from rigsmith.resolving.lock.lock import Lock
from rigsmith.resolving.model.hub import DEFAULT_ENDPOINT, HfHub, RetryPolicy
from rigsmith.resolving.model.modelfiles import read_text_or_none, token_from
from rigsmith.spec import Deployment

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

HeaderRow = tuple[str, int, tuple[int, ...]]


class Checkpoint(Protocol):
    """What fit reads from a checkpoint."""

    where: str

    def config(self) -> dict[str, Any]: ...
    def weight_files(self) -> list[str]: ...
    def header(self, file: str) -> list[HeaderRow]: ...


def rows(ckpt: Checkpoint, window: int = 4) -> Iterator[HeaderRow]:
    """Every tensor of every weight file, in file order. Up to ``window`` headers are fetched at once (a
    Hub round trip per header dominates), so at most ``window`` + 1 headers are in memory."""
    files = iter(ckpt.weight_files())
    pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix="fit-header")
    try:
        pending = deque(pool.submit(ckpt.header, f) for f in islice(files, window))
        while pending:
            done = pending.popleft().result()
            nxt = next(files, None)
            if nxt is not None:
                pending.append(pool.submit(ckpt.header, nxt))
            yield from done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: safetensors' own limit on a header (100 MB); a longer one is not a safetensors file.
MAX_HEADER = 100_000_000
#: The most files a checkpoint's index may name (the largest published checkpoints have a few hundred).
MAX_SHARDS = 20_000
#: The most dimensions of one tensor (real tensors have up to 5 or so).
MAX_DIMS = 16


def _rows(meta: SafetensorsFileMetadata) -> list[HeaderRow]:
    # The byte size is the file's own (end − begin): exact for packed and sub-byte dtypes too.
    return [(n, t.data_offsets[1] - t.data_offsets[0], tuple(t.shape)) for n, t in meta.tensors.items()]


def _checked_rows(where: str, rows: list[HeaderRow]) -> list[HeaderRow]:
    """Rows whose sizes and shapes are whole non-negative numbers (a header is untrusted)."""
    for name, size, shape in rows:
        if (
            not isinstance(name, str)
            or isinstance(size, bool)
            or not isinstance(size, int)
            or size < 0
            or len(shape) > MAX_DIMS
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape)
        ):
            raise FitError(
                f"{where}: tensor {name!r} has data_offsets or shape that are not whole numbers "
                f"(size {size!r}, shape {shape!r})",
                hint="the safetensors header is damaged or hostile; check the repo",
            )
    return rows


def header_rows(where: str, header: object) -> list[HeaderRow]:
    """The rows of a parsed safetensors header (a JSON object of tensor name → dtype, shape, data_offsets),
    every value checked; one FitError naming the file and the tensor otherwise."""
    if not isinstance(header, dict):
        raise FitError(f"{where}: the safetensors header is a JSON {type(header).__name__}, not an object")
    out: list[HeaderRow] = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        shape = t.get("shape") if isinstance(t, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and isinstance(shape, list)):
            raise FitError(
                f"{where}: tensor {name!r} is not an object with shape and two data_offsets",
                hint="the safetensors header is damaged or hostile; check the repo",
            )
        begin, end = offsets
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in offsets)
        size = end - begin if ok and end >= begin >= 0 else -1
        out.append((name, size, tuple(shape)))
    return _checked_rows(where, out)


def _read_header(where: str, fh: BinaryIO) -> list[HeaderRow]:
    """A safetensors file's header: 8 bytes of length (little-endian), then that much JSON."""
    head = fh.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 2 <= n <= MAX_HEADER:
        raise FitError(f"{where}: not a safetensors file (header length {n}, at most {MAX_HEADER})")
    raw = fh.read(n)
    if len(raw) != n:
        raise FitError(f"{where}: the safetensors header is cut short ({len(raw)} of {n} bytes)")
    return header_rows(where, _parse_json(where, raw))


_SHARD = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.safetensors$")


def _pick(paths: list[str], index: Callable[[], Mapping[str, Any] | None]) -> list[str]:
    """The weight files vLLM loads: those the index maps to (vLLM's ``filter_duplicate_safetensors_files``),
    else model.safetensors, else every top-level one. A complete ``*-0000k-of-0000n`` family alone at the
    top level is taken as it is: its index maps every tensor name, so reading it would cost memory and a
    download in proportion to the whole checkpoint, for the same answer."""
    top = sorted(p for p in paths if p.endswith(".safetensors") and "/" not in p)
    shards = [m for p in top if (m := _SHARD.match(p))]
    family = top and len(shards) == len(top) and len({(m[1], m[3]) for m in shards}) == 1
    if family and sorted(int(m[2]) for m in shards) == list(range(1, int(shards[0][3]) + 1)):
        return top
    idx = index()
    if idx is not None:
        return _weight_map(INDEX, idx)
    if SINGLE in paths:
        return [SINGLE]
    return top


#: The most bytes of a config.json or index fit reads (real ones are a few hundred kB at most).
MAX_JSON = 64 << 20


def _parse_json(where: str, text: bytes | str) -> Any:
    if len(text) > MAX_JSON:
        raise FitError(f"{where}: larger than {MAX_JSON >> 20} MiB; not a checkpoint's JSON")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FitError(f"{where} is not JSON: {err}") from None
    except RecursionError:
        raise FitError(f"{where}: JSON nested too deeply to be a checkpoint's file") from None


def _json(where: str, text: bytes | str) -> dict[str, Any]:
    data = _parse_json(where, text)
    if not isinstance(data, dict):
        raise FitError(f"{where} is not a JSON object")
    return data


def _weight_map(where: str, index: Mapping[str, Any]) -> list[str]:
    """The files an index's ``weight_map`` names, each a safe name inside the checkpoint."""
    wmap = index.get("weight_map") or {}
    if not isinstance(wmap, dict):
        raise FitError(f"{where}: weight_map is a JSON {type(wmap).__name__}, not an object of tensor → file")
    files = sorted(set(wmap.values()), key=str)
    if len(files) > MAX_SHARDS:
        raise FitError(f"{where}: weight_map names {len(files)} files (at most {MAX_SHARDS})")
    return [confine.check(f, f"{where}: weight_map", FitError) for f in files]


class LocalCheckpoint:
    """A checkpoint directory on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)

    def _read(self, name: str) -> bytes | None:
        """The file's bytes (at most one past the JSON limit), None when there is no such file; a link or
        special file is refused by the confinement rule."""
        path = self.root / name
        if not path.exists() and not path.is_symlink():
            return None
        with confine.open_regular(self.root, name, f"checkpoint {self.root}", FitError) as fh:
            return fh.read(MAX_JSON + 1)

    def config(self) -> dict[str, Any]:
        text = self._read(CONFIG)
        if text is None:
            raise FitError(f"no {CONFIG} in {self.root}", hint="fit needs the checkpoint's config.json")
        return _json(str(self.root / CONFIG), text)

    def weight_files(self) -> list[str]:
        def index() -> dict[str, Any] | None:
            text = self._read(INDEX)
            return _json(str(self.root / INDEX), text) if text is not None else None

        return _pick(sorted(p.name for p in self.root.glob("*.safetensors")), index)

    def header(self, file: str) -> list[HeaderRow]:
        where = str(self.root / file)
        if not (self.root / file).exists():
            raise FitError(f"{where}: no such file", hint="the index names a shard the directory lacks")
        with confine.open_regular(self.root, file, f"checkpoint {self.root}", FitError) as fh:
            return _read_header(where, fh)


class HubCheckpoint:
    """A repo at one commit on the Hub (or a Hub-compatible endpoint); nothing is written to disk."""

    def __init__(self, hub: HfHub, api: HfApi, repo: str, commit: str, files: Mapping[str, int]) -> None:
        self.hub, self.api, self.repo, self.commit, self.files = hub, api, repo, commit, dict(files)
        self.where = f"{hub.endpoint}/{repo}@{commit}"
        self._retry = RetryPolicy(attempts=3)

    def _small(self, path: str) -> bytes:
        if path not in self.files:
            raise FitError(f"{self.where} has no {path}", hint="fit needs the checkpoint's config.json")
        if self.files[path] > MAX_JSON:
            raise FitError(f"{self.where}/{path}: {self.files[path]} bytes, larger than a checkpoint's JSON")
        buf = io.BytesIO()
        self.hub.download(self.repo, self.commit, path, buf, offset=0, size=self.files[path])
        return buf.getvalue()

    def config(self) -> dict[str, Any]:
        return _json(f"{self.where}/{CONFIG}", self._small(CONFIG))

    def weight_files(self) -> list[str]:
        def index() -> dict[str, Any] | None:
            return _json(f"{self.where}/{INDEX}", self._small(INDEX)) if INDEX in self.files else None

        return _pick(sorted(self.files), index)

    def header(self, file: str) -> list[HeaderRow]:
        what = f"read the safetensors header of {self.where}/{file}"
        try:
            for attempt in self._retry.retrying(what):
                with attempt:
                    meta = self.api.parse_safetensors_file_metadata(self.repo, file, revision=self.commit)
                    return _checked_rows(f"{self.where}/{file}", _rows(meta))
        except FitError:
            raise
        except (
            SafetensorsParsingError,
            ValueError,
            TypeError,
            AttributeError,
            KeyError,
            RecursionError,
        ) as err:
            # huggingface_hub builds its dataclasses from the header as it stands: a hostile header fails
            # inside it with whatever error the wrong type gives.
            raise FitError(
                f"{self.where}/{file}: not a readable safetensors header ({type(err).__name__})",
                hint="the safetensors header is damaged or hostile; check the repo",
            ) from None
        except Exception as err:
            status = getattr(getattr(err, "response", None), "status_code", None)
            raise AdapterError(
                f"{what}: {type(err).__name__}" + (f" (HTTP {status})" if status else f": {err}"),
                hint="check the network, HF_ENDPOINT and HF_TOKEN; only the headers are read",
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _complete(local: Path, files: Mapping[str, int]) -> bool:
    """The directory holds config.json and every .safetensors file at its locked size."""
    want = [p for p in files if p == CONFIG or p.endswith(".safetensors")]
    if CONFIG not in want:
        return False
    for p in want:
        try:
            if (local / p).stat().st_size != files[p]:
                return False
        except OSError:
            return False
    return True


def open_checkpoint(
    spec: Deployment,
    lock: Lock,
    env: Mapping[str, str] = os.environ,
    hub: HfHub | None = None,
    *,
    local_only: bool = False,
) -> Checkpoint:
    """The cheapest faithful source: a local checkpoint; a complete download of the locked commit; or the
    XX (HF_HUB_OFFLINE, or ``local_only`` as doctor
        asks: a preflight makes no network request), only the directory."""
    local = Path(spec.model.local_dir).expanduser()
    if spec.model.repo is None:
        if not (local / CONFIG).is_file():
            raise FitError(
                f"local checkpoint (model.repo is null): no {CONFIG} in {local}",
                hint="copy the checkpoint there or point model.local_dir at it",
            )
        return LocalCheckpoint(local)
    locked = lock.models.get(spec.name)
    files: dict[str, int] | None = None
    commit: str | None = None
    if locked is not None and locked.repo == spec.model.repo:
        commit, files = locked.commit, {p: f.size for p, f in locked.files.items()}
    elif spec.model.pinned and spec.model.revision:
        commit = spec.model.revision
    # else nothing is locked yet: fit needs only the model, so the spec's branch or tag (default main) is
    # resolved on the Hub below, read-only, without `invoke pin` (which would also pin the image's sources)
    want = commit[:12] if commit else (spec.model.revision or "main")
    offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if (files and _complete(local, files)) or ((offline or local_only) and (local / CONFIG).is_file()):
        return LocalCheckpoint(local)
    if local_only:
        raise FitError(
            f"{spec.model.repo}@{want} is not in {local} yet",
            hint=f"`invoke fit --deployment {spec.name}` reads its headers from the Hub (range requests)",
        )
    if offline:
        raise FitError(
            f"HF_HUB_OFFLINE is set and {local} does not hold {spec.model.repo}@{want}",
            hint="unset HF_HUB_OFFLINE (fit reads only headers), or `invoke fetch-model` first",
        )
    hub = hub or HfHub.from_env(env)
    if commit is None:
        commit = hub.resolve(spec.model.repo, spec.model.revision or "main")
    if files is None:
        files = {p: f.size for p, f in hub.tree(spec.model.repo, commit).items()}
    token = token_from(env, read_text_or_none)
    api = HfApi(
        endpoint=env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT, token=token or False, library_name="rigsmith"
    )
    return HubCheckpoint(hub, api, spec.model.repo, commit, files)


def estimate_for(spec: Deployment, ckpt: Checkpoint) -> Estimate:
    """The per-rank estimate of a deployment, from its checkpoint's config.json and headers."""
    shape = ModelShape.from_config(ckpt.config(), f"{ckpt.where}/{CONFIG}")
    return estimate(shape, engine_inputs(spec), rows(ckpt))
