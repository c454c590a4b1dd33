"""A user's CustomJobSpec file (vertexJobSpec), as `plan` and `run` read it before anything is
created: each problem one line naming the file's own field, its value and what is allowed."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.base.errors import UserError
from infra.vertex_jobspec import check_job_spec
from infra.vertex_pools import pool_rows, price_pools
from tests.support.vertex_world import JOB_SPEC, World, job_spec_with

_ON_DEMAND_1H: dict[str, Any] = {"capacity": "on-demand", "max_run_duration_s": 3600}


def test_a_good_file_gives_each_pool_its_shape() -> None:
    shapes = check_job_spec(JOB_SPEC, "config.yaml")
    assert [(i, s.machine_type, s.accelerator, s.gpus, s.replicas) for i, s in shapes] == [
        (0, "a3-highgpu-8g", "nvidia-h100-80gb", 8, 1),
        (1, "a3-highgpu-8g", "nvidia-h100-80gb", 8, 3),
        (2, "n1-highcpu-16", None, 0, 8),
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (["a", "list"], "config.yaml: a YAML list; allowed: a CustomJobSpec mapping"),
        ({"displayName": "x", "jobSpec": JOB_SPEC}, "config.yaml: a whole CustomJob"),
        ({"worker_pool_specs": []}, "config.yaml: worker_pool_specs: keys with underscores are invalid"),
        ({"pools": []}, "config.yaml: pools: not a CustomJobSpec field"),
        ({"scheduling": {}}, "workerPoolSpecs[0] (the primary replica) is missing"),
        (job_spec_with("workerPoolSpecs.1.machineSpec.machineType", "a3-hugegpu-8g"), "workerPoolSpecs[1].machineSpec.machineType = 'a3-hugegpu-8g': unknown"),
        (job_spec_with("workerPoolSpecs.1.machineSpec.acceleratorType", "NVIDIA_X100"), "workerPoolSpecs[1].machineSpec.acceleratorType = 'NVIDIA_X100': unknown"),
        (job_spec_with("workerPoolSpecs.1.replicaCount", 0), "workerPoolSpecs[1].replicaCount = 0: allowed: 1 to 63 (with the primary replica, at most 64 nodes, as gputrain:nodes has)"),
        (job_spec_with("workerPoolSpecs.2.replicaCount", -1), "workerPoolSpecs[2].replicaCount = -1: allowed: 1 to 125 reducer nodes (default 125: "),
        (job_spec_with("workerPoolSpecs.0.replicaCount", 2), "workerPoolSpecs[0].replicaCount = 2: the primary replica's pool takes 1"),
        (job_spec_with("workerPoolSpecs.2.machineSpec.machineType", "n1-standard-4"), "workerPoolSpecs[2].machineSpec.machineType = 'n1-standard-4': allowed for Reduction Server"),
        (job_spec_with("workerPoolSpecs.1", {"machineSpec": {"machineType": "a3-highgpu-8g"}}), "set exactly one of containerSpec"),
        (job_spec_with("workerPoolSpecs.0.containerSpec", "x"), "workerPoolSpecs[0].containerSpec: a YAML str; allowed: a map"),
        (job_spec_with("workerPoolSpecs.0.containerSpec", {}), "workerPoolSpecs[0].containerSpec.imageUri is missing: allowed: the URI"),
        (job_spec_with("workerPoolSpecs.1.machineSpec", "a3-highgpu-8g"), "workerPoolSpecs[1].machineSpec: a YAML str; allowed: a map"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line(doc: Any, message: str) -> None:
    with pytest.raises(UserError) as e:
        check_job_spec(doc, "config.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)


_N1 = {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("1.machineSpec.acceleratorCount", 4, "workerPoolSpecs[1].machineSpec.acceleratorCount = 4: a3-highgpu-8g has 8 x NVIDIA_H100_80GB; use 0 (implied) or 8"),
        ("1.machineSpec.acceleratorType", "NVIDIA_L4", "workerPoolSpecs[1].machineSpec.acceleratorType = 'NVIDIA_L4': a3-highgpu-8g brings NVIDIA_H100_80GB; leave it empty"),
        ("1.machineSpec", {**_N1, "acceleratorType": "NVIDIA_L4"}, "workerPoolSpecs[1].machineSpec.acceleratorType = 'NVIDIA_L4': n1-standard-8 (N1) can attach NVIDIA_TESLA_T4, NVIDIA_TESLA_V100, NVIDIA_TESLA_P100, NVIDIA_TESLA_P4"),
        ("1.machineSpec", {**_N1, "acceleratorCount": 3}, "workerPoolSpecs[1].machineSpec.acceleratorCount = 3: allowed for NVIDIA_TESLA_T4 on N1: 1, 2, 4"),
        ("1.machineSpec", {**_N1, "machineType": "n1-standard-96"}, "workerPoolSpecs[1].machineSpec.machineType = 'n1-standard-96': 1 x NVIDIA_TESLA_T4 allows at most 48 vCPUs and 312 GB (n1-standard-96 has 96 vCPUs, 360 GB)"),
        ("0.machineSpec", {"machineType": "n1-highcpu-16"}, "workerPoolSpecs[0].machineSpec.machineType = 'n1-highcpu-16': no GPU; allowed for the primary replica: a GPU machine type, or acceleratorType and acceleratorCount set (pools without GPUs: workerPoolSpecs[1] to [3])"),
        ("1.machineSpec", {"machineType": "n1-highcpu-16", "acceleratorCount": 2}, "workerPoolSpecs[1].machineSpec.acceleratorType is empty: n1-highcpu-16 on Vertex needs an attached GPU: NVIDIA_TESLA_T4, NVIDIA_TESLA_V100, NVIDIA_TESLA_P100, NVIDIA_TESLA_P4"),
        ("2.machineSpec.acceleratorCount", 2, "workerPoolSpecs[2].machineSpec.acceleratorCount = 2: Reduction Server nodes use no GPUs; allowed: 0"),
    ],
)  # fmt: skip
def test_a_pools_machine_problem_names_the_files_own_field(
    path: str, value: Any, message: str
) -> None:
    """The line named the stack's keys (`machineSpec: gpuCount 4: ...`), which the file does not
    have: it names the field as the file writes it, its value, what is allowed, and GPU types
    as acceleratorType spells them."""
    with pytest.raises(UserError) as e:
        check_job_spec(job_spec_with(f"workerPoolSpecs.{path}", value), "config.yaml")
    assert str(e.value) == f"config.yaml: {message}"


_CPU = {
    "machineSpec": {"machineType": "n1-standard-8"},
    "containerSpec": {"imageUri": "r/p/eval:1"},
}
_CHIEF = JOB_SPEC["workerPoolSpecs"][0]
_ENTRY = {"executorImageUri": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
          "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "gputrain_node.vertex_entry",
          "args": ["-m", "jobs.evaluate"]}  # fmt: skip


def test_pools_without_gpus_beside_the_chief_are_vertexs_roles_and_are_priced() -> None:
    """Vertex runs CPU pools (parameter servers in pool 2, evaluators in pool 3, CPU workers):
    all but the Reduction Server's were refused ("no GPU"). They are accepted where the price
    data prices their machine type (N1), each named by its role, and priced in its row."""
    doc = {"workerPoolSpecs": [_CHIEF, {**_CPU, "replicaCount": 2}, _CPU,
                               {**_CPU, "machineSpec": {"machineType": "n1-highmem-16"}}]}  # fmt: skip
    shapes = check_job_spec(doc, "c.yaml")
    assert [(i, s.machine_type, s.accelerator, s.gpus, s.replicas) for i, s in shapes] == [
        (0, "a3-highgpu-8g", "nvidia-h100-80gb", 8, 1), (1, "n1-standard-8", None, 0, 2),
        (2, "n1-standard-8", None, 0, 1), (3, "n1-highmem-16", None, 0, 1),
    ]  # fmt: skip
    rows = pool_rows(price_pools(shapes, "us-central1", spot=True))
    assert [r[1] for r in rows] == ["chief", "workers", "parameter servers", "evaluators", "total"]
    assert all(r[-1].startswith("$") for r in rows), rows
    assert rows[3][3] == "-"  # GPUs per replica
    # a parameter-server pool is no Reduction Server: one training node is fine beside it
    assert len(check_job_spec({"workerPoolSpecs": [_CHIEF, {}, _CPU]}, "c.yaml")) == 2


@pytest.mark.parametrize(
    ("machine_type", "message"),
    [
        ("e2-standard-8", "workerPoolSpecs[3].machineSpec.machineType = 'e2-standard-8': not in gputrain's price data (infra/prices.csv), so plan and the spending caps cannot price this pool (did you mean g2-standard-8 or g2-standard-48 or n1-standard-8?); allowed without GPUs: n1-standard-4..96, n1-highmem-*, n1-highcpu-16..96, or a GPU machine type"),
        ("n2-standard-8", "= 'n2-standard-8': not in gputrain's price data (infra/prices.csv), so plan and the spending caps cannot price this pool"),
        ("n1-standard-2", "workerPoolSpecs[3].machineSpec.machineType = 'n1-standard-2': Vertex AI custom training does not run it; allowed without GPUs: n1-standard-4..96"),
    ],
)  # fmt: skip
def test_a_pool_without_gpus_the_caps_cannot_price_says_so(machine_type: str, message: str) -> None:
    """The spending caps count every pool: a CPU machine type the price data lacks (it lists GPU
    machine types and the N1 hosts) is refused for that reason, not as "unknown"."""
    cpu = {**_CPU, "machineSpec": {"machineType": machine_type}}
    with pytest.raises(UserError) as e:
        check_job_spec({"workerPoolSpecs": [_CHIEF, {}, {}, cpu]}, "c.yaml")
    assert str(e.value).startswith("c.yaml: workerPoolSpecs[3].machineSpec.machineType = ")
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([_CHIEF, {**_CPU, "pythonPackageSpec": _ENTRY, "containerSpec": None}], "workerPoolSpecs[1].machineSpec.machineType = 'n1-standard-8': no GPU, and the pool runs gputrain's entry (gputrain_node.vertex_entry), which joins pool 1 to the chief's torchrun world of GPU processes; allowed: a GPU machine type, or these replicas in workerPoolSpecs[3] (ENTRY on its own)"),
        ([_CHIEF, {}, {**_CPU, "pythonPackageSpec": _ENTRY, "containerSpec": None}], "workerPoolSpecs[2]: runs gputrain's entry (gputrain_node.vertex_entry), which has no parameter-server role (its torchrun world is pools 0 and 1); allowed: your own container or pythonModule there, or these replicas in workerPoolSpecs[3] (ENTRY on its own)"),
        ([_CHIEF, {}, {**_CHIEF, "containerSpec": {"imageUri": "i", "command": ["sh", "-c", "exec python3 -m gputrain_node.vertex_entry \"$@\"", "gputrain"]}}], "workerPoolSpecs[2]: runs gputrain's entry"),
        ([_CHIEF, {}, {**_CPU, "containerSpec": {"imageUri": "i", "command": ["python3"], "args": ["-m", "gputrain_node.vertex_entry", "-m", "jobs.ps"]}}], "workerPoolSpecs[2]: runs gputrain's entry"),
        ([_CHIEF, {**_CPU, "containerSpec": {"imageUri": "i", "command": ["python3", "-mgputrain_node.vertex_entry"]}}], "workerPoolSpecs[1].machineSpec.machineType = 'n1-standard-8': no GPU, and the pool runs gputrain's entry"),
        ([_CHIEF, {**_CPU, "containerSpec": {"imageUri": "i", "args": ["python3", "-m", "gputrain_node.vertex_entry"]}}], "workerPoolSpecs[1].machineSpec.machineType = 'n1-standard-8': no GPU, and the pool runs gputrain's entry"),
    ],
)  # fmt: skip
def test_gputrains_entry_on_a_pool_it_cannot_run_is_one_line(pools: Any, message: str) -> None:
    """gputrain's entry starts torchrun's world on pools 0 and 1, and an evaluator (pool 3) on
    its own; on pool 2 it stopped on Vertex ("does not run the trainer"), and a CPU pool 1 joins
    GPU ranks: both were submitted."""
    doc = {"workerPoolSpecs": [{k: v for k, v in p.items() if v is not None} for p in pools]}
    with pytest.raises(UserError) as e:
        check_job_spec(doc, "c.yaml")
    assert str(e.value).startswith(f"c.yaml: {message}")
    evaluator = {**_CPU, "pythonPackageSpec": _ENTRY}
    del evaluator["containerSpec"]
    assert len(check_job_spec({"workerPoolSpecs": [_CHIEF, {}, {}, evaluator]}, "c.yaml")) == 2


_EXPORTED = ["sh", "-c", "set -e; export PYTHONPATH=/tmp/j; exec python3 -m gputrain_node.vertex_entry \"$@\"", "gputrain"]  # fmt: skip


@pytest.mark.parametrize(
    ("code", "entry"),
    [
        ({"pythonPackageSpec": {**_ENTRY, "args": ["--preset", "tiny"]}}, ["--preset", "tiny"]),
        ({"pythonPackageSpec": {k: v for k, v in _ENTRY.items() if k != "args"}}, []),
        ({"containerSpec": {"imageUri": "i", "command": _EXPORTED, "args": []}}, []),
        ({"containerSpec": {"imageUri": "i", "command": _EXPORTED, "args": ["--steps", "5"]}}, ["--steps", "5"]),
        ({"containerSpec": {"imageUri": "i", "command": ["python3", "-m", "gputrain_node.vertex_entry"]}}, []),
        ({"containerSpec": {"imageUri": "i", "command": ["sh", "-c", "exec python3 -mgputrain_node.vertex_entry"]}}, []),
    ],
)  # fmt: skip
def test_an_evaluator_that_would_run_the_reference_trainer_is_one_line(
    code: dict[str, Any], entry: list[str]
) -> None:
    """On pool 3 gputrain's entry given only flags, or no ENTRY, starts the reference trainer
    (the entry's own rule, gputrain_node.contract.is_trainer_flags): the replica refused it once
    the job was submitted and the chief's GPUs billed."""
    evaluator = {"machineSpec": {"machineType": "n1-standard-8"}, **code}
    with pytest.raises(UserError) as e:
        check_job_spec({"workerPoolSpecs": [_CHIEF, {}, {}, evaluator]}, "c.yaml")
    assert str(e.value) == (
        f"c.yaml: workerPoolSpecs[3]: runs gputrain's entry (gputrain_node.vertex_entry) with "
        f"ENTRY {entry!r}, which starts the reference trainer: it would train, into the chief's "
        "checkpoints; allowed for an evaluator: your own -m MODULE or script.py first in its args"
    )


@pytest.mark.parametrize(
    "container",
    [
        {"command": _EXPORTED, "args": ["-m", "jobs.evaluate", "--every", "60"]},
        {"command": ["python3"], "args": ["-m", "gputrain_node.vertex_entry", "jobs/eval.py"]},
        {"command": ["sh", "-c", "exec python3 -m gputrain_node.vertex_entry $MODE \"$@\""]},
        {"command": ["python3", "-m", "gputrain_node.vertex_entry_old"]},  # not the entry
    ],
)  # fmt: skip
def test_an_evaluator_with_its_own_entry_or_its_own_script_is_accepted(
    container: dict[str, Any],
) -> None:
    """A module or script of its own runs; a script that gives the entry more than its "$@" is
    decided on the replica, where its words are known."""
    evaluator = {"machineSpec": {"machineType": "n1-standard-8"},
                 "containerSpec": {"imageUri": "i", **container}}  # fmt: skip
    assert len(check_job_spec({"workerPoolSpecs": [_CHIEF, {}, {}, evaluator]}, "c.yaml")) == 2


@pytest.mark.parametrize("pool", [0, 1, 3])
@pytest.mark.parametrize(("machine", "said"), [({}, " is missing"), ({"machineType": None}, " is missing"),
                                               ({"machineType": " "}, " = ' '"), ({"machineType": 5}, " = 5")])  # fmt: skip
def test_a_pool_without_a_machine_type_names_the_field(
    pool: int, machine: dict[str, Any], said: str
) -> None:
    """A missing machineType is that, not a type the price data lacks nor an unknown one ''."""
    pools: list[Any] = [_CHIEF, {}, {}, {}][: max(pool, 1) + 1]
    pools[pool] = {**_CPU, "machineSpec": machine}
    with pytest.raises(UserError) as e:
        check_job_spec({"workerPoolSpecs": pools}, "c.yaml")
    assert str(e.value) == (
        f"c.yaml: workerPoolSpecs[{pool}].machineSpec.machineType{said}: allowed: the replicas' "
        "machine type, e.g. g2-standard-8 (n1-standard-8 in a pool 1 to 3 without GPUs)"
    )


_EVALUATORS = {**JOB_SPEC["workerPoolSpecs"][1], "replicaCount": 1}


@pytest.mark.parametrize(
    ("pool", "fits", "allowed"),
    [
        (1, 63, "1 to 63 (with the primary replica, at most 64 nodes, as gputrain:nodes has)"),
        (2, 125, "1 to 125 reducer nodes (default 125: their bandwidth matching the GPU nodes'; "
                 "more cannot speed up all-reduce, only add to the bill)"),
        (3, 64, "1 to 64 (at most 64 nodes, as gputrain:nodes has)"),
    ],
)  # fmt: skip
def test_a_pools_replica_count_is_bounded_as_the_stacks_keys_are(
    pool: int, fits: int, allowed: str
) -> None:
    """`nodes` is 1 to 64, `reductionServer.replicas` 1 to the bandwidth rule's count (4 x
    a3-highgpu-8g at 1000 Gbps: 125) or 64: a file's replicaCount had no upper bound (100000000
    workers passed `plan`, priced at $/h to the billions)."""
    doc = copy.deepcopy(
        job_spec_with("workerPoolSpecs", [*JOB_SPEC["workerPoolSpecs"], _EVALUATORS])
    )

    def with_replicas(count: Any) -> Any:
        doc["workerPoolSpecs"][pool]["replicaCount"] = count
        return doc

    assert dict(check_job_spec(with_replicas(fits), "c.yaml"))[pool].replicas == fits
    for bad in (fits + 1, 10**8, str(10**8), 0):
        with pytest.raises(UserError) as e:
            check_job_spec(with_replicas(bad), "c.yaml")
        assert (
            str(e.value)
            == f"c.yaml: workerPoolSpecs[{pool}].replicaCount = {bad!r}: allowed: {allowed}"
        )


_PACKAGE = {"executorImageUri": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
            "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "trainer.task"}  # fmt: skip
_NEEDS = "(Vertex requires executorImageUri, packageUris and pythonModule)"


@pytest.mark.parametrize(
    ("package", "message"),
    [
        ({**_PACKAGE, "pythonModule": None}, f"pythonPackageSpec.pythonModule is missing: allowed: the Python module to run, e.g. trainer.task {_NEEDS}"),
        ({**_PACKAGE, "pythonModule": " "}, "pythonPackageSpec.pythonModule = ' ': allowed: the Python module"),
        ({**_PACKAGE, "packageUris": None}, f"pythonPackageSpec.packageUris is missing: allowed: a list of the package files' gs:// URIs {_NEEDS}"),
        ({**_PACKAGE, "packageUris": []}, "pythonPackageSpec.packageUris = []: allowed: a list of the package files' gs:// URIs"),
        ({**_PACKAGE, "packageUris": ["p.tar.gz"]}, "pythonPackageSpec.packageUris = ['p.tar.gz']: allowed"),
        ({**_PACKAGE, "executorImageUri": None}, f"pythonPackageSpec.executorImageUri is missing: allowed: a prebuilt training container's URI {_NEEDS}"),
        (["trainer.task"], "pythonPackageSpec: a YAML list; allowed: a map"),
    ],
)  # fmt: skip
def test_a_python_package_without_what_vertex_requires_is_one_line(
    package: Any, message: str
) -> None:
    """Vertex's PythonPackageSpec reference marks executorImageUri, packageUris and
    pythonModule "Required": a pool without one passed `plan` and failed only once submitted."""
    pool = {k: v for k, v in JOB_SPEC["workerPoolSpecs"][1].items() if k != "containerSpec"}
    assert check_job_spec(
        job_spec_with("workerPoolSpecs.1", {**pool, "pythonPackageSpec": _PACKAGE}), ""
    )
    if isinstance(package, dict):
        package = {k: v for k, v in package.items() if v is not None}
    with pytest.raises(UserError) as e:
        check_job_spec(
            job_spec_with("workerPoolSpecs.1", {**pool, "pythonPackageSpec": package}), "c"
        )
    assert str(e.value).startswith(f"c: workerPoolSpecs[1].{message}")
    assert "\n" not in str(e.value)


def test_a_psc_interface_config_is_sent_by_a_client_that_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pscInterfaceConfig is a CustomJobSpec field (aiplatform_v1 from google-cloud-aiplatform
    1.96.0; the floor, 1.93, lacks it): it was refused as "not a CustomJobSpec field". The
    installed client sends it; an older one is named in one line, not by the parser's list."""
    from google.cloud import aiplatform_v1

    from scripts.targets.vertex.jobfile import read_job_file

    psc = {"networkAttachment": "projects/p/regions/us-central1/networkAttachments/a"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job_spec_with("pscInterfaceConfig", psc)))
    doc, shapes = read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert doc["pscInterfaceConfig"] == psc and len(shapes) == 3
    monkeypatch.delitem(aiplatform_v1.CustomJobSpec.meta.fields, "psc_interface_config")
    with pytest.raises(UserError) as e:
        read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert re.fullmatch(
        r"gputrain:vertexJobSpec = 'job.yaml': pscInterfaceConfig: the installed "
        r"google-cloud-aiplatform [0-9.]+ cannot send it; allowed: 1\.96\.0 or newer "
        r"\(pip install 'google-cloud-aiplatform>=1\.96\.0'\), or a file without it",
        str(e.value),
    )


def test_a_pool_the_price_data_lacks_says_why_in_its_row() -> None:
    """Vertex takes N2 reducers, which infra/prices.csv does not list (GPU machines and the N1
    hosts only): the row said "unknown" and no more. N1 CPU-only reducers are priced."""
    n2 = job_spec_with("workerPoolSpecs.2.machineSpec.machineType", "n2-highcpu-16")
    rows = pool_rows(price_pools(check_job_spec(n2, ""), "us-central1", spot=True))
    assert [r[-1] for r in rows[2:]] == [
        "unknown: not in the price data (infra/prices.csv)",
        "unknown",
    ]
    assert rows[0][-1].startswith("$") and rows[1][-1].startswith("$")
    n1 = pool_rows(price_pools(check_job_spec(JOB_SPEC, ""), "us-central1", spot=True))
    assert n1[2][2] == "n1-highcpu-16" and n1[2][-1].startswith("$")
    nowhere = pool_rows(price_pools(check_job_spec(JOB_SPEC, ""), "xx-nowhere1", spot=False))
    assert nowhere[0][-1] == "unknown: no on-demand price in xx-nowhere1"


_POOL0 = "workerPoolSpecs:\n- machineSpec: {machineType: g2-standard-24}\n  containerSpec: {imageUri: x}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheduling: 5\n" + _POOL0, "not what Vertex reads: Failed to parse scheduling field"),
        (_POOL0.replace("x}", "x, args: -m}"), "Failed to parse args field: repeated field args"),
        (_POOL0.replace("x}", "x, env: [{name: A, value: 1}]}"), "Failed to parse value field"),
        (_POOL0 + "- {machineSpec: {machineType: g2-standard-24}, replicaCount: 1" + "0" * 20
         + ", containerSpec: {imageUri: x}}\n", "replicaCount = 1" + "0" * 20 + ": allowed: 1 to 63"),
        ("scheduling: {timeout: 2026-01-01}\n" + _POOL0, "Object of type date is not JSON"),
    ],
)  # fmt: skip
def test_a_file_vertex_cannot_read_is_one_line_before_anything(
    tmp_path: Path, text: str, message: str
) -> None:
    """Submitted, the job goes through CustomJob.from_json after `up`: a value of the wrong type
    was a traceback there, with the stack up. read_job_file (plan, and run before `up`) refuses
    it."""
    from scripts.targets.vertex.jobfile import read_job_file

    (tmp_path / "job.yaml").write_text(text)
    with pytest.raises(UserError) as e:
        read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert str(e.value).startswith("gputrain:vertexJobSpec = 'job.yaml': ")
    assert message in str(e.value) and "\n" not in str(e.value)


