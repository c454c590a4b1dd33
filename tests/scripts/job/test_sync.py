"""Code sync's planning: what is collected (gitignore, size limit), what an upload sends and removes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.launch import prepare_nodes
from scripts.job.records import Job
from scripts.job.sync import (
    CodeBundle,
    check_size,
    collect_sources,
    plan_upload,
    sync_code,
    unpack_command,
)
from scripts.transport.local import LocalTransport
from tests.support.local_fleet import local_fleet


def _git_repo(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text("data/\n*.ckpt\n")
    (path / "train.py").write_text("print('hi')\n")
    (path / "data").mkdir()
    (path / "data" / "big.bin").write_bytes(b"x" * 1000)
    (path / "model.ckpt").write_bytes(b"x" * 10)
    (path / "lib").mkdir()
    (path / "lib" / "util.py").write_text("X = 1\n")


def test_collect_respects_gitignore_and_size_limit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _git_repo(repo)
    files = collect_sources(repo)
    assert sorted(files) == [".gitignore", "lib/util.py", "train.py"]
    # `--local` node state under a runs/ that git does not ignore is never shipped back
    node_code = repo / "runs" / "local" / "node" / ".gputrain" / "code"
    node_code.mkdir(parents=True)
    (node_code / "train.py").write_text("print('hi')\n")
    assert sorted(collect_sources(repo)) == [".gitignore", "lib/util.py", "train.py"]
    (repo / "weights.bin").write_bytes(b"w" * 2 * 1024 * 1024)
    with pytest.raises(
        UserError, match=r"above the limit of 1 MiB; biggest files: weights.bin \(2.0 MiB\)"
    ):
        check_size(collect_sources(repo), 1, repo)
    # not a git repository: a walk that skips .git/.venv/__pycache__/runs
    plain = tmp_path / "plain"
    (plain / ".venv").mkdir(parents=True)
    (plain / ".venv" / "x.py").write_text("")
    (plain / "runs").mkdir()
    (plain / "runs" / "r.json").write_text("")
    (plain / "a.py").write_text("")
    assert sorted(collect_sources(plain, {"pkg": repo / "lib"})) == ["a.py", "pkg/util.py"]


def test_plan_upload_sends_only_changes() -> None:
    plan = plan_upload({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "old", "gone": "9"})
    assert plan.send == ("b", "c") and plan.delete == ("gone",)


def test_sync_skips_unchanged_files_and_removes_deleted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _git_repo(repo)
    t = LocalTransport("n", tmp_path / "node")
    first = sync_code(t, collect_sources(repo))
    assert first.send == (".gitignore", "lib/util.py", "train.py")
    again = sync_code(t, collect_sources(repo))
    assert again.send == () and again.delete == ()
    (repo / "train.py").write_text("print('changed')\n")
    (repo / "lib" / "util.py").unlink()
    third = sync_code(t, collect_sources(repo))
    assert third.send == ("train.py",) and third.delete == ("lib/util.py",)
    code = tmp_path / "node" / ".gputrain" / "code"
    assert (code / "train.py").read_text() == "print('changed')\n"
    assert not (code / "lib" / "util.py").exists()


def test_code_bundle_is_built_once_per_distinct_plan(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a\n")
    (tmp_path / "b.py").write_text("b\n")
    bundle = CodeBundle({"a.py": tmp_path / "a.py", "b.py": tmp_path / "b.py"}, run_script="x")
    fresh = [bundle.payload(bundle.plan("")) for _ in range(8)]  # eight fresh nodes
    assert all(p is fresh[0] for p in fresh)  # the same bytes, built once
    old = json.dumps({"a.py": bundle.manifest["a.py"], "gone.py": "1:0o644"})
    plan = bundle.plan(old)
    assert plan.send == ("b.py",) and plan.delete == ("gone.py",)
    assert bundle.payload(plan) is not fresh[0]
    assert bundle.plan("not json").send == ("a.py", "b.py")


def _path_without(tmp_path: Path, missing: str) -> str:
    """A PATH holding every command of this machine's but `missing` (a node that lacks it)."""
    bin_dir = tmp_path / f"bin-without-{missing}"
    bin_dir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        for p in Path(d).iterdir() if Path(d).is_dir() else ():
            if p.name != missing and not (bin_dir / p.name).exists():
                (bin_dir / p.name).symlink_to(p)
    return str(bin_dir)


def test_a_node_gets_its_code_zstd_compressed_where_it_has_zstd_else_gzipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_nodes asks each node for zstd; the bundle is built once per codec and each
    payload unpacks with its own command (the real zstd and gzip of this machine)."""
    (tmp_path / "train.py").write_text("print('hi')\n" * 100)
    bundle = CodeBundle({"train.py": tmp_path / "train.py"}, run_script="echo run")
    gzipped, zstd = bundle.payload(bundle.plan(""), "gzip"), bundle.payload(bundle.plan(""), "zstd")
    assert gzipped[:2] == b"\x1f\x8b" and zstd[:4] == b"\x28\xb5\x2f\xfd"  # the magic numbers
    assert bundle.payload(bundle.plan(""), "zstd") is zstd  # built once per codec
    fleet = local_fleet()
    job = Job(run_id="r1", workdir=tmp_path, rdzv_port=29500)
    for codec, path in (("zstd", None), ("gzip", _path_without(tmp_path, "zstd"))):
        if path:
            monkeypatch.setenv("PATH", path)
        node = LocalTransport("local", tmp_path / codec)
        assert prepare_nodes(fleet, {"local": node}, job).codecs == {"local": codec}
        payload = bundle.payload(bundle.plan(""), codec)
        r = node.run(unpack_command(codec=codec), 30, stdin=payload)
        assert r.ok, r.stderr
        code = tmp_path / codec / ".gputrain" / "code"
        assert (code / "train.py").read_text() == "print('hi')\n" * 100
        assert (code / ".gputrain-run.sh").read_text() == "echo run"
    # a payload in the other codec fails to unpack (its status says so)
    r = node.run(unpack_command(codec="gzip"), 30, stdin=zstd)
    assert not r.ok
