"""The out-dir mirror (gputrain_node/mirror_out.py) against the real Cloud Storage emulator: new and
changed files go up oldest first and only once they held still, a file rewritten while it was
sent goes again, a SIGTERM waits for the job's end before the last pass, and a restore brings back
what a re-created node lacks without touching what it has."""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain_node.mirror_out import Mirror, Target, due, incomplete
from tests.support import wait_for
from tests.support.gcs_emulator import GcsEmulator

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def gcs() -> Iterator[GcsEmulator]:
    with GcsEmulator() as g:
        yield g


def test_due_is_changed_settled_and_oldest_first() -> None:
    now = {"a": (1, 30), "b": (1, 10), "c": (2, 20), "d": (5, 40)}
    before = {"a": (1, 30), "b": (1, 10), "c": (2, 20), "d": (4, 35)}  # d is being written
    sent = {"a": (1, 30)}  # a is up to date
    assert due(now, before, sent) == ["b", "c"]


def test_files_go_up_once_settled_and_again_when_changed(gcs: GcsEmulator, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "ckpt.pt").write_bytes(b"v1")
    os.utime(out / "ckpt" / "ckpt.pt", ns=(1, 1_000_000_000))
    (out / "log.txt").write_text("hello")
    lines: list[str] = []
    m = Mirror(
        out, Target.parse(f"gs://{gcs.bucket_name}/runs/r1/out/node-1"), gcs.client(), lines.append
    )
    assert m.run_once() == []  # first look: nothing has held still yet
    assert m.run_once() == ["ckpt/ckpt.pt", "log.txt"]  # oldest first
    assert gcs.read("runs/r1/out/node-1/ckpt/ckpt.pt") == b"v1"
    assert "mirror: 2 file(s) to gs://gputrain-ckpt-test/runs/r1/out/node-1/" in lines[0]
    assert m.run_once() == []  # nothing changed: nothing sent
    (out / "ckpt" / "ckpt.pt").write_bytes(b"v2-longer")
    assert m.run_once() == [] and m.run_once() == ["ckpt/ckpt.pt"]
    assert gcs.read("runs/r1/out/node-1/ckpt/ckpt.pt") == b"v2-longer"


