"""The controller's side of datasets: run.sh's variables, the copy command each node runs, its
summary line, the prefix checks and the doctor's rows against the real Cloud Storage emulator,
and the `mount` command run for real against stub gcsfuse/mountpoint/sudo commands."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.base.errors import UserError
from infra.datasets import parse_datasets
from scripts.doctor.data import data_rows
from scripts.job.data_io import (
    build_fetch_command,
    check_prefixes,
    data_env_lines,
    list_prefix,
    parse_fetch_result,
    stage_data,
    storage_client,
)
from scripts.job.gcsfuse import build_mount_command, gcsfuse_install_script
from scripts.job.node_scripts import build_node_command
from scripts.job.records import Job
from scripts.transport.base import TransportError
from tests.support.fake_gcp_admin import FakeGcpAdmin
from tests.support.gcs_emulator import GcsEmulator

DATASETS = parse_datasets({"train": "gs://b-1/owt", "web": "gs://b-2/fw/10B:mount"})


def sh(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)


def test_run_sh_exports_the_data_paths_expanded_on_the_node(tmp_path: Path) -> None:
    job = Job(
        "r1",
        entry=("x.py",),
        rdzv_port=29500,
        datasets=DATASETS,
        env={"GPUTRAIN_DATA_WEB": "/mine"},
    )
    script = build_node_command(
        job, nnodes=1, nproc_per_node=1, head_address="10.0.0.1", python="python3"
    )
    lines = data_env_lines(DATASETS)
    assert lines in script and script.index(lines) < script.index(
        "export GPUTRAIN_DATA_WEB=/mine\n"
    )
    probe = (
        lines
        + 'echo "$GPUTRAIN_DATA_DIR|$GPUTRAIN_DATA_TRAIN|$GPUTRAIN_DATA_WEB|${GPUTRAIN_SCRATCH-none}"'
    )
    r = sh(probe, {"PATH": os.environ["PATH"], "GPUTRAIN_NODE_ROOT": str(tmp_path)})
    d = f"{tmp_path}/.gputrain/data"
    assert r.stdout.strip() == f"{d}|{d}/train|{d}/web|none"


def test_the_copy_command_and_its_summary() -> None:
    cmd, values = build_fetch_command(
        DATASETS, "node-1", "/opt/py 3", {"STORAGE_EMULATOR_HOST": "http://h:1"}
    )
    assert "http://h:1" not in cmd  # the job's values come on stdin, never in an argv
    assert values is not None and values.startswith(b"#gputrain-secrets\nSTORAGE_EMULATOR_HOST ")
    assert "exec '/opt/py 3' - --root" in cmd  # the module itself comes in the command
    # mount datasets are not copied
    assert "--node node-1 train=gs://b-1/owt/:copy <<'GPUTRAIN_FETCH_DATA'\n" in cmd
    assert "def fetch(" in cmd and cmd.endswith("\nGPUTRAIN_FETCH_DATA\n")
    assert "--scratch /mnt/gputrain-scratch" in cmd
    assert parse_fetch_result(["data: x", 'gputrain-data: {"node": "n", "seconds": 1}']) == {
        "node": "n",
        "seconds": 1,
    }
    assert parse_fetch_result(["gputrain-data: {broken"]) is None


def test_prefixes_are_checked_from_here_and_in_the_doctor() -> None:
    with GcsEmulator() as g:
        g.write("ds/a.bin", b"x" * 1000)
        ok, empty, gone = parse_datasets(
            {
                "ok": f"gs://{g.bucket_name}/ds",
                "empty": f"gs://{g.bucket_name}/nothing",
                "gone": "gs://no-such-bkt/x",
            }
        )
        [info] = check_prefixes([ok], g.client())
        assert (info.objects, info.bytes) == (1, 1000)
        with pytest.raises(
            UserError, match=r"data empty \(gs://gputrain-ckpt-test/nothing/\): no objects"
        ):
            check_prefixes([ok, empty], g.client())
        rows = data_rows([ok, empty, gone], g.client())
        assert [(r.check, r.status) for r in rows] == [
            ("data ok", "ok"),
            ("data empty", "fail"),
            ("data gone", "fail"),
        ]
        assert (
            "1 object(s)" in rows[0].detail
            and "bucket gs://no-such-bkt does not exist" in rows[2].detail
        )
        assert "roles/storage.objectViewer on gs://no-such-bkt" in rows[2].fix


#: parses its arguments as the real one does (cmd/root.go: cobra counts argv[0] in
#: RangeArgs(2, 3); bool flags take no separate value; the file-cache flags from 2.5.0), records
#: them and "mounts" by making the mount point answer mountpoint -q
GCSFUSE_STUB = """
case "$1" in --version|-v) echo "gcsfuse version $GCSFUSE_VERSION (Go version go1.23.0)"; exit 0;; esac
all="$*"; n=1
while [ $# -gt 0 ]; do
  case "$1" in
    --file-cache-*) case "$GCSFUSE_VERSION" in [01].*|2.[0-4].*)
      echo "Error: unknown flag: ${1%%=*}" >&2; exit 1;; esac;;
  esac
  case "$1" in
    -o|--only-dir|--cache-dir|--file-cache-max-size-mb) shift;;
    -*) ;;
    *) n=$((n + 1)); last=$1;;
  esac
  shift
