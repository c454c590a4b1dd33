"""What the launch records for a reconcile pass and what the pass reads back: the environment
plan, the image at its digest, the datasets and the Secret Manager references come back as the
objects the launch had; a secret of the laptop's environment keeps a run from being relaunched."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.datasets import Dataset
from scripts.job.container import ImageRef
from scripts.job.environment import machine_secrets_line, plan_environment, read_secret_references
from scripts.job.records import Job
from scripts.targets.gce.manifest import RunManifest, manifest_for

DIGEST = "sha256:" + "ab" * 32


def job(tmp_path: Path, **fields: object) -> Job:
    (tmp_path / "requirements.txt").write_text("--find-links wheels\nprobe==1.0\n")
    environment = plan_environment(tmp_path, setup="echo hi", setup_timeout_s=60, force=True)
    return Job(
        "r1",
        entry=("train.py",),
        environment=environment,
        image=ImageRef("us-docker.pkg.dev", "p/r/img", "v1", DIGEST),
        datasets=(Dataset("shards", "data-b", "tok/", "mount"), Dataset("val", "data-b", "")),
        **fields,  # type: ignore[arg-type]
    )


def test_environment_image_and_datasets_round_trip_through_the_manifest(tmp_path: Path) -> None:
    given = job(
        tmp_path,
        secrets={"HF_TOKEN": "v"},
        secret_refs={"HF_TOKEN": "projects/p/secrets/hf/versions/latest"},
    )
    m = manifest_for(given, "s", max_recoveries=3, deadline=1e12, code=None)
    assert m.not_relaunchable is None  # its one secret is in Secret Manager
    back = RunManifest.parse(m.to_json(), generation=7)
    parts = back.job_parts()
    assert given.environment is not None
    assert parts["environment"] == given.environment.__class__(
        **{**given.environment.__dict__, "force": False}  # a relaunch reuses what is built
    )
    assert parts["environment"].sources == ("requirements.txt",)
    assert parts["image"] == given.image and parts["image"].pinned.endswith(DIGEST)
    assert parts["datasets"] == given.datasets
    assert back.secret_refs == {"HF_TOKEN": "projects/p/secrets/hf/versions/latest"}
    assert b'"v"' not in m.to_json()  # a value never


def test_a_run_without_any_of_them_reads_back_as_none(tmp_path: Path) -> None:
    m = manifest_for(Job("r2", entry=("x.py",)), "s", max_recoveries=1, deadline=1, code=None)
    parts = RunManifest.parse(m.to_json(), generation=1).job_parts()
    assert parts == {"environment": None, "image": None, "datasets": ()}
    # a manifest written before these fields existed reads the same
    old = b'{"run_id": "r0", "stack": "s", "entry": ["x.py"], "env": {}}'
    assert RunManifest.parse(old, generation=1).job_parts() == parts
    assert RunManifest.parse(old, generation=1).ledger is None  # its cost record: a new one
    with pytest.raises(ValueError, match="ledger is not a dict"):
        RunManifest.parse(old[:-1] + b', "ledger": ["x"]}', generation=1)


def test_a_secret_from_the_laptops_environment_is_not_relaunchable(tmp_path: Path) -> None:
    given = job(
        tmp_path,
        secrets={"HF_TOKEN": "v", "WANDB_API_KEY": "w"},
        secret_refs={"HF_TOKEN": "projects/p/secrets/hf/versions/latest"},
    )
    m = manifest_for(given, "s", max_recoveries=3, deadline=1e12, code=None)
    assert m.not_relaunchable == (
        "with secrets from this machine's environment (WANDB_API_KEY) a pass cannot relaunch "
        "this run; use NAME=sm://SECRET[/VERSION] for WANDB_API_KEY"
    )
    assert m.secret_refs == {"HF_TOKEN": "projects/p/secrets/hf/versions/latest"}
    assert machine_secrets_line(["A"], {"A": "projects/p/secrets/a/versions/1"}) is None


def test_a_pass_reads_its_secrets_by_reference() -> None:
    asked: list[tuple[str, str, str]] = []

    def fetch(project: str, secret: str, version: str) -> str:
        asked.append((project, secret, version))
        return f"value-of-{secret}"

    refs = {"HF_TOKEN": "projects/p1/secrets/hf/versions/3"}
    assert read_secret_references(refs, fetch) == {"HF_TOKEN": "value-of-hf"}
    assert asked == [("p1", "hf", "3")]


def test_plan_says_it_up_front_on_a_stack_only(capsys: pytest.CaptureFixture[str]) -> None:
    from scripts.run_plan import warn_unrelaunchable
    from scripts.targets.base import Capabilities, Feature

    warn_unrelaunchable(Capabilities(), ["WANDB_API_KEY", "HF_TOKEN"], ["HF_TOKEN"])
    err = capsys.readouterr().err
    assert "with secrets from this machine's environment (WANDB_API_KEY) a pass cannot" in err
    warn_unrelaunchable(Capabilities(), ["HF_TOKEN"], ["HF_TOKEN"])  # all in Secret Manager
    hosts = Capabilities({Feature.AUTODOWN: "machines gputrain did not create"})
    warn_unrelaunchable(hosts, ["WANDB_API_KEY"], [])  # no pass recovers a hosts file's runs
    assert capsys.readouterr().err == ""
