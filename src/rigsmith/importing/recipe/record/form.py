"""A prose record read as a record (seed 000: an experiment notebook with no launch command). Pure.

The record's form: a title line; sections under short headings; bullets ``• Label: text`` (Host, Model @
rev, Stack, Serving, Result, and ops lines Start, Stop, Bench, Proxy); a Config paragraph of flag
shorthand (``PP=3 / TP=1, max-model-len 262144, prefix caching OFF, cudagraph_mode=FULL_DECODE_ONLY sizes
[1,2,4]``) ending in an ``Env:`` list; numbered pitfalls with fixes; paragraphs of context. Each item is
read by the rules of :mod:`.tables` into a spec field, and every item is also kept: in ``notes``
(the item verbatim, with where it went) or in ``not_taken`` (the item and why). Nothing disappears.

What the record leaves open is asked (:mod:`.ask`): the answers file or the terminal answers, a
guess unanswered stays a placeholder.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.digits import ascii_digits
from rigsmith.importing import vllmflags
from rigsmith.importing.recipe.notes import NoteFacts, file_facts
from rigsmith.importing.recipe.record import env as recordenv
from rigsmith.importing.recipe.record import tables as t
from rigsmith.importing.recipe.record.ask import Answer, Ask, Reading, no_answer, top_split
from rigsmith.importing.recipe.tables import GPUS

_BULLET_RE = re.compile(r"^[•\-*▪◦]\s+(?:(?P<label>[A-Z][\w /-]{0,30}?):\s+)?(?P<body>.*)$")
_NUMBERED_RE = re.compile(r"^(?P<n>\d+)[.)]\s+(?P<body>.*)$")
_LABEL_RE = re.compile(r"^[A-Z][\w /-]{0,30}:\s")
_ENV_SPLIT_RE = re.compile(r"(?:^|(?<=[.;])\s+)Env:\s*")


@dataclass
class Block:
    """One item of the record: a bullet, a numbered item or a paragraph, under its section heading."""

    kind: str  # "bullet" | "numbered" | "para"
    text: str
    section: str
    label: str | None = None
    number: str | None = None


def blocks(text: str) -> tuple[str | None, list[Block], list[str]]:
    """The title, the items by section, and the headings of sections with no item."""
    paras: list[list[str]] = [[]]
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            paras[-1].append(line)
        elif paras[-1]:
            paras.append([])
    paras = [p for p in paras if p]
    title = paras[0][0] if paras and len(paras[0]) == 1 else None
    out: list[Block] = []
    section, empty, seen = "", [], False
    for para in paras[1:] if title else paras:
        if len(para) == 1 and _is_heading(para[0]):
            if section and not seen:
                empty.append(section)
            section, seen = para[0], False
            continue
        seen = True
        for line in para:
            if (b := _BULLET_RE.match(line)) is not None:
                out.append(Block("bullet", b.group("body").strip(), section, b.group("label")))
            elif (n := _NUMBERED_RE.match(line)) is not None:
                out.append(Block("numbered", n.group("body").strip(), section, number=n.group("n")))
            elif out and out[-1].kind == "para" and out[-1].section == section and para.index(line):
                out[-1].text += " " + line
            else:
                out.append(Block("para", line, section))
    if section and not seen:
        empty.append(section)
    return title, out, empty


def _is_heading(line: str) -> bool:
    """A short line on its own that is no sentence, list item or ``Label: value`` line."""
    return (
        len(line) <= 90
        and not line.endswith((".", ":", ";", ","))
        and not _BULLET_RE.match(line)
        and not _LABEL_RE.match(line)
    )


def _first_word(heading: str) -> str:
    return (heading.split() or [""])[0].lower()


def read(text: str, answer: Answer = no_answer) -> Reading:
    """The record, item by item (see the module docstring); ``answer`` answers its questions. Notes come
    in the record's order."""
    r = Reading(answer=answer)
    title, items, empty = blocks(text)
    r.title = title
    bullets = {b.label.lower(): b for b in items if b.kind == "bullet" and b.label}
    if (model := bullets.get("model")) is not None:
        _model(r, model.text)
    pitfalls = [b for b in items if b.kind == "numbered" or _first_word(b.section) in t.PITFALL_HEADINGS]
    mounts = {id(b): m for b in pitfalls if (m := _pitfall_mount(r, b)) is not None}
    front: list[str] = []
    flags: list[str] = []
    compilation: dict[str, object] = {}
    files = [m.container for m in mounts.values()]
    for b in items:
        if b.kind == "para":
            text, _, env_text = _split_env(b.text)
            if text:
                r.notes.append(f"{b.section}: {text}" if b.section else text)
            if text and _first_word(b.section) in t.CONFIG_HEADINGS:
                flags += _config(r, text.rstrip("."), compilation)
            if env_text is not None:
                recordenv.read_env(r, env_text, files)
        elif b.kind == "bullet" and (b.label or "").lower() == "env":
            recordenv.read_env(r, b.text, files)
        elif b in pitfalls:
            _pitfall(r, b, mounts.get(id(b)))
        else:
            _bullet(r, b, front)
    if "network.listen" not in r.fields:  # no Serving line: the safe default, said in a note
        r.notes.append(f"(the record says nothing of where it served) → {'; '.join(_serving(r, '', front))}")
    for heading in empty:
        r.skip(heading, "the record has this heading and nothing under it")
    if compilation:
        flags += ["--compilation-config", json.dumps(compilation, separators=(",", ":"))]
    if mounts:
        r.set("mounts", [m.model_dump(exclude_defaults=True) for m in mounts.values()])
    r.argv = [*([r.repo] if r.repo else []), *front, *flags]
    return r