def test_a_checkpoint_cut_short_is_not_sent_over_the_last_good_one(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """A writer killed mid-save leaves a file closed and holding still: a torch.save zip without
    its end record stays on the node, said once, and the bucket keeps the last good one; the
    next whole save goes up."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    torch.save({"step": 100, "w": torch.ones(4096)}, ckpt)
    good = ckpt.read_bytes()
    lines: list[str] = []
    m = Mirror(out, Target.parse(f"gs://{gcs.bucket_name}/k/"), gcs.client(), lines.append)
    assert m.run_once() == [] and m.run_once() == ["ckpt.pt"]
    torch.save({"step": 200, "w": torch.zeros(4096)}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[: len(good) // 2])  # killed half way through
    assert m.run_once() == [] and m.run_once() == [] and m.run_once() == []
    assert gcs.read("k/ckpt.pt") == good
    held = [ln for ln in lines if "not sent" in ln]
    assert held == ["mirror: ckpt.pt not sent: a zip without its end record (its writer stopped "
                    "mid-write?)"]  # fmt: skip
    torch.save({"step": 300, "w": torch.zeros(4096)}, ckpt)
    assert m.run_once() == [] and m.run_once() == ["ckpt.pt"]
    assert torch.load(out / "ckpt.pt")["step"] == 300


def test_incomplete_knows_zips_safetensors_and_pickles_and_takes_anything_else(
    tmp_path: Path,
) -> None:
    with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("x.npy", b"\x00" * 5000)
    whole_zip = (tmp_path / "a.npz").read_bytes()
    whole_pickle = pickle.dumps({"step": 7, "w": list(range(500))}, protocol=4)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    whole_st = struct.pack("<Q", len(header)) + header + b"\x01" * 16
    files = {
        "a.npz": whole_zip,
        "cut.npz": whole_zip[:-30],
        "m.safetensors": whole_st,
        "cut.safetensors": whole_st[:-1],
        "junk.safetensors": b"not a header",
        "state.pkl": whole_pickle,
        "cut.pkl": whole_pickle[:-40],
        "legacy.pt": whole_pickle[:-40],  # torch's old format: pickles, then raw storage bytes
        "log.txt": b"PK but not a zip, and any text",
        "empty.pt": b"",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    found = {name: incomplete(tmp_path / name) for name in files}
    assert found == {
        "a.npz": None,
        "cut.npz": "a zip without its end record",
        "m.safetensors": None,
        "cut.safetensors": f"{len(whole_st) - 1} of the {len(whole_st)} bytes its header gives",
        "junk.safetensors": "a header that does not parse",
        "state.pkl": None,
        "cut.pkl": "a pickle without its STOP opcode",
        "legacy.pt": None,
        "log.txt": None,
        "empty.pt": None,
    }


def test_a_socket_or_a_fifo_in_the_out_dir_stops_nothing(gcs: GcsEmulator, tmp_path: Path) -> None:
    """A job's socket and FIFO are not files to mirror: the upload of a socket failed the whole
    pass, every pass, and an open of the FIFO blocked it (and run.sh's wait for the mirror)."""
    import socket

    out = tmp_path / "out"
    out.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(out / "agent.sock"))
    os.mkfifo(out / "pipe")
    (out / "z-ckpt.pt").write_bytes(b"state")
    lines: list[str] = []
    m = Mirror(
        out, Target.parse(f"gs://{gcs.bucket_name}/runs/r2/out/n"), gcs.client(), lines.append
    )
    try:
        m.run_once()
        assert m.run_once() == ["z-ckpt.pt"]  # and the pass ends: no FIFO opened
        assert gcs.read("runs/r2/out/n/z-ckpt.pt") == b"state"
    finally:
        listener.close()


def test_restore_brings_back_what_the_node_lacks(gcs: GcsEmulator, tmp_path: Path) -> None:
    gcs.write("runs/r1/out/node-1/nanogpt/ckpt.pt", b"from the bucket")
    gcs.write("runs/r1/out/node-1/kept.txt", b"old")
    gcs.write("runs/r1/out/node-2/other.txt", b"another node's")
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("newer on the node")
    m = Mirror(out, Target.parse(f"gs://{gcs.bucket_name}/runs/r1/out/node-1/"), gcs.client())
    assert m.restore() == ["nanogpt/ckpt.pt"]
    assert (out / "nanogpt" / "ckpt.pt").read_bytes() == b"from the bucket"
    assert (out / "kept.txt").read_text() == "newer on the node"
    assert not (out / "other.txt").exists()
    assert m.run_once() == [] and m.run_once() == ["kept.txt"]  # restored files are not re-sent


def mirror_process(gcs: GcsEmulator, out: Path, uri: str, *args: str) -> subprocess.Popen[str]:
    """The mirror as run.sh starts it, returned once it handles SIGTERM (a signal before that
    would end the process, as a loaded machine's slow start showed)."""
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.url, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [sys.executable, "-m", "gputrain_node.mirror_out", "--dir", str(out), "--uri", uri, *args],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not caught_signals(p.pid) >> (signal.SIGTERM - 1) & 1:
        assert p.poll() is None and time.monotonic() < deadline, "the mirror never handled SIGTERM"
        time.sleep(0.02)
    return p


def caught_signals(pid: int) -> int:
    """The process's mask of signals it has a handler for (Linux: SigCgt in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16)


def test_a_sigterm_waits_for_the_save_it_asked_for_and_the_jobs_end(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """A stop's SIGTERM reaches the trainer and the mirror at once: the trainer saves after it,
    so the mirror goes on until run.sh says the job has ended (SIGUSR1), then makes its last
    pass: the checkpoint written seconds after the SIGTERM is in the bucket."""
    out = tmp_path / "out"
    out.mkdir()
    uri = f"gs://{gcs.bucket_name}/runs/r2/out/n/"
    p = mirror_process(gcs, out, uri, "--interval", "60")  # long before its first pass
    (out / "final.txt").write_text("written just before the end")
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # the trainer finishes its step, then saves on the signal
    (out / "ckpt.pt").write_bytes(b"saved on SIGTERM")
    time.sleep(1.5)
    assert p.poll() is None  # still waiting for the job's end
    p.send_signal(signal.SIGUSR1)
    output, _ = p.communicate(timeout=30)
    assert p.returncode == 0, output
    assert gcs.read("runs/r2/out/n/final.txt") == b"written just before the end"
    assert gcs.read("runs/r2/out/n/ckpt.pt") == b"saved on SIGTERM"
    assert "mirror: stopping" in output and "mirror: flushed" in output


def test_after_a_sigterm_a_checkpoint_still_open_for_writing_is_not_sent_half_way(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """A trainer saving on the SIGTERM pauses mid-write for longer than the mirror's pass a
    second (a slow disk, a serializer holding the GIL): the bucket keeps the last good
    checkpoint while the file is open for writing, and gets it whole once it is closed."""
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    ckpt.write_bytes(b"good")
    p = mirror_process(gcs, out, f"gs://{gcs.bucket_name}/c/", "--interval", "60")
    p.send_signal(signal.SIGTERM)  # its first pass (final-style) sends the good one
    wait_for("the good one in the bucket", lambda: _object(gcs, "c/ckpt.pt") == b"good", 20)
    saving = "import sys, time\nf = open(sys.argv[1], 'wb'); f.write(b'half'); f.flush()\n"
    saving += "time.sleep(4); f.write(b' and the rest'); f.close()\n"
    writer = subprocess.Popen([sys.executable, "-c", saving, str(ckpt)])
    try:
        wait_for("the half save", lambda: ckpt.read_bytes() == b"half", 20, every_s=0.02)
        time.sleep(3)  # three passes, the half file holding still
        assert _object(gcs, "c/ckpt.pt") == b"good"
    finally:
        writer.wait(timeout=30)
    whole = b"half and the rest"  # closed: sent whole
    wait_for("the whole save in the bucket", lambda: _object(gcs, "c/ckpt.pt") == whole, 20)
    p.send_signal(signal.SIGUSR1)
    output, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and "mirror: flushed" in output, output


def _object(gcs: GcsEmulator, name: str) -> bytes | None:
    try:
        return gcs.read(name)
    except Exception:  # not there yet
        return None


def test_a_sigterm_whose_job_never_says_it_ended_ends_after_the_grace(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    p = mirror_process(
        gcs, out, f"gs://{gcs.bucket_name}/o/", "--interval", "60", "--stop-grace", "1"
    )
    (out / "late.txt").write_text("kept")
    started = time.monotonic()
    p.send_signal(signal.SIGTERM)
    output, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and time.monotonic() - started < 10, output
    assert gcs.read("o/late.txt") == b"kept" and "mirror: flushed" in output


def test_the_preemption_notice_flushes_at_once_and_mirroring_goes_on(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    import threading

    from gputrain_node.mirror_out import Wake, run

    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"saved just before the notice")
    lines: list[str] = []
    m = Mirror(
        out, Target.parse(f"gs://{gcs.bucket_name}/runs/r3/out/n/"), gcs.client(), lines.append
    )
    wake = Wake()
    t = threading.Thread(target=run, args=([m], 3600.0, wake), daemon=True)  # no pass on its own
    t.start()
    wake.set(wake.notice)
    deadline = time.monotonic() + 20
    while not any("preemption notice: flushed (1 file(s))" in ln for ln in lines):
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    assert gcs.read("runs/r3/out/n/ckpt.pt") == b"saved just before the notice"
    assert t.is_alive()  # still mirroring until the job's end
    wake.set(wake.ended)
    t.join(timeout=20)
    assert not t.is_alive() and "mirror: flushed" in lines[-1]


def test_a_working_directory_mirror_sends_only_what_the_job_wrote(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """`--changed-dir`: the code the job was given stays home; its snapshot.pt goes up."""
    code = tmp_path / "code"
    (code / "__pycache__").mkdir(parents=True)
    (code / "multinode.py").write_text("uploaded")
    start = tmp_path / "pgid"
    start.write_text("1")
    started_ns = start.stat().st_mtime_ns
    os.utime(code / "multinode.py", ns=(started_ns - 10**9, started_ns - 10**9))
    (code / "snapshot.pt").write_bytes(b"epoch 3")
    (code / "__pycache__" / "multinode.cpython-311.pyc").write_bytes(b"cache")
    os.utime(code / "snapshot.pt", ns=(started_ns + 10**9, started_ns + 10**9))
    uri = f"gs://{gcs.bucket_name}/runs/r4/workdir/n/"
    m = Mirror(code, Target.parse(uri), gcs.client(), lambda s: None, newer_ns=started_ns)
    m.run_once()
    assert m.run_once() == ["snapshot.pt"]
    assert gcs.read("runs/r4/workdir/n/snapshot.pt") == b"epoch 3"
    back = Mirror(tmp_path / "back", Target.parse(uri), gcs.client(), lambda s: None)
    assert back.restore() == ["snapshot.pt"]


def test_a_fill_gives_a_node_what_rank_0_wrote_and_it_lacks(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """A job that checkpoints on rank 0 only: before a relaunch, every other node gets rank 0's
    node's files it lacks (out dir and working directory), a newer copy replaces an earlier fill
    it left alone, its own files are never touched, and the mirror never sends a fill as its own."""
    from gputrain_node.mirror_out import read_filled

    gcs.write("runs/r5/out/node-0/ckpt.pt", b"rank 0 at step 10")
    gcs.write("runs/r5/workdir/node-0/snapshot.pt", b"3")
    gcs.write("runs/r5/workdir/node-0/notes.txt", b"rank 0's notes")
    gcs.write("runs/r5/workdir/node-1/mine.txt", b"node 1's own, mirrored")
    run = tmp_path / "run"
    (run / "workdir").mkdir(parents=True)
    (run / "workdir" / "notes.txt").write_text("node 1's own notes")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.url, "PYTHONPATH": str(ROOT)}
    uri = f"gs://{gcs.bucket_name}/runs/r5"
    argv = [
        sys.executable, "-m", "gputrain_node.mirror_out", "--restore",
        "--dir", str(run / "out"), "--uri", f"{uri}/out/node-1/",
        "--changed-dir", str(run / "workdir"), "--changed-uri", f"{uri}/workdir/node-1/",
        "--fill-uri", f"{uri}/out/node-0/", "--fill-changed-uri", f"{uri}/workdir/node-0/",
        "--filled", str(run / "filled"),
    ]  # fmt: skip

    def restore() -> str:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    said = restore()
    assert f"filled 1 file(s) it lacked from {uri}/out/node-0/ (ckpt.pt)" in said
    assert f"filled 1 file(s) it lacked from {uri}/workdir/node-0/ (snapshot.pt)" in said
    assert (run / "out" / "ckpt.pt").read_bytes() == b"rank 0 at step 10"
    assert (run / "workdir" / "snapshot.pt").read_bytes() == b"3"
    assert (run / "workdir" / "mine.txt").read_bytes() == b"node 1's own, mirrored"
    assert (run / "workdir" / "notes.txt").read_text() == "node 1's own notes"  # never replaced
    assert set(read_filled(run / "filled")) == {"out/ckpt.pt", "workdir/snapshot.pt"}
    # the mirror on the node: the fill is rank 0's, not sent as this node's own
    m = Mirror(run / "out", Target.parse(f"{uri}/out/node-1/"), gcs.client(), lambda s: None)
    m.seed(read_filled(run / "filled"), lambda rel: f"out/{rel}")
    assert m.run_once() == [] and m.run_once() == []
    # rank 0 saved again: the fill it left alone is replaced; one its job changed is its own now
    gcs.write("runs/r5/out/node-0/ckpt.pt", b"rank 0 at step 20")
    gcs.write("runs/r5/workdir/node-0/snapshot.pt", b"5")
    (run / "workdir" / "snapshot.pt").write_bytes(b"node 1 wrote this")
    said = restore()
    assert f"filled 1 file(s) it lacked from {uri}/out/node-0/ (ckpt.pt)" in said
    assert f"filled 0 file(s) it lacked from {uri}/workdir/node-0/" in said
    assert (run / "out" / "ckpt.pt").read_bytes() == b"rank 0 at step 20"
    assert (run / "workdir" / "snapshot.pt").read_bytes() == b"node 1 wrote this"
    assert restore().count("filled 0 file(s)") == 2  # nothing newer: nothing downloaded
