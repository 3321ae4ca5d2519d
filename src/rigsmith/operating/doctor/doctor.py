"""``invoke doctor``: one go/no-go table of host facts against a deployment spec.

``evaluate`` is pure (HostFacts + spec → checks); ``render`` lays the checks out with rich; ``diagnose``
gathers the facts the rendered plan needs (its image, sparse files, the model dir against the lock) and
evaluates them. Every failing check carries a hint saying what to do.
"""

from __future__ import annotations

import io
import os

from rich.console import Console
from rich.table import Table

from rigsmith.errors import RigsmithError
from rigsmith.operating.checkrow import Check as Check
from rigsmith.operating.checkrow import Verdict as Verdict
from rigsmith.operating.checkrow import requested_gpus
from rigsmith.operating.doctor import drift, targetrows
from rigsmith.operating.doctor.podmanchecks import (
    NVIDIA_CDI_HINT,
    check_helpers,
    check_image,
    check_init,
    check_podman,
    vtuple,
)
from rigsmith.operating.doctor.podmanchecks import max_cdi_version as max_cdi_version
from rigsmith.operating.fit.report import fit_check
from rigsmith.operating.host import Host, gather
from rigsmith.operating.probes import P2P_LINKS, CdiSpec, HostFacts
from rigsmith.project import Project
from rigsmith.rendering import plan as planmod
from rigsmith.rendering import validate
from rigsmith.rendering.targets import RenderContext
from rigsmith.resolving.image import engineroute
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import expand_dir
from rigsmith.spec import Deployment

GiB = 1024**3
MiB = 1024**2


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _check_gpus(spec: Deployment, facts: HostFacts, want: list[int]) -> Check:
    g = spec.resources.gpus
    need = f"spec: {g.count}× {g.model or 'GPU'}" + (f", {g.vram_gib:g} GiB each" if g.vram_gib else "")
    if facts.gpu_error:
        return Check(
            "GPUs",
            "no-go",
            f"no driver: {facts.gpu_error} ({need})",
            "install and load the NVIDIA driver; `nvidia-smi -L` must list the GPUs",
        )
    by_index = {x.index: x for x in facts.gpus}
    problems = []
    missing = [i for i in want if i not in by_index]
    if len(facts.gpus) < g.count or missing:
        problems.append(f"found {len(facts.gpus)} GPU(s)" + (f", no GPU {missing}" if missing else ""))
    for i in want:
        x = by_index.get(i)
        if x is None:
            continue
        if g.model and g.model.lower() not in x.name.lower():
            problems.append(f"GPU{i} is {x.name}")
        if g.vram_gib and x.memory_total_mib * MiB < g.vram_gib * GiB * 0.97:
            problems.append(f"GPU{i} has {x.memory_total_mib} MiB")
    names = sorted({by_index[i].name for i in want if i in by_index})
    found = f"{len([i for i in want if i in by_index])}× {', '.join(names) or '?'}"
    if facts.gpus:
        found += f", {facts.gpus[0].memory_total_mib} MiB, driver {facts.gpus[0].driver_version}"
    if problems:
        return Check(
            "GPUs",
            "no-go",
            f"{'; '.join(problems)} ({need})",
            "fix resources.gpus (count, model, cdi_devices) or run on the rig the recipe names",
        )
    return Check("GPUs", "go", f"{found} ({need})")


def _check_squatters(spec: Deployment, facts: HostFacts, want: list[int]) -> Check:
    if facts.gpu_error:
        return Check(
            "VRAM holders", "no-go", "cannot list GPU processes without the driver", "fix the driver first"
        )
    uuid_index = {x.uuid: x.index for x in facts.gpus}
    own: list[str] = []
    foreign: list[str] = []
    for app in facts.apps:
        idx = uuid_index.get(app.gpu_uuid)
        if idx is None or idx not in want:
            continue
        ctr = facts.containers.get(app.pid)
        used = f"{app.used_mib} MiB" if app.used_mib is not None else "? MiB"
        desc = f"GPU{idx}: PID {app.pid} {app.name} {used}" + (f" (container {ctr})" if ctr else "")
        (own if ctr == spec.name else foreign).append(desc)
    if foreign:
        return Check(
            "VRAM holders",
            "no-go",
            "; ".join(foreign),
            "stop them first (`kill PID`, `podman stop NAME`): a squatter OOMs rank 0 at high "
            "gpu-memory-utilization (seeds/000 pitfall 3)",
        )
    if own:
        return Check(
            "VRAM holders",
            "warn",
            f"this deployment is running: {'; '.join(own)}",
            f"`invoke down --deployment {spec.name}` before starting it again",
        )
    return Check("VRAM holders", "go", f"no compute process on GPU {', '.join(map(str, want)) or '-'}")


