"""`python -m gputrain_node.mirror_out --dir OUT --uri gs://BUCKET/PREFIX/`: a node's out directory,
mirrored to Cloud Storage while any trainer runs, so its checkpoints outlive a preempted VM.

Every `--interval` seconds the new and changed files go up, oldest first, whole files only: a file
is sent once its size and modification time held still since the previous scan, and sent again
if it changed while it was read; a checkpoint whose format says where it ends (a zip, as
torch.save writes, .safetensors, a .pkl) only when it is whole. GCE's preemption notice (the
metadata server, where GPUTRAIN_WATCH_PREEMPTION=1) makes a pass at once. SIGTERM (a stop, or the VM shutting down)
reaches the trainer too, which may be saving on it: a pass at once, then one a second until the
job has ended (run.sh's SIGUSR1) or `--stop-grace` has passed; then the last pass, and it exits.
`--restore` is the other way: before a relaunch, what the bucket holds of this
node's out dir and the node lacks comes back. `--changed-dir DIR --changed-uri URI --newer FILE`
does the same, in the same process, for the job's working directory: only the files created or
changed there since FILE (the attempt's start), never the uploaded code (a trainer that checkpoints
beside its code, like pytorch/examples' `snapshot.pt`). `--fill-uri`/`--fill-changed-uri` with
`--restore`: then what rank 0's node has there and this node still lacks comes too (a job that
checkpoints on rank 0 only, assuming a shared file system), noted in `--filled FILE` so that a
later fill replaces it with rank 0's newer copy and the mirror never sends it as this node's own.
Stands alone; honours STORAGE_EMULATOR_HOST.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

Stamp = tuple[int, int]  # (size, mtime_ns)
#: --filled's record: a line per file another node's state gave this one, "PATH\tSIZE\tMTIME_NS
#: \tGENERATION", PATH relative to the record's folder (the run dir: out/..., workdir/...)
Filled = dict[str, tuple[int, int, str]]


def read_filled(path: Path | None) -> Filled:
    """--filled's record (empty when there is none). Pure but for reading it."""
    found: Filled = {}
    try:
        text = path.read_text() if path is not None else ""
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            found[parts[0]] = (int(parts[1]), int(parts[2]), parts[3])
    return found


def write_filled(path: Path, filled: Filled) -> None:
    """The record, replaced whole (a half-written one would lose what the fills were)."""
    part = path.with_name(path.name + ".part")
    part.write_text("".join(f"{k}\t{s}\t{m}\t{g}\n" for k, (s, m, g) in sorted(filled.items())))
    os.replace(part, path)


@dataclass(frozen=True)
class Target:
    bucket: str
    prefix: str  # ends in "/"

    @classmethod
    def parse(cls, uri: str) -> Target:
        if not uri.startswith("gs://"):
            raise SystemExit(f"mirror: --uri {uri!r}: expected gs://BUCKET/PREFIX/")
        bucket, _, prefix = uri[len("gs://") :].partition("/")
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "")

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"


