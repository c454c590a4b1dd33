"""What the Pulumi program tests share: the machine families every check runs on, the whole-family
check of the declared resources, and running __main__.py under the SDK's mocks (declaring nothing
on a bad config)."""

from __future__ import annotations

import runpy
from typing import Any

import pulumi
import pytest

from infra import catalog
from infra.disk_prices import cluster_hourly
from infra.spec import ClusterSpec, SpecError
from tests.support import ROOT
from tests.support.pulumi_mocks import (
    ACCOUNT,
    FIREWALL,
    IAM_MEMBER,
    POLICY,
    TEST_PRIVATE_KEY,
    TEST_PROJECT,
    TEST_PUBLIC_KEY,
    TEST_SOURCE_RANGE,
    GcpMocks,
    pulumi_mocks,
    walk,
)

MAIN = str(ROOT / "__main__.py")
COMPONENTS = (
    "gputrain:infra:GpuCluster",
    "gputrain:infra:ClusterNetwork",
    "gputrain:infra:NodeIdentity",
    "gputrain:infra:GpuNodes",
    "gputrain:infra:StackBucket",
)

# (id, base stack file, overrides): the nine families the issue names.
FAMILIES: list[tuple[str, str, dict[str, str]]] = [
    ("a2-high", "dev", {"machineType": "a2-highgpu-8g", "nodes": "2", "capacity": "on-demand"}),
    ("a2-ultra", "a100", {}),
    ("a3-high-8g", "h100", {}),
    ("a3-mega", "dev", {"machineType": "a3-megagpu-8g", "nodes": "3", "bootDiskType": "pd-ssd"}),
    ("a3-high-2g-spot", "dev", {"machineType": "a3-highgpu-2g", "spot": "true"}),
    ("a4", "dev", {"machineType": "a4-highgpu-8g", "nodes": "2", "labels": '["team=ml"]'}),
    ("g2", "dev", {}),
    ("n1-t4", "t4", {"nodes": "2", "gpuCount": "4", "machineType": "n1-standard-16"}),
    (
        "n1-v100",
        "dev",
        {
            "machineType": "n1-standard-8",
            "gpuType": "nvidia-tesla-v100",
            "gpuCount": "1",
            "capacity": "on-demand",
        },
    ),
]


def contains_private_key(value: Any) -> bool:
    body = "".join(TEST_PRIVATE_KEY.splitlines()[1:-1])[:40]
    return any(
        isinstance(v, str) and ("PRIVATE KEY" in v or body in v.replace("\n", ""))
        for v in walk(value)
    )