_G2 = {"machineSpec": {"machineType": "g2-standard-8"}, "containerSpec": {"imageUri": "r/p/i:1"}}


def test_a_files_scheduling_dearer_than_the_caps_are_checked_at_is_refused_before_anything(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """The file's scheduling wins over the stack's, but the caps priced the stack's: on a spot
    stack (maxRunDuration 1h, budget $5) `strategy: STANDARD, timeout: 604800s` passed `plan` at
    the Spot rate for 1h and was submitted on demand for up to 7 days. Refused in one line, by
    `plan` and by `run` before `up`; a file within the stack's terms is accepted."""
    w = world()
    stack = w.settings.root / "Pulumi.vtest.yaml"
    stack.write_text(
        stack.read_text()
        + "  gputrain:vertexJobSpec: job.yaml\n  gputrain:budget: '5'\n"
        + "  gputrain:maxHourlyCost: '3'\n"
    )
    job = w.settings.root / "job.yaml"
    where = "gputrain:vertexJobSpec = 'job.yaml': scheduling"
    for scheduling, refused in [
        ({"timeout": "604800s", "strategy": "STANDARD"}, (
            f"{where}.strategy = 'STANDARD': the stack's capacity is spot, the mode the spending "
            "caps and prices are reckoned at; allowed: SPOT, no strategy (the stack's is sent), "
            "or gputrain:capacity on-demand")),
        ({"timeout": "604800s"}, (
            f"{where}.timeout = '604800s': longer than gputrain:maxRunDuration 1h, the "
            "server-side bound the budget is checked against; allowed: '3600s' or less, no "
            "timeout (the stack's is sent), or a longer maxRunDuration")),
    ]:  # fmt: skip
        job.write_text(yaml.safe_dump({"workerPoolSpecs": [_G2, _G2], "scheduling": scheduling}))
        for argv in (("plan",), ("run", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")):
            assert w.run(argv[0], "--stack", "vtest", *argv[1:]) == 2
            assert capsys.readouterr().err.strip() == f"gputrain: error: {refused}"
    assert w.runner.call_names() == [] and w.created() == []
    job.write_text(
        yaml.safe_dump(
            {"workerPoolSpecs": [_G2, _G2], "scheduling": {"timeout": "1800s", "strategy": "SPOT"}}
        )
    )
    assert w.run("plan", "--stack", "vtest") == 0
    assert "Caps: maxHourlyCost $3.00/h >= $" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("capacity", "scheduling", "refused"),
    [
        ("spot", {"strategy": "STANDARD"}, "strategy = 'STANDARD': the stack's capacity is spot"),
        ("spot", {"strategy": "ON_DEMAND"}, "allowed: SPOT, no strategy (the stack's is sent), or gputrain:capacity on-demand"),
        ("spot", {"strategy": "STRATEGY_UNSPECIFIED"}, "or gputrain:capacity on-demand"),  # STANDARD
        ("spot", {"strategy": 0}, "strategy = 0: the stack's capacity is spot"),
        ("spot", {"strategy": "FLEX_START"}, "allowed: SPOT, no strategy (the stack's is sent), or gputrain:capacity flex-start"),
        ("on-demand", {"strategy": "LOW_COST"}, "strategy = 'LOW_COST': the stack's capacity is on-demand, the mode the spending caps and prices are reckoned at; allowed: STANDARD, no strategy (the stack's is sent)"),
        ("on-demand", {"strategy": "SPOT"}, "allowed: STANDARD, no strategy (the stack's is sent), or gputrain:capacity spot"),
        ("flex-start", {"strategy": "STANDARD"}, "allowed: FLEX_START, no strategy"),
        ("spot", {"timeout": "3600.000000001s"}, "timeout = '3600.000000001s': longer than gputrain:maxRunDuration 1h"),
        ("spot", {"timeout": "0s"}, "timeout = '0s': allowed: seconds as Vertex writes a duration, more than 0 and at most '3600s' (gputrain:maxRunDuration 1h), or no timeout (the stack's is sent)"),
        ("spot", {"timeout": "-5s"}, "timeout = '-5s': allowed: seconds as Vertex writes a duration"),
    ],
)  # fmt: skip
def test_a_files_scheduling_must_keep_the_stacks_capacity_and_bound(
    tmp_path: Path, capacity: str, scheduling: dict[str, Any], refused: str
) -> None:
    """Scheduling.Strategy as aiplatform_v1 has it: STRATEGY_UNSPECIFIED defaults to STANDARD,
    ON_DEMAND is STANDARD's deprecated name, LOW_COST (deprecated) matches no capacity, proto JSON
    takes numbers; a timeout past maxRunDuration, or none at all (0s), is not the stack's bound."""
    from scripts.targets.vertex.jobfile import read_job_file

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job_spec_with("scheduling", scheduling)))
    with pytest.raises(UserError) as e:
        read_job_file(tmp_path, "job.yaml", capacity=capacity, max_run_duration_s=3600)
    assert str(e.value).startswith("gputrain:vertexJobSpec = 'job.yaml': scheduling.")
    assert refused in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("capacity", "scheduling"),
    [
        ("spot", {"strategy": "SPOT", "timeout": "3600s", "disableRetries": True}),
        ("spot", {"strategy": 4, "timeout": "60.5s"}),
        ("on-demand", {"strategy": "ON_DEMAND"}),
        ("on-demand", {"strategy": "STRATEGY_UNSPECIFIED", "timeout": "1800s"}),
        ("flex-start", {"strategy": "FLEX_START", "maxWaitDuration": "7200s"}),
        ("spot", {"strategy": None, "timeout": None}),
        ("spot", {}),
    ],
)
def test_a_files_scheduling_within_the_stacks_terms_is_kept(
    tmp_path: Path, capacity: str, scheduling: dict[str, Any]
) -> None:
    """A matching strategy, a shorter timeout, or none (the stack's is sent) is what the caps
    priced: the file is read as it is."""
    from scripts.targets.vertex.jobfile import read_job_file

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job_spec_with("scheduling", scheduling)))
    doc, _ = read_job_file(tmp_path, "job.yaml", capacity=capacity, max_run_duration_s=3600)
    assert doc["scheduling"] == scheduling


