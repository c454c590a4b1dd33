"""Vertex worker pools: the Reduction Server (pool 2) and the chief's own shape in the CustomJob
body, `plan --export` round-tripping through vertexJobSpec on the fake Vertex, the user's
CustomJobSpec file end to end (its checks one by one: test_jobfile.py), and the aiplatform
floor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.base.errors import UserError
from infra.spec import parse_spec
from infra.vertex_jobspec import check_job_spec
from infra.vertex_pools import REDUCTION_SERVER_IMAGE, price_pools
from scripts.targets.vertex.job import JobRequest, custom_job_body
from scripts.targets.vertex.preflight import aiplatform_problem
from tests.support.fake_vertex import DEFAULT_PROGRESSION
from tests.support.vertex_world import (
    BUCKET,
    JOB_SPEC,
    STACK_FILE,
    World,
    assert_torn_down,
    job_spec_with,
)

BASE = {
    "gcp:project": "gputrain-test",
    "gputrain:backend": "vertex",
    "gputrain:zones": '["us-central1-a"]',
    "gputrain:machineType": "a2-highgpu-8g",
    "gputrain:nodes": "4",
}


def _spec(**keys: str) -> Any:
    return parse_spec({**BASE, **{f"gputrain:{k}": v for k, v in keys.items()}}, "vtest")


def _request(spec: Any, region: str = "us-central1") -> JobRequest:
    return JobRequest(
        display_name="d", region=region, machine_type=spec.machine_type, gpu_type=None,
        gpu_count=0, nodes=spec.nodes, spot=False, max_run_duration_s=3600,
        output_dir="gs://b/runs/r/", package_uris=("gs://b/staging/r/p.tar.gz",),
        env={"A": "1"}, chief=spec.chief, reduction_server=spec.reduction_server,
    )  # fmt: skip


# ---- the body ------------------------------------------------------------------------------------


def test_reduction_server_is_pool_2_with_googles_image_and_the_training_pools_get_its_env() -> None:
    spec = _spec(reductionServer='{"replicas": 13}')
    pools = custom_job_body(_request(spec))["jobSpec"]["workerPoolSpecs"]
    chief, workers, reducers = pools
    assert reducers == {
        "machineSpec": {"machineType": "n1-highcpu-16"},
        "replicaCount": 13,
        "containerSpec": {"imageUri": REDUCTION_SERVER_IMAGE},
    }
    assert workers["replicaCount"] == 3
    for pool in (chief, workers):
        env = pool["pythonPackageSpec"]["env"]
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in env and {"name": "A", "value": "1"} in env
    # the docs' rule by default: 4 nodes x 100 Gbps / 32 Gbps per n1-highcpu-16 = 13 reducers
    assert _spec(reductionServer="{}").reduction_server.replicas == 13
    europe = custom_job_body(_request(spec, "europe-west4"))["jobSpec"]["workerPoolSpecs"][2]
    assert europe["containerSpec"]["imageUri"].startswith("europe-docker.pkg.dev/")


def test_off_there_is_no_pool_2_and_no_nccl_env() -> None:
    pools = custom_job_body(_request(_spec()))["jobSpec"]["workerPoolSpecs"]
    assert len(pools) == 2
    assert all(e["name"] != "NCCL_DEBUG" for p in pools for e in p["pythonPackageSpec"]["env"])


@pytest.mark.parametrize("gpu_type", ["T4", "t4", "nvidia-tesla-t4", "NVIDIA-TESLA-T4"])
def test_a_chiefs_gpu_type_takes_the_model_names_gpus_takes(gpu_type: str) -> None:
    """Pulumi.yaml's own example, `{machineType: n1-standard-8, gpuType: T4, gpuCount: 1}`."""
    spec = _spec(
        chief=json.dumps({"machineType": "n1-standard-8", "gpuType": gpu_type, "gpuCount": 1})
    )
    chief = custom_job_body(_request(spec))["jobSpec"]["workerPoolSpecs"][0]
    assert chief["machineSpec"] == {
        "machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1,
    }  # fmt: skip


