"""`mount` datasets: Cloud Storage FUSE on the nodes. Pure: the install script (Google's apt
repository, as its install docs give it) and the mount command (read-only, `--only-dir` for the
prefix, the file cache on local SSD when one is mounted). gcsfuse cannot run where the tests run:
these strings are checked against the documentation only (docs/guides/data-and-outputs.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from infra.datasets import NODE_DATA_DIR, Dataset
from infra.scratch import SCRATCH_MOUNT
from scripts.node_layout import NODE_ROOT_SH

#: Google's package repository for gcsfuse (one suite per Ubuntu/Debian codename)
GCSFUSE_APT_REPO = "https://packages.cloud.google.com/apt"
GCSFUSE_APT_KEY = "https://packages.cloud.google.com/apt/doc/apt-key.gpg"
GCSFUSE_KEYRING = "/usr/share/keyrings/cloud.google.asc"


def gcsfuse_install_script() -> str:
    """Installs fuse + gcsfuse from Google's repository where the image lacks it (idempotent:
    a no-op when `gcsfuse` is on PATH). Runs as root (sudo -n on the stack's VMs)."""
    return f"""set -e
command -v gcsfuse >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
CODENAME=$(lsb_release -c -s 2>/dev/null || (. /etc/os-release && echo "$VERSION_CODENAME"))
curl -fsSL {GCSFUSE_APT_KEY} -o {GCSFUSE_KEYRING}
echo "deb [signed-by={GCSFUSE_KEYRING}] {GCSFUSE_APT_REPO} gcsfuse-$CODENAME main" > /etc/apt/sources.list.d/gcsfuse.list
apt-get update -qq
apt-get install -y -qq fuse gcsfuse
"""


#: every mount: read-only, implicit directories (objects written without folder placeholders)
GCSFUSE_OPTIONS = ("-o", "ro", "--implicit-dirs")
#: with local SSD: the file cache there, unbounded, reads of a part of a file cached too. The
#: range-read flag is a bool flag: its value goes after `=` (a separate `true` is a third
#: positional, and gcsfuse refuses the mount: it takes 2 to 3 arguments, cmd/root.go)
GCSFUSE_CACHE_OPTIONS = (
    "--file-cache-max-size-mb", "-1", "--file-cache-cache-file-for-range-read=true",
)  # fmt: skip
#: the file-cache flags exist from gcsfuse 2.5.0 (cfg/params.yaml; absent at v2.4.0)
GCSFUSE_CACHE_SINCE = (2, 5)


def build_mount_command(datasets: Sequence[Dataset], *, install: bool) -> str:
    """On a node: install gcsfuse (stack VMs only: `install`), then mount each dataset's prefix
    (`--only-dir`) at its data path unless something is mounted there already; the file cache
    goes to the local SSD when one is mounted at SCRATCH_MOUNT and gcsfuse is new enough for its
    flags (else it says it mounts without the cache). Without gcsfuse it fails naming
    what to do. Pure."""
    q = shlex.quote
    opts = " ".join(q(o) for o in GCSFUSE_OPTIONS)
    cache = " ".join(q(o) for o in GCSFUSE_CACHE_OPTIONS)
    major, minor = GCSFUSE_CACHE_SINCE
    lines = ["set -e", f"ROOT={NODE_ROOT_SH}"]
    if install:
        lines.append(f"sudo -n sh -c {q(gcsfuse_install_script())}")
    lines += [
        "command -v gcsfuse >/dev/null 2>&1 || { echo 'gcsfuse is not installed on this "
        "machine: install Cloud Storage FUSE there, or use :copy'; exit 1; }",
        # `gcsfuse --version` prints "gcsfuse version 2.5.1 (Go version go1.23.0)"
        "V=$(gcsfuse --version 2>/dev/null | head -n 1 | sed -n 's/.*version \\([0-9][0-9.]*\\).*/\\1/p')",
        "MAJOR=${V%%.*}; MINOR=${V#*.}; MINOR=${MINOR%%.*}",
        f"CACHE=; if mountpoint -q {SCRATCH_MOUNT}; then",
        f'  if [ -n "$V" ] && {{ [ "$MAJOR" -gt {major} ] || {{ [ "$MAJOR" -eq {major} ] && '
        f'[ "$MINOR" -ge {minor} ]; }}; }}; then CACHE={SCRATCH_MOUNT}/gcsfuse-cache',
        f'  else echo "gcsfuse ${{V:-of unknown version}} is older than {major}.{minor} (no file-cache '
        'flags): mounting without the cache on local SSD"; fi',
        "fi",
        "mount_one() {  # NAME BUCKET [gcsfuse options]",
        f'  mp="$ROOT/{NODE_DATA_DIR}/$1"; b=$2; shift 2; mkdir -p "$mp"',
        '  if mountpoint -q "$mp"; then echo "$mp: mounted already"; return 0; fi',
        f'  if [ -n "$CACHE" ]; then mkdir -p "$CACHE/$(basename "$mp")"; set -- "$@" '
        f'--cache-dir "$CACHE/$(basename "$mp")" {cache}; fi',
        f'  gcsfuse {opts} "$@" "$b" "$mp"',
        "}",
    ]
    for d in datasets:
        only = f" --only-dir {q(d.prefix.rstrip('/'))}" if d.prefix else ""
        lines.append(f"mount_one {q(d.name)} {q(d.bucket)}{only}")
    return "\n".join(lines) + "\n"
