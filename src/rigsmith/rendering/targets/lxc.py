"""The Proxmox LXC target: ``lxc/NAME/VMID.conf`` (pct.conf) and ``lxc/NAME/provision.sh`` (runs in the CT).

The CT holds podman; provision.sh checks what the CT needs from the host (device nodes, nvidia-uvm, a driver
whose userspace matches the host's kernel module), makes the CDI spec inside the CT and starts the same
``podman run`` as the podman target. With ``engine.runtime: venv`` there is no podman: provision.sh checks
the venv's vllm and installs a systemd service in the CT whose ExecStart is the venv's vllm + the recipe
argv. The pct.conf carries the CT side of the same facts: GPU nodes, a sized /dev/shm, memlock, env, the
model dir, and a ``startup: down=`` that outlasts every stop timeout inside.

A config rigsmith writes (``lxc/NAME/VMID.conf``, no ``--lxc-config``) is its own, owned whole: a re-render
is exactly a fresh render (issue 24: merging into the previous copy kept the mounts, env lines and ``mpN``
entries a spec change removed); a hand edit there is a conflict the writer shows, like in any generated
file. A config the user hands in (``--lxc-config``) is theirs: it is read, never written, and the merged
copy goes to ``lxc/NAME/VMID.conf`` under the rules of :mod:`rigsmith.rendering.targets.pctconf` (only
rigsmith's settings change, three-way against the recorded base, CT identity keys never touched). Either way
everything goes before the first ``[section]`` (snapshots, ``[pve:pending]``), because lines appended after
it would land in the last snapshot (research/runtime-facts.md §4.1).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rigsmith import render as tpl
from rigsmith.digits import ascii_digits
from rigsmith.errors import ConsentError, RigsmithError, SpecError
from rigsmith.render import banner, breaks_line
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets import pctconf
from rigsmith.rendering.targets.context import LxcOptions, RenderContext
from rigsmith.rendering.targets.filecheck import FILE_CHECK
from rigsmith.rendering.targets.lxcservice import SECRETS_DIR, unit_text, venv_program
from rigsmith.rendering.targets.podman import run_lines
from rigsmith.rendering.targets.pvekeys import PVE_KEYS, Version, check
from rigsmith.rendering.targets.refusals import (
    Check,
    cannot_express,
    entrypoint_problems,
    mount_fields,
    volume_problems,
)
from rigsmith.rendering.targets.timing import timings
from rigsmith.writer import BANNER_MARK, Artifact

#: Device nodes per CDI vendor/class: per-GPU node pattern, shared nodes, and which may be absent.
NVIDIA_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
NVIDIA_OPTIONAL = frozenset({"nvidia-uvm-tools", "nvidia-modeset"})
#: nvidia.ko's fixed char major (NV_MAJOR_DEVICE_NUMBER); nvidia-uvm's is dynamic, a host fact.
NVIDIA_MAJOR = 195


@dataclass(frozen=True)
class Line:
    """One pct.conf line rigsmith manages; ``mp``/``dev`` keys get their index when the file is laid out."""

    key: str
    value: str

    def identity(self) -> str:
        """What makes an existing line "the same setting" (so rigsmith replaces it instead of adding)."""
        return _identity(self.key, self.value)


def _identity(key: str, value: str) -> str:
    # The setting a line is: pctconf's identity for the keys rigsmith may own, the key itself otherwise
    # (in the config rigsmith generates, every other key is one setting).
    return pctconf.identity(key, value) or key


def _gpu_nodes(plan: RunPlan, count: int, problems: list[tuple[str, str]]) -> list[tuple[str, bool]]:
    """(/dev path, optional) of every node the CT needs; vendors without a table go to ``problems``."""
    vendors = sorted({d.split("=", 1)[0] for d in plan.devices})
    bad = [v for v in vendors if v != "nvidia.com/gpu"]
    if bad:
        problems.append(
            (
                "resources.gpus.cdi_devices",
                f"no device-node table for {', '.join(bad)} (only nvidia.com/gpu); pass the nodes through "
                "by hand with devN: lines in your pct.conf, or use --target podman on the host",
            )
        )
        return []
    if not plan.devices:
        return []
    indices = (
        list(range(count))
        if "all" in plan.gpu_indices
        else [int(i) for i in plan.gpu_indices if ascii_digits(i)]
    )
    return [(f"/dev/nvidia{i}", False) for i in indices] + [
        (f"/dev/{n}", n in NVIDIA_OPTIONAL) for n in NVIDIA_SHARED
    ]


#: PVE's CT ids (pve-container: VMIDs 100 to 999999999); the id names the file and the rootfs volume.
VMID_RANGE = range(100, 1_000_000_000)
#: pct.conf(5) numbers its mount points and device passthroughs mp0..mp255 and dev0..dev255.
MAX_INDEXED = 256


def _option_problems(opts: LxcOptions) -> list[tuple[str, str]]:
    """The deploy options that reach the files (file name, comments, rootfs, cgroup rules), checked."""
    out = []
    if opts.vmid not in VMID_RANGE:
        out.append(("--vmid", f"{opts.vmid} is not a Proxmox CT id; use a number from 100 to 999999999"))
    if not re.fullmatch(r"(\d+)\.(\d+)(?:[.-][0-9A-Za-z.+~_-]*)?", opts.pve_version):
        out.append(("--pve-version", f"{opts.pve_version!r} is not a Proxmox VE version; write e.g. 8.2"))
    if opts.uvm_major is not None and not 0 < opts.uvm_major < 4096:
        out.append(("--uvm-major", f"{opts.uvm_major} is not a char major number (1-4095)"))
    return out


def _version(text: str) -> Version:
    m = re.match(r"(\d+)\.(\d+)", text)
    assert m is not None  # checked by _option_problems
    return int(m.group(1)), int(m.group(2))


def _fstab_path(path: str, field_name: str, problems: list[tuple[str, str]]) -> str:
    # liblxc reads lxc.mount.entry with getmntent(3), which splits on whitespace and decodes \040-style
    # octal escapes, so a backslash would name another path.
    if re.search(r"[\s\\]", path) or not path.startswith("/"):
        problems.append(
            (
                field_name,
                f"{path!r}: an lxc.mount.entry path must be absolute and hold no whitespace or backslash",
            )
        )
    return path


#: Host RAM when the spec sets none: the engine reads the weights through host memory (page cache and
#: pinned staging) next to its own few GiB, so the checkpoint's size plus headroom, never under the floor.
DEFAULT_RAM_FLOOR_GIB = 16.0
DEFAULT_RAM_UNKNOWN_GIB = 32.0


def default_host_ram_gib(size_bytes: int | None) -> tuple[float, str]:
    """The CT memory (GiB) for a spec without ``resources.host_ram_gib``, and the words that say why."""
    if size_bytes is None:
        return (
            DEFAULT_RAM_UNKNOWN_GIB,
            "the model's size is unknown: set model.size_bytes or run fetch-model",
        )
    size_gib = size_bytes / 2**30
    ram = max(DEFAULT_RAM_FLOOR_GIB, float(math.ceil(size_gib * 1.25 + 8)))
    return ram, f"from the model's size, {size_gib:.1f} GiB: 1.25 × size + 8 GiB, at least 16"


def lines(plan: RunPlan, ctx: RenderContext) -> list[Line]:
    """Every setting of the CT, in file order, before mp/dev indexes are assigned."""
    problems = _option_problems(ctx.lxc)
    if problems:
        raise SpecError("invoke deploy --target lxc", problems, what="command-line options")
    out, problems = _lines(plan, ctx)
    if problems:
        raise SpecError(plan.spec_path, cannot_express("lxc", problems))
    return out


def _problems(plan: RunPlan, ctx: RenderContext) -> list[tuple[str, str]]:
    """The deploy options' problems, else every spec field a CT cannot carry."""
    return _option_problems(ctx.lxc) or cannot_express("lxc", _lines(plan, ctx)[1])