def test_a_files_null_scheduling_values_leave_the_stacks_in_place() -> None:
    """Proto JSON reads null as unset: `strategy: null` over the stack's SPOT went out as no
    strategy (STANDARD, on demand), `timeout: null` as no timeout (Vertex's 7 days)."""
    from scripts.targets.vertex.jobfile import job_spec_for_run

    doc = job_spec_with("scheduling", {"strategy": None, "timeout": None, "disableRetries": True})
    spec = job_spec_for_run(
        doc,
        run_id="r1",
        output_dir="gs://b/runs/r1/",
        service_account="sa@p.iam.gserviceaccount.com",
        scheduling={"timeout": "3600s", "strategy": "SPOT"},
    )
    assert spec["scheduling"] == {"timeout": "3600s", "strategy": "SPOT", "disableRetries": True}


def test_lustre_mounts_are_sent_by_a_client_that_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lustreMounts is a WorkerPoolSpec field (aiplatform_v1 from google-cloud-aiplatform
    1.136.0; 1.135.0 lacks it): it was refused as "not a WorkerPoolSpec field". The installed
    client sends it; an older one is named in one line, not by the parser's list."""
    from google.cloud import aiplatform_v1

    from scripts.targets.vertex.jobfile import read_job_file

    lustre = [{"instanceIp": "10.0.0.2", "volumeHandle": "p/us-central1-a/l", "filesystem": "fs",
               "mountPoint": "data"}]  # fmt: skip
    doc = job_spec_with("workerPoolSpecs.1.lustreMounts", lustre)
    assert len(check_job_spec(doc, "c.yaml")) == 3
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    got, shapes = read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert got["workerPoolSpecs"][1]["lustreMounts"] == lustre and len(shapes) == 3
    monkeypatch.delitem(aiplatform_v1.WorkerPoolSpec.meta.fields, "lustre_mounts")
    with pytest.raises(UserError) as e:
        read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert re.fullmatch(
        r"gputrain:vertexJobSpec = 'job.yaml': workerPoolSpecs\[1\]: lustreMounts: the installed "
        r"google-cloud-aiplatform [0-9.]+ cannot send it; allowed: 1\.136\.0 or newer "
        r"\(pip install 'google-cloud-aiplatform>=1\.136\.0'\), or a file without it",
        str(e.value),
    )


