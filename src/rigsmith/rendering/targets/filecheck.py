"""The check every target runs for a file mount before its container starts (seeds/000 pitfall 2). Pure."""

from __future__ import annotations

from rigsmith.rendering.plan import RunPlan

#: What every target runs for a file mount before its container starts (seeds/000 pitfall 2) — run.sh, the
#: quadlet unit's ``ExecStartPre=``, compose's files.sh, the lxc CT's ``lxc.hook.pre-start`` — as one
#: ``sh -c`` with the path and size (0: no size) as arguments, never in the script text: podman makes a
#: directory for a missing path, and a file of another size is the stale file the patched loader rejects. A
#: third argument, when not empty, is the ``uid:gid`` a created file is given (the lxc target's CT root, so an
#: unprivileged CT can write it).
FILE_CHECK = " ".join(
    [
        'f=$1 n=$2; if [ -d "$f" ]; then echo "$f is a directory, but the deployment mounts a file there:',
        'remove the directory (podman makes one for a missing path)" >&2; exit 1; fi;',
        'if [ ! -e "$f" ]; then if [ "$n" = 0 ]; then echo "$f does not exist: create the file the engine',
        'reads (never a directory)" >&2; exit 1; fi; mkdir -p "$(dirname "$f")" && truncate -s "$n" "$f"',
        '&& { [ -z "${3:-}" ] || chown "$3" "$f"; }',
        '&& echo "created sparse file $f ($n bytes)"; exit; fi;',
        'if [ ! -f "$f" ]; then echo "$f is not a regular file, but the deployment mounts a file there" >&2;',
        "exit 1; fi;",
        'if [ "$n" != 0 ] && [ "$(stat -c %s "$f")" != "$n" ]; then echo "$f has the wrong size; the engine',
        'needs exactly $n bytes: move it aside (it is then re-created sparse)" >&2; exit 1; fi',
    ]
)


def file_checks(plan: RunPlan) -> list[list[str]]:
    """One argv per file mount, run before the container starts (quadlet's ``ExecStartPre=``, compose's
    files.sh): a file of exactly ``sparse_size`` bytes (created sparse when missing), or any existing file
    when the spec gives no size (0)."""
    return [
        ["/bin/sh", "-c", FILE_CHECK, "rigsmith-file-check", m.host, str(m.sparse_size or 0)]
        for m in plan.mounts
        if m.kind == "file"
    ]