#: What the lxc target cannot express (the CT's settings are built and checked in one walk).
CHECKS: tuple[Check, ...] = (_problems,)


def _lines(plan: RunPlan, ctx: RenderContext) -> tuple[list[Line], list[tuple[str, str]]]:
    """The CT's settings and the problems found building them; the options must be valid."""
    # One walk on purpose: each setting's value is checked where it is built (a problem names the field).
    opts, spec = ctx.lxc, ctx.spec
    t = timings(plan)
    problems: list[tuple[str, str]] = []
    pve = _version(opts.pve_version)
    ram_gib = spec.resources.host_ram_gib
    if ram_gib is None:
        ram_gib, basis = default_host_ram_gib(spec.model.size_bytes)
        ctx.warn(
            f"warning: resources.host_ram_gib is not set; the CT gets {ram_gib:g} GiB of memory ({basis}); "
            "set resources.host_ram_gib in the spec to choose it"
        )
    mem = math.ceil(ram_gib * 1024) + math.ceil(plan.shm_bytes / 2**20)
    hostname = re.sub(r"[^a-zA-Z0-9-]", "-", plan.name)[:63].strip("-")
    out = [
        Line("arch", "amd64"),
        Line("cores", str(opts.cores)),
        Line(
            "features", "keyctl=1,nesting=1"
        ),  # podman inside an unprivileged CT (keyctl), systemd (nesting)
        Line("hostname", hostname),
        Line("memory", str(mem)),  # host RAM the recipe needs + the /dev/shm tmpfs, which is charged here too
        Line("onboot", "1"),
        Line("ostype", "debian"),
        Line("rootfs", f"{opts.storage}:vm-{opts.vmid}-disk-0,size={opts.rootfs_gib}G"),
        Line("startup", f"order={opts.order},up={t.pve_up},down={t.pve_down}"),
        Line("swap", "0"),
        Line("unprivileged", "1"),
    ]
    out += _mount_lines(plan, problems)
    out += _passthrough_lines(plan, ctx, pve, problems)
    if plan.memlock != "host":
        out.append(
            Line("lxc.prlimit.memlock", "unlimited" if plan.memlock == "unlimited" else str(plan.memlock))
        )
    out.append(
        Line(
            "lxc.mount.entry",
            f"tmpfs dev/shm tmpfs rw,nosuid,nodev,size={plan.shm_bytes // 1024}k,mode=1777,create=dir 0 0",
        )
    )
    for k, v in plan.env:
        if breaks_line(v) or v != v.strip():
            problems.append(
                (
                    f"env.{k}",
                    "a pct.conf line cannot hold a line break (of any kind), another control character or "
                    "leading/trailing whitespace",
                )
            )
        out.append(Line("lxc.environment", f"{k}={v}"))
    if plan.runtime == "container":  # provision.sh runs the podman target's argv
        problems += volume_problems(plan) + entrypoint_problems(plan)
    return out, problems