_NFS = {"server": "10.0.0.2", "path": "/vol1", "mountPoint": "data"}
_LUSTRE = {"instanceIp": "10.0.0.3", "volumeHandle": "p/us-central1-a/l", "filesystem": "fs",
           "mountPoint": "scratch"}  # fmt: skip
_PEERED = {"network": "projects/123/global/networks/vpc"}


@pytest.mark.parametrize(
    ("key", "mounts", "message"),
    [
        ("nfsMounts", [{**_NFS, "mountPoint": None}], "nfsMounts[0].mountPoint is missing: allowed: a directory name, e.g. data: Vertex mounts the share at /mnt/nfs/data (a string: Vertex requires it)"),
        ("nfsMounts", [_NFS, {"server": "10.0.0.2", "path": "/vol2"}], "nfsMounts[1].mountPoint is missing: allowed"),
        ("nfsMounts", [{**_NFS, "server": ""}], "nfsMounts[0].server = '': allowed: the NFS server's IP address (a string: Vertex requires it)"),
        ("nfsMounts", [{**_NFS, "server": "filer.internal"}], "nfsMounts[0].server = 'filer.internal': not an IP address; allowed: the NFS server's IP address"),
        ("nfsMounts", [{**_NFS, "path": "vol1"}], "nfsMounts[0].path = 'vol1': not absolute; allowed: the exported path, starting with '/'"),
        ("nfsMounts", [{**_NFS, "mountPoint": "/mnt/nfs/data"}], "nfsMounts[0].mountPoint = '/mnt/nfs/data': not a single directory name; allowed: a directory name, e.g. data: Vertex mounts the share at /mnt/nfs/data"),
        ("nfsMounts", [{**_NFS, "mountPoint": ".."}], "nfsMounts[0].mountPoint = '..': not a single directory name"),
        ("nfsMounts", [{**_NFS, "mountPoint": 7}], "nfsMounts[0].mountPoint = 7: allowed: a directory name"),
        ("nfsMounts", [{**_NFS, "readOnly": True}], "nfsMounts[0].readOnly: not a NfsMount field; allowed: server, path, mountPoint"),
        ("nfsMounts", ["10.0.0.2:/vol1"], "nfsMounts[0]: a YAML str; allowed: a NfsMount map (server, path, mountPoint)"),
        ("nfsMounts", _NFS, "nfsMounts: a YAML dict; allowed: a list of NfsMount maps (server, path, mountPoint)"),
        ("lustreMounts", [{**_LUSTRE, "filesystem": None}], "lustreMounts[0].filesystem is missing: allowed: the Lustre file system's name (a string: Vertex requires it)"),
        ("lustreMounts", [{**_LUSTRE, "volumeHandle": 3}], "lustreMounts[0].volumeHandle = 3: allowed: the Lustre volume's unique identifier"),
        ("lustreMounts", [{**_LUSTRE, "instanceIp": "10.0.0"}], "lustreMounts[0].instanceIp = '10.0.0': not an IP address; allowed: the Lustre instance's IP address"),
        ("lustreMounts", [{**_LUSTRE, "mountPoint": "a/b"}], "lustreMounts[0].mountPoint = 'a/b': not a single directory name; allowed: a directory name, e.g. data: Vertex mounts it at /mnt/lustre/data"),
        ("lustreMounts", [{**_LUSTRE, "server": "10.0.0.3"}], "lustreMounts[0].server: not a LustreMount field; allowed: instanceIp, volumeHandle, filesystem, mountPoint"),
    ],
)  # fmt: skip
def test_a_mount_vertex_would_reject_is_one_line_before_anything(
    tmp_path: Path, key: str, mounts: Any, message: str
) -> None:
    """NfsMount's server, path and mountPoint and LustreMount's four fields are "Required"; the
    path is absolute, mountPoint one directory name under /mnt/nfs/ (/mnt/lustre/): nothing
    looked inside the mounts, and Vertex refused them once the job was submitted (or the parser,
    after `up`, for a wrong type)."""
    from scripts.targets.vertex.jobfile import read_job_file

    doc = {**job_spec_with(f"workerPoolSpecs.1.{key}", mounts), **_PEERED}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError) as e:
        read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
    assert str(e.value).startswith(
        f"gputrain:vertexJobSpec = 'job.yaml': workerPoolSpecs[1].{message}"
    )
    assert "\n" not in str(e.value)


