"""A user's project on the sshd test bed, 2 nodes, through the CLI: its requirements.txt names a
package the hosts lack (served by a local package index on the bridge), `setup` runs once per node,
the second run skips both; a secret reaches every rank and is found nowhere else. Through
`--hosts` and through `run --stack` with the fake stack world (a kept cluster's `train` is cached).

The job is our torch-free nanoGPT stand-in (tests/support/nanogpt_standin/train_with_requirements.py:
its flags, step lines and out_dir/ckpt.pt): the subject is the environment; nanoGPT's DDP on the
test hosts is test_nanogpt.py's and test_outputs.py's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings
from tests.support import JOBS
from tests.support.stack_world import World, assert_torn_down
from tests.support.testbed import TestBed, TestHost
from tests.support.wheelhouse import PackageIndex, build_wheel

STANDIN = (
    Path(__file__).resolve().parents[1]
    / "support"
    / "nanogpt_standin"
    / "train_with_requirements.py"
)
READ_SECRET = JOBS / "read_secret.py"
SETUP = (
    "echo setup ran in $(basename $(pwd))\npython -c 'import gputrain_probe; print(\"probe ok\")'"
)


@pytest.fixture
def index(tb: TestBed, tmp_path: Path) -> Iterator[PackageIndex]:
    """On the bridge, where the test hosts reach it."""
    with PackageIndex(tmp_path / "index", host=tb.bridge_address) as idx:
        idx.add(build_wheel("gputrain-probe", tmp_path / "wheel"))
        yield idx


def _project(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDIN, d / "train.py")
    shutil.copy(READ_SECRET, d / "read_secret.py")
    (d / "requirements.txt").write_text("gputrain-probe==1.0\n")


def _hosts_file(tb: TestBed, d: Path, hosts: list[TestHost]) -> Path:
    setup = "".join(f"  {line}\n" for line in SETUP.splitlines())
    return tb.hosts_file(d, hosts, f"cpu: true\nsecrets: [TB_TOKEN]\nsetup: |\n{setup}")


class ArgvWatch:
    """Every process's argv on the machine (the test hosts share its /proc) while it runs."""

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.hits: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for d in Path("/proc").iterdir():
                try:
                    argv = (d / "cmdline").read_bytes() if d.name.isdigit() else b""
                except OSError:
                    continue
                if self.needle in argv:
                    self.hits.append(argv)
            time.sleep(0.05)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _files_holding(roots: list[Path], needle: bytes) -> list[str]:
    return [
        str(p)
        for root in roots
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    ]


def test_hosts_requirements_setup_cached_and_secret(
    tb: TestBed,
    index: PackageIndex,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = tb.add_host(), tb.add_host()
    proj = tmp_path / "proj"
    _project(proj)
    path = _hosts_file(tb, proj, [a, b])
    monkeypatch.chdir(proj)
    token = "tb-token-" + os.urandom(8).hex()
    monkeypatch.setenv("TB_TOKEN", token)
    settings = Settings(root=proj, runs_dir=proj / "runs", connect_deadline_s=30)
    pip = ["--env", f"PIP_INDEX_URL={index.url}", "--env", f"PIP_TRUSTED_HOST={tb.bridge_address}"]
    run = ["run", "--hosts", str(path), *pip]

    assert main([*run, "--", "train.py", "--max_iters=3"], settings) == 0
    out = capsys.readouterr().out
    for node in (a.address, b.address):  # a hosts file's nodes are named by their address
        assert f"[{node}] [requirements] Successfully installed gputrain-probe-1.0" in out
        assert f"[{node}] [setup] setup ran in code" in out  # in the uploaded working dir
        assert f"[{node}] [setup] probe ok" in out  # after the requirements, in their venv
    assert "iter 2: loss" in out
    first = sorted((proj / "runs" / "hosts-lab").glob("*/*/setup.log"))
    assert len(first) == 2 and all("probe ok" in p.read_text() for p in first)
    # nanoGPT-style: out_dir/ckpt.pt relative to the working directory (the run's code snapshot),
    # on the node of rank 0 (c10d's rendezvous assigns the ranks: either node)
    assert [
        p
        for h in (a, b)
        for p in (h.dir / "home" / ".gputrain" / "runs").glob("*/code/out/ckpt.pt")
    ]

    # the same hash: nothing installed or run again; the secret reaches every rank
    with ArgvWatch(token) as watch:
        code = main([*run, "--env", "SECRET_NAME=TB_TOKEN", "--", "read_secret.py"], settings)
    assert code == 0
    out = capsys.readouterr().out
    assert "Successfully installed" not in out and "[setup] setup ran" not in out
    assert out.count("skipped (cached)") == 2
    assert out.count("the token is ***") == 2 and token not in out
    digests = [json.loads(p.read_text()) for p in (proj / "runs").rglob("secret.json")]
    assert digests == [{"sha256": hashlib.sha256(token.encode()).hexdigest()}]
    assert not watch.hits
    homes = [h.dir / "home" for h in (a, b)]
    assert not _files_holding([proj, *homes], token.encode())


def test_stack_run_keep_then_train_skips_the_install(
    world: Callable[..., World],
    index: PackageIndex,
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = world(nodes=2, settings={"setup": json.dumps(SETUP)})
    _project(w.dir)
    pip = [
        "--env",
        f"PIP_INDEX_URL={index.url}",
        "--env",
        f"PIP_TRUSTED_HOST={w.bed.bridge_address}",
    ]
    stack = ["--stack", "e2e"]
    assert w.run("run", *stack, "--yes", "--skip-preflight", "--keep", *pip, "--", "train.py") == 0
    assert "destroy" not in w.runner.call_names() and len(w.runner.existing) == 2  # kept
    out = capsys.readouterr().out
    for vm in ("e2e-node-0", "e2e-node-1"):
        assert f"[{vm}] [requirements] Successfully installed gputrain-probe-1.0" in out
        assert f"[{vm}] [setup] probe ok" in out
    assert "iter 4: loss" in out
    # the kept cluster: the same hash is ready on both VMs; the run resumes nanoGPT-style
    argv = ["train", *stack, *pip, "--", "train.py", "--max_iters=7", "--init_from=resume"]
    runs = [h.dir / "home" / ".gputrain" / "runs" for h in w.node_hosts.values()]
    # out_dir, relative to the snapshot, on rank 0's node (c10d assigns the ranks: either node)
    ckpt = next(p for r in runs for p in r.glob("*/code/out/ckpt.pt"))
    shutil.copytree(ckpt.parent, w.dir / "out")  # the user brings the checkpoint along
    assert w.run(*argv) == 0
    out = capsys.readouterr().out
    assert out.count("skipped (cached)") == 2 and "Successfully installed" not in out
    assert "iter 5: loss" in out and "iter 4: loss" not in out
    assert w.run("down", *stack) == 0
    assert_torn_down(w)