def _mount_lines(plan: RunPlan, problems: list[tuple[str, str]]) -> list[Line]:
    """An ``mpN`` line per directory mount, an ``lxc.mount.entry`` per file one; bad paths to ``problems``."""
    out = []
    for (fld, _, _, _), m in zip(mount_fields(plan), plan.mounts, strict=True):
        path = m.host
        if m.kind == "dir":
            # PVE splits the mpN property string on ',' and reads a part holding '=' as key=value.
            if re.search(r"[,=\s]", path):
                problems.append((fld, f"{path!r}: a PVE mount point path cannot hold ',', '=' or whitespace"))
            out.append(Line("mp", f"{path},mp={path}" + (",ro=1" if m.readonly else "")))
        else:
            src = _fstab_path(path, fld, problems)
            opt = "bind,create=file" + (",ro" if m.readonly else "")
            out.append(Line("lxc.hook.pre-start", file_hook(src, m.sparse_size)))
            out.append(Line("lxc.mount.entry", f"{src} {src.lstrip('/')} none {opt} 0 0"))
    return out


#: The CT's root as the host sees it, ``uid:gid`` from the ``lxc.idmap`` lines of the config liblxc started
#: (PVE writes ``u 0 100000 65536`` for an unprivileged CT), empty for a privileged one: expanded by the
#: shell liblxc runs a hook in (``$LXC_CONFIG_FILE`` is set for hooks).
_CT_ROOT = (
    """"$(awk -F'[ =]+' '$1=="lxc.idmap" && $3==0 {o[$2]=$4} END {if ("u" in o) print o["u"] ":" o["g"]}' """
    '"$LXC_CONFIG_FILE")"'
)


