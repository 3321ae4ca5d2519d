"""What doctor checks on the podman that runs the artifacts: its version and features per target, the CDI spec
versions it reads, its init binary, OCI runtime and conmon, and the plan's image in its storage. Pure.
"""

from __future__ import annotations

from rigsmith.digits import ascii_digits
from rigsmith.imageref import parse_ref
from rigsmith.operating.checkrow import Check
from rigsmith.operating.doctor.drift import image_fix
from rigsmith.operating.probes import (
    DEFAULT_INIT_PATH,
    HELPER_DIRS,
    PACKAGES,
    PATH_DIRS,
    QUADLET_GENERATORS,
    HostFacts,
)
from rigsmith.spec import Deployment

#: podman release → newest CDI spec version its vendored CDI library accepts (runtime-facts §2.3, from
#: podman's go.mod/validSpecVersions). A newer spec is skipped *silently* ("unresolvable CDI devices").
PODMAN_CDI: tuple[tuple[str, str], ...] = (
    ("4.1.0", "0.4.0"),
    ("4.3.0", "0.5.0"),
    ("4.9.0", "0.6.0"),
    ("5.2.0", "0.8.0"),
    ("5.8.0", "1.0.0"),
)

#: Feature → first podman version that has it (runtime-facts §2, §3).
PODMAN_FEATURES: dict[str, str] = {
    "cdi-device": "4.1.0",  # --device vendor/class=name routed to CDI
    "quadlet": "4.4.0",  # systemd generator for .container units
    "kube-play": "4.2.0",  # `podman kube play` (before: `podman play kube`)
}

#: What each target needs from the podman that runs it (lxc runs no podman on this host).
TARGET_FEATURES: dict[str, tuple[str, ...]] = {
    "podman": ("cdi-device",),
    "quadlet": ("cdi-device", "quadlet"),
    "compose": ("cdi-device",),
    "kube": ("cdi-device", "kube-play"),
    "lxc": (),
}

#: Targets whose artifacts run the container with podman's --init (run.sh, quadlet RunInit, compose init);
#: kube's pod needs catatonit as its pause binary instead.
INIT_TARGETS = ("podman", "quadlet", "compose")

NVIDIA_CDI_HINT = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml, then `nvidia-ctk cdi list`"


def vtuple(v: str) -> tuple[int, ...]:
    """'4.3.1' → (4, 3, 1); junk parts count as 0."""
    return tuple(int(p) if ascii_digits(p) else 0 for p in v.split("-")[0].split("."))


def max_cdi_version(podman_version: str) -> str | None:
    """Newest CDI spec version the given podman reads (None: too old for CDI)."""
    best = None
    for since, cdi in PODMAN_CDI:
        if vtuple(podman_version) >= vtuple(since):
            best = cdi
    return best


def check_podman(spec: Deployment, facts: HostFacts, target: str) -> Check:
    v = facts.podman_version
    if target == "lxc":
        return Check("podman", "go", "target lxc runs no podman on this host")
    if v is None:
        return Check("podman", "no-go", "podman not found", "apt-get install podman (≥ 4.1 for CDI devices)")
    lacking = [
        f"{f} needs ≥ {PODMAN_FEATURES[f]}"
        for f in TARGET_FEATURES.get(target, ("cdi-device",))
        if vtuple(v) < vtuple(PODMAN_FEATURES[f])
    ]
    detail = f"podman {v}; target {target}"
    if lacking:
        return Check(
            "podman",
            "no-go",
            detail + f": {', '.join(lacking)}",
            "upgrade podman, or use --target podman (plain podman run)",
        )
    if target == "quadlet" and facts.binaries and not any(facts.binaries.get(g) for g in QUADLET_GENERATORS):
        return Check(
            "podman",
            "no-go",
            detail
            + f": no quadlet generator ({' or '.join(QUADLET_GENERATORS)}); systemd would find no unit",
            "install the distribution's full podman package (Debian ≥ 13: podman), or use --target podman",
        )
    if spec.podman_version and spec.podman_version != v:
        return Check(
            "podman",
            "warn",
            detail + f"; spec was written for podman {spec.podman_version}",
            "set podman_version in the spec to this host's version if you deploy here",
        )
    return Check("podman", "go", detail)


def _package(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return PACKAGES.get(name, name)


def check_init(facts: HostFacts, target: str) -> Check | None:
    if target not in (*INIT_TARGETS, "kube") or facts.podman_version is None:
        return None
    if target == "kube":
        found = [p for p in (f"{d}/catatonit" for d in (*HELPER_DIRS, *PATH_DIRS)) if facts.binaries.get(p)]
        if found:
            return Check("init binary", "go", f"pause binary for kube play: {found[0]}")
        return Check(
            "init binary",
            "no-go",
            "kube play needs catatonit as the pod's pause binary; none in podman's helper dirs or $PATH",
            "apt-get install catatonit (podman only Recommends it)",
        )
    path = facts.init_path or DEFAULT_INIT_PATH
    where = "containers.conf init_path" if facts.init_path else "podman's default init_path"
    if facts.binaries.get(path):
        return Check("init binary", "go", f"--init runs {path} ({where})")
    return Check(
        "init binary",
        "no-go",
        f"the artifacts run podman --init, and its init binary {path} ({where}) is missing: every start "
        "fails with 'container-init binary not found on the host'",
        f"apt-get install {_package(path)} (podman only Recommends it)"
        + ("" if facts.init_path else ", or set init_path in containers.conf to an installed catatonit/tini"),
    )


def check_helpers(facts: HostFacts, target: str) -> list[Check]:
    info = facts.podman_info
    if target == "lxc" or facts.podman_version is None or info is None:
        return []
    if info.error:
        return [
            Check(
                "OCI runtime",
                "no-go",
                f"podman info failed: {info.error}",
                "apt-get install runc conmon (or crun), then `podman info` must succeed",
            )
        ]
    out = []
    for row, name, path, pkg in (
        ("OCI runtime", info.runtime or "runtime", info.runtime_path, "runc"),
        ("conmon", "conmon", info.conmon_path, "conmon"),
    ):
        if path and facts.binaries.get(path):
            out.append(Check(row, "go", f"{name} at {path}"))
        else:
            out.append(
                Check(
                    row,
                    "no-go",
                    f"podman names {name} at {path or '?'}, which is missing",
                    f"apt-get install {_package(path) if path else pkg}",
                )
            )
    return out


def check_image(facts: HostFacts, fix: str | None = None) -> Check | None:
    """The image row; ``fix``: what to do when it is missing (default: pull it, or build it)."""
    img = facts.image
    if img is None:
        return None
    if img.present:
        if img.pinned and img.ref.startswith("sha256:"):
            return Check("image", "go", f"{img.ref} in local storage (the local build's image ID, as locked)")
        if img.pinned:
            return Check("image", "go", f"{img.ref} in local storage (pinned by rigsmith.lock)")
        if parse_ref(img.ref).registry == "localhost":
            # No registry serves a localhost/ name: presence is all there is to check (pin skips it too).
            return Check("image", "go", f"{img.ref} in local storage as {img.image_id} (local-only name)")
        return Check(
            "image",
            "warn",
            f"{img.ref} in local storage, NOT pinned by digest",
            "`invoke pin` locks its digest (`invoke build` for an engine.build image)",
        )
    return Check(
        "image",
        "no-go",
        f"{img.ref} is not in local storage" + (f" ({img.error})" if img.error else ""),
        fix or image_fix(img.ref),
    )
