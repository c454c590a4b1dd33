"""Ship the code to the nodes: which files (respecting .gitignore), how big, only what changed —
and all of that once per launch, not once per node (CodeBundle). And ENTRY against what the upload
will hold, before anything is created: a script or module that is not there is refused (not found
after a cluster boot in 30 lines of torchrun traceback), and a data path ENTRY names that the
upload leaves out (ignored by git, a secret) is warned about."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain_node import contract
from infra.base.errors import UserError
from scripts import ui
from scripts.node_layout import CODE_DIR, NODE_STATE
from scripts.settings import RESULTS_MARKER
from scripts.transport.base import Transport, TransportError
from scripts.transport.tar import Codec, tar_files, untar_command

if TYPE_CHECKING:
    import pathspec


DEFAULT_MAX_UPLOAD_MIB = 200
SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "runs",
    NODE_STATE,
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "node_modules",
}
MANIFEST = ".gputrain-manifest.json"
DELETE_LIST = ".gputrain-delete"
RUN_SCRIPT = ".gputrain-run.sh"  # a launch's run.sh: its bundle carries it, the start runs it


@dataclass(frozen=True)
class UploadPlan:
    """What to send to one node: changed files, files to delete there, the new manifest."""

    send: tuple[str, ...]
    delete: tuple[str, ...]
    manifest: Mapping[str, str]


def list_workdir_files(workdir: Path) -> list[str]:
    """Files to ship, relative to workdir: git's view (tracked + untracked, not ignored) in a git
    repo, else a walk that skips VCS, virtualenv, cache and run directories. Symbolic links are
    listed too (never_upload names them: they are not followed)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(workdir), "ls-files", "-z", "-co", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        # A node's own state (`--local` keeps it under runs/) is never code, ignored by git or not.
        files = [f for f in out.decode().split("\0") if f and NODE_STATE not in f.split("/")]
        return sorted(f for f in files if (workdir / f).is_file() or (workdir / f).is_symlink())
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
        pass
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(workdir):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not (Path(dirpath) / d / RESULTS_MARKER).exists()  # results, wherever they are
        )
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if (p.is_file() or p.is_symlink()) and not fn.endswith(".pyc"):
                found.append(str(p.relative_to(workdir)))
    return found


def results_dirs(files: list[str] | Mapping[str, Path]) -> set[str]:
    """gputrain's own results directories among the listed files ("runs/"): the one holding
    RESULTS_MARKER, or `<dir>/<target>/LAST_RUN` as runs before the marker left them."""
    found = set()
    for rel in files:
        parts = rel.split("/")
        if parts[-1] == RESULTS_MARKER:
            found.add("/".join(parts[:-1]) + "/")
        elif parts[-1] == "LAST_RUN" and len(parts) >= 3:
            found.add("/".join(parts[:-2]) + "/")
    return found


def collect_sources(workdir: Path, packages: Mapping[str, Path] | None = None) -> dict[str, Path]:
    """relative path on the node -> local file. ``packages`` (e.g. {"trainer": <dir>}) are added
    under their name unless the workdir already has them. gputrain's own results (runs/),
    secrets, symbolic links and what `.gputrainignore` matches are left out, and named in one
    line."""
    files = {rel: workdir / rel for rel in list_workdir_files(workdir)}
    for name, pkg_dir in (packages or {}).items():
        if any(rel.startswith(name + "/") for rel in files) or not pkg_dir.is_dir():
            continue
        for rel in list_workdir_files(pkg_dir):
            files[f"{name}/{rel}"] = pkg_dir / rel
    for rel in files:
        if "\n" in rel or "\0" in rel:
            raise UserError(f"cannot upload a file whose name holds a newline: {rel!r}")
    results = results_dirs(files)
    in_results = {rel for rel in files if any(rel.startswith(d) for d in results)}
    if in_results:
        ui.say(
            f"upload: not sending {', '.join(sorted(results))} ({len(in_results)} file(s): "
            "gputrain's own results, never code; add it to .gitignore)"
        )
    files = {rel: p for rel, p in files.items() if rel not in in_results}
    skipped = never_upload(files, workdir)
    if skipped:
        shown = ", ".join(f"{rel} ({why})" for rel, why in sorted(skipped.items()))
        ui.say(f"upload: not sending {len(skipped)} file(s): {shown}")
    return {rel: p for rel, p in files.items() if rel not in skipped}