def file_hook(path: str, size: int | None) -> str:
    """The ``lxc.hook.pre-start`` command for a file mount: the check the other targets run before their
    container starts (:data:`~rigsmith.rendering.targets.filecheck.FILE_CHECK`), run on the PVE host before
    liblxc applies the CT's mounts (without it a missing file is liblxc's "Failed to mount" and no start).
    liblxc runs the value with ``sh -c``, appending the CT name, section and hook type (ignored)."""
    return (
        shlex.join(["/bin/sh", "-c", FILE_CHECK, "rigsmith-file-check", path, str(size or 0)])
        + " "
        + _CT_ROOT
    )


def _passthrough_lines(
    plan: RunPlan, ctx: RenderContext, pve: Version, problems: list[tuple[str, str]]
) -> list[Line]:
    """The GPU nodes: ``devN`` lines (PVE >= 8.1) or raw cgroup rules and bind entries."""
    opts, out = ctx.lxc, []
    nodes = _gpu_nodes(plan, ctx.spec.resources.gpus.count, problems)
    if len(nodes) > MAX_INDEXED and pve >= PVE_KEYS["devN"][1]:
        problems.append(
            (
                "resources.gpus.count",
                f"{len(nodes)} device nodes ({len(nodes) - len(NVIDIA_SHARED)} GPUs and the shared nvidia "
                f"nodes) do not fit pct.conf's dev0..dev{MAX_INDEXED - 1}; give the CT fewer GPUs",
            )
        )
        nodes = []
    if pve >= PVE_KEYS["devN"][1]:
        out += [Line("dev", path) for path, _opt in nodes]
    elif nodes:
        if opts.uvm_major is None:
            problems.append(
                (
                    "--uvm-major",
                    f"PVE {opts.pve_version} has no devN: passthrough, and the raw form "
                    "needs nvidia-uvm's char major, which differs per host: pass the number from "
                    "`grep nvidia-uvm /proc/devices` on the PVE host (or use PVE >= 8.1)",
                )
            )
        out.append(Line("lxc.cgroup2.devices.allow", f"c {NVIDIA_MAJOR}:* rwm"))
        out.append(Line("lxc.cgroup2.devices.allow", f"c {opts.uvm_major}:* rwm"))
        for path, optional in nodes:
            out.append(
                Line(
                    "lxc.mount.entry",
                    f"{path} {path.lstrip('/')} none bind,{'optional,' if optional else ''}create=file 0 0",
                )
            )
    return out