def _split_env(text: str) -> tuple[str, str, str | None]:
    """A paragraph and the ``Env:`` list it ends in (or is), if any."""
    parts = _ENV_SPLIT_RE.split(text, maxsplit=1)
    if len(parts) == 1:
        return text, "", None
    return parts[0].rstrip(" ."), "Env:", parts[1].rstrip(" .")


# -- bullets -----------------------------------------------------------------------------------------


def _model(r: Reading, body: str) -> None:
    m = t.MODEL_RE.search(body)
    if m is None:
        return
    r.repo = m.group("repo")
    default = f"~/models/{r.repo.rsplit('/', 1)[-1]}"
    where = r.ask(Ask("model.local_dir", f"the host directory {r.repo} is downloaded to", default=default))
    if where is not None and not where.startswith(("/", "~/")):
        r.problems.append(f"answer model.local_dir {where!r}: write an absolute (or ~/) directory")
    elif where is not None:
        r.set("model.local_dir", where)
    if m.group("rev"):
        r.set("model.revision", m.group("rev"))
    if m.group("size"):
        r.set("model.size_bytes", int(float(m.group("size")) * t.SIZE_UNITS[m.group("unit").upper()]))


def _bullet(r: Reading, b: Block, front: list[str]) -> None:
    """A bullet into fields and a note (or not_taken); ``front`` gets the argv words it decides (served
    name, --host, --port), which lead the command."""
    label = (b.label or "").lower()
    whole = f"{b.label}: {b.text}" if b.label else b.text
    if label in t.OPS_LABELS or label == "proxy":
        _ops(r, b, whole)
        return
    went = {
        "host": _host,
        "model": _model_went,
        "stack": _stack,
        "serving": _serving,
        "result": _result,
    }.get(label)
    taken = went(r, b.text, front) if went else []
    r.notes.append(whole + (f" → {'; '.join(taken)}" if taken else ""))


def _model_went(r: Reading, body: str, _front: list[str]) -> list[str]:
    out = [f"model.repo {r.repo}"] if r.repo else []
    if "model.revision" in r.fields:
        out.append("model.revision")
    if "model.size_bytes" in r.fields:
        out.append(f"model.size_bytes {r.fields['model.size_bytes']}")
    if r.fields.get("model.revision"):
        out.append("(no --revision in the args: the pinned download at that revision is what is mounted)")
    return out


def _host(r: Reading, body: str, _front: list[str]) -> list[str]:
    out = []
    g = t.GPU_RE.search(body)
    if g is not None:
        count, model = int(g.group("count")), g.group("model")
        vram, arch = GPUS.get(model, (None, None))
        if g.group("vram"):
            vram = round(float(g.group("vram")) / count, 1)
        gpus = {"count": count, "model": model, "arch": arch, "vram_gib": vram}
        r.set("resources.gpus", {k: v for k, v in gpus.items() if v is not None})
        out.append(f"resources.gpus ({count} × {model}" + (f", {vram} GiB each)" if vram else ")"))
    ram = t.RAM_RE.search(body)
    if ram is not None:
        r.set("resources.host_ram_gib", float(ram.group("gb")))
        out.append(f"resources.host_ram_gib {float(ram.group('gb'))}")
    return out