IGNORE_FILE = ".gputrainignore"

#: Whole file names (lower case) that hold credentials, whatever their contents.
SECRET_NAMES: dict[str, str] = {
    ".netrc": "netrc credentials",
    "_netrc": "netrc credentials",
    ".git-credentials": "git credentials",
    ".pgpass": "PostgreSQL passwords",
    ".pypirc": "PyPI credentials",
    ".npmrc": "npm credentials",
    ".dockercfg": "Docker credentials",
    ".boto": "cloud credentials",
    ".s3cfg": "cloud credentials",
    "kubeconfig": "kubeconfig",
    ".htpasswd": "passwords",
    "credentials.db": "cloud credentials",
    "access_tokens.db": "cloud credentials",
    "legacy_credentials": "cloud credentials",
    "secrets.toml": "secrets file (Streamlit-style)",
    ".secrets.toml": "secrets file",
    "stored_tokens": "Hugging Face tokens",
}
#: Path endings (lower case) that hold credentials: a tool's config directory and its file.
SECRET_PATHS: dict[str, str] = {
    ".aws/credentials": "AWS credentials",
    ".kube/config": "kubeconfig",
    ".docker/config.json": "Docker credentials",
    ".config/gh/hosts.yml": "GitHub CLI token",
    "huggingface/token": "Hugging Face token",
    ".huggingface/token": "Hugging Face token",
}
#: Suffixes (lower case) of key and keystore formats.
SECRET_SUFFIXES: dict[str, str] = {
    ".pem": "key file",
    ".key": "key file",
    ".ppk": "PuTTY private key",
    ".p12": "key store",
    ".pfx": "key store",
    ".jks": "key store",
    ".keystore": "key store",
    ".kdbx": "password database",
    ".gpg": "GnuPG file",
    ".tfstate": "Terraform state (holds secrets)",
    ".kubeconfig": "kubeconfig",
    ".env": "environment file",
}
#: Contents anywhere in a file (checked over the whole file, streaming), case-insensitive: a
#: literal every match contains (found fast in the lowered chunk), then the pattern itself.
SECRET_CONTENTS: tuple[tuple[bytes, re.Pattern[bytes], str], ...] = (
    (
        b"private key",
        re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----", re.I),
        "holds a private key",
    ),
    (b"putty-user-key-file-", re.compile(rb"PuTTY-User-Key-File-\d+:", re.I), "holds a PuTTY key"),
    (
        b"aws_secret_access_key",
        re.compile(rb"aws_secret_access_key\s*[=:]", re.I),
        "AWS credentials",
    ),
    (
        b"-data",
        re.compile(rb"^\s*(?:client-key-data|client-certificate-data)\s*:", re.I | re.M),
        "kubeconfig",
    ),
    # OAuth: a token file (google-auth's token.json: refresh_token with no "type") or a client
    # secret (client_secret*.json), a non-empty value in JSON or YAML
    (
        b"refresh_token",
        re.compile(rb"[\"']?refresh_token[\"']?\s*[:=]\s*[\"'][^\"'\s]{8,}", re.I),
        "OAuth token",
    ),
    (
        b"client_secret",
        re.compile(rb"[\"']?client_secret[\"']?\s*[:=]\s*[\"'][^\"'\s]{8,}", re.I),
        "OAuth client secret",
    ),
    # a Hugging Face access token (hf_ and 34 letters and digits), in any file
    (
        b"hf_",
        re.compile(rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,40}(?![A-Za-z0-9_])"),
        "Hugging Face token",
    ),
    # a shell file exporting a literal credential: export OPENAI_API_KEY=sk-... (not =$OTHER,
    # not MAX_TOKENS=512)
    (
        b"export",
        re.compile(
            rb"^\s*export\s+[A-Za-z0-9_]*(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|PASSWORD|PASSWD"
            rb"|ACCESS_KEY)\s*=\s*[\"']?[^\s\"'$`(]{8,}",
            re.I | re.M,
        ),
        "exports a credential",
    ),
)
#: Google credentials: their "type" and a field holding the secret, both in one file (a text that
#: only names the types, like this project's README, is none).
_GOOGLE_TYPE = re.compile(
    rb'"type"\s*:\s*"(?:service_account|authorized_user|external_account'
    rb"|external_account_authorized_user|impersonated_service_account|gdch_service_account)\"",
    re.I,
)
_GOOGLE_SECRET = re.compile(
    rb'"(?:client_secret|refresh_token|private_key(?:_id)?|credential_source|source_credentials'
    rb'|service_account_impersonation_url)"\s*:',
    re.I,
)
_OVERLAP = 4096  # bytes kept between chunks so a match across a chunk boundary is still seen
_CHUNK = 1 << 20