def merge(existing: str | None, ours: Sequence[Line], head: Sequence[str]) -> list[str]:
    """The final file lines: the user's lines kept, ours replacing the settings they manage, before ``[…]``.

    Args:
        existing: the current file, or None for a new one.
        ours: rigsmith's settings in order (``mp``/``dev`` without index).
        head: comment lines rigsmith puts first (banner); older copies of them are dropped.
    """
    user = (existing or "").splitlines()
    cut = next((i for i, ln in enumerate(user) if ln.startswith("[")), len(user))
    main, rest = user[:cut], user[cut:]
    our_ids = {ln.identity() for ln in ours}
    kept: list[str] = []
    index_of: dict[str, int] = {}
    used: dict[str, set[int]] = {"mp": set(), "dev": set()}
    for ln in main:
        m = pctconf.KEY_RE.match(ln)
        if ln.startswith("#") and (BANNER_MARK in ln or ln.startswith(("#   invoke ", "# rigsmith:"))):
            continue
        if m:
            key, value = m.group(1), m.group(2)
            ident = _identity(key, value)
            base = re.sub(r"\d+$", "", key)
            if ident in our_ids:
                if base in used and key != base:
                    index_of[ident] = int(key[len(base) :])
                continue
            if base in used and key != base:
                used[base].add(int(key[len(base) :]))
        kept.append(ln)
    while kept and not kept[-1].strip():
        kept.pop()
    laid: list[str] = []
    for own in ours:
        key = own.key
        if key in used:
            n = index_of.get(own.identity())
            if n is None or n in used[key]:
                n = next(
                    (i for i in range(MAX_INDEXED) if i not in used[key] and i not in index_of.values()), -1
                )
                if n < 0:
                    raise RigsmithError(
                        f"pct.conf has no free {key}N index left (at most {key}0..{key}{MAX_INDEXED - 1}) "
                        f"for {key}: {own.value}",
                        hint=f"remove {key}N lines the CT no longer needs from the config, or give "
                        "it fewer GPUs/mounts",
                    )
            used[key].add(n)
            key = f"{key}{n}"
        laid.append(f"{key}: {own.value}")
    body = [*head, *kept, *laid]
    if rest:
        body += ["", *rest]
    return body


#: Keys that make the CT what it is: rigsmith writes them in a new config, never in the user's.
CT_KEYS = frozenset(
    {"arch", "cores", "hostname", "memory", "onboot", "ostype", "rootfs", "swap", "unprivileged"}
)


def _users_conf(plan: RunPlan, ctx: RenderContext, ours: Sequence[Line], out: Path) -> list[Artifact]:
    """The user's --lxc-config (read, never written) merged with rigsmith's settings, to ``out``."""
    opts = ctx.lxc
    assert opts.config is not None
    existing = ctx.read(opts.config)
    if existing is None:
        raise ConsentError(f"--lxc-config {opts.config}: no such file", hint="give the CT's config (a copy)")
    base_path = out.parent / ".base" / f"{out.name}.json"
    settings = [(ln.key, ln.value) for ln in ours if ln.key not in CT_KEYS]
    merged = pctconf.merge_conf(
        existing,
        settings,
        ctx.read(base_path),
        resolve=opts.resolve,
        replace_passthrough=opts.replace_passthrough,
    )
    if merged.passthrough and not opts.replace_passthrough:
        raise ConsentError(
            f"{opts.config} already passes GPUs through in another form: {' | '.join(merged.passthrough)}. "
            "Nothing was written: keeping them next to rigsmith's devN lines would pass each device twice",
            hint="re-run with --replace-gpu-passthrough to drop those lines (only those)",
        )
    if merged.conflicts and opts.resolve is None:
        raise ConsentError(
            f"{opts.config}: you and rigsmith changed the same settings: "
            f"{'; '.join(c.describe() for c in merged.conflicts)}. Nothing was written",
            hint="re-run with --ours to keep your values or --theirs to take rigsmith's",
        )
    _warn_below_need(plan, ctx, ours, existing)
    return [Artifact(out, merged.text), Artifact(base_path, merged.base)]


def _warn_below_need(plan: RunPlan, ctx: RenderContext, ours: Sequence[Line], existing: str) -> None:
    need = {ln.key: ln.value for ln in ours if ln.key in ("memory", "cores")}
    have: dict[str, str] = {}
    for ln in existing.split("\n[", 1)[0].splitlines():
        if m := pctconf.KEY_RE.match(ln):
            have.setdefault(m.group(1), m.group(2))
    for key, want in need.items():
        got = have.get(key)
        if got is not None and ascii_digits(got) and int(got) < int(want):
            ctx.warn(
                f"warning: {ctx.lxc.config} has {key}: {got}; {plan.name} needs {want} "
                f"(kept as you wrote it: set it with `pct set {ctx.lxc.vmid} --{key} {want}`)"
            )