def _provider(dev: str, specs: list[CdiSpec]) -> CdiSpec | None:
    found = None
    for s in specs:  # later directories win (/var/run/cdi over /etc/cdi)
        if not s.error and dev in s.qualified():
            found = s
    return found


def conflicts(specs: list[CdiSpec]) -> dict[str, list[str]]:
    """Devices defined by two spec files in one directory: podman's CDI registry refuses both (seen here:
    "conflicting device ... (specs a, b)" then "unresolvable CDI devices")."""
    where: dict[tuple[str, str], list[str]] = {}
    for s in specs:
        if not s.error:
            for dev in s.qualified():
                where.setdefault((s.directory, dev), []).append(s.path)
    return {dev: paths for (_d, dev), paths in where.items() if len(paths) > 1}


def _check_cdi(spec: Deployment, facts: HostFacts) -> Check:
    problems: list[str] = []
    hints: list[str] = []
    ok: list[str] = []
    clash = conflicts(facts.cdi)
    readable = max_cdi_version(facts.podman_version) if facts.podman_version else None
    for dev in spec.resources.gpus.cdi_devices:
        if dev in clash:
            problems.append(f"{dev} is defined twice ({', '.join(clash[dev])}); podman refuses both")
            hints.append("remove the stale copy (keep one spec per vendor per directory)")
            continue
        s = _provider(dev, facts.cdi)
        if s is None:
            problems.append(f"no CDI spec provides {dev}")
            hints.append(NVIDIA_CDI_HINT if dev.startswith("nvidia.com/") else "add a CDI spec for it")
            continue
        if readable and vtuple(s.cdi_version) > vtuple(readable):
            problems.append(
                f"{s.path} is cdiVersion {s.cdi_version}; podman {facts.podman_version} reads "
                f"≤ {readable} and skips it silently"
            )
            hints.append("regenerate the spec at an older version or upgrade podman")
            continue
        if s.driver_version and facts.driver_version and s.driver_version != facts.driver_version:
            problems.append(
                f"{s.path} was generated for driver {s.driver_version}; the loaded driver is "
                f"{facts.driver_version}"
            )
            hints.append(NVIDIA_CDI_HINT + " (after every driver update)")
            continue
        ok.append(f"{dev} ({s.path}, cdiVersion {s.cdi_version})")
    broken = [f"{s.path}: {s.error}" for s in facts.cdi if s.error]
    if problems:
        return Check("CDI devices", "no-go", "; ".join(problems + broken), "; ".join(dict.fromkeys(hints)))
    detail = (
        "; ".join(ok)
        if len(ok) <= 2
        else f"{len(ok)} devices in " + ", ".join(sorted({o.split(" (")[1].split(",")[0] for o in ok}))
    )
    return Check(
        "CDI devices",
        "warn" if broken else "go",
        "; ".join([detail, *broken]),
        "fix or remove the broken spec file" if broken else None,
    )


def _check_shm(spec: Deployment, facts: HostFacts) -> Check:
    want = spec.resources.shm_bytes
    total = facts.meminfo.get("MemTotal")
    detail = f"container /dev/shm {spec.resources.shm_size} (--shm-size)"
    if facts.shm_bytes:
        detail += f"; host /dev/shm {_gib(facts.shm_bytes)}"
    if spec.resources.gpus.count > 1 and want < GiB:
        return Check(
            "shm",
            "no-go",
            detail + "; tensor/pipeline parallel NCCL needs ≥ 1 GiB",
            "set resources.shm_size: 8g",
        )
    if total and want > total:
        return Check(
            "shm", "no-go", detail + f"; more than host RAM ({_gib(total)})", "lower resources.shm_size"
        )
    return Check("shm", "go", detail)


def _kib(n: int | None) -> str:
    return "unlimited" if n is None else f"{n // 1024} KiB"