def never_upload(files: Mapping[str, Path], workdir: Path) -> dict[str, str]:
    """relative path -> why it must not leave this machine: symbolic links (never followed),
    well-known credential files and key formats by name (case-insensitive), any file whose
    contents hold a private key or credentials, and what `.gputrainignore` matches."""
    spec = _ignore_spec(workdir / IGNORE_FILE)
    out = {}
    for rel, path in files.items():
        why = _secret_reason(rel, path)
        if why is None and spec is not None and spec.match_file(rel):
            why = IGNORE_FILE
        if why is not None:
            out[rel] = why
    return out


def _secret_reason(rel: str, path: Path) -> str | None:
    if path.is_symlink():
        return "symbolic link, not followed"
    low = rel.lower()
    name = low.rsplit("/", 1)[-1]
    if name.startswith("id_") and "." not in name:
        return "SSH private key"
    if name in SECRET_NAMES:
        return SECRET_NAMES[name]
    for ending, why in SECRET_PATHS.items():
        if low == ending or low.endswith("/" + ending):
            return why
    if name.startswith("client_secret") and name.endswith(".json"):
        return "OAuth client secret"
    if name.startswith((".env", "application_default_credentials")) or "credentials.json" in name:
        return "environment file" if name.startswith(".env") else "Google credentials"
    for suffix, why in SECRET_SUFFIXES.items():
        if name.endswith(suffix) or f"{suffix}." in name:  # server.key.bak, prod.env.old too
            return why
    return scan_contents(path)


def scan_contents(path: Path) -> str | None:
    """The first SECRET_CONTENTS match over the whole file, read in chunks; None if none (or the
    file cannot be read: the upload then fails on it, naming it)."""
    tail = b""
    google_type = google_secret = False
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                window = tail + chunk
                low = window.lower()
                for needle, pattern, why in SECRET_CONTENTS:
                    if needle in low and pattern.search(window):
                        return why
                if b'":' in low or b'" :' in low:
                    google_type = google_type or bool(_GOOGLE_TYPE.search(window))
                    google_secret = google_secret or bool(_GOOGLE_SECRET.search(window))
                    if google_type and google_secret:
                        return "Google credentials"
                tail = window[-_OVERLAP:]
    except OSError:
        return None
    return None


def _ignore_spec(path: Path) -> pathspec.GitIgnoreSpec | None:
    import pathspec

    try:
        return pathspec.GitIgnoreSpec.from_lines(path.read_text().splitlines())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(
            f"{path}: cannot read it ({e}); allowed: a gitignore-style text file"
        ) from e


def check_size(files: Mapping[str, Path], limit_mib: float, workdir: Path) -> int:
    """Total bytes; UserError naming the limit and the biggest files when above it."""
    sizes = {rel: p.stat().st_size for rel, p in files.items()}
    total = sum(sizes.values())
    if total > limit_mib * 1024 * 1024:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        listing = ", ".join(f"{rel} ({b / 1048576:.1f} MiB)" for rel, b in biggest)
        raise UserError(
            f"upload size: the code in {workdir} is {total / 1048576:.1f} MiB, above the limit of "
            f"{limit_mib:g} MiB; biggest files: {listing}. Add them to .gitignore or raise the "
            "limit (max_upload_mib)."
        )
    return total


def hash_files(files: Mapping[str, Path]) -> dict[str, str]:
    out = {}
    for rel, p in sorted(files.items()):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        # the mode matters too (scripts must stay executable)
        out[rel] = f"{h.hexdigest()[:32]}:{oct(p.stat().st_mode & 0o777)}"
    return out


def plan_upload(local: Mapping[str, str], remote: Mapping[str, str]) -> UploadPlan:
    """Pure: send what is new or changed, delete what is gone."""
    send = tuple(sorted(rel for rel, h in local.items() if remote.get(rel) != h))
    delete = tuple(sorted(rel for rel in remote if rel not in local))
    return UploadPlan(send, delete, dict(local))


