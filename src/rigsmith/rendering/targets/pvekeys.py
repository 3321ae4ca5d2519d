"""Proxmox's pct.conf(5) keys as data, and the check of a config's ``key: value`` lines against them.

The tables are text in the layout of the man page (key, first PVE version, value pattern), so a reviewer
compares them with pct.conf(5) and pve-container's Config.pm line by line. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

Version = tuple[int, int]


def _rows(text: str, columns: int) -> list[list[str]]:
    """Whitespace-separated columns, the last one taking the rest of the line (a regex has no blanks)."""
    return [ln.split(maxsplit=columns - 1) for ln in text.strip().splitlines()]


def _since(text: str) -> Version:
    major, minor = text.split(".")
    return int(major), int(minor)


#: pct.conf(5) keys rigsmith may write: name → (value pattern, first PVE version). Indexed keys end in N.
PVE_KEYS: dict[str, tuple[str, Version]] = {
    key: (pattern, _since(since))
    for key, since, pattern in _rows(
        r"""
arch          4.0  amd64|i386|arm64|armhf|riscv32|riscv64
cores         4.0  [1-9]\d{0,3}
memory        4.0  \d+
swap          4.0  \d+
hostname      4.0  [a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?
ostype        4.0  debian|devuan|ubuntu|centos|fedora|opensuse|archlinux|alpine|gentoo|nixos|unmanaged
rootfs        4.0  [^,\s]+(,[a-z]+=[^,\s]+)*
mpN           4.0  [^,\s]+,mp=/[^,\s]*(,[a-z]+=[^,\s]+)*
devN          8.1  (path=)?/dev/[^,\s]+(,[a-z-]+=[^,\s]+)*
features      4.0  (force_rw_sys|fuse|keyctl|mknod|nesting)=[01](,(force_rw_sys|fuse|keyctl|mknod|nesting)=[01])*
startup       4.0  (order=)?\d+(,up=\d+)?(,down=\d+)?
onboot        4.0  [01]
unprivileged  4.0  [01]
""",
        3,
    )
}

#: pct.conf(5) keys a user's CT config may hold besides PVE_KEYS (rigsmith never writes them): key → value.
PVE_USER_KEYS: dict[str, str] = dict(
    (key, pattern)
    for key, pattern in _rows(
        r"""
netN          \S+
description   .*
tags          [^\s]*
lock          backup|create|destroyed|disk|fstrim|migrate|mounted|rollback|snapshot|snapshot-delete
cmode         shell|console|tty
console       [01]
tty           \d
protection    [01]
template      [01]
timezone      \S+
nameserver    .+
searchdomain  .+
hookscript    \S+
cpulimit      \d+(\.\d+)?
cpuunits      \d+
parent        \S+
unusedN       \S+
""",
        2,
    )
)

#: Raw keys PVE passes to liblxc (Config.pm whitelist plus the lxc.cgroup2.*/lxc.prlimit.* families).
RAW_ALLOWED = re.compile(
    r"^lxc\.(mount\.entry|environment|hook\.pre-start|cgroup2\.[a-z0-9_.]+|prlimit\.[a-z]+)$"
)
_IDMAP_KEYS = re.compile(r"^lxc\.(idmap|apparmor\.profile|cap\.(drop|keep)|autodev|mount\.auto|hook\.\w+)$")


def check(lines_: Sequence[tuple[str, str]], pve: Version, user_keys: bool = False) -> list[str]:
    """Problems with (key, value) pairs against pct.conf(5) and PVE's raw-key whitelist.

    ``user_keys`` also accepts the keys of a user's own CT config that rigsmith never writes (net0, tags,
    idmap lines…), for checking a merged config as a whole.
    """
    bad = []
    for key, value in lines_:
        name = re.sub(r"\d+$", "N", key) if re.match(r"^(mp|dev|net|unused)\d+$", key) else key
        if user_keys and (name in PVE_USER_KEYS or _IDMAP_KEYS.match(key)):
            if name in PVE_USER_KEYS and not re.fullmatch(PVE_USER_KEYS[name], value):
                bad.append(f"{key}: {value!r} does not match pct.conf(5)")
            continue
        if key.startswith("lxc."):
            if not RAW_ALLOWED.match(key):
                bad.append(f"{key}: not a raw key PVE passes to liblxc")
            continue
        if name not in PVE_KEYS:
            bad.append(f"{key}: not a pct.conf key")
            continue
        pattern, since = PVE_KEYS[name]
        if pve < since:
            bad.append(f"{key}: needs PVE {since[0]}.{since[1]}")
        if not re.fullmatch(pattern, value):
            bad.append(f"{key}: {value!r} does not match pct.conf(5)")
    return bad