def test_mounts_as_vertex_documents_them_are_sent_and_nfs_names_its_network(
    tmp_path: Path,
) -> None:
    """Good mounts reach the job as written; a job that mounts an NFS share names the network
    Vertex reaches it through (Google's NFS guide: "you must specify the name of the network"),
    by VPC peering or a Private Service Connect interface."""
    from scripts.targets.vertex.jobfile import read_job_file

    doc = job_spec_with("workerPoolSpecs.1.nfsMounts", [_NFS, {**_NFS, "server": "fd00::2"}])
    doc["workerPoolSpecs"][0]["lustreMounts"] = [_LUSTRE]
    for network in (_PEERED, {"pscInterfaceConfig": {"networkAttachment": "projects/p/regions/"
                                                     "us-central1/networkAttachments/a"}}):  # fmt: skip
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({**doc, **network}))
        got, _ = read_job_file(tmp_path, "job.yaml", **_ON_DEMAND_1H)
        assert got["workerPoolSpecs"][1]["nfsMounts"][1]["server"] == "fd00::2"
    for blank in ({}, {"network": " "}):  # a blank network names none
        with pytest.raises(UserError) as e:
            check_job_spec({**doc, **blank}, "c.yaml")
        assert str(e.value) == (
            "c.yaml: workerPoolSpecs[1].nfsMounts needs the network Vertex reaches the share "
            "through, and the file has none; allowed: network (projects/PROJECT_NUMBER/global/"
            "networks/NETWORK, with VPC Network Peering) or pscInterfaceConfig (a Private "
            "Service Connect interface)"
        )
    lustre_only = job_spec_with("workerPoolSpecs.1.lustreMounts", [_LUSTRE])
    assert len(check_job_spec(lustre_only, "c.yaml")) == 3  # the guide's rule is NFS's


def test_the_mount_fields_checked_are_the_installed_clients() -> None:
    """What the checks allow is what aiplatform_v1 sends: NfsMount's and LustreMount's fields."""
    from google.cloud import aiplatform_v1

    from infra.vertex_mounts import LUSTRE_FIELDS, NFS_FIELDS

    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(w.title() for w in rest)

    assert [camel(f) for f in aiplatform_v1.NfsMount.meta.fields] == list(NFS_FIELDS)
    assert [camel(f) for f in aiplatform_v1.LustreMount.meta.fields] == list(LUSTRE_FIELDS)