def parse_manifest(text: str) -> dict[str, str]:
    """A node's manifest file as read back (empty: nothing there, or not a manifest)."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


class CodeBundle:
    """The code of one launch, made once and not once per node: the files (relative path on the
    node -> local file) hashed once, and each distinct upload plan's gzip'd tar built once —
    every fresh node, and every node holding the same older code, gets the very same bytes.

    A payload carries the changed files and control files: the new manifest (kept, so the next
    upload sends only what changed), the delete list, and a launch's run.sh (RUN_SCRIPT)."""

    def __init__(self, files: Mapping[str, Path], run_script: str | None = None) -> None:
        self.files = dict(files)
        self.manifest = hash_files(self.files)
        self.run_script = run_script
        self._payloads: dict[tuple[tuple[str, ...], tuple[str, ...], Codec], bytes] = {}
        self._lock = threading.Lock()

    def plan(self, remote_manifest: str) -> UploadPlan:
        """What a node whose manifest file reads ``remote_manifest`` needs."""
        return plan_upload(self.manifest, parse_manifest(remote_manifest))

    def payload(self, plan: UploadPlan, codec: Codec = "gzip") -> bytes:
        """The bytes for ``plan``, built on first use (nodes ask from many threads)."""
        key = (plan.send, plan.delete, codec)
        with self._lock:
            if key not in self._payloads:
                control = {MANIFEST: json.dumps(plan.manifest, sort_keys=True).encode()}
                if plan.delete:  # none: no list, and no process at the node to remove it
                    control[DELETE_LIST] = b"".join(rel.encode() + b"\0" for rel in plan.delete)
                if self.run_script is not None:
                    control[RUN_SCRIPT] = self.run_script.encode()
                self._payloads[key] = tar_files(
                    {rel: self.files[rel] for rel in plan.send}, control, compress=codec
                )
            return self._payloads[key]


def read_manifest_command(remote_dir: str = CODE_DIR) -> str:
    """At the node: print the manifest of the code in remote_dir (nothing, and no process, if
    there is none: a fresh node)."""
    m = shlex.quote(f"{remote_dir}/{MANIFEST}")
    return f"[ ! -f {m} ] || cat {m} 2>/dev/null; true"


def unpack_command(
    remote_dir: str = CODE_DIR, *, also_make: tuple[str, ...] = (), codec: Codec = "gzip"
) -> str:
    """At the node: unpack a CodeBundle payload (made with ``codec``) from stdin into remote_dir
    and apply its delete list (a run.sh it carries stays for the start to run); `also_make`:
    more directories the same mkdir makes (every process counts when 64 nodes share a launch)."""
    d = shlex.quote(remote_dir)
    dirs = " ".join(shlex.quote(x) for x in (NODE_STATE, remote_dir, *also_make))
    return (  # umask 077 and a 0700 .gputrain (made so, or made so again where it was there):
        # what gputrain writes there is the user's alone
        f"umask 077 && {{ [ ! -d {NODE_STATE} ] || chmod 700 {NODE_STATE}; }} && "
        f"mkdir -p {dirs} && {untar_command(d, codec)} && "
        f"if [ -e {d}/{DELETE_LIST} ]; then (cd {d} && xargs -0 rm -f -- < {DELETE_LIST} && "
        f"rm -f {DELETE_LIST}); fi"
    )


def sync_code(
    transport: Transport, files: Mapping[str, Path], *, remote_dir: str = CODE_DIR
) -> UploadPlan:
    """Bring remote_dir on one node in line with files, sending only what changed since the last
    upload (a launch does the same for every node with one bundle: scripts/job/launch.py)."""
    bundle = CodeBundle(files)
    r = transport.run(read_manifest_command(remote_dir), timeout=60)
    plan = bundle.plan(r.stdout if r.ok else "")
    r = transport.run(unpack_command(remote_dir), timeout=600, stdin=bundle.payload(plan))
    if not r.ok:
        raise TransportError(f"node {transport.name}: upload failed: {r.stderr.strip()}")
    return plan


BUNDLED = ("trainer",)  # packages the upload adds itself (job.include_trainer)