done
if [ $n -lt 2 ] || [ $n -gt 3 ]; then
  echo "Error: accepts between 2 and 3 arg(s), received $n" >&2; exit 1
fi
echo "$all" >> "$LOG"; touch "$last/.mounted"
"""
STUBS = {
    "gcsfuse": GCSFUSE_STUB,
    "mountpoint": '[ "$2" = "$SCRATCH" ] && [ -n "$HAVE_SSD" ] && exit 0; [ -e "$2/.mounted" ]',
    "sudo": 'shift; exec "$@"',
}


def stub_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.mark.parametrize("ssd", [False, True])
def test_the_mount_command_mounts_each_dataset_once(tmp_path: Path, ssd: bool) -> None:
    mounts = [d for d in DATASETS if d.mode == "mount"] + parse_datasets({"all": "gs://b-3:mount"})
    log = tmp_path / "gcsfuse.log"
    cmd = build_mount_command(mounts, install=False).replace(
        "/mnt/gputrain-scratch", str(tmp_path / "ssd")
    )
    env = {
        "PATH": stub_path(tmp_path), "GPUTRAIN_NODE_ROOT": str(tmp_path / "node"), "LOG": str(log),
        "SCRATCH": str(tmp_path / "ssd"), "HAVE_SSD": "1" if ssd else "",
    }  # fmt: skip
    r = sh(cmd, {**env, "GCSFUSE_VERSION": "2.5.1"})
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "node" / ".gputrain" / "data"
    cache = (
        f" --cache-dir {tmp_path}/ssd/gcsfuse-cache/web --file-cache-max-size-mb -1 --file-cache-cache-file-for-range-read=true"
        if ssd
        else ""
    )
    assert (
        log.read_text().splitlines()[0]
        == f"-o ro --implicit-dirs --only-dir fw/10B{cache} b-2 {root}/web"
    )
    assert (
        log.read_text().splitlines()[1].endswith(f" b-3 {root}/all")
        and "--only-dir" not in log.read_text().splitlines()[1]
    )
    r = sh(cmd, {**env, "GCSFUSE_VERSION": "2.5.1"})  # again: mounted already, not run twice
    assert (
        r.returncode == 0
        and "mounted already" in r.stdout
        and len(log.read_text().splitlines()) == 2
    )


@pytest.mark.parametrize("version", ["2.4.0", "1.4.2", "unknown"])
def test_a_gcsfuse_older_than_2_5_mounts_without_the_cache_and_says_so(
    tmp_path: Path, version: str
) -> None:
    [web] = [d for d in DATASETS if d.mode == "mount"]
    log = tmp_path / "gcsfuse.log"
    cmd = build_mount_command([web], install=False).replace(
        "/mnt/gputrain-scratch", str(tmp_path / "ssd")
    )
    env = {
        "PATH": stub_path(tmp_path), "GPUTRAIN_NODE_ROOT": str(tmp_path / "node"), "LOG": str(log),
        "SCRATCH": str(tmp_path / "ssd"), "HAVE_SSD": "1",
        "GCSFUSE_VERSION": "" if version == "unknown" else version,
    }  # fmt: skip
    r = sh(cmd, env)
    assert r.returncode == 0, r.stdout + r.stderr
    shown = "of unknown version" if version == "unknown" else version
    assert (
        f"gcsfuse {shown} is older than 2.5 (no file-cache flags): mounting without the cache"
        in r.stdout
    )
    assert "--file-cache" not in log.read_text() and "--cache-dir" not in log.read_text()


def test_the_stub_gcsfuse_refuses_a_bool_flags_separate_value(tmp_path: Path) -> None:
    """The old mount line (`--file-cache-cache-file-for-range-read true`) as the real gcsfuse
    sees it: `true` is a third positional."""
    (tmp_path / "mp").mkdir()
    env = {"PATH": stub_path(tmp_path), "LOG": str(tmp_path / "log"), "GCSFUSE_VERSION": "2.5.1"}
    flag = "--file-cache-cache-file-for-range-read"
    r = sh(f"gcsfuse {flag} true b {tmp_path}/mp", env)
    assert r.returncode == 1 and "accepts between 2 and 3 arg(s), received 4" in r.stderr
    assert sh(f"gcsfuse {flag}=true b {tmp_path}/mp", env).returncode == 0


def test_without_gcsfuse_the_mount_fails_saying_what_to_do(tmp_path: Path) -> None:
    cmd = build_mount_command(DATASETS[1:], install=False)
    r = sh(cmd, {"PATH": "/usr/bin:/bin", "GPUTRAIN_NODE_ROOT": str(tmp_path)})
    assert r.returncode == 1 and "gcsfuse is not installed on this machine" in r.stdout


def test_the_install_script_uses_googles_repository() -> None:
    text = gcsfuse_install_script()
    assert "command -v gcsfuse >/dev/null 2>&1 && exit 0" in text.splitlines()[1]  # idempotent
    assert "https://packages.cloud.google.com/apt gcsfuse-$CODENAME main" in text
    assert "signed-by=/usr/share/keyrings/cloud.google.asc" in text
    assert "apt-get install -y -qq fuse gcsfuse" in text
    assert "sudo -n sh -c" in build_mount_command(DATASETS[1:], install=True)


def test_the_doctor_fails_copy_datasets_larger_than_the_disk() -> None:
    with GcsEmulator() as g:
        g.write("ds/a.bin", b"x" * 3000)
        [ok] = parse_datasets({"ok": f"gs://{g.bucket_name}/ds"})
        assert [r.check for r in data_rows([ok], g.client(), room_gib=1)] == ["data ok"]
        rows = data_rows([ok], g.client(), room_gib=0)
        assert rows[-1].check == "data size" and rows[-1].status == "fail"
        assert "a node's disk for them has 0 GiB" in rows[-1].detail


def test_the_install_script_finds_the_codename_once(tmp_path: Path) -> None:
    """Its codename line run for real, with and without lsb_release."""
    line = next(ln for ln in gcsfuse_install_script().splitlines() if ln.startswith("CODENAME="))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lsb_release").write_text("#!/bin/sh\necho jammy\n")
    (bin_dir / "lsb_release").chmod(0o755)
    r = sh(line + '\necho "[$CODENAME]"', {"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.stdout.strip() == "[jammy]"
    r = sh(line + '\necho "[$CODENAME]"', {"PATH": "/usr/bin:/bin"})  # from /etc/os-release
    assert r.stdout.strip().startswith("[") and "\n" not in r.stdout.strip()


class NodeSaying:
    """A node whose copy step prints `lines` and exits `rc` (the stream of gputrain_node.fetch_data)."""

    def __init__(self, name: str, rc: int, lines: list[str]) -> None:
        self.name, self.rc, self.lines = name, rc, lines

    def stream(
        self, cmd: str, on_line: Any, timeout: float | None, stdin: bytes | None = None
    ) -> int:
        assert "<<'GPUTRAIN_FETCH_DATA'" in cmd
        for line in self.lines:
            on_line(line)
        return self.rc


def test_a_node_without_room_is_a_user_error_naming_it() -> None:
    from infra.base.records import Fleet, Node

    fleet = Fleet("t", (Node("n0", "head", "10.0.0.1"), Node("n1", "worker", "10.0.0.2")))
    full = "data: node n1: the datasets need 3.00 GiB to download (train 3.00 GiB) but / has 1.00 GiB free"
    ok = 'gputrain-data: {"node": "n0", "seconds": 1.0, "downloaded_bytes": 5, "cached_objects": 0}'
    transports: dict[str, Any] = {
        "n0": NodeSaying("n0", 0, [ok]),
        "n1": NodeSaying("n1", 3, [full]),
    }
    copy = parse_datasets({"train": "gs://b-1/a"})
    with pytest.raises(UserError) as e:
        stage_data(fleet, transports, copy, env={})
    assert str(e.value) == full.removeprefix("data: ")
    transports["n1"] = NodeSaying("n1", 1, ["Traceback ...", "boom"])
    with pytest.raises(TransportError, match=r"node n1: copying the datasets failed \(exit 1\)"):
        stage_data(fleet, transports, copy, env={})
    transports["n1"] = NodeSaying("n1", 0, [ok.replace("n0", "n1")])
    done = stage_data(fleet, transports, copy, env={})
    assert done["n1"]["downloaded_bytes"] == 5


def test_a_cloud_storage_that_does_not_answer_is_one_line_within_the_deadline() -> None:
    """Listing a dataset retried an unreachable Cloud Storage for the client's 120 s, then a
    RetryError traceback; now one line naming the dataset, within the deadline (issue 39, 5)."""
    import time

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": "http://127.0.0.1:9"},  # nothing listens there
    )
    (dataset,) = parse_datasets({"d": "gs://bkt/x"}, "data")
    started = time.monotonic()
    with pytest.raises(UserError) as e:
        list_prefix(dataset, client, deadline_s=2)
    assert time.monotonic() - started < 15
    text = str(e.value)
    assert (
        text.startswith("data d (gs://bkt/x/): Cloud Storage did not answer (") and "\n" not in text
    )


@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_an_expired_login_is_one_line_naming_the_login_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login Google refuses (expired or revoked refresh token) while a dataset is listed: the
    user's setup, one line with the login to run, never google-auth's RefreshError."""
    (dataset,) = parse_datasets({"d": "gs://bkt/x"}, "data")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")  # gcloud's project, as a login has one
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        with pytest.raises(UserError) as e:
            list_prefix(dataset, storage_client(), deadline_s=2)
    assert str(e.value) == (
        "data d (gs://bkt/x/): the credentials were refused (RefreshError: invalid_grant: Token "
        "has been expired or revoked.); run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS"
    )