def _stack(r: Reading, body: str, _front: list[str]) -> list[str]:
    out = []
    if (p := t.PODMAN_RE.search(body)) is not None:
        r.set("podman_version", p.group("version"))
        out.append(f"podman_version {p.group('version')}")
    digest = t.DIGEST_RE.search(body)
    if digest is None:
        return out
    value = digest.group("digest")
    up = t.UPSTREAM_RE.search(body)
    version = t.ENGINE_VERSION_RE.search(body)
    what = f"vLLM {version.group('version')}" if version else "the engine"
    if up is not None:
        what += f" from upstream {up.group('upstream')}" + (
            f" ({up.group('parts')})" if up.group("parts") else ""
        )
    truncated = "…" in value or "..." in value
    r.skip(
        f"{specmod.IMAGE_NOT_TAKEN} {value}",
        ("the digest is truncated in the record, so it can be neither pulled nor checked"
         if truncated else "a digest names no repository to pull it from")
        + f"; the image is {what}: engine.build builds it and `invoke build` locks the real digest",
    )  # fmt: skip
    default = _slug(up.group("upstream").rsplit("/", 1)[-1]) if up else None
    name = r.ask(
        Ask(
            "engine.build",
            f"the record runs {what}, pinned by a digest {'it shortened' if truncated else 'alone'} "
            f"({value}); name the image definition (images/NAME/image.yaml) that builds it",
            default=f"vllm-{default}" if default else None,
            guess=True,
        )
    )
    if name is None:
        r.skip("engine.build", "not answered: name the images/NAME/image.yaml that builds the engine")
    elif not specmod.NAME_RE.match(name):
        r.problems.append(f"answer engine.build {name!r}: not an image definition name (images/NAME)")
    else:
        r.set("engine.build", name)
        out.append(f"engine.build {name} (answered)")
    return out


def _serving(r: Reading, body: str, front: list[str]) -> list[str]:
    out = []
    loop, wide = t.LOOPBACK_RE.search(body), t.WIDE_RE.search(body)
    listen = "0.0.0.0" if wide and not loop else "127.0.0.1"
    said = wide or loop
    why = f"'{said.group(0)}'" if said is not None else "no exposure words (the safe default)"
    r.set("network.listen", listen)
    out.append(f"network.listen {listen} ({why})")
    proxy = _proxy(r, body)
    if proxy:
        out.append(f"proxy {proxy}")
        family = r.fields["proxy"].get("family")
        if family:
            front += ["--served-model-name", family]
            out.append(f"--served-model-name {family} (the proxy routes requests by the family's name)")
    front += ["--host", listen]
    port = r.ask(
        Ask(
            "network.port",
            "the port vLLM listens on"
            + (f" (the proxy on :{r.fields['proxy']['port']} forwards to it)" if proxy else ""),
            default="8000",
        )
    )
    if port is not None and specmod.ascii_int(port) is None:
        r.problems.append(f"answer network.port {port!r}: not a port number (1-65535)")
    else:
        front += ["--port", port or "8000"]
        out.append(f"--port {port or '8000'} ({'answered' if port else 'vLLM default; not stated'})")
    container = re.match(r"(?P<name>[\w.-]+) container\b", body)
    if container is not None:
        r.skip(
            f"container name {container.group('name')}",
            "rigsmith names the container after the deployment (every target, `invoke down`, doctor)",
        )
    return out


def _proxy(r: Reading, body: str) -> str | None:
    behind = t.PROXY_RE.search(body)
    port = (
        behind.group("port") if behind else (m.group("port") if (m := t.PROXY_PORT_RE.search(body)) else None)
    )
    family = t.FAMILY_RE.search(body)
    if port is None and family is None:
        return None
    proxy = dict(r.fields.get("proxy") or {})
    if family:
        proxy["family"] = family.group("family")
    if port:
        proxy["port"] = int(port)
    if (managed := t.MANAGED_RE.search(body)) is not None:
        proxy["backend_managed"] = managed.group("v").lower() == "true"
    r.set("proxy", proxy)
    return ", ".join(f"{k} {v}" for k, v in proxy.items())