def _check_conf(conf: Artifact, ours: Sequence[Line], pve: Version, ctx: RenderContext) -> None:
    """The config PVE will read, line by line against pct.conf(5) for PVE ``pve``: a line of rigsmith's
    that PVE would refuse stops the render; a line of the user's is reported and kept as written."""
    own = {(ln.key, ln.value) for ln in ours}
    mine: list[str] = []
    for text in conf.content.split("\n[", 1)[0].splitlines():
        m = pctconf.KEY_RE.match(text)
        if m is None:
            continue
        key, value = m.group(1), m.group(2)
        for problem in check([(key, value)], pve, user_keys=True):
            if (re.sub(r"^(mp|dev)\d+$", r"\1", key), value) in own:
                mine.append(problem)
            else:
                ctx.warn(f"warning: {conf.path}: your line {text!r}: {problem} (kept as you wrote it)")
    if mine:
        raise RigsmithError(
            f"{conf.path}: rigsmith rendered lines PVE {pve[0]}.{pve[1]} would refuse: {'; '.join(mine)}",
            hint="a spec value the lxc target does not check yet, or a rigsmith bug: please report it with "
            "the spec; --pve-version names the host's PVE",
        )


def render(plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """``lxc/NAME/VMID.conf`` (new, or the --lxc-config file merged) and ``lxc/NAME/provision.sh``."""
    opts = ctx.lxc
    base = ctx.out / "lxc" / plan.name
    conf = base / f"{opts.vmid}.conf"
    t = timings(plan)
    head = [
        *banner(ctx.command, plan.spec_path).rstrip("\n").splitlines(),
        f"# rigsmith: CT {opts.vmid} runs {plan.name}; run provision.sh inside it. "
        + (
            f"Stop timeouts nest: container {t.container_stop}s"
            if plan.runtime == "container"
            else f"Stop timeouts nest: vLLM --shutdown-timeout {t.shutdown or 0}s"
        )
        + f" < systemd {t.systemd_stop}s < startup down={t.pve_down}s.",
    ]
    if any(m.kind == "file" for m in plan.mounts):
        head.append(
            "# rigsmith: each lxc.hook.pre-start checks a file mount on the host before the CT's mounts (a "
            "missing sized one is created sparse); a start refused there says `Failed to run "
            f"lxc.hook.pre-start`: `pct start {opts.vmid} --debug` prints why."
        )
    ours = lines(plan, ctx)
    if opts.config is not None:
        confs = _users_conf(plan, ctx, ours, conf)
    else:
        confs = [Artifact(conf, "\n".join(merge(None, ours, head)) + "\n")]
    _check_conf(confs[0], ours, _version(opts.pve_version), ctx)
    nodes = _gpu_nodes(plan, ctx.spec.resources.gpus.count, [])
    script = tpl.render(
        f"lxc/provision-{plan.runtime}.sh.j2",
        banner=banner(ctx.command, plan.spec_path),
        plan=plan,
        vmid=opts.vmid,
        nodes=[(p, o) for p, o in nodes],
        nvidia=bool(nodes),
        run_lines=run_lines(plan) if plan.runtime == "container" else [],
        unit=unit_text(plan, ctx) if plan.runtime == "venv" else "",
        venv_program=venv_program(plan).removeprefix(plan.venv or ""),
        secrets_dir=SECRETS_DIR,
        dirs=[tpl.shpath(m.host) for m in plan.mounts if m.kind == "dir"],
        files=[(tpl.shpath(m.host), m.sparse_size, m.readonly) for m in plan.mounts if m.kind == "file"],
        secrets=plan.secret_env,
        secret_from=dict(plan.secret_from),
    )
    return [*confs, Artifact(base / "provision.sh", script, 0o755)]