def test_the_chief_has_its_own_machine_and_each_pool_its_price() -> None:
    spec = _spec(chief='{"machineType": "a2-highgpu-1g"}', reductionServer='{"replicas": 2}')
    chief, workers, _ = custom_job_body(_request(spec))["jobSpec"]["workerPoolSpecs"]
    assert chief["machineSpec"] == {
        "machineType": "a2-highgpu-1g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 1,
    }  # fmt: skip
    assert workers["machineSpec"]["machineType"] == "a2-highgpu-8g"

    priced = price_pools(spec.vertex_pools(), "us-central1", spot=False)
    assert [(p.index, p.shape.machine_type, p.shape.replicas) for p in priced] == [
        (0, "a2-highgpu-1g", 1), (1, "a2-highgpu-8g", 3), (2, "n1-highcpu-16", 2),
    ]  # fmt: skip
    chief_h, workers_h, reducers_h = (p.hourly for p in priced)
    assert chief_h and workers_h and reducers_h
    assert workers_h > 3 * chief_h and reducers_h < chief_h  # 8 GPUs vs 1; CPUs only


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"reductionServer": '{"replicas": 0}'}, "gputrain:reductionServer.replicas = 0: allowed: 1 to 64"),
        ({"reductionServer": '{"replicas": -2}'}, "gputrain:reductionServer.replicas = -2: allowed: 1 to 64"),
        ({"reductionServer": '{"replicas": 10000}'}, "gputrain:reductionServer.replicas = 10000: allowed: 1 to 64"),
        ({"reductionServer": '{"machineType": "n1-highcpu-8"}'}, "reductionServer.machineType 'n1-highcpu-8': allowed"),
        ({"reductionServer": '{"replicas": "٣"}'}, "gputrain:reductionServer.replicas = '٣': allowed: 1 to 64"),
        ({"reductionServer": '{"machineType": "n1-highcpu-١٦"}'}, "reductionServer.machineType 'n1-highcpu-١٦': allowed"),
        ({"chief": '{"machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": "١"}'}, "gputrain:chief.gpuCount = '١': allowed"),
        ({"reductionServer": '{"size": 2}'}, "gputrain:reductionServer.size: not a setting"),
        ({"reductionServer": "{}", "nodes": "1"}, "the job has 1 node; Reduction Server only speeds up"),
        ({"chief": '{"machineType": "a9-hugegpu-1g"}'}, "gputrain:chief.machineType 'a9-hugegpu-1g': unknown"),
        ({"chief": '{"machineType": "n1-standard-8", "gpuType": "X100"}'}, "gputrain:chief.gpuType 'X100': unknown; allowed: nvidia-tesla-t4 (T4), nvidia-tesla-v100 (V100), nvidia-tesla-p100 (P100), nvidia-tesla-p4 (P4) (n1-standard-8 is N1)"),
    ],
)  # fmt: skip
def test_bad_pool_settings_are_one_line_each(keys: dict[str, str], message: str) -> None:
    with pytest.raises(UserError) as e:
        _spec(**keys)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- the client floor ----------------------------------------------------------------------------


def _installed(tmp: Path, version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older google-cloud-aiplatform first on sys.path, as a user's environment may have."""
    info = tmp / f"google_cloud_aiplatform-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: google-cloud-aiplatform\nVersion: {version}\n"
    )
    monkeypatch.syspath_prepend(str(tmp))


def test_the_floor_is_the_first_client_with_h200_and_b200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert aiplatform_problem() is None  # what this environment installed from pyproject
    assert aiplatform_problem("1.93.0") is None and aiplatform_problem("2.7.0") is None
    assert "1.92.0 is too old for backend vertex" in (aiplatform_problem("1.92.0") or "")
    _installed(tmp_path, "1.60.0", monkeypatch)
    assert "google-cloud-aiplatform 1.60.0 is too old" in (aiplatform_problem() or "")
    pyproject = (Path(__file__).parents[4] / "pyproject.toml").read_text()
    assert '"google-cloud-aiplatform>=1.93,<3"' in pyproject