def _result(r: Reading, body: str, _front: list[str]) -> list[str]:
    benches: list[dict[str, str | int | float]] = []
    for m in t.BENCH_RE.finditer(body):
        n = 1 if not ascii_digits(m.group("n")) else int(m.group("n"))
        name = f"decode_{n}stream" + ("_aggregate" if m.group("agg") else "")
        streams = {"streams": n} if n > 1 else {}
        benches.append({"name": name, **streams, "tokens_per_second": float(m.group("tps"))})
    if benches:
        r.set("benchmarks", benches)
    for segment in re.split(r"\s+[—–]\s+", body):
        if t.TOKS_RE.search(t.BENCH_RE.sub("", segment)) and not t.BENCH_RE.search(segment):
            r.skip(
                segment.strip(),
                "a comparison with another configuration, not a number this deployment is measured against",
            )
    return [f"benchmarks {', '.join(str(b['name']) for b in benches)}"] if benches else []


def _ops(r: Reading, b: Block, whole: str) -> None:
    label = (b.label or "").lower()
    if label == "proxy":
        got = _proxy(r, b.text)
        r.notes.append(whole + (f" → proxy {got}" if got else ""))
        return
    for part in b.text.split(";"):
        word, _, rest = part.strip().partition(":")
        sub = word.strip().lower() if rest else label
        what = f"{b.label}: {part.strip()}" if sub == label else part.strip()
        r.skip(what, t.OPS_LABELS.get(sub, t.OPS_LABELS[label]))


# -- the Config paragraph ----------------------------------------------------------------------------


def _config(r: Reading, text: str, compilation: dict[str, object]) -> list[str]:
    argv: list[str] = []
    for item in top_split(text):
        for part in item.split(" / ") if " / " in item else [item]:
            words = _config_item(r, part.strip(), compilation)
            if words is None:
                r.skip(part, "names no vLLM flag rigsmith knows (nor a --flag written out)")
            argv += words or []
    return argv


def _config_item(r: Reading, item: str, compilation: dict[str, object]) -> list[str] | None:
    body, note = _paren(item)
    if note:
        r.notes.append(f"{body}: {note}")
    for pattern, phrase_flag in t.PHRASES:
        if pattern.match(body):
            return [phrase_flag]
    if _compilation(body, compilation):
        return []
    explicit = re.fullmatch(r"(?P<flag>--[a-z][a-z0-9-]*)(?:[ =](?P<value>.+))?", body)
    if explicit is not None:
        value = explicit.group("value")
        return [explicit.group("flag"), *([_json_value(value.strip())] if value else [])]
    named = re.fullmatch(r"(?P<name>[A-Za-z][A-Za-z0-9_-]*)\s*[= ]\s*(?P<value>\S+)", body)
    if named is None:
        return None
    flag = flag_named(named.group("name"))
    if flag is None:
        return None
    known = vllmflags.lookup(flag)
    if known is not None and known.kind == "bool":
        return [flag] if named.group("value").lower() in ("on", "true", "1", "yes") else None
    return [flag, named.group("value")]


def _paren(item: str) -> tuple[str, str | None]:
    """``kv-cache-memory 550000000 (do NOT round up — …)`` → the item, and its parenthesis."""
    m = re.fullmatch(r"(?P<body>[^(]*?)\s*\((?P<note>.*)\)", item)
    if m is None or not m.group("body") or m.group("body").rstrip().endswith(("[", "{")):
        return item, None
    return m.group("body").strip(), m.group("note").strip()


def flag_named(name: str) -> str | None:
    """The vLLM flag a record's spelling names (``max-model-len``, ``TP``, ``gpu-mem-util``)."""
    low = name.lower().replace("_", "-")
    if low in t.FLAG_SHORTHANDS:
        return t.FLAG_SHORTHANDS[low]
    flag = vllmflags.lookup("--" + low)
    if flag is not None and flag.kind in ("value", "bool"):
        return flag.name
    return "--" + low if "--" + low in t.VALUE_FLAGS else None


