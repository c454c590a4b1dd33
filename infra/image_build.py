"""`build: PATH/TO/Dockerfile`: what is built and where it goes, without building anything.

The build context is the Dockerfile's directory (less what its `.dockerignore` excludes); the tag is
a hash of that context (every file's path, mode and bytes, and the Dockerfile), so an unchanged
context is found in the registry and never rebuilt. The image lives in the stack's own Artifact
Registry repository: REGION-docker.pkg.dev/PROJECT/gputrain-STACK/NAME:ctx-HASH. Also the request
body Cloud Build gets and the tarball it builds from. Reads files; talks to nothing.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.stackfile import SpecError

#: Artifact Registry's Docker hosts are per region: us-central1-docker.pkg.dev
REGISTRY_SUFFIX = "-docker.pkg.dev"
TAG_PREFIX = "ctx-"
DOCKERIGNORE = ".dockerignore"
#: Cloud Build's own builder image with the docker CLI (its documented `docker build` step)
DOCKER_BUILDER = "gcr.io/cloud-builders/docker"
BUILD_TIMEOUT_S = 3600
#: What every image gputrain builds runs on: the x86-64 VMs of every series it offers (A2, A3,
#: A4, G2, N1: Intel CPU platforms, cloud.google.com/compute/docs/cpu-platforms) and Cloud Run
#: (the reconcile job: linux/amd64 images). A laptop of another architecture (an Apple silicon
#: Mac) would otherwise build an image for itself that no node can run. Documentation only.
PLATFORM = "linux/amd64"
#: The repository's Pulumi type (infra/components/registry.py): `run --keep-images` keeps it.
REPOSITORY_TYPE = "gcp:artifactregistry/repository:Repository"


def repository_id(stack: str) -> str:
    """The stack's Docker repository in Artifact Registry (a-z, 0-9, -; stack names fit)."""
    return f"gputrain-{stack}"


def registry_host(region: str) -> str:
    return f"{region}{REGISTRY_SUFFIX}"


def repository_path(region: str, project: str, stack: str) -> str:
    """Where the stack's images go: REGION-docker.pkg.dev/PROJECT/REPOSITORY."""
    return f"{registry_host(region)}/{project}/{repository_id(stack)}"


@dataclass(frozen=True)
class BuildContext:
    """A Dockerfile and what `docker build` would be sent."""

    dockerfile: Path  # absolute
    files: tuple[str, ...]  # relative to the directory, sorted, '/' separated; the Dockerfile too
    tag: str  # ctx-<16 hex>: the content hash
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) left out: links, secrets (`exclude`)

    @property
    def directory(self) -> Path:
        return self.dockerfile.parent

    @property
    def name(self) -> str:
        """The image's name in the repository: the context directory's, as a registry allows."""
        name = re.sub(r"[^a-z0-9._-]+", "-", self.directory.name.lower()).strip("._-")
        return name or "image"


#: What a caller may leave out of a context besides `.dockerignore`: {path: local file} ->
#: {path: why} (the controller passes its upload filter: secrets never reach a build).
Exclude = Callable[[Mapping[str, Path]], Mapping[str, str]]


def dockerfile_in_project(path: str, base: Path, setting: str) -> Path:
    """The Dockerfile `path` (relative to `base`, the project directory), resolved; SpecError
    (one line naming `setting`) when it is not there or not inside the project."""
    project = base.resolve()
    dockerfile = (base / path).resolve()
    if not dockerfile.is_relative_to(project):
        raise SpecError(
            f"{setting} = {path!r}: {dockerfile} is outside the project ({project}); allowed: "
            "the path of a Dockerfile inside the project directory"
        )
    if not dockerfile.is_file():
        raise SpecError(
            f"{setting} = {path!r}: no such file ({dockerfile}); allowed: the path of a "
            "Dockerfile, relative to the project directory"
        )
    return dockerfile


def read_context(
    path: str, base: Path, setting: str, exclude: Exclude | None = None
) -> BuildContext:
    """The Dockerfile `path` (relative to `base`, the project directory) and its context;
    SpecError (one line naming `setting`) for a Dockerfile that is not there or not inside the
    project (symbolic links resolved). Symbolic links in the context are never followed."""
    dockerfile = dockerfile_in_project(path, base, setting)
    directory = dockerfile.parent
    ignore_file = directory / DOCKERIGNORE
    where = f"{setting} = {path!r}: {os.path.relpath(ignore_file, base)}"
    rules = parse_dockerignore(_read_text(ignore_file), where)
    own = dockerfile.relative_to(directory).as_posix()
    found, links = _walk(directory)
    files = {f for f in found if f == own or not ignored(f, rules)}
    skipped = {f: "symbolic link, not followed" for f in links if not ignored(f, rules)}
    if exclude is not None:
        others = {f: directory / f for f in files if f != own}
        skipped.update(exclude(others))
    kept = sorted((files - skipped.keys()) | {own})
    return BuildContext(
        dockerfile,
        tuple(kept),
        context_tag(_entries(directory, kept)),
        tuple(sorted(skipped.items())),
    )


def context_tag(entries: Iterable[tuple[str, int, bytes]]) -> str:
    """ctx-<16 hex> over the platform and (path, executable bit, bytes) of every file: what
    `docker build` sees and what changes the image. Timestamps and owners do not count. (Version
    2: built for PLATFORM; a tag of version 1 may hold an image of the builder's own platform.)"""
    h = hashlib.sha256(f"gputrain-build 2\0{PLATFORM}\0".encode())
    for rel, mode, data in sorted(entries):
        h.update(f"{rel}\0{1 if mode & 0o111 else 0}\0{len(data)}\0".encode())
        h.update(data)
    return TAG_PREFIX + h.hexdigest()[:16]