def test_doctor_and_plan_name_a_too_old_client_in_one_line(
    world: Callable[..., World], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    w = world()
    _installed(tmp_path / "old", "1.70.0", monkeypatch)
    assert w.run("doctor", "--stack", "vtest") == 1
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if "Vertex AI client" in line]
    assert "fail" in row and "google-cloud-aiplatform 1.70.0 is too old" in row
    assert w.run("plan", "--stack", "vtest") == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "1.70.0 is too old" in line]
    # and `run` stops before anything exists, even without the doctor's table
    assert (
        w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")
        == 2
    )
    assert "1.70.0 is too old" in capsys.readouterr().err
    assert w.runner.call_names() == [] and w.created() == []


# ---- end to end on the fake Vertex ---------------------------------------------------------------


def _stack(w: World, extra: str) -> None:
    (w.settings.root / "Pulumi.vtest.yaml").write_text(STACK_FILE + extra)


def test_a_run_with_reduction_server_submits_pool_2_and_the_reducers_serve_until_the_end(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    _stack(w, "  gputrain:reductionServer:\n    replicas: 2\n")
    assert w.run("plan", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    assert "Vertex AI worker pools" in out and "reduction server" in out and "n1-highcpu-16" in out
    assert "Reduction Server: worker pool 2 at $" in out and "It pays when NCCL all-reduce" in out
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    [body] = w.created()
    *_, reducers = body["jobSpec"]["workerPoolSpecs"]
    assert reducers["machineSpec"] == {"machineType": "n1-highcpu-16"}
    assert reducers["containerSpec"] == {"imageUri": REDUCTION_SERVER_IMAGE}
    assert reducers["replicaCount"] == "2"
    assert "2 x n1-highcpu-16 (reducers)" in out
    for task in ("workerpool2-0", "workerpool2-1"):
        assert w.replicas.outputs[task] == ["reduction server: serving 2 training replicas"]
    assert "[reducer-1] reduction server: serving 2" in out
    assert "answer 42 from rank 0" in out and "answer 42 from rank 1" in out
    assert_torn_down(w)


def _normal(job_spec: Any) -> Any:
    """A jobSpec as the API reads it (enum names or numbers, int64 as strings or not)."""
    from google.cloud import aiplatform_v1

    msg = aiplatform_v1.CustomJobSpec.from_json(json.dumps(job_spec))
    return json.loads(aiplatform_v1.CustomJobSpec.to_json(msg))


def test_export_round_trips_through_vertex_job_spec(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --export` writes what `run` submits; read back by `vertexJobSpec`, the same job is
    submitted (the new run's id in the old one's place) and trains. Both submissions equal the
    export, so one job that trains proves both would."""
    w = world()
    exported = w.settings.root / "job.yaml"
    entry = ("--", "-m", "jobs.answer")
    assert w.run("plan", "--stack", "vtest", "--export", str(exported), *entry) == 0
    out = capsys.readouterr().out
    assert f"wrote the CustomJobSpec to {exported}" in out and "--config=" in out
    doc = yaml.safe_load(exported.read_text())
    assert "*id0" not in exported.read_text()  # each pool in full, as a user writes one
    old = next(e["value"] for e in doc["workerPoolSpecs"][0]["pythonPackageSpec"]["env"]
               if e["name"] == "GPUTRAIN_RUN_ID")  # fmt: skip
    # without --force an existing file stays: one line, exit 2, nothing written
    before = exported.read_text()
    assert w.run("plan", "--stack", "vtest", "--export", str(exported)) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--export {exported}: the file exists; add --force to replace it")
    assert len(err.splitlines()) == 1 and exported.read_text() == before
    long = w.settings.root / ("x" * 300)  # a name the system refuses: one line, not an OSError
    assert w.run("plan", "--stack", "vtest", "--export", str(long)) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--export {long}: cannot write it (File name too long)"), err

    # the stack keys' run submits what was exported. Vertex fails this job before it runs
    # (no replica starts): what it submitted is the subject, and the same job trains below.
    run = ("run", "--stack", "vtest", "--yes", "--skip-preflight", *entry)
    w.vertex.progression = ("JOB_STATE_PENDING", "JOB_STATE_FAILED")
    assert w.run(*run) == 1
    err = capsys.readouterr().err
    assert err.startswith("gputrain: error: Vertex job ") and " FAILED" in err, err
    assert w.replicas.pids == []  # no replica started
    w.vertex.progression = DEFAULT_PROGRESSION
    first = w.run_dir.name
    assert _normal(w.created()[0]["jobSpec"]) == _normal(
        json.loads(json.dumps(doc).replace(old, first))
    )

    # read back by vertexJobSpec: the same job again (the file names its entry), and it trains
    _stack(w, "  gputrain:vertexJobSpec: job.yaml\n")
    assert w.run("plan", "--stack", "vtest") == 0
    assert "submits job.yaml as it is" in capsys.readouterr().out
    rc = w.run(*run[:-3])
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    second = w.run_dir.name
    assert second != first
    assert _normal(w.created()[1]["jobSpec"]) == _normal(
        json.loads(json.dumps(doc).replace(old, second))
    )
    assert "answer 42 from rank 1" in out
    assert f"gs://{BUCKET}/runs/{second}/" in json.dumps(w.created()[1])
    assert_torn_down(w)


_EVALUATE = (  # the user's evaluator: its own world (rank 0 of 1), its own out dir
    "import os\nfrom pathlib import Path\n"
    "print(f\"evaluated: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\", flush=True)\n"
    "out = Path(os.environ['GPUTRAIN_OUT']); out.mkdir(parents=True, exist_ok=True)\n"
    "(out / 'eval.txt').write_text('ok')\n"
)


def test_a_cpu_evaluator_pool_is_priced_counted_by_the_caps_and_runs_on_its_own(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """A job file's pool without GPUs beside the GPU trainers (pool 3, evaluators on
    n1-standard-4) was refused ("no GPU ... only the Reduction Server's"), and gputrain's entry
    stopped on pool 3 ("does not run the trainer"). An export with an evaluator added runs end
    to end: `plan` prices the pool and the caps count it; its replica runs ENTRY on its own, not
    in the trainers' torchrun world, its out dir mirrored as evaluator-0; the chief alone copies
    to AIP_MODEL_DIR."""
    w = world()
    (Path.cwd() / "jobs" / "evaluate.py").write_text(_EVALUATE)
    exported = w.settings.root / "job.yaml"
    assert (
        w.run("plan", "--stack", "vtest", "--export", str(exported), "--", "-m", "jobs.answer") == 0
    )
    doc = yaml.safe_load(exported.read_text())
    evaluator = json.loads(json.dumps(doc["workerPoolSpecs"][1]))
    evaluator["machineSpec"] = {"machineType": "n1-standard-4"}
    evaluator["pythonPackageSpec"]["args"] = ["-m", "jobs.evaluate"]
    doc["workerPoolSpecs"] += [{}, evaluator]
    exported.write_text(yaml.safe_dump(doc))
    shapes = [(0, "g2-standard-8", 1), (1, "g2-standard-8", 1), (3, "n1-standard-4", 1)]
    priced = price_pools(check_job_spec(doc, "job.yaml", spot=True), "us-central1", spot=True)
    assert [(p.index, p.shape.machine_type, p.shape.replicas) for p in priced] == shapes
    total = sum(p.hourly or 0 for p in priced)
    assert priced[2].hourly and total > priced[2].hourly > 0
    capsys.readouterr()

    _stack(
        w, f"  gputrain:vertexJobSpec: job.yaml\n  gputrain:maxHourlyCost: '{total - 0.001:.4f}'\n"
    )
    assert w.run("plan", "--stack", "vtest") == 2  # the GPU pools alone would fit under it
    assert "+ 1 x n1-standard-4 (evaluators) (spot) costs up to" in capsys.readouterr().err
    _stack(w, f"  gputrain:vertexJobSpec: job.yaml\n  gputrain:maxHourlyCost: '{total + 1:.2f}'\n")
    assert w.run("plan", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if "evaluators" in line]
    assert "n1-standard-4" in row and "$" in row
    assert f"Caps: maxHourlyCost ${total + 1:,.2f}/h >= ${total:,.2f}/h" in out

    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight")
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    assert "1 x n1-standard-4 (evaluators)" in out
    assert "[evaluator-0] evaluated: rank 0 of 1" in out
    assert "answer 42 from rank 0" in out and "answer 42 from rank 1" in out
    started = w.replicas.outputs["workerpool3-0"]
    assert any("workerpool3[0] is evaluator-0 on its own" in line for line in started), started
    assert (w.run_dir / "out" / "evaluator-0" / "eval.txt").read_text() == "ok"
    assert not any(p.name == "eval.txt" for p in (w.run_dir / "model").rglob("*"))
    assert (w.run_dir / "model" / "answer.txt").is_file()  # the chief's
    assert_torn_down(w)


def test_a_parameter_server_pool_is_priced_as_such_and_is_no_reduction_server(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """Pool 2 without Google's Reduction Server image, on CPUs: refused ("no GPU"), and
    beside one training node it would have been "a Reduction Server, but pools 0 and 1 hold 1
    node". `plan` prices it as parameter servers and says nothing of Reduction Server."""
    w = world()
    chief = {
        "machineSpec": {"machineType": "g2-standard-8"},
        "containerSpec": {"imageUri": "r/t:1"},
    }
    servers = {"machineSpec": {"machineType": "n1-highmem-8"}, "replicaCount": 2,
               "containerSpec": {"imageUri": "r/ps:1"}}  # fmt: skip
    (w.settings.root / "job.yaml").write_text(
        yaml.safe_dump({"workerPoolSpecs": [chief, {}, servers]})
    )
    _stack(w, "  gputrain:vertexJobSpec: job.yaml\n")
    assert w.run("plan", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if "parameter servers" in line]
    assert "n1-highmem-8" in row and "$" in row
    assert "Reduction Server" not in out and "reduction server" not in out


def test_an_export_to_a_directory_or_to_no_name_is_one_line(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """'' was read as no --export at all (plan passed, nothing written); a directory was 'the
    file exists; add --force', and with --force 'Is a directory'."""
    w = world()
    for written, why in (("", "empty"), (str(w.settings.root), "a directory")):
        for force in ((), ("--force",)):
            assert w.run("plan", "--stack", "vtest", "--export", written, *force) == 2
            err = capsys.readouterr().err.strip()
            assert err == (
                f"gputrain: error: --export {written!r}: {why}; allowed: the name of the file "
                "to write"
            )


def test_the_spending_caps_price_a_vertex_job_files_pools_before_anything(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """The file's pools are the job (the stack's 2 x g2-standard-8 are not used): the caps that
    the stack's shape would pass refuse the file's 4 x a3-highgpu-8g, in `plan` and `run`."""
    w = world()
    (w.settings.root / "config.yaml").write_text(yaml.safe_dump(JOB_SPEC))
    _stack(w, "  gputrain:maxHourlyCost: '5'\n")
    assert w.run("plan", "--stack", "vtest") == 0  # the stack's own shape fits
    capsys.readouterr()
    _stack(w, "  gputrain:maxHourlyCost: '5'\n  gputrain:vertexJobSpec: config.yaml\n")
    assert w.run("plan", "--stack", "vtest") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputrain: error: gputrain:maxHourlyCost 5: 1 x a3-highgpu-8g (chief) ")
    assert "3 x a3-highgpu-8g (workers) + 8 x n1-highcpu-16 (reduction server)" in err
    assert len(err.splitlines()) == 1
    run = ("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")
    assert w.run(*run) == 2
    assert "gputrain:maxHourlyCost 5: 1 x a3-highgpu-8g (chief)" in capsys.readouterr().err
    assert w.runner.call_names() == [] and w.created() == []


@pytest.mark.parametrize(
    ("command", "extra", "said"),
    [
        (("run", "--yes", "--", "-m", "jobs.answer"), "", "ENTRY -m jobs.answer"),
        (("run", "--yes", "--env", "A=1"), "", "--env"),
        (("train", "--secret", "HOME_X"), "", "--secret"),
        (("run", "--yes", "--data", "d=gs://b-1/d"), "", "--data"),
        (("run", "--yes", "--setup", "true"), "", "--setup"),
        (("plan", "--export", "out.yaml", "--", "x.py"), "", "ENTRY x.py"),
        (("plan",), "  gputrain:secrets: [TOKEN_X=sm://tok]\n", "gputrain:secrets"),
        (("plan",), "  gputrain:data: {d: 'gs://b-1/d'}\n", "gputrain:data"),
        (("run", "--yes"), "  gputrain:setup: pip install x\n", "gputrain:setup"),
    ],
)
def test_what_a_vertex_job_file_would_not_use_is_one_line_before_anything(
    world: Callable[..., World],
    capsys: pytest.CaptureFixture[str],
    command: tuple[str, ...],
    extra: str,
    said: str,
) -> None:
    """The file's pools run their own commands, env and data: an ENTRY, --env, a secret, data or
    setup was dropped without a word, and the job ran without them."""
    w = world()
    (w.settings.root / "config.yaml").write_text(yaml.safe_dump(JOB_SPEC))
    _stack(w, "  gputrain:vertexJobSpec: config.yaml\n" + extra)
    name, *rest = command
    assert w.run(name, "--stack", "vtest", *rest) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gputrain: error: {said}: not used with gputrain:vertexJobSpec (its pools run the "
        "commands, env and data the file names); put it in the file, or remove it"
    )
    assert w.runner.call_names() == [] and w.created() == []
    assert not (w.settings.root / "out.yaml").exists()


def test_a_vertex_job_spec_that_is_not_a_job_spec_is_one_line_before_anything(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    (w.settings.root / "specs").mkdir()
    (w.settings.root / "specs" / "config.yaml").write_text("- just\n- a list\n")
    _stack(w, "  gputrain:vertexJobSpec: specs/config.yaml\n")
    assert (
        w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (  # the setting as written, not the file's last name
        "gputrain:vertexJobSpec = 'specs/config.yaml': a YAML list; allowed: a CustomJobSpec" in err
    )
    assert len(err.splitlines()) == 1
    assert w.runner.call_names() == [] and w.created() == []


def test_a_users_file_is_submitted_as_it_is_but_for_what_makes_it_this_stacks_run() -> None:
    from scripts.targets.vertex.jobfile import job_spec_for_run, replaced_fields

    doc = job_spec_with("scheduling", {"strategy": "STANDARD"})
    doc["baseOutputDirectory"] = {"outputUriPrefix": "gs://theirs/out/"}
    spec = job_spec_for_run(
        doc,
        run_id="r2",
        output_dir="gs://b/runs/r2/",
        service_account="sa@p.iam.gserviceaccount.com",
        scheduling={"timeout": "3600s", "strategy": "SPOT"},
        image="reg/p/app@sha256:" + "0" * 64,
    )
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://b/runs/r2/"}
    assert spec["serviceAccount"] == "sa@p.iam.gserviceaccount.com"
    assert spec["scheduling"] == {"timeout": "3600s", "strategy": "STANDARD"}  # theirs kept
    images = [p["containerSpec"]["imageUri"] for p in spec["workerPoolSpecs"]]
    assert images == ["reg/p/app@sha256:" + "0" * 64] * 2 + [REDUCTION_SERVER_IMAGE]
    assert (
        spec["workerPoolSpecs"][1]["machineSpec"] == JOB_SPEC["workerPoolSpecs"][1]["machineSpec"]
    )
    assert doc["baseOutputDirectory"] == {"outputUriPrefix": "gs://theirs/out/"}  # not mutated
    said = replaced_fields(
        doc, service_account="sa@p.iam.gserviceaccount.com", build="app/Dockerfile"
    )
    assert [s.split(" ")[0] for s in said] == ["containerSpec.imageUri", "baseOutputDirectory"]


@pytest.mark.parametrize(
    "written", ["/etc/passwd", "../job.yaml", "specs/../../job.yaml", "~/job.yaml"]
)
def test_a_vertex_job_spec_outside_the_project_directory_is_refused_unread(written: str) -> None:
    """The path is relative to the project directory (docs/guides/vertex.md): a stack file
    never makes gputrain read a file elsewhere."""
    with pytest.raises(UserError) as e:
        _spec(vertexJobSpec=written)
    assert str(e.value) == (
        f"gputrain:vertexJobSpec = {written!r}: allowed: a CustomJobSpec YAML file inside the "
        "project directory, relative to it, without '..'"
    )
    assert _spec(vertexJobSpec="specs/job.yaml").vertex_job_spec == "specs/job.yaml"