def _compilation(body: str, compilation: dict[str, object]) -> bool:
    """``cudagraph_mode=FULL_DECODE_ONLY sizes [1,2,4]`` → CompilationConfig fields (all or nothing)."""
    pairs = re.findall(r"([A-Za-z_][\w -]*?)\s*[= ]\s*(\[[^\]]*\]|\S+)(?:\s+|$)", body)
    if not pairs or any(k.strip() not in t.COMPILATION_KEYS for k, _ in pairs):
        return False
    for key, value in pairs:
        compilation[t.COMPILATION_KEYS[key.strip()]] = json.loads(_json_value(value))
    return True


def _json_value(value: str) -> str:
    """A record's value as JSON where it is a structure or a word: ``{cpu_offload:true}`` →
    ``{"cpu_offload":true}``, ``[1,2,4]``, ``FULL_DECODE_ONLY`` → ``"FULL_DECODE_ONLY"``; other text as is."""
    if value[:1] in "{[":
        quoted = re.sub(r"(?<=[{,\s])([A-Za-z_][\w.-]*)\s*:", r'"\1":', value)
        try:
            return json.dumps(json.loads(quoted), separators=(",", ":"))
        except ValueError:
            return value
    try:
        json.loads(value)
        return value
    except ValueError:
        return json.dumps(value) if re.fullmatch(r"[A-Za-z_]\w*", value) else value


# -- pitfalls ----------------------------------------------------------------------------------------


def _pitfall_mount(r: Reading, b: Block) -> specmod.Mount | None:
    """The file a pitfall says must pre-exist at an exact size (``truncate -s N PATH``), as a mount."""
    facts = NoteFacts()
    file_facts(b.text, facts)
    sized = [(p, s) for p, s in facts.files.items() if s]
    if not sized or not (t.FILE_PITFALL_RE.search(b.text) or "truncate" in b.text):
        return None
    label = f"pitfall {b.number}" if b.number else "pitfall"
    return _file_mount(r, *sized[0], f"{label}: {b.text.split(' — ')[0].split('. ')[0]}")


def _pitfall(r: Reading, b: Block, mount: specmod.Mount | None) -> None:
    """A pitfall: kept as a note, with what it becomes (a file mount, doctor's check, the target advice)."""
    went = []
    if mount is not None:
        went.append(f"mounts: {mount.container} (kind: file, sparse_size {mount.sparse_size})")
    if t.SQUATTER_RE.search(b.text):
        went.append("doctor's 'VRAM holders' check and run.sh's squatter check refuse a start while another "
                    "process holds one of the GPUs")  # fmt: skip
    if t.CDI_DROP_RE.search(b.text):
        went.append("deploy --target podman or quadlet (plain podman run with --device); the compose target "
                    "writes the devices as `devices:`, which podman-compose passes, and `deploy --check` "
                    "shows what the compose tool on this host keeps")  # fmt: skip
    if (boot := t.FIRST_BOOT_RE.search(b.text)) is not None:
        seconds = int(boot.group("hi") or boot.group("lo")) * 60
        r.set("readiness.startup_seconds", seconds)
        went.append(f"readiness.startup_seconds {seconds}")
    label = f"Pitfall {b.number}" if b.number else "Pitfall"
    r.notes.append(f"{label}: {b.text}" + (f" → {'; '.join(went)}" if went else ""))


def _file_mount(r: Reading, path: str, size: int, note: str) -> specmod.Mount | None:
    gen = t.GENERALIZED_RE.match(path)
    if gen is not None:
        token, rest = gen.group("token"), gen.group("rest")
        placeholder = f"<{token}>"
        host_dir = r.ask(
            Ask(
                f"placeholders.{placeholder}",
                f"the record's paths under {token}/ were generalized by its publisher; the host directory "
                f"{token} stands for (it will hold {rest}, a sparse file of {size} bytes)",
                guess=True,
            )
        )
        if host_dir is None:
            r.placeholders[placeholder] = None
            host = f"{placeholder}/{rest}"
        else:
            host = f"{host_dir.rstrip('/')}/{rest}"
        container = f"/{token.lower()}/{rest}"
    elif path.startswith(("/", "~/")):
        host, container = path, path if path.startswith("/") else f"/{PurePosixPath(path).name}"
    else:
        r.skip(path, "a relative path: the record does not say where it is; mount the file by hand")
        return None
    return specmod.Mount(host=host, container=container, kind="file", sparse_size=size, note=note)


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return s or "engine"


def command(reading: Reading) -> str:
    """The ``vllm serve`` command the record describes, as one shell line."""
    return shlex.join(["vllm", "serve", *reading.argv])
