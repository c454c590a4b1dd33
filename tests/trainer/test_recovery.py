"""Recovery through Cloud Storage: the trainer uploads, a replaced node resumes from the bucket,
a damaged newest checkpoint (local or remote) falls back to an intact one, SIGTERM leaves a
complete remote checkpoint, and every resumed loss equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gcs_emulator import GcsEmulator
from tests.support.trainer_helpers import metrics, summary
from trainer import checkpoint
from trainer.storage import MANIFEST_SUFFIX
from trainer.train import main

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
STEPS = 40
FLAGS = ["--checkpoint-every", "10", "--keep-checkpoints", "4", "--log-every", "1"]
FLAGS += ["--eval-batches", "0", "--steps", str(STEPS)]


def train(out: Path, *extra: str) -> dict[int, float]:
    """The tiny preset in this process (one rank); its loss at every step."""
    main(["--out", str(out), *FLAGS, *extra])
    return {r["step"]: r["loss"] for r in metrics(out)}


@dataclass(frozen=True)
class FirstRun:
    """An uninterrupted run with a bucket whose step-40 upload never got its manifest (the node
    died in between): a resume starts from 30 and must reproduce this run's later losses."""

    uri: str
    losses: dict[int, float]
    out: Path  # its out dir, as the run left it
    objects: dict[str, bytes]  # its bucket, as the run (and the lost manifest) left it
    said: str

    def bucket_into(self, gcs: GcsEmulator) -> tuple[str, dict[int, float]]:
        """This run's bucket, byte for byte, in a test's own emulator: (its URI, the losses)."""
        for name, data in self.objects.items():
            gcs.write(name, data)
        return self.uri, self.losses

    def out_into(self, out: Path) -> dict[int, float]:
        """This run's out dir, copied to a test's own `out`: the losses."""
        shutil.copytree(self.out, out)
        return self.losses


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> FirstRun:
    """The one first run of the module's tests (of each pytest-xdist worker that runs them): the
    same flags and seed in each gave the same files, so each test starts from copies of it. Its
    checkpoints are the same bytes as a run without --checkpoint-uri writes."""
    out = tmp_path_factory.mktemp("first") / "out"
    said = io.StringIO()
    with (
        GcsEmulator() as gcs,
        pytest.MonkeyPatch.context() as m,
        contextlib.redirect_stdout(said),
    ):
        m.setenv("STORAGE_EMULATOR_HOST", gcs.url)
        uri = f"gs://{gcs.bucket_name}/runs/r1/"
        losses = train(out, "--checkpoint-uri", uri)
        bucket = gcs.client().bucket(gcs.bucket_name)
        bucket.blob(f"runs/r1/ckpt-00000040.pt{MANIFEST_SUFFIX}").delete()
        objects = {name: gcs.read(name) for name in gcs.names()}
    return FirstRun(uri, losses, out, objects, said.getvalue())


def assert_continues_exactly(out: Path, reference: dict[int, float], start: int) -> None:
    assert summary(out)["resumed_from"] == start
    losses = {r["step"]: r["loss"] for r in metrics(out)}
    later = [step for step in reference if step > start]
    assert len(later) == STEPS - start
    assert [losses[step] for step in later] == [reference[step] for step in later]  # bit for bit


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_replaced_node_resumes_from_the_bucket_exactly(
    first: FirstRun, gcs: GcsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri, reference = first.bucket_into(gcs)
    assert (
        gcs.names("runs/")
        == [  # the last --keep-checkpoints (4), each with its manifest
            f"runs/r1/ckpt-{s:08d}.pt{m}" for s in (10, 20, 30, 40) for m in ("", MANIFEST_SUFFIX)
        ][:-1]
    )
    assert "checkpoint step 40 uploaded to gs://" in first.said
    fresh = tmp_path / "fresh"  # a new VM: its disk is empty, the bucket is all there is
    train(fresh, "--checkpoint-uri", uri)
    said = capsys.readouterr().out
    assert f"resume: step 30 downloaded from {uri}ckpt-00000030.pt" in said
    assert "ckpt-00000040.pt" not in said.split("trainer: preset")[0]  # incomplete: not a candidate
    assert_continues_exactly(fresh, reference, 30)
    assert [s for s, _ in checkpoint.list_checkpoints(fresh)] == [30, 40]


def test_a_truncated_newest_local_checkpoint_falls_back_to_the_older_one(
    first: FirstRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    reference = first.out_into(out)
    (out / "ckpt-00000040.pt").unlink()
    cut_in_half(out / "ckpt-00000030.pt")  # e.g. the disk filled up under a copy
    capsys.readouterr()
    train(out)
    said = capsys.readouterr().out
    assert (
        f"resume: skipped checkpoint {out / 'ckpt-00000030.pt'} cannot be read: truncated" in said
    )
    assert "weights_only" not in said
    assert_continues_exactly(out, reference, 20)


def test_a_truncated_newest_remote_checkpoint_falls_back_to_the_older_one(
    first: FirstRun, gcs: GcsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri, reference = first.bucket_into(gcs)
    gcs.write("runs/r1/ckpt-00000030.pt", gcs.read("runs/r1/ckpt-00000030.pt")[:1000])
    capsys.readouterr()
    fresh = tmp_path / "fresh"
    train(fresh, "--checkpoint-uri", uri)
    said = capsys.readouterr().out
    assert f"resume: skipped {uri}ckpt-00000030.pt: 1000 bytes" in said
    assert "truncated or overwritten" in said
    assert f"resume: step 20 downloaded from {uri}ckpt-00000020.pt" in said
    assert_continues_exactly(fresh, reference, 20)


def test_a_damaged_local_copy_gives_way_to_the_buckets_copy_of_the_same_step(
    first: FirstRun, gcs: GcsEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    uri, reference = first.bucket_into(gcs)
    first.out_into(out)
    (out / "ckpt-00000040.pt").unlink()
    cut_in_half(out / "ckpt-00000030.pt")
    capsys.readouterr()
    train(out, "--checkpoint-uri", uri)
    said = capsys.readouterr().out
    assert f"resume: skipped checkpoint {out / 'ckpt-00000030.pt'} cannot be read" in said
    assert f"resume: step 30 downloaded from {uri}ckpt-00000030.pt" in said
    assert_continues_exactly(out, reference, 30)


def test_no_usable_checkpoint_or_one_without_model_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    out = tmp_path / "out"
    out.mkdir()
    old = out / "ckpt-00000010.pt"
    torch.save({"step": 10, "model": {}, "optimizer": {}}, old)  # an older format, no model_config
    for argv in (["--resume", str(old)], []):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(out), *FLAGS, *argv])
        assert exc.value.code == 2
        said = capsys.readouterr()
        (line,) = said.err.strip().splitlines()
        assert "weights_only" not in said.out + said.err
        if argv:
            assert (
                line
                == f"error: checkpoint {old} is not a gputrain trainer checkpoint: it has no model_config"
            )
        else:
            assert "it has no model_config" in said.out
            assert line.startswith(f"error: --resume auto: no usable checkpoint in {out} ")
            assert line.endswith("use --resume never to start over")