def _check_memlock(spec: Deployment, facts: HostFacts) -> Check:
    want = spec.resources.memlock
    ml = facts.memlock
    if want == "host":
        cur = "unknown" if ml is None else _kib(ml.hard_bytes)
        return Check(
            "memlock",
            "warn",
            f"spec sets none (memlock: host); runtime hard limit {cur}",
            "NCCL may fail to pin memory (ENOMEM); prefer memlock: unlimited where the host allows",
        )
    if ml is None:
        return Check("memlock", "warn", "could not probe RLIMIT_MEMLOCK", None)
    need = None if want == "unlimited" else int(want)
    hard = _kib(ml.hard_bytes)
    fits = ml.hard_bytes is None or (need is not None and ml.hard_bytes >= need)
    label = "unlimited" if need is None else f"{need} bytes"
    if fits or ml.raisable:
        return Check(
            "memlock", "go", f"spec wants {label}; hard limit {hard}" + ("" if fits else ", raisable")
        )
    return Check(
        "memlock",
        "no-go",
        f"spec wants {label}; hard limit {hard} and it cannot be raised here "
        "(`--ulimit memlock` will fail at container start)",
        "raise it for the container engine (LimitMEMLOCK=infinity in its systemd unit; "
        "lxc.prlimit.memlock for an LXC host), or accept NCCL's risk and set none: "
        f"`invoke up --memlock host --yes --deployment {spec.name}` (it writes resources.memlock: host "
        "into the spec and run.sh without --ulimit memlock)",
    )


def _check_ram(spec: Deployment, facts: HostFacts) -> Check:
    total = facts.meminfo.get("MemTotal")
    avail = facts.meminfo.get("MemAvailable")
    need = spec.resources.host_ram_gib
    if total is None:
        return Check("host RAM", "warn", "could not read /proc/meminfo")
    detail = f"{_gib(total)} total, {_gib(avail or 0)} available"
    if need is None:
        return Check("host RAM", "go", detail + "; spec names no requirement")
    # Recipes write "96 GB" loosely; allow 10 % for GB/GiB and firmware reservations.
    if total < need * GiB * 0.9:
        return Check(
            "host RAM",
            "no-go",
            detail + f"; spec needs {need:g} GiB",
            "run on a host with more RAM, or lower the offload settings the recipe uses",
        )
    return Check("host RAM", "go", detail + f"; spec needs {need:g} GiB")


def _check_disk(spec: Deployment, facts: HostFacts) -> Check:
    size = spec.model.size_bytes or (int(spec.resources.disk_gib * GiB) if spec.resources.disk_gib else None)
    d = facts.disk
    if d is None:
        return Check("disk", "warn", f"could not stat {spec.model.local_dir}")
    if spec.model.repo is None:
        # A local checkpoint is never downloaded: what matters is that it is there, not free space.
        if d.present_bytes == 0:
            return Check(
                "disk",
                "no-go",
                f"local checkpoint (model.repo is null): nothing at {spec.model.local_dir}",
                "copy the checkpoint there or point model.local_dir at it; fetch-model downloads nothing",
            )
        return Check(
            "disk", "go", f"local checkpoint: {_gib(d.present_bytes)} present at {spec.model.local_dir}"
        )
    if size is None:
        return Check(
            "disk",
            "warn",
            f"{_gib(d.free_bytes)} free at {d.path}; model size unknown",
            "set model.size_bytes so doctor can check",
        )
    need = max(size - d.present_bytes, 0)
    detail = f"{_gib(d.free_bytes)} free at {d.path}; model {_gib(size)}, {_gib(d.present_bytes)} present"
    if d.free_bytes < need:
        return Check(
            "disk",
            "no-go",
            detail + f"; {_gib(need)} more needed",
            "free space or point model.local_dir at a larger disk",
        )
    return Check("disk", "go", detail)


