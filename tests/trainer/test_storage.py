"""Checkpoint files and the Cloud Storage store, against a real emulator and the real client."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.support.gcs_emulator import GcsEmulator
from trainer import checkpoint
from trainer.errors import CorruptCheckpoint, InputError
from trainer.storage import (
    MANIFEST_SUFFIX,
    CheckpointStore,
    GsUri,
    Uploader,
    crc32c_of,
    parse_gs_uri,
)

SMALL_CHUNK = 256 * 1024  # the smallest resumable chunk GCS allows: the tests send several


def fake_state(step: int, numel: int = 200_000) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "step": step,
        "model": {"w": torch.randn(numel, generator=g)},
        "optimizer": {},
        "model_config": {"n_layer": 1},
    }


def write_ckpt(directory: Path, step: int, numel: int = 200_000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return checkpoint.save(directory, fake_state(step, numel), keep=100)


def store_at(gcs: GcsEmulator, prefix: str = "runs/r1/") -> CheckpointStore:
    return CheckpointStore(GsUri(gcs.bucket_name, prefix), chunk_bytes=SMALL_CHUNK)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("gs://my-bucket", GsUri("my-bucket", "")),
        ("gs://my-bucket/", GsUri("my-bucket", "")),
        ("gs://my_bucket.x/runs/abc", GsUri("my_bucket.x", "runs/abc/")),
        ("gs://b12/runs/abc/", GsUri("b12", "runs/abc/")),
    ],
)
def test_gs_uris_parse(value: str, parsed: GsUri) -> None:
    assert parse_gs_uri(value, "--checkpoint-uri") == parsed


@pytest.mark.parametrize(
    "value",
    [
        "s3://bucket/x",
        "gs://",
        "gs://ab",
        "gs://Upper/x",
        "gs://-dash/x",
        "gs://goog-x",
        "gs://a/b//c",
    ],
)
def test_bad_gs_uris_are_one_line_naming_the_setting(value: str) -> None:
    with pytest.raises(InputError) as e:
        parse_gs_uri(value, "--checkpoint-uri")
    assert str(e.value).startswith(f"--checkpoint-uri {value}: must be gs://BUCKET[/PREFIX]")
    assert "\n" not in str(e.value)


def test_upload_writes_the_object_then_a_manifest_with_the_servers_checksums(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    path = write_ckpt(tmp_path, 100)
    size = path.stat().st_size
    assert size > 2 * SMALL_CHUNK  # a resumable upload in several chunks
    store = store_at(gcs)
    with path.open("rb") as f:
        manifest = store.upload(f, 100, size)
    assert gcs.names("runs/") == [
        "runs/r1/ckpt-00000100.pt",
        "runs/r1/ckpt-00000100.pt" + MANIFEST_SUFFIX,
    ]
    assert gcs.read("runs/r1/ckpt-00000100.pt") == path.read_bytes()
    stored = json.loads(gcs.read("runs/r1/ckpt-00000100.pt" + MANIFEST_SUFFIX))
    assert stored == manifest
    assert (stored["step"], stored["size"], stored["crc32c"]) == (100, size, crc32c_of(path))
    assert stored["md5"] and stored["object"] == "ckpt-00000100.pt"

    found, problems = store.complete()
    assert [(c.step, c.size) for c in found] == [(100, size)] and problems == []
    dest = tmp_path / "fresh" / "ckpt-00000100.pt"
    dest.parent.mkdir()
    store.download(found[0], dest)
    assert dest.read_bytes() == path.read_bytes()
    assert checkpoint.load(dest)["step"] == 100


def test_an_object_without_manifest_is_an_interrupted_upload_and_not_listed(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    gcs.write("runs/r1/ckpt-00000200.pt", write_ckpt(tmp_path, 200).read_bytes())
    assert store_at(gcs).complete() == ([], [])


def test_a_truncated_or_missing_remote_object_is_reported_and_not_complete(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    store = store_at(gcs)
    for step in (100, 200, 300):
        path = write_ckpt(tmp_path, step)
        with path.open("rb") as f:
            store.upload(f, step, path.stat().st_size)
    whole = gcs.read("runs/r1/ckpt-00000300.pt")
    gcs.write("runs/r1/ckpt-00000300.pt", whole[: len(whole) // 2])  # cut short after the manifest
    gcs.client().bucket(gcs.bucket_name).blob("runs/r1/ckpt-00000200.pt").delete()
    found, problems = store.complete()
    assert [c.step for c in found] == [100]
    assert len(problems) == 2
    assert "ckpt-00000200.pt: the object is missing" in problems[0]
    assert "ckpt-00000300.pt:" in problems[1] and "truncated or overwritten" in problems[1]
    assert f"{len(whole) // 2} bytes" in problems[1] and f"says {len(whole)} bytes" in problems[1]


def test_a_download_that_differs_from_the_manifest_is_refused_and_leaves_nothing(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    store = store_at(gcs)
    path = write_ckpt(tmp_path, 100)
    with path.open("rb") as f:
        store.upload(f, 100, path.stat().st_size)
    (good,) = store.complete()[0]
    data = bytearray(gcs.read(good.name))
    data[1000] ^= 0xFF  # same size, one byte flipped after the listing was taken
    gcs.write(good.name, bytes(data))
    dest = tmp_path / "dl" / "ckpt-00000100.pt"
    dest.parent.mkdir()
    with pytest.raises(CorruptCheckpoint, match="the manifest says"):
        store.download(good, dest)
    assert list(dest.parent.iterdir()) == []


def test_prune_keeps_the_newest_k_complete_and_removes_older_orphans(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    store = store_at(gcs)
    gcs.write("runs/r1/ckpt-00000050.pt", b"an interrupted upload of an older step")
    gcs.write("runs/r1/other/ckpt-00000001.pt", b"not ours: in a sub-folder")
    for step in (100, 200, 300):
        path = write_ckpt(tmp_path, step, numel=10)
        with path.open("rb") as f:
            store.upload(f, step, path.stat().st_size)
    gone = store.prune(keep=2)
    assert gone == ["ckpt-00000100.pt" + MANIFEST_SUFFIX, "ckpt-00000050.pt", "ckpt-00000100.pt"]
    assert [c.step for c in store.complete()[0]] == [200, 300]
    assert "runs/r1/other/ckpt-00000001.pt" in gcs.names()


def test_open_checks_the_bucket_before_training(gcs: GcsEmulator) -> None:
    store = CheckpointStore.open(parse_gs_uri(f"gs://{gcs.bucket_name}/p", "--x"), "--x")
    assert store.complete() == ([], []) and gcs.names() == []  # the write probe cleaned up
    with pytest.raises(
        InputError, match=r"^--x gs://no-such-bucket/p/: bucket no-such-bucket does not exist$"
    ):
        CheckpointStore.open(parse_gs_uri("gs://no-such-bucket/p", "--x"), "--x")


def test_uploader_sends_in_the_background_and_survives_local_rotation(
    gcs: GcsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_at(gcs)
    uploader = Uploader(store, keep=2)
    for step in (10, 20, 30, 40):
        path = write_ckpt(tmp_path, step)
        uploader.submit(path, step)
        path.unlink()  # keep-last-K locally may remove a file before its upload starts
    assert uploader.wait(60)
    assert uploader.failures == []
    assert uploader.uploaded[-1] == 40 and [c.step for c in store.complete()[0]][-1] == 40
    assert len(store.complete()[0]) <= 2
    out = capsys.readouterr().out
    assert "checkpoint step 40 uploaded to gs://" in out
    # a step still waiting when a newer one arrives is skipped, and says so
    skipped = {s for s in (10, 20, 30) if f"checkpoint step {s}: upload skipped, step" in out}
    assert skipped | set(uploader.uploaded) == {10, 20, 30, 40}


def test_uploader_failures_are_reported_and_training_goes_on(
    tmp_path: Path, gcs: GcsEmulator
) -> None:
    store = CheckpointStore(GsUri("no-such-bucket", "x/"))
    uploader = Uploader(store, keep=2)
    uploader.submit(write_ckpt(tmp_path, 10), 10)
    assert uploader.wait(60)
    assert (
        uploader.uploaded == []
        and len(uploader.failures) == 1
        and "NotFound" in uploader.failures[0]
    )


def test_a_corrupt_checkpoint_names_the_file_and_never_suggests_weights_only_false(
    tmp_path: Path,
) -> None:
    good = write_ckpt(tmp_path, 100)
    truncated = tmp_path / "ckpt-00000200.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x04not a checkpoint at all")
    foreign = tmp_path / "foreign.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}, "model_config": os.stat_result}, foreign)
    no_config = tmp_path / "old.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}}, no_config)
    cases = {
        truncated: "cannot be read: truncated or not a gputrain checkpoint",
        garbage: "cannot be read: truncated or not a gputrain checkpoint",
        foreign: "is not a gputrain checkpoint: it holds Python objects",
        no_config: "is not a gputrain trainer checkpoint: it has no model_config",
    }
    for path, words in cases.items():
        with pytest.raises(CorruptCheckpoint) as e:
            checkpoint.load(path)
        message = str(e.value)
        assert str(path) in message and words in message and "\n" not in message
        assert "weights_only" not in message and e.value.exit_code == 2
