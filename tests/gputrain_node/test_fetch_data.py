"""The node-side dataset copy (gputrain_node/fetch_data.py) against the real Cloud Storage emulator:
many objects and a sliced big one arrive verified, a repeat downloads nothing, a changed object is
fetched again, a deleted one removed, and a disk too small is refused before any byte moves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputrain_node import fetch_data
from gputrain_node.fetch_data import EXIT_NO_SPACE, EXIT_UNREADABLE, FetchError, Remote, fetch
from tests.support.gcs_emulator import GcsEmulator


@pytest.fixture
def gcs() -> GcsEmulator:
    with GcsEmulator() as g:
        yield g


def put(g: GcsEmulator, objects: dict[str, bytes]) -> None:
    for name, data in objects.items():
        g.write(name, data)


def run(g: GcsEmulator, root: Path, *specs: str, **kw: object) -> dict[str, object]:
    lines: list[str] = []
    kw.setdefault("reserve", 0)
    summary = fetch(
        specs or (f"train=gs://{g.bucket_name}/ds",),
        root,
        "node-0",
        client=g.client(),
        slice_bytes=1 << 20,
        say=lines.append,
        **kw,  # type: ignore[arg-type]
    )
    summary["lines"] = lines
    return summary


def test_copy_verifies_caches_by_generation_and_follows_changes(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    objects = {f"ds/part-{i:03d}.bin": os.urandom(1000 + i) for i in range(40)}
    objects["ds/sub/big.bin"] = os.urandom(3 * (1 << 20) + 17)  # sliced: >= 1 MiB here
    objects["elsewhere/x.bin"] = b"not in the dataset"
    put(gcs, objects)
    root = tmp_path / "data"
    first = run(gcs, root)
    assert first["downloaded_objects"] == 41 and first["cached_objects"] == 0
    for name, data in objects.items():
        if name.startswith("ds/"):
            assert (root / "train" / name[3:]).read_bytes() == data
    assert not (root / "train" / "x.bin").exists()
    assert not list(root.rglob("*.part"))
    assert sorted(p.name for p in root.iterdir()) == [".train.gputrain-data.json", "train"]
    assert "41 object(s)" in first["lines"][0] and "to download 41" in first["lines"][0]

    again = run(gcs, root)  # a repeat run: nothing moves
    assert again["downloaded_objects"] == 0 and again["downloaded_bytes"] == 0
    assert again["cached_objects"] == 41

    gcs.write("ds/part-003.bin", b"new contents")  # a new generation
    gcs.client().bucket(gcs.bucket_name).blob("ds/part-004.bin").delete()
    third = run(gcs, root)
    assert third["downloaded_objects"] == 1 and third["removed"] == 1
    assert (root / "train" / "part-003.bin").read_bytes() == b"new contents"
    assert not (root / "train" / "part-004.bin").exists()

    (root / "train" / "part-005.bin").write_bytes(b"truncated")  # damaged on the node
    assert run(gcs, root)["downloaded_objects"] == 1


def test_a_disk_too_small_is_refused_before_any_download(gcs: GcsEmulator, tmp_path: Path) -> None:
    put(gcs, {"ds/a.bin": b"x" * 5000})
    root = tmp_path / "data"
    with pytest.raises(FetchError) as e:
        run(gcs, root, reserve=1 << 60)
    assert e.value.code == EXIT_NO_SPACE
    assert "node node-0: the datasets need" in str(e.value) and "free" in str(e.value)
    assert not (root / "train").exists()


def test_missing_bucket_or_empty_prefix_is_one_line(gcs: GcsEmulator, tmp_path: Path) -> None:
    with pytest.raises(FetchError) as e:
        run(gcs, tmp_path, "train=gs://no-such-bucket/x")
    assert e.value.code == EXIT_UNREADABLE and "gs://no-such-bucket" in str(e.value)
    with pytest.raises(FetchError) as e:
        run(gcs, tmp_path, f"train=gs://{gcs.bucket_name}/nothing-here")
    assert e.value.code == EXIT_UNREADABLE and "no objects under" in str(e.value)


def test_a_corrupted_download_is_rejected(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    part.write_bytes(b"abc")
    with pytest.raises(FetchError, match="CRC32C mismatch"):
        fetch_data.verify(Remote("f", "ds/f", 3, 1, "AAAAAA=="), part)
    assert not part.exists()
    part.write_bytes(b"abcd")
    with pytest.raises(FetchError, match="downloaded 4 bytes, the object has 3"):
        fetch_data.verify(Remote("f", "ds/f", 3, 1, None), part)


def test_main_prints_the_summary_line_and_exit_codes(
    gcs: GcsEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    put(gcs, {"ds/a.bin": b"abc"})
    assert (
        fetch_data.main([f"t=gs://{gcs.bucket_name}/ds", "--root", str(tmp_path), "--node", "n"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(fetch_data.RESULT_PREFIX)
    assert (tmp_path / "t" / "a.bin").read_bytes() == b"abc"
    assert fetch_data.main(["t=gs://no-such-bucket/ds", "--root", str(tmp_path)]) == EXIT_UNREADABLE
    assert "data: gs://no-such-bucket does not exist" in capsys.readouterr().err


def test_with_local_ssd_the_data_root_is_a_link_onto_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssd, root = tmp_path / "ssd", tmp_path / "node" / ".gputrain" / "data"
    (root / "old").mkdir(parents=True)  # a copy on the boot disk from before: replaced
    assert fetch_data.prepare_root(root, str(ssd)) == root and not root.is_symlink()  # not mounted
    monkeypatch.setattr(fetch_data.os.path, "ismount", lambda p: p == str(ssd))
    fetch_data.prepare_root(root, str(ssd))
    assert root.is_symlink() and root.resolve() == (ssd / "gputrain-data").resolve()
    fetch_data.prepare_root(root, str(ssd))  # idempotent
    assert (
        root.resolve() == (ssd / "gputrain-data").resolve()
        and not (ssd / "gputrain-data" / "old").exists()
    )


def test_on_vertex_the_copy_datasets_land_on_the_replica_and_their_variables_follow(
    gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    put(gcs, {"ds/a.bin": b"abc", "ds/b/c.bin": b"de"})
    env = {
        "GPUTRAIN_DATA_COPY": f"train=gs://{gcs.bucket_name}/ds/:copy",
        "GPUTRAIN_DATA_WEB": "/gcs/x/w",
    }
    fetch_data.copy_on_vertex(env, tmp_path, "workerpool0-0")
    root = tmp_path / "gputrain-data"
    assert env["GPUTRAIN_DATA_TRAIN"] == str(root / "train") and env["GPUTRAIN_DATA_DIR"] == str(
        root
    )
    assert (root / "train" / "b" / "c.bin").read_bytes() == b"de"
    assert env["GPUTRAIN_DATA_WEB"] == "/gcs/x/w"  # mount: Vertex's own /gcs/ path, untouched
    untouched = {"OTHER": "1"}
    fetch_data.copy_on_vertex(untouched, tmp_path, "w")
    assert untouched == {"OTHER": "1"}


def _write_manifests(dest: str, writer: int) -> None:
    for i in range(300):
        fetch_data._write_manifest(Path(dest), {f"w{writer}": {"i": i}})


def test_replicas_sharing_a_data_folder_write_its_manifest_without_tripping_on_each_other(
    tmp_path: Path,
) -> None:
    """The test world's Vertex replicas share one data folder: with one temp name, one writer's
    rename took the other's temp file away (FileNotFoundError, a traceback from the job)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_manifests, args=(str(tmp_path), w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert fetch_data.read_manifest(tmp_path) in ({"w1": {"i": 299}}, {"w2": {"i": 299}})
    manifest = fetch_data.manifest_path(tmp_path)
    assert not list(manifest.parent.glob(f"{manifest.name}*.tmp"))  # every temp file renamed