def context_tarball(ctx: BuildContext) -> bytes:
    """The context as a gzipped tar for Cloud Build (fixed owners and times: the same context
    gives the same bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, mode, data in _entries(ctx.directory, ctx.files):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o755 if mode & 0o111 else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_context(ctx: BuildContext, dest: Path) -> None:
    """The context's files under `dest` as the tarball holds them (modes 0755/0644): what a local
    docker builds from, since docker itself would read the directory with .dockerignore only."""
    for rel, mode, data in _entries(ctx.directory, ctx.files):
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if mode & 0o111 else 0o644)


def cloud_build_request(
    image: str,
    bucket: str,
    object_name: str,
    *,
    stack: str,
    project: str,
    account: str,
    dockerfile: str = "Dockerfile",
) -> dict[str, object]:
    """The Build (REST JSON) that builds `image` from the tarball in gs://bucket/object_name
    with docker and pushes it (`images`: Cloud Build pushes them once the steps succeed). It
    runs as `account`, the stack's own (a project's default build account may lack the rights);
    a build with its own account must log to Cloud Logging or a bucket of the user's."""
    return {
        "serviceAccount": f"projects/{project}/serviceAccounts/{account}",
        "options": {"logging": "CLOUD_LOGGING_ONLY"},
        "source": {"storageSource": {"bucket": bucket, "object": object_name}},
        "steps": [
            {
                "name": DOCKER_BUILDER,
                "args": [
                    "build",
                    "--network=cloudbuild",
                    f"--platform={PLATFORM}",
                    "-f",
                    dockerfile,
                    "-t",
                    image,
                    ".",
                ],
            }
        ],
        "images": [image],
        "timeout": f"{BUILD_TIMEOUT_S}s",
        "tags": ["gputrain", f"gputrain-stack-{stack}"],
    }


# ---- .dockerignore -------------------------------------------------------------------------------


def parse_dockerignore(text: str, where: str = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, pattern) per rule: comments and blank lines dropped, `!` re-includes, a leading
    `/` or `./` dropped; patterns as docker reads them (moby/patternmatcher): `*` and `?` stay
    within one path element, `**` spans any number, `[...]` is a character class, `\\` escapes
    the next character. The last matching rule wins, and a rule matching a directory covers
    everything below it (as docker). A pattern docker cannot read either (an unclosed `[`) is
    one SpecError naming it (`where`: the file, for the message)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        if pattern in ("", "."):
            continue
        try:
            rules.append((exclude, re.compile(_glob_regex(pattern))))
        except re.error as e:
            raise SpecError(
                f"{where}: {line!r} is not a pattern docker can read ({e}); allowed: "
                "Go's filepath.Match syntax with ** (docs.docker.com: .dockerignore file)"
            ) from e
    return rules


def ignored(rel: str, rules: Sequence[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for exclude, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            result = exclude
    return result


def _glob_regex(pattern: str) -> str:
    """The regexp (fullmatch) of a cleaned pattern, as moby/patternmatcher's Pattern.compile
    reads it for `/`: `*` and `?` within one path element, `**/` any number of them, `[...]` a
    class (`[^...]` its complement), `\\c` the character c. A pattern with no wildcard
    matches itself; `X**` (no wildcard in X) every path that starts with X; `**X` (none in X)
    every path that ends with X, and `**/X` X itself too."""
    out, kind, i, n, first = "", "exact", 0, len(pattern), True
    while i < n:
        ch, i = pattern[i], i + 1
        if ch == "*" and pattern.startswith("*", i):
            i += 1 + pattern.startswith("/", i + 1)
            if i >= n:  # `**` at the end: anything below
                out, kind = out + ".*", "prefix" if kind == "exact" else "regexp"
            else:
                out, kind = out + "(?:.*/)?", "regexp"
            kind = "suffix" if first else kind
        elif ch in "*?":
            out, kind = out + ("[^/]*" if ch == "*" else "[^/]"), "regexp"
        elif ch == "\\" and i < n:  # the next character as it is
            out, kind, i = out + re.escape(pattern[i]), "regexp", i + 1
        elif ch == "[":  # a class up to its `]`, its own escapes kept; unclosed: re.error
            out, kind = out + "[", "regexp"
            if pattern.startswith("^", i):
                out, i = out + "^", i + 1
            while i < n and pattern[i] != "]":
                if pattern[i] == "\\" and i + 1 < n:
                    out, i = out + re.escape(pattern[i + 1]), i + 2
                else:
                    out, i = (
                        out + (re.escape(pattern[i]) if pattern[i] in "[&~|" else pattern[i]),
                        i + 1,
                    )
            if i < n:
                out, i = out + "]", i + 1
        else:
            out += re.escape(ch)
        first = False
    if kind == "suffix":  # HasSuffix(path, rest); `**/X` also matches X
        rest = pattern[2:]
        return f"(?:.*/)?{re.escape(rest[1:])}" if rest.startswith("/") else f".*{re.escape(rest)}"
    return out


# ---- files ---------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _walk(directory: Path) -> tuple[list[str], list[str]]:
    """(regular files, symbolic links) under `directory`; linked folders are not entered."""
    files, links = [], []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for n in [*names, *(d for d in dirs if Path(root, d).is_symlink())]:
            p = Path(root, n)
            rel = p.relative_to(directory).as_posix()
            if p.is_symlink():
                links.append(rel)
            elif p.is_file():
                files.append(rel)
    return files, links


def _entries(directory: Path, files: Iterable[str]) -> list[tuple[str, int, bytes]]:
    out = []
    for rel in files:
        fd = os.open(directory / rel, os.O_RDONLY | os.O_NOFOLLOW)  # a link made since: refused
        with open(fd, "rb") as f:
            out.append((rel, os.fstat(fd).st_mode, f.read()))
    return out