def check_family(m: GcpMocks, spec: ClusterSpec, outputs: dict[str, Any]) -> None:
    """Everything the issue requires of the declared resources for one family."""
    vms = m.instances()
    assert [v.name for v in vms] == [f"{spec.stack}-node-{i}" for i in range(spec.nodes)]
    mt = catalog.MACHINE_TYPES[spec.machine_type]
    for i, vm in enumerate(vms):
        x = vm.inputs
        assert x["machineType"] == spec.machine_type and x["zone"] == spec.zone
        assert x["project"] == TEST_PROJECT
        s = x["scheduling"]
        assert s["onHostMaintenance"] == "TERMINATE"
        assert s["instanceTerminationAction"] == "DELETE"
        assert float(s["maxRunDuration"]["seconds"]) == spec.max_run_duration_s
        if spec.spot:
            assert (s["provisioningModel"], s["preemptible"], s["automaticRestart"]) == (
                "SPOT",
                True,
                False,
            )
        else:
            want_model = spec.instance_capacity.provisioning_model
            assert s["provisioningModel"] == want_model and s["preemptible"] is False
        if spec.placement == "compact":
            assert s["automaticRestart"] is False
        # GPUs: A/G series bring them (no guest_accelerators at all); N1 attaches count > 0.
        if mt.has_builtin_gpus:
            assert not x.get("guestAccelerators")
            assert "guestAccelerators" not in x
        else:
            [acc] = x["guestAccelerators"]
            assert acc["type"] == spec.accelerator and int(acc["count"]) == spec.gpus_per_node > 0
        nic, *extra = x["networkInterfaces"]
        assert nic.get("nicType") == ("GVNIC" if spec.series in ("a3", "a4") else None)
        # publicIp: head -> only node 0 has an access config; GPU NICs never have one.
        assert bool(nic.get("accessConfigs")) == (i == 0), vm.name
        assert spec.fabric is not None and len(extra) == len(spec.fabric.nics) - 1
        assert not any(n.get("accessConfigs") for n in extra)
        md = x["metadata"]
        assert md["ssh-keys"] == f"{spec.ssh_user}:{TEST_PUBLIC_KEY}"
        assert md["enable-guest-attributes"] == "TRUE"
        assert md["install-nvidia-driver"] == "True"
        assert md["enable-oslogin"] == "FALSE"
        assert md["block-project-ssh-keys"] == "TRUE"  # project-wide keys do not log in
        want = {"gputrain-stack": spec.stack, "gputrain-project": "gputrain", **spec.labels}
        assert want.items() <= x["labels"].items()
        disk = x["bootDisk"]["initializeParams"]
        assert want.items() <= disk["labels"].items()
        assert disk["type"] == spec.boot_disk_type and int(disk["size"]) == spec.boot_disk_gb
        assert disk["image"].endswith(f"/images/{spec.image_family}-v20260416")
        assert x["tags"] == [f"gputrain-{spec.stack}"]
    # Firewall: internal by tag; SSH (22 only) only from the configured range, never the world.
    fws = {f.name: f.inputs for f in m.of_type(FIREWALL)}
    fabric_fws = {f"{spec.stack}-{n.suffix}-internal" for n in spec.fabric.networks if n.firewall}
    assert set(fws) == {f"{spec.stack}-internal", f"{spec.stack}-ssh", *fabric_fws}
    ssh = fws[f"{spec.stack}-ssh"]
    assert ssh["sourceRanges"] == [TEST_SOURCE_RANGE]
    assert ssh["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    internal = fws[f"{spec.stack}-internal"]
    assert "sourceRanges" not in internal
    assert internal["sourceTags"] == internal["targetTags"] == [f"gputrain-{spec.stack}"]
    assert "0.0.0.0/0" not in list(walk(fws))
    # Service account: only log and metric writes, and (autodown) deleting the stack's own VMs.
    [sa] = m.of_type(ACCOUNT)
    unconditioned = [r for r in m.of_type(IAM_MEMBER) if "condition" not in r.inputs]
    roles = sorted(r.inputs["role"] for r in unconditioned)
    # nothing for the fabric: its images and apt repos are in Google's gce-ai-infra project
    assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    [delete] = [r for r in m.of_type(IAM_MEMBER) if "condition" in r.inputs]
    assert delete.inputs["role"] == "roles/compute.instanceAdmin.v1"
    expr = delete.inputs["condition"]["expression"]
    assert f'startsWith("projects/{spec.project}/zones/")' in expr
    assert f'extract("/instances/{{name}}").startsWith("{spec.stack}-node-")' in expr
    assert all(
        r.inputs["member"].startswith(f"serviceAccount:{sa.inputs['accountId']}@")
        for r in m.of_type(IAM_MEMBER)
    )
    # Placement.
    policies = m.of_type(POLICY)
    if spec.placement == "compact":
        [p] = policies
        gp = p.inputs["groupPlacementPolicy"]
        assert gp["collocation"] == "COLLOCATED" and int(gp["vmCount"]) == spec.nodes
        assert all(v.inputs["resourcePolicies"].endswith(f"/{p.name}") for v in vms)
    else:
        assert policies == [] and all("resourcePolicies" not in v.inputs for v in vms)
    # One GpuCluster of three child components; everything else is a real (custom) GCE resource.
    fabric = ("gputrain:infra:GpuFabric",) if spec.fabric.enabled else ()
    assert sorted(r.typ for r in m.resources if not r.custom) == sorted(COMPONENTS + fabric)
    # The private key is nowhere.
    assert not any(contains_private_key(r.inputs) for r in m.resources)
    assert not contains_private_key(outputs)
    # Exports.
    assert outputs["gpusPerNode"] == spec.gpus_per_node
    assert outputs["gpuModel"] == catalog.ACCELERATORS[spec.accelerator].model
    assert [n["role"] for n in outputs["nodes"]] == ["head"] + ["worker"] * (spec.nodes - 1)
    assert outputs["nodes"][0]["externalIp"] == "203.0.113.10"
    assert all(n["externalIp"] is None for n in outputs["nodes"][1:])
    assert outputs["headAddress"] == "203.0.113.10"
    # the rate the caps, the budget and the cost record count (the VMs with their disks);
    # unknown in the price data: exported as null, never 0
    price = cluster_hourly(spec)
    assert outputs["hourlyPriceUsd"] == (None if price is None else pytest.approx(price, abs=1e-3))
    # The controller reads exactly these exports (contract between program and lifecycle).
    from infra.outputs import parse_stack_outputs

    parsed = parse_stack_outputs(outputs)
    assert [n.name for n in parsed.nodes] == list(spec.node_names)
    assert parsed.max_run_duration_s == spec.max_run_duration_s
    assert parsed.gpus_per_node == spec.gpus_per_node and parsed.ssh_user == spec.ssh_user
    # The disks the spending caps price, as every VM got them (`train` compares them with the file).
    disks = parsed.disks
    assert disks is not None and disks.local_ssd_gib == spec.scratch.node_gib
    for vm in vms:
        boot = vm.inputs["bootDisk"]["initializeParams"]
        assert (boot["type"], boot["size"]) == (disks.boot_disk_type, disks.boot_disk_gb)
        assert len(vm.inputs.get("scratchDisks") or []) == disks.local_ssd_count


def run_main(config: dict[str, str], stack: str) -> dict[str, Any]:
    pulumi.runtime.set_all_config(config, secret_keys=["gputrain:sshPrivateKey"])
    return runpy.run_path(MAIN)


def expect_declares_nothing(
    config: dict[str, str], stack: str, mocks: GcpMocks | None = None
) -> str:
    """Run __main__.py under mocks, expect a SpecError; return its line. Nothing may be declared."""
    with pulumi_mocks({}, stack=stack, mocks=mocks) as m:
        message: list[str] = []

        @pulumi.runtime.test
        def run() -> None:
            with pytest.raises(SpecError) as exc:
                run_main(config, stack)
            message.append(str(exc.value))

        run()  # awaits every outstanding RPC, so a declared resource would be recorded
        assert m.resources == [], [r.name for r in m.resources]
        assert len(message) == 1 and "\n" not in message[0]
        return message[0]