def scan(root: Path, newer_ns: int | None = None) -> dict[str, Stamp]:
    """Every regular file under root (relative path -> stamp); files vanishing mid-scan skipped.
    `newer_ns`: only files modified after it, Python's caches left out (the job's own files in
    its working directory, not the code it was given)."""
    found: dict[str, Stamp] = {}
    for dirpath, dirs, files in os.walk(root):
        if newer_ns is not None:
            dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            p = Path(dirpath) / f
            try:
                st = p.stat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):  # a socket or FIFO (one blocks an open for good)
                continue
            if newer_ns is not None and (st.st_mtime_ns <= newer_ns or f.endswith(".pyc")):
                continue
            found[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


def due(now: dict[str, Stamp], before: dict[str, Stamp], sent: dict[str, Stamp]) -> list[str]:
    """What to upload, oldest first: changed since it was sent and unchanged since the previous
    scan, so a file being written is not sent half-way. Pure."""
    ready = [
        rel for rel, stamp in now.items() if sent.get(rel) != stamp and before.get(rel) == stamp
    ]
    return sorted(ready, key=lambda rel: (now[rel][1], rel))


def open_for_writing(root: Path) -> set[str]:
    """Files under root that a process (this user's: /proc) holds open for writing: a writer
    paused mid-save. Empty where /proc cannot tell."""
    base, held = f"{root.resolve()}/", set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            fds = list(os.scandir(fd_dir))
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                target = os.readlink(fd.path)
                if target.startswith(base):
                    info = (fd_dir.parent / "fdinfo" / fd.name).read_text()
                    if int(info.split("flags:", 1)[1].split()[0], 8) & (os.O_WRONLY | os.O_RDWR):
                        held.add(target.removeprefix(base))
            except (OSError, ValueError, IndexError):  # closed meanwhile
                continue
    return held


PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")  # PROTO, then 2-5


def incomplete(path: Path) -> str | None:
    """Why a checkpoint in a format that says where it ends stops short (its writer killed
    mid-write: closed and holding still, it would replace the last good one), else None: a zip
    (torch.save, numpy's .npz) needs its end record, a .safetensors file the length its header
    gives, a .pkl/.pickle of protocol 2 or later its STOP opcode last. Any other file is taken
    as it is."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if head.startswith(b"PK\x03\x04"):
                import zipfile

                return None if zipfile.is_zipfile(f) else "a zip without its end record"
            if path.suffix in (".pkl", ".pickle") and head[:2] in PICKLE_PROTOCOLS:
                f.seek(-1, os.SEEK_END)
                return None if f.read(1) == b"." else "a pickle without its STOP opcode"
            if path.suffix == ".safetensors" and len(head) == 8:
                size = int.from_bytes(head, "little")
                header = json.loads(f.read(min(size, 100 << 20)))
                ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
                want = 8 + size + max(ends, default=0)
                have = os.fstat(f.fileno()).st_size
                return None if have >= want else f"{have} of the {want} bytes its header gives"
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "a header that does not parse" if path.suffix == ".safetensors" else None
    return None


class Mirror:
    """One out dir -> one prefix; `sent` remembers what the bucket has."""

    def __init__(
        self,
        root: Path,
        target: Target,
        client: Any = None,
        say: Callable[[str], None] = lambda s: print(s, flush=True),
        newer_ns: int | None = None,
    ) -> None:
        if client is None:
            import google.cloud.storage as storage

            client = storage.Client()
        self.root, self.target, self.say, self.newer_ns = root, target, say, newer_ns
        self.bucket = client.bucket(target.bucket)
        self.sent: dict[str, Stamp] = {}
        self.before: dict[str, Stamp] = {}
        self.held_back: dict[str, Stamp] = {}  # incomplete as it stands: said once, kept local
        self.uploaded_bytes = 0

    def run_once(
        self, *, final: bool = False, settle_s: float = 0.5, stopping: bool = False
    ) -> list[str]:
        """One pass; the files sent whole (a file that changed while read is sent again later).
        `final`: the last pass, after a short look for files still being written (a trainer
        stopped mid-save must not replace its last good checkpoint with half of the next).
        `stopping` (after a SIGTERM, the node about to go): nor a file still open for writing,
        whose writer may pause mid-save longer than a pass (a log held open waits for its end)."""
        if final:
            self.before = scan(self.root, self.newer_ns)
            time.sleep(settle_s)
        now = scan(self.root, self.newer_ns)
        ready = due(now, self.before, self.sent)
        if stopping and ready:
            held = open_for_writing(self.root)
            ready = [rel for rel in ready if rel not in held]
        sent = [rel for rel in ready if self.whole(rel, now[rel]) and self.send(rel, now[rel])]
        self.before = now
        if sent:
            self.say(
                f"mirror: {len(sent)} file(s) to {self.target.uri} "
                f"({', '.join(sent[:3])}{', ...' if len(sent) > 3 else ''})"
            )
        return sent

    def whole(self, rel: str, stamp: Stamp) -> bool:
        """Not `incomplete`: each version judged once, a cut one said once (the bucket keeps
        its last)."""
        if self.held_back.get(rel) == stamp:
            return False
        why = incomplete(self.root / rel)
        if why is not None:
            self.held_back[rel] = stamp
            self.say(f"mirror: {rel} not sent: {why} (its writer stopped mid-write?)")
        return why is None

    def send(self, rel: str, stamp: Stamp) -> bool:
        """One file up now; True when it was still as `stamp` says after the upload (sent whole,
        and remembered as sent), False when it changed or went meanwhile."""
        path = self.root / rel
        try:
            self.bucket.blob(self.target.prefix + rel).upload_from_filename(str(path))
            st = path.stat()
        except FileNotFoundError:
            return False  # replaced or removed meanwhile: the next scan sees what is there
        if (st.st_size, st.st_mtime_ns) != stamp:
            return False
        self.sent[rel] = stamp
        self.uploaded_bytes += stamp[0]
        return True

    def restore(self) -> list[str]:
        """What the bucket holds and the out dir lacks, downloaded (present files are newer or
        the same: never overwritten)."""
        got = []
        for blob in self.bucket.client.list_blobs(self.target.bucket, prefix=self.target.prefix):
            rel = blob.name[len(self.target.prefix) :]
            if not safe_rel(rel):
                continue
            path = self.root / rel
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".restoring")
            blob.download_to_filename(str(part))
            os.replace(part, path)
            got.append(rel)
        self.sent.update({rel: stamp for rel, stamp in scan(self.root).items() if rel in got})
        return got

    def fill(self, source: Target, filled: Filled, key: Callable[[str], str]) -> list[str]:
        """What `source` (rank 0's node's prefix) holds and this dir lacks, downloaded and noted
        in `filled` (under `key(rel)`, with its stamp and generation). A file of this node's own
        is never touched; one an earlier fill gave it, unchanged since, is replaced when the
        source has a newer generation of it."""
        got = []
        for blob in self.bucket.client.list_blobs(source.bucket, prefix=source.prefix):
            rel = blob.name[len(source.prefix) :]
            if not safe_rel(rel) or "\t" in rel or "\n" in rel:
                continue
            path, before = self.root / rel, filled.get(key(rel))
            generation = str(blob.generation)
            if path.exists():  # its own, or rank 0's newest already: kept
                st = path.stat()
                if before is None or (st.st_size, st.st_mtime_ns) != before[:2]:
                    continue
                if before[2] == generation:
                    continue
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".restoring")
            blob.download_to_filename(str(part))
            os.replace(part, path)
            st = path.stat()
            filled[key(rel)] = (st.st_size, st.st_mtime_ns, generation)
            got.append(rel)
        return got

    def seed(self, filled: Filled, key: Callable[[str], str]) -> None:
        """The files a fill gave this dir count as sent while unchanged: they are rank 0's, never
        this node's own state (changed by this node's job, they are its own and go up)."""
        for rel in scan(self.root):
            if (stamp := filled.get(key(rel))) is not None:
                self.sent[rel] = stamp[:2]


def safe_rel(rel: str) -> bool:
    """A bucket name's rest as a relative path that stays inside the dir. Pure."""
    return (
        bool(rel)
        and not rel.endswith("/")
        and all(p not in ("", ".", "..") for p in rel.split("/"))
    )