def check_entry(entry: Sequence[str], workdir: Path, *, node_is_here: bool = False) -> None:
    """UserError for an ENTRY script or module the nodes will not have; a warning for each path
    an argument names that exists here but stays out of the upload. `node_is_here`: the node is
    this machine's Python with nothing installed for the run (`--local`, no image, no
    requirements or setup), so a module it cannot find here is refused, not warned of."""
    listed = set(list_workdir_files(workdir))
    if not entry:
        return
    if contract.is_node_entry(entry):  # gputrain's own copy runs it, never the user's code
        args = entry[2:]
    elif entry[0] == "-m":
        if len(entry) < 2 or not entry[1]:
            raise UserError("ENTRY -m: give the module to run, e.g. -m trainer.train")
        _check_module(entry[1], workdir, listed, node_is_here)
        args = entry[2:]
    else:
        if not entry[0].startswith("/"):
            _check_file(entry[0], workdir, listed, what=f"ENTRY {entry[0]}")
        args = entry[1:]
    for arg in args:
        for value in {arg, arg.partition("=")[2]} - {""}:
            _warn_left_out(value, workdir, listed)


def _left_out(rel: str, workdir: Path, listed: set[str]) -> str | None:
    """Why this local file stays home, or None when the upload sends it."""
    if rel not in listed:
        if (workdir / ".git").exists():
            return "ignored by .gitignore"
        return "in a directory the upload skips (VCS, virtualenv, cache or runs)"
    return never_upload({rel: workdir / rel}, workdir).get(rel)


def _check_file(rel: str, workdir: Path, listed: set[str], *, what: str) -> None:
    """UserError unless `rel` (as given: `train.py/` is no file) is a file the upload sends."""
    if os.path.normpath(rel).split(os.sep)[0] == os.pardir:
        raise UserError(
            f"{what}: outside {workdir} (the directory that is uploaded); the nodes would not "
            "have it"
        )
    if not os.path.isfile(os.path.join(workdir, rel)):  # False for a name too long, too
        raise UserError(f"{what}: no such file in {workdir} (the directory that is uploaded)")
    rel = os.path.normpath(rel)
    why = _left_out(rel, workdir, listed)
    if why is not None:
        raise UserError(
            f"{what}: it is left out of the upload ({why}); the nodes would not have it"
        )


def _check_module(module: str, workdir: Path, listed: set[str], node_is_here: bool) -> None:
    parts = module.split(".")
    top = parts[0]
    if top in BUNDLED:
        return
    local = workdir / top
    if not (os.path.isdir(local) or os.path.isfile(workdir / f"{top}.py")):
        if importlib.util.find_spec(top) is not None:
            return
        if node_is_here:
            raise UserError(
                f"ENTRY -m {module}: not in {workdir} and not installed in {sys.executable}, "
                "the Python --local runs it with; allowed: a module in the project or one "
                "installed there"
            )
        ui.warn(
            f"ENTRY -m {module}: not in {workdir} and not installed here; it must be "
            "installed on the nodes"
        )
        return
    path = "/".join(parts)
    for candidate in (f"{path}.py", f"{path}/__main__.py", f"{path}/__init__.py"):
        if os.path.isfile(workdir / candidate):
            _check_file(candidate, workdir, listed, what=f"ENTRY -m {module}")
            return
    raise UserError(
        f"ENTRY -m {module}: no {path}.py or {path}/__main__.py in {workdir} (the directory that "
        "is uploaded)"
    )


def _warn_left_out(value: str, workdir: Path, listed: set[str]) -> None:
    if value.startswith(("-", "/", "~")) or "{out}" in value or "\n" in value:
        return
    try:
        path = workdir / value
        if not path.exists():
            return
        rel = str(path.resolve().relative_to(workdir.resolve()))
    except (OSError, ValueError):
        return
    if path.is_dir():
        inside = [f for f in listed if f.startswith(rel.rstrip("/") + "/")]
        if inside or not any(p.is_file() for p in path.rglob("*")):
            return
        why = "every file in it is ignored by .gitignore"
    else:
        why = _left_out(rel, workdir, listed) or ""
        if not why:
            return
    ui.warn(
        f"ENTRY names {value}, which the upload leaves out ({why}): it will not be on the nodes "
        "(add it to the upload, or put the data on the nodes and give its path there)"
    )