def _check_p2p(spec: Deployment, facts: HostFacts, want: list[int]) -> Check:
    gpus = [f"GPU{i}" for i in want]
    if len(gpus) < 2:
        return Check("PCIe P2P", "go", "single GPU; not needed")
    if facts.gpu_error or (facts.topo is None and not facts.p2p):
        return Check("PCIe P2P", "warn", "topology unknown (nvidia-smi topo -m unavailable)")
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    links = [facts.topo.links.get((a, b), "?") if facts.topo else "?" for a, b in pairs]
    if facts.p2p:
        no_p2p = [f"{a}-{b} {facts.p2p.get((a, b), '?')}" for a, b in pairs if facts.p2p.get((a, b)) != "OK"]
    else:
        no_p2p = [f"{a}-{b} {lk}" for (a, b), lk in zip(pairs, links, strict=True) if not P2P_LINKS.match(lk)]
    kinds = ", ".join(sorted(set(links)))
    if not no_p2p:
        return Check("PCIe P2P", "go", f"P2P between all {len(gpus)} GPUs (links {kinds})")
    env = {e.name: e.value for e in spec.active_env()}
    detail = f"no P2P: {', '.join(no_p2p)} (links {kinds})"
    if spec.resources.gpus.p2p == "required":
        return Check(
            "PCIe P2P",
            "no-go",
            detail + "; the recipe requires P2P",
            "use GPUs behind one PCIe switch / NVLink, or a recipe variant without P2P",
        )
    if env.get("NCCL_P2P_DISABLE") == "1":
        return Check("PCIe P2P", "go", detail + "; NCCL_P2P_DISABLE=1 is set")
    return Check(
        "PCIe P2P",
        "warn",
        detail,
        "add env NCCL_P2P_DISABLE=1 to the spec (NCCL hangs on consumer PCIe boxes otherwise)",
    )


def _check_model(spec: Deployment, facts: HostFacts) -> Check | None:
    m = facts.model
    if m is None:
        return None
    if m.unpinned and not m.problems:  # nothing to verify against: say so, never "go"
        return Check(
            "model files",
            "warn",
            f"not pinned yet: rigsmith.lock has no commit for {', '.join(m.unpinned)}"
            + (f"; {m.checked} other file(s) match it" if m.checked else ""),
            f"`invoke pin --deployment {spec.name}`, then `invoke fetch-model --deployment {spec.name}`",
        )
    if m.note and not m.checked and not m.problems:
        return Check("model files", "go", m.note)
    how = "full hashes" if m.hashed else "sizes + verified-file record"
    if not m.problems:
        return Check("model files", "go", f"{m.checked} files at {m.local_dir} match rigsmith.lock ({how})")
    return Check(
        "model files",
        "no-go",
        f"{len(m.problems)} of {m.checked} files at {m.local_dir} differ from rigsmith.lock ({how}): "
        + "; ".join(m.problems),
        "`invoke fetch-model --verify` re-checks every file and downloads what differs",
    )


def _check_filled(spec: Deployment) -> Check | None:
    """A placeholder the import left (the model first): nothing renders or pins until it is filled."""
    unfilled = spec.fill_problems()
    if not unfilled:
        return None
    return Check(
        "placeholders",
        "no-go",
        "; ".join(f"{field} {what}" for field, what in unfilled),
        f"fill them in deployments/{spec.name}.yaml (`invoke next` then says the step after)",
    )


#: What creates a missing sparse file before the container starts, per target (kube: nothing, the user).
_SPARSE_CREATOR = {
    "podman": "run.sh",
    "quadlet": "the unit's ExecStartPre",
    "compose": "files.sh",
    "lxc": "the CT's lxc.hook.pre-start",
}


def _check_sparse(facts: HostFacts, target: str) -> Check | None:
    if not facts.sparse:
        return None
    wrong = [
        f"{p} is {have} bytes, wants {want}"
        for p, (want, have) in facts.sparse.items()
        if have not in (None, want)
    ]
    missing = [p for p, (_w, have) in facts.sparse.items() if have is None]
    creator = _SPARSE_CREATOR.get(target)
    if wrong:
        return Check(
            "sparse files",
            "no-go",
            "; ".join(wrong),
            "move each aside; "
            + (f"{creator} recreates it sparse at its size" if creator else "`truncate -s SIZE PATH`"),
        )
    if missing:
        return Check(
            "sparse files",
            "go" if creator else "no-go",
            f"missing: {', '.join(missing)}"
            + (f"; {creator} creates each sparse at its size" if creator else ""),
            None if creator else "; ".join(f"truncate -s {facts.sparse[p][0]} {p}" for p in missing),
        )
    return Check("sparse files", "go", f"{len(facts.sparse)} file(s) at their exact size")