STOP_GRACE_S = 30.0  # after a SIGTERM, the job's end waited for (GCE's shutdown gives 30 s)
STOPPING_PASS_S = 1.0  # meanwhile a pass a second: a save-on-SIGTERM goes up once it holds still


class Wake:
    """What ends a wait between passes: `ended` (run.sh: the job has ended; the last pass),
    `stop` (SIGTERM: passes a second until `ended` or the grace) or `notice` (GCE's
    preemption notice: flush now, keep mirroring)."""

    def __init__(self) -> None:
        self.any, self.stop, self.notice = threading.Event(), threading.Event(), threading.Event()
        self.ended = threading.Event()

    def set(self, which: threading.Event) -> None:
        which.set()
        self.any.set()


def run(
    mirrors: Sequence[Mirror], interval_s: float, wake: Wake, stop_grace_s: float = STOP_GRACE_S
) -> None:
    """Passes every interval until the job ends, then the final pass; the preemption notice and
    the stop each make a final-style pass at once (errors are said, not fatal: the training must
    not die because an upload failed)."""
    noticed, stopped = False, None  # stopped: when the SIGTERM came (monotonic)
    while True:
        wake.any.wait(interval_s if stopped is None else STOPPING_PASS_S)
        wake.any.clear()
        if wake.ended.is_set() or (
            stopped is not None and time.monotonic() - stopped > stop_grace_s
        ):
            break
        noticing = wake.notice.is_set() and not noticed
        stopping = wake.stop.is_set() and stopped is None
        noticed = noticed or noticing
        if stopping:
            stopped = time.monotonic()
            for mirror in mirrors:
                mirror.say("mirror: stopping: a pass a second until the job has ended")
        for mirror in mirrors:
            try:
                sent = mirror.run_once(final=noticing or stopping, stopping=stopped is not None)
                if noticing and not stopping:
                    mirror.say(f"mirror: preemption notice: flushed ({len(sent)} file(s))")
            except Exception as e:
                mirror.say(
                    f"mirror: upload failed, trying again next pass: {type(e).__name__}: {e}"
                )
    for mirror in mirrors:
        try:
            mirror.run_once(final=True, stopping=stopped is not None)
            mirror.say(f"mirror: flushed, {mirror.uploaded_bytes / (1 << 20):,.1f} MiB sent in all")
        except Exception as e:
            mirror.say(f"mirror: the last upload failed: {type(e).__name__}: {e}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputrain_node.mirror_out", description=__doc__)
    p.add_argument("--dir", required=True, type=Path, help="the out dir (GPUTRAIN_OUT)")
    p.add_argument("--uri", required=True, help="gs://BUCKET/PREFIX/ for this node's files")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between passes")
    p.add_argument("--restore", action="store_true", help="download what the dir lacks, exit")
    p.add_argument("--changed-dir", type=Path, help="the job's working directory (its files)")
    p.add_argument("--changed-uri", help="gs://BUCKET/PREFIX/ for the --changed-dir files")
    p.add_argument("--newer", type=Path, help="--changed-dir: only files newer than this one")
    p.add_argument("--fill-uri", help="--restore: rank 0's node's --uri, for what --dir lacks")
    p.add_argument("--fill-changed-uri", help="the same for --changed-dir")
    p.add_argument("--filled", type=Path, help="the record of what fills gave this node")
    p.add_argument(
        "--stop-grace", type=float, default=STOP_GRACE_S, help="after SIGTERM: the job's end waited"
    )
    args = p.parse_args(argv)
    wake = Wake()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        wake.set(wake.ended if signum == signal.SIGUSR1 else wake.stop)

    if not args.restore:  # first: a stop that comes while the storage client starts is kept
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, on_signal)
    args.dir.mkdir(parents=True, exist_ok=True)
    mirror = Mirror(args.dir, Target.parse(args.uri))
    mirrors = [mirror]
    if args.changed_dir is not None and args.changed_uri:
        args.changed_dir.mkdir(parents=True, exist_ok=True)
        since = None if args.restore or args.newer is None else args.newer.stat().st_mtime_ns
        # one storage client for both (each makes its own session and token)
        client = mirror.bucket.client
        mirrors.append(
            Mirror(args.changed_dir, Target.parse(args.changed_uri), client, newer_ns=since)
        )
    filled = read_filled(args.filled)

    def key(m: Mirror) -> Callable[[str], str]:  # a path in the record: beside the record
        base = Path(os.path.relpath(m.root, args.filled.parent)) if args.filled else m.root
        return lambda rel: str(base / rel)

    if args.restore:
        for m in mirrors:
            got = m.restore()
            print(f"restored {len(got)} file(s) from {m.target.uri}", flush=True)
        sources = zip(mirrors, (args.fill_uri, args.fill_changed_uri), strict=False)
        for m, uri in [(m, uri) for m, uri in sources if uri]:
            source = Target.parse(uri)
            got = m.fill(source, filled, key(m))
            shown = f" ({', '.join(got[:3])}{', ...' if len(got) > 3 else ''})" if got else ""
            print(f"filled {len(got)} file(s) it lacked from {source.uri}{shown}", flush=True)
        if args.filled is not None:
            write_filled(args.filled, filled)
        return 0
    for m in mirrors:
        m.seed(filled, key(m))
    from trainer.preemption import PreemptionWatcher, watch_requested  # not for --restore

    if watch_requested():  # GCE spot nodes (GPUTRAIN_WATCH_PREEMPTION=1): the metadata server
        PreemptionWatcher(lambda: wake.set(wake.notice)).start()
    run(mirrors, args.interval, wake, args.stop_grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