def evaluate(
    spec: Deployment,
    facts: HostFacts,
    target: str = "podman",
    fit: Check | None = None,
    image_fix: str | None = None,
) -> list[Check]:
    """Every check, in table order. Pure. ``fit``: the memory-fit row (operating.fit.report), when given;
    ``image_fix``: what to do about a missing image (resolving.image.engineroute), when not the generic
    hint."""
    want = requested_gpus(spec, facts)
    optional = [
        _check_filled(spec),
        check_init(facts, target),
        *check_helpers(facts, target),
        check_image(facts, image_fix),
        _check_model(spec, facts),
        _check_sparse(facts, target),
    ]
    # lxc: doctor runs on the PVE host; CDI specs and memlock are the CT's own (its provision.sh checks them)
    in_ct = target == "lxc"
    return [
        _check_gpus(spec, facts, want),
        _check_squatters(spec, facts, want),
        *([] if in_ct else [_check_cdi(spec, facts)]),
        _check_shm(spec, facts),
        *([] if in_ct else [_check_memlock(spec, facts)]),
        _check_ram(spec, facts),
        _check_disk(spec, facts),
        _check_p2p(spec, facts, want),
        check_podman(spec, facts, target),
        *(c for c in optional if c is not None),
        *([fit] if fit is not None else []),
    ]


def diagnose(
    project: Project, deployment: str | None, *, target: str, host: Host, verify: bool = False
) -> tuple[str, list[Check]]:
    """(deployment name, checks) for this host: every probe, the plan's image and sparse files, and the
    model dir against the lock (full hashes with ``verify``)."""
    name = project.resolve_name(deployment)
    spec = project.load(name)
    lock = lockmod.read(project.lock_path)
    plan: planmod.RunPlan | None = None
    planned: Check | None = None
    spec_path = f"deployments/{name}.yaml"
    ctx = RenderContext(spec, project.root, "invoke doctor", podman_version=spec.podman_version)
    try:
        # The one validation pass deploy runs for this target, so doctor names every problem too.
        validate.refuse(spec_path, validate.problems(spec, lock, target, ctx, spec_path=spec_path))
        plan = planmod.make(spec, lock, spec_path=spec_path)
    except RigsmithError as err:
        planned = Check("plan", "no-go", f"cannot render the artifacts: {err.message}", err.hint)
    image = (
        (plan.image, plan.image_pinned) if plan and plan.runtime == "container" and target != "lxc" else None
    )
    sparse = [(m.host, m.sparse_size) for m in plan.mounts if m.sparse_size] if plan else []
    facts = gather(
        host,
        model_dir=spec.model.local_dir,
        target=target,
        image=image,
        sparse=[(str(expand_dir(h)), s) for h, s in sparse],
        model=drift.model_facts(spec, lock, verify=verify),
    )
    found = engineroute.proposed(project, spec)
    fix = engineroute.missing_image(spec, image[0], found) if image and found else None
    checks = evaluate(spec, facts, target, fit_check(spec, lock, facts, os.environ), fix)
    compose_file = str(project.root / "compose" / name / "compose.yaml")
    checks += targetrows.rows(spec, targetrows.gather(host, target, compose_file), target)
    return name, checks + ([planned] if planned else [])


def go(checks: list[Check]) -> bool:
    """True when nothing is no-go."""
    return all(c.verdict != "no-go" for c in checks)


_STYLE = {"go": "green", "warn": "yellow", "no-go": "bold red"}


def table(checks: list[Check], title: str) -> Table:
    """The rich table."""
    t = Table(title=title, show_lines=False, expand=False)
    t.add_column("check", no_wrap=True)
    t.add_column("result", no_wrap=True)
    t.add_column("detail", overflow="fold")
    t.add_column("what to do", overflow="fold")
    for c in checks:
        t.add_row(c.name, f"[{_STYLE[c.verdict]}]{c.verdict}[/]", c.detail, c.hint or "")
    return t


def render(checks: list[Check], title: str, width: int = 160) -> str:
    """Plain-text table plus the verdict line (no colour), for logs and golden tests."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(table(checks, title))
    n = sum(c.verdict == "no-go" for c in checks)
    console.print("verdict: GO" if n == 0 else f"verdict: NO-GO ({n} check(s) failed)")
    return buf.getvalue()
