"""GpuCluster and __main__.py under Pulumi SDK mocks: the resources and inputs GCE would get."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.components.nodes import MAX_RUN_DURATION_PATH
from infra.spec import ClusterSpec, SpecError, parse_spec
from infra.stackfile import load_stack_config
from infra.ttl import RECREATE_DEADLINE_ENV, Recreation
from tests.support.program import (
    FAMILIES,
    check_family,
    expect_declares_nothing,
    run_main,
)
from tests.support.pulumi_mocks import (
    FIREWALL,
    GET_IMAGE,
    NETWORK,
    POLICY,
    ROOT,
    SUBNET,
    TEST_PRIVATE_KEY,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
    pulumi_mocks,
)


def _spec(stack: str, **overrides: str) -> ClusterSpec:
    return parse_spec(deployable_config(stack, **overrides), stack)


@pytest.mark.parametrize(
    ("stack", "overrides"), [f[1:] for f in FAMILIES], ids=[f[0] for f in FAMILIES]
)
@pulumi.runtime.test
def test_family_declares_correct_secure_resources(
    mocks: GcpMocks, stack: str, overrides: dict[str, str]
) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(stack, **overrides)
    cluster = GpuCluster(spec.stack, spec)
    return pulumi.Output.all(**cluster.exports()).apply(lambda out: check_family(mocks, spec, out))


def test_family_table_covers_each_series_as_the_issue_lists() -> None:
    specs = {fid: _spec(stack, **ov) for fid, stack, ov in FAMILIES}
    assert {s.machine_type for s in specs.values()} >= {
        "a2-highgpu-8g",
        "a2-ultragpu-2g",
        "a3-highgpu-8g",
        "a3-megagpu-8g",
        "a3-highgpu-2g",
        "a4-highgpu-8g",
        "g2-standard-24",
    }
    assert (
        specs["n1-t4"].accelerator == "nvidia-tesla-t4"
        and specs["n1-v100"].accelerator == "nvidia-tesla-v100"
    )
    assert specs["a3-high-2g-spot"].spot and specs["a3-high-8g"].placement == "compact"


@pytest.fixture
def stack_mocks(stack: str) -> Iterator[GcpMocks]:
    """Mocks whose Pulumi stack name is the parametrized `stack` (what pulumi.get_stack() says)."""
    with pulumi_mocks(load_stack_config(ROOT, stack), stack=stack) as m:
        yield m


@pytest.mark.parametrize("stack", ["dev", "a100", "h100", "t4", "a4", "a3mega"])
@pulumi.runtime.test
def test_whole_program_on_each_shipped_stack(stack_mocks: GcpMocks, stack: str) -> Any:
    cfg = deployable_config(stack)
    namespace = run_main(cfg, stack)
    spec = parse_spec(cfg, stack)
    cluster = namespace["cluster"]
    assert cluster.spec == spec

    def check(out: dict[str, Any]) -> None:
        check_family(stack_mocks, spec, out)
        assert out["project"] == TEST_PROJECT and out["sshUser"] == "gputrain"
        assert out["zone"] == spec.zones[0] and out["region"] == "us-central1"
        assert out["maxRunDuration"] == spec.max_run_duration
        assert out["image"].endswith("-v20260416")
        node0 = out["nodes"][0]
        assert node0 == {
            "name": f"{stack}-node-0",
            "zone": spec.zones[0],
            "internalIp": "10.42.0.2",
            "externalIp": "203.0.113.10",
            "role": "head",
        }
        root: Any = pulumi.runtime.get_root_resource()  # the Stack: what pulumi.export set
        assert set(root.outputs) == set(out)

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_program_reads_config_but_never_the_private_key(mocks: GcpMocks) -> None:
    from infra.stackfile import CONTROLLER_KEYS, NS, stack_config_from_pulumi

    cfg = deployable_config("dev", zone="us-central1-b")
    pulumi.runtime.set_all_config(cfg, secret_keys=["gputrain:sshPrivateKey"])
    read = stack_config_from_pulumi()
    assert "gputrain:sshPrivateKey" not in read
    # nor the keys only gputrain reads (setup, secrets, image: the job's environment), nor the
    # webhook URLs (secrets the program never needs)
    assert "gputrain:notify" not in read
    unread = {"gputrain:sshPrivateKey", "gputrain:notify", *(NS + k for k in CONTROLLER_KEYS)}
    assert read == {k: v for k, v in cfg.items() if k not in unread}
    assert parse_spec(read, "dev").zone == "us-central1-b"


@pulumi.runtime.test
def test_existing_network_is_used_as_is(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec("dev", network="shared-vpc", nodes="2", publicIp="all")
    cluster = GpuCluster(spec.stack, spec)

    def check(out: dict[str, Any]) -> None:
        assert mocks.of_type(NETWORK) == [] and mocks.of_type(SUBNET) == []
        assert {f.inputs["network"] for f in mocks.of_type(FIREWALL)} == {"shared-vpc"}
        for vm in mocks.instances():
            [nic] = vm.inputs["networkInterfaces"]
            assert nic["network"] == "shared-vpc" and "subnetwork" not in nic
            assert nic["accessConfigs"]  # publicIp: all
        assert [n["externalIp"] for n in out["nodes"]] == ["203.0.113.10", "203.0.113.11"]
        # g2 supports compact placement, so auto picks it for 2 nodes
        assert len(mocks.of_type(POLICY)) == 1

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_created_network_has_one_subnet_in_the_region(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    # publicIp none is refused by the spec; the component still supports internal-only nodes
    spec = dataclasses.replace(
        _spec("dev", zones='["europe-west4-b", "europe-west4-a"]', nodes="2", placement="none"),
        public_ip="none",
    )
    cluster = GpuCluster(spec.stack, spec)

    def check(out: dict[str, Any]) -> None:
        [net] = mocks.of_type(NETWORK)
        assert net.inputs["autoCreateSubnetworks"] is False
        [sub] = mocks.of_type(SUBNET)
        assert sub.inputs["region"] == "europe-west4"
        assert all(vm.inputs["zone"] == "europe-west4-b" for vm in mocks.instances())
        assert all(
            not vm.inputs["networkInterfaces"][0].get("accessConfigs") for vm in mocks.instances()
        )
        assert out["headAddress"] == "10.42.0.2"  # no public IP: the internal one
        assert all(n["externalIp"] is None for n in out["nodes"])

    return pulumi.Output.all(**cluster.exports()).apply(check)


def test_g2_keeps_dlvm_with_a_warning_and_the_accelerator_image_fallback_deploys() -> None:
    """Issue 10 item 13: G2 + DLVM is what the defaults give (warned); the documented fallback
    (Ubuntu accelerator image) validates, resolves and boots the VMs from that image."""
    from infra.components.cluster import GpuCluster
    from infra.spec_warnings import (
        ACCELERATOR_IMAGE_FAMILY,
        ACCELERATOR_IMAGE_PROJECT,
        spec_warnings,
    )

    default = _spec("dev")
    assert default.series == "g2" and default.image_project == "deeplearning-platform-release"
    [warning] = [w for w in spec_warnings(default) if w.startswith("G2 on a Deep Learning VM")]
    assert ACCELERATOR_IMAGE_PROJECT in warning and ACCELERATOR_IMAGE_FAMILY in warning
    fallback = _spec(
        "dev", imageProject=ACCELERATOR_IMAGE_PROJECT, imageFamily=ACCELERATOR_IMAGE_FAMILY
    )
    assert not any(w.startswith("G2 on") for w in spec_warnings(fallback))
    images = {"pytorch-2-9-cu129-ubuntu-2204-nvidia-580": 50, ACCELERATOR_IMAGE_FAMILY: 30}
    with pulumi_mocks(load_stack_config(ROOT, "dev"), mocks=GcpMocks(images)) as m:

        @pulumi.runtime.test
        def build() -> Any:
            cluster = GpuCluster(fallback.stack, fallback)

            def check(_: Any) -> None:
                for vm in m.instances():
                    image = vm.inputs["bootDisk"]["initializeParams"]["image"]
                    assert f"/projects/{ACCELERATOR_IMAGE_PROJECT}/" in image
                    assert image.endswith(f"/images/{ACCELERATOR_IMAGE_FAMILY}-v20260416")

            return pulumi.Output.all(**cluster.exports()).apply(check)

        build()


@pytest.mark.parametrize(
    ("overrides", "disks"),
    [
        (
            {
                "machineType": "g2-standard-24",
                "bootDiskType": "pd-ssd",
                "bootDiskGb": "300",
                "localSsdCount": "2",
            },
            ("pd-ssd", 300, 2, 750),
        ),
        ({"machineType": "a3-highgpu-8g"}, ("pd-ssd", 200, 0, 6000)),  # bundled
        ({"machineType": "a4-highgpu-8g"}, ("hyperdisk-balanced", 200, 0, None)),  # size unknown
    ],
    ids=["g2-local-ssd", "a3-bundled", "a4-bundled-unknown"],
)
@pulumi.runtime.test
def test_outputs_record_the_disks_the_caps_price(
    mocks: GcpMocks, overrides: dict[str, str], disks: tuple[Any, ...]
) -> Any:
    """Each node's boot disk and Local SSD, as the VMs get them: `train --budget` on a stack that
    is up compares them with the stack file (infra/outputs.py drift)."""
    from infra.components.cluster import GpuCluster

    spec = _spec("dev", **overrides)
    cluster = GpuCluster(spec.stack, spec)

    def check(out: dict[str, Any]) -> None:
        check_family(mocks, spec, out)
        keys = ("bootDiskType", "bootDiskGb", "localSsdCount", "localSsdGib")
        assert tuple(out[k] for k in keys) == disks

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_on_demand_without_compact_placement_may_restart(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec("a100")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: object) -> None:
        [vm] = mocks.instances()
        assert vm.inputs["scheduling"]["automaticRestart"] is True
        assert vm.inputs["scheduling"]["provisioningModel"] == "STANDARD"

    return pulumi.Output.all(*[vm.id for vm in cluster.instances]).apply(check)


@pulumi.runtime.test
def test_compact_placement_turns_automatic_restart_off(mocks: GcpMocks) -> Any:
    """On-demand VMs in a compact placement policy are not restarted by GCE: the spec says so
    (the recovery reads it) and the program sets it."""
    from infra.components.cluster import GpuCluster

    spec = _spec("a100", nodes="2", placement="compact")
    assert spec.capacity == "on-demand" and spec.placement == "compact"
    assert spec.automatic_restart is False
    cluster = GpuCluster(spec.stack, spec)

    def check(_: object) -> None:
        assert [vm.inputs["scheduling"]["automaticRestart"] for vm in mocks.instances()] == [
            False,
            False,
        ]

    return pulumi.Output.all(*[vm.id for vm in cluster.instances]).apply(check)


def _declared(
    cfg: dict[str, str], stack: str, mocks: GcpMocks | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, ...]], dict[str, Any]]:
    """__main__.py under mocks, in this process's environment: each VM's inputs, what each
    resource asks the engine to ignore, the stack outputs."""
    outputs: dict[str, Any] = {}
    with pulumi_mocks({}, stack=stack, mocks=mocks) as m:

        @pulumi.runtime.test
        def run() -> Any:
            cluster = run_main(cfg, stack)["cluster"]
            return pulumi.Output.all(**cluster.exports()).apply(outputs.update)

        run()
    return {vm.name: vm.inputs for vm in m.instances()}, m.ignore_changes, outputs


def test_a_recovery_up_gives_new_vms_what_is_left_and_leaves_the_standing_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recovery's `up` (the run's deadline in its environment) differs from a plain `up` only
    in scheduling.maxRunDuration, what is left of the run's TTL, which it marks ignore_changes
    on the survivors it names alone: Pulumi diffs a standing VM with the value in its state, so
    the provider's replace on a changed maxRunDuration never fires. Every other VM (the lost
    one, created anew; any the state holds elsewhere, replaced) takes what is left, as a
    replacement would take an ignored value from the state (pulumi/pulumi#2657). A plain `up`
    gives every VM the full TTL and ignores nothing, so an edited maxRunDuration still
    replaces the VMs."""
    cfg = deployable_config("dev", nodes="3")
    spec = parse_spec(cfg, "dev")
    head, lost, other = spec.node_names
    monkeypatch.delenv(RECREATE_DEADLINE_ENV, raising=False)
    plain, plain_ignored, plain_out = _declared(cfg, "dev")
    survivors = (head, other)
    for key, value in Recreation(time.time() + 1800, spec.zone, keep=survivors).env().items():
        monkeypatch.setenv(key, value)
    again, again_ignored, again_out = _declared(cfg, "dev")
    assert list(plain) == list(again) == list(spec.node_names)
    for name in spec.node_names:
        full = plain[name]["scheduling"].pop("maxRunDuration")
        left = again[name]["scheduling"].pop("maxRunDuration")  # the path names a real input
        assert float(full["seconds"]) == spec.max_run_duration_s == 3 * 3600
        assert 1790 <= float(left["seconds"]) <= 1800
        kept = (MAX_RUN_DURATION_PATH,) if name in survivors else ()
        assert (plain_ignored[name], again_ignored[name]) == ((), kept), name
        assert again[name] == plain[name]  # nothing else of a standing VM changes
    assert MAX_RUN_DURATION_PATH == "scheduling.maxRunDuration"
    assert again_ignored[lost] == ()  # created (or replaced) with what is left
    others = set(again_ignored) - set(spec.node_names)
    assert others and all(plain_ignored[n] == again_ignored[n] == () for n in others)
    assert again_out == plain_out  # the stack's TTL is still the one its outputs say


def test_a_recovery_up_in_another_zone_ignores_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failover moved the cluster: every VM is replaced (its zone changed), and a replacement
    would take an ignored input from the old VM's state, a fresh TTL; so nothing is ignored, the
    survivors named too, and every new VM gets what is left."""
    cfg = deployable_config("dev", nodes="2")
    survivors = parse_spec(cfg, "dev").node_names
    for key, value in Recreation(time.time() + 600, "us-central1-f", keep=survivors).env().items():
        monkeypatch.setenv(key, value)
    vms, ignored, _ = _declared(cfg, "dev")
    assert parse_spec(cfg, "dev").zone != "us-central1-f"
    for name, inputs in vms.items():
        assert 590 <= float(inputs["scheduling"]["maxRunDuration"]["seconds"]) <= 600
        assert ignored[name] == ()


def test_a_recovery_up_keeps_the_image_the_cluster_runs_when_the_family_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The family now points at a newer image than the one the stack's outputs record: a
    recovery's `up` gives every VM the recorded image (the provider replaces a VM whose
    boot_disk.initialize_params.image changes: every survivor would go, and the new VM would
    boot another driver and CUDA than its peers) and records it again; it does not resolve the
    family. A plain `up` takes the family's current image."""
    cfg = deployable_config("dev", nodes="2")
    spec = parse_spec(cfg, "dev")
    monkeypatch.delenv(RECREATE_DEADLINE_ENV, raising=False)
    plain, _, plain_out = _declared(cfg, "dev")
    current = plain_out["image"]
    assert current.endswith(f"/images/{spec.image_family}-v20260416")
    running = current.replace("-v20260416", "-v20260301")  # what the cluster was created on
    for key, value in Recreation(time.time() + 1800, spec.zone, running).env().items():
        monkeypatch.setenv(key, value)
    mocks = GcpMocks()
    again, _, again_out = _declared(cfg, "dev", mocks)
    assert list(again) == list(spec.node_names)
    for name in spec.node_names:
        assert plain[name]["bootDisk"]["initializeParams"]["image"] == current
        assert again[name]["bootDisk"]["initializeParams"]["image"] == running
    assert again_out["image"] == running  # and the next recovery keeps it too
    assert not [call for call in mocks.calls if call[0] == GET_IMAGE]


@pulumi.runtime.test
def test_retired_default_image_family_falls_back(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    mocks.images = {"common-cu129-ubuntu-2204-nvidia-580": 50}
    spec = _spec("dev")
    cluster = GpuCluster(spec.stack, spec)
    families = [a["family"] for tok, a in mocks.calls if tok == GET_IMAGE]
    assert families == [
        "pytorch-2-9-cu129-ubuntu-2204-nvidia-580",
        "common-cu129-ubuntu-2204-nvidia-580",
    ]
    assert cluster.image_self_link.endswith("/images/common-cu129-ubuntu-2204-nvidia-580-v20260416")

    def check(_: object) -> None:
        for vm in mocks.instances():
            assert vm.inputs["bootDisk"]["initializeParams"]["image"] == cluster.image_self_link

    return pulumi.Output.all(*[vm.id for vm in cluster.instances]).apply(check)


def test_unknown_image_family_fails_before_any_resource() -> None:
    msg = expect_declares_nothing(deployable_config("dev", imageFamily="pytorch-9-9-gone"), "dev")
    assert msg.startswith(
        "gputrain:imageFamily = 'pytorch-9-9-gone': not found in deeplearning-platform-release"
    )


def test_boot_disk_smaller_than_image_fails_before_any_resource() -> None:
    mocks = GcpMocks(images={"pytorch-2-9-cu129-ubuntu-2204-nvidia-580": 120})
    msg = expect_declares_nothing(deployable_config("dev", bootDiskGb="100"), "dev", mocks)
    assert (
        msg
        == "gputrain:bootDiskGb = '100': image pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20260416 needs at least 120 GB"
    )


@pytest.mark.parametrize("autodown", ["10m", "600s"])
def test_a_bare_pulumi_up_refuses_the_autodown_plan_refuses_in_the_same_line(
    autodown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An autodown the stack file sets, not below maxRunDuration: refused by the program (a bare
    `pulumi up`) in plan's own line, before any resource, however it is spelt, even as the
    default's own text (which the engine hands on alike when the stack sets nothing)."""
    from infra.spec import stack_file_spec
    from infra.stackfile import read_stack_file

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"] |= {"gputrain:maxRunDuration": "10m", "gputrain:autodown": autodown}
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as planned:
        stack_file_spec(read_stack_file(tmp_path, "dev"))
    monkeypatch.chdir(tmp_path)  # where a bare `pulumi up` runs the program
    config = deployable_config("dev", maxRunDuration="10m", autodown=autodown)
    assert expect_declares_nothing(config, "dev") == str(planned.value)
    assert str(planned.value).startswith(f"gputrain:autodown '{autodown}': not below")


def _missing(key: str) -> dict[str, str]:
    cfg = deployable_config("dev")
    del cfg[key]
    return cfg


def _base(**overrides: str) -> dict[str, str]:
    """The dev stack written with its machine type (the cases below are about machineType)."""
    return deployable_config("dev", **{"machineType": "g2-standard-24", **overrides})


# (id, config, expected one-line message) — every case runs the whole program.
BAD_CONFIGS: list[tuple[str, dict[str, str], str]] = [
    (
        "unknown-machine",
        _base(machineType="a2-higpu-1g"),
        "gputrain:machineType = 'a2-higpu-1g': not a known machine type; nearest: a2-highgpu-1g",
    ),
    (
        "n1-without-gpu",
        _base(machineType="n1-standard-8"),
        "gputrain:gpuType is empty: n1-standard-8 needs an attached GPU: nvidia-tesla-t4, nvidia-tesla-v100, nvidia-tesla-p100, nvidia-tesla-p4",
    ),
    (
        "gpu-not-attachable",
        _base(machineType="n1-standard-8", gpuType="nvidia-l4", gpuCount="1"),
        "gputrain:gpuType = 'nvidia-l4': n1-standard-8 (N1) can attach: nvidia-tesla-t4, nvidia-tesla-v100, nvidia-tesla-p100, nvidia-tesla-p4",
    ),
    (
        "unknown-gpu",
        _base(machineType="n1-standard-8", gpuType="nvidia-rtx-9090", gpuCount="1"),
        "gputrain:gpuType = 'nvidia-rtx-9090': unknown; allowed: nvidia-tesla-t4 (T4), ",
    ),
    (
        "t4-x8",
        _base(machineType="n1-standard-8", gpuType="nvidia-tesla-t4", gpuCount="8"),
        "gputrain:gpuCount = '8': allowed for nvidia-tesla-t4: 1, 2, 4",
    ),
    (
        "n1-gpu-count-0",
        _base(machineType="n1-standard-8", gpuType="nvidia-tesla-t4"),
        "gputrain:gpuCount = '0': allowed for nvidia-tesla-t4: 1, 2, 4",
    ),
    (
        "v100-vcpu-cap",
        _base(machineType="n1-standard-16", gpuType="nvidia-tesla-v100", gpuCount="1"),
        "gputrain:machineType = 'n1-standard-16': 1 x nvidia-tesla-v100 allows at most 12 vCPUs and 78 GB",
    ),
    (
        "t4-memory-cap",
        _base(machineType="n1-highmem-64", gpuType="nvidia-tesla-t4", gpuCount="2"),
        "gputrain:machineType = 'n1-highmem-64': 2 x nvidia-tesla-t4 allows at most 48 vCPUs and 312 GB",
    ),
    (
        "g2-32-has-one-l4",
        _base(machineType="g2-standard-32", gpuCount="4"),
        "gputrain:gpuCount = '4': g2-standard-32 has 1 x nvidia-l4; use 0 (implied) or 1",
    ),
    (
        "a2-wrong-gpu-type",
        _base(machineType="a2-highgpu-1g", gpuType="nvidia-l4"),
        "gputrain:gpuType = 'nvidia-l4': a2-highgpu-1g brings nvidia-tesla-a100",
    ),
    (
        "gpucount-not-number",
        _base(gpuCount="two"),
        "gputrain:gpuCount = 'two': allowed: a whole number",
    ),
    (
        "a3-2g-on-demand",
        _base(machineType="a3-highgpu-2g", capacity="", spot="false"),
        "gputrain:spot = 'false': a3-highgpu-2g is not offered as on-demand; allowed capacity: "
        "spot, flex-start",
    ),
    (
        "a3-1g-on-demand",
        _base(machineType="a3-highgpu-1g", capacity="", spot="false"),
        "gputrain:spot = 'false': a3-highgpu-1g is not offered as on-demand; allowed capacity: "
        "spot, flex-start",
    ),
    (
        "a3-edge",
        _base(machineType="a3-edgegpu-8g"),
        "gputrain:machineType = 'a3-edgegpu-8g': A3 Edge is a serving product",
    ),
    (
        "duration-garbage",
        _base(maxRunDuration="six hours"),
        "gputrain:maxRunDuration = 'six hours': allowed: durations like 90m, 6h, 2d, 1h30m",
    ),
    (
        "duration-wrong-order",
        _base(maxRunDuration="30m1h"),
        "gputrain:maxRunDuration = '30m1h': allowed: durations like",
    ),
    (
        "duration-too-short",
        _base(maxRunDuration="9m"),
        "gputrain:maxRunDuration = '9m': allowed: 10m to 120d",
    ),
    (
        "duration-too-long",
        _base(maxRunDuration="121d"),
        "gputrain:maxRunDuration = '121d': allowed: 10m to 120d",
    ),
    (
        "zone-not-a-zone",
        _base(zones='["us-central1"]'),
        "gputrain:zones = 'us-central1': allowed: zone names like us-central1-a",
    ),
    (
        "zones-span-regions",
        _base(zones='["us-central1-a", "us-east1-b"]'),
        "gputrain:zones = 'us-central1-a,us-east1-b': all zones must be in one region, got us-central1, us-east1",
    ),
    (
        "regions-with-machine-type",
        _base(regions='["us-central1"]'),
        "gputrain:regions = '[\"us-central1\"]': allowed only with gpus",
    ),
    (
        "zone-not-in-zones",
        _base(zone="us-central1-f"),
        "gputrain:zone = 'us-central1-f': allowed: one of zones (us-central1-a, us-central1-b, us-central1-c) or empty",
    ),
    ("nodes-too-many", _base(nodes="65"), "gputrain:nodes = '65': allowed: 1..64"),
    (
        "nodes-not-number",
        _base(nodes="many"),
        "gputrain:nodes = 'many': allowed: a whole number 1..64",
    ),
    ("disk-too-small", _base(bootDiskGb="40"), "gputrain:bootDiskGb = '40': allowed: 50..65536 GB"),
    (
        "disk-type-g2",
        _base(bootDiskType="pd-standard"),
        "gputrain:bootDiskType = 'pd-standard': allowed for g2-standard-24: pd-balanced, pd-ssd",
    ),
    (
        "disk-type-a4",
        _base(machineType="a4-highgpu-8g", bootDiskType="pd-ssd"),
        "gputrain:bootDiskType = 'pd-ssd': allowed for a4-highgpu-8g: hyperdisk-balanced",
    ),
    (
        "cidr-malformed",
        _base(sshSourceRanges='["203.0.113.300/32"]'),
        "gputrain:sshSourceRanges = '203.0.113.300/32': allowed: IPv4 CIDRs like 203.0.113.7/32",
    ),
    (
        "cidr-host-bits",
        _base(sshSourceRanges='["203.0.113.7/24"]'),
        "gputrain:sshSourceRanges = '203.0.113.7/24': host bits set (the network: "
        "203.0.113.0/24; the address: 203.0.113.7/32); allowed: IPv4 CIDRs",
    ),
    (
        "ssh-from-world",
        _base(sshSourceRanges='["0.0.0.0/0"]'),
        "gputrain:sshSourceRanges = '0.0.0.0/0': SSH open to the whole internet is refused",
    ),
    (
        "cidr-ipv6",
        _base(sshSourceRanges='["2001:db8::/32"]'),
        "gputrain:sshSourceRanges = '2001:db8::/32': allowed: IPv4 CIDRs only",
    ),
    (
        "no-source-ranges",
        _base(sshSourceRanges="[]"),
        "gputrain:sshSourceRanges is not set (where SSH may come from (your address/32)); run: pulumi config set --path 'gputrain:sshSourceRanges[0]' YOUR.IP.ADD.RESS/32 --stack dev",
    ),
    (
        "no-project",
        _missing("gcp:project"),
        "gcp:project is not set (the GCP project to create the VMs in); run: pulumi config set gcp:project YOUR_PROJECT_ID --stack dev",
    ),
    (
        "bad-project",
        _base(**{"gcp:project": "My Project"}),
        "gcp:project = 'My Project': allowed: a GCP project ID",
    ),
    (
        "no-ssh-key",
        _missing("gputrain:sshPublicKey"),
        "gputrain:sshPublicKey is not set (the SSH key pair for the nodes (the private half is stored as a secret)); run: gputrain keygen --stack dev",
    ),
    (
        "private-key-as-public",
        _base(sshPublicKey=TEST_PRIVATE_KEY),
        "gputrain:sshPublicKey holds a PRIVATE key",
    ),
    (
        "public-key-garbage",
        _base(sshPublicKey="ssh-ed25519 not!base64"),
        "gputrain:sshPublicKey = 'ssh-ed25519 not!base64': the key data is not base64",
    ),
    ("spot-not-bool", _base(spot="yes"), "gputrain:spot = 'yes': allowed: true or false"),
    # issue 16: capacity, reservation, gpuDirect, subnetRange
    (
        "capacity-unknown",
        _base(capacity="ondemand"),
        "gputrain:capacity = 'ondemand': allowed: on-demand, spot, flex-start, reservation; "
        "did you mean on-demand?",
    ),
    (
        "reservation-without-name",
        _base(machineType="a4-highgpu-8g", capacity="reservation"),
        "gputrain:reservation = '': capacity reservation needs the name of a specific reservation",
    ),
    (
        "reservation-bad-name",
        _base(capacity="reservation", reservation="My_Reservation"),
        "gputrain:reservation = 'My_Reservation': allowed: a reservation name",
    ),
    (
        "reservation-without-capacity",
        _base(reservation="team-res"),
        "gputrain:reservation = 'team-res': only used with capacity reservation (capacity is spot)",
    ),
    (
        "flex-start-over-7-days",
        _base(machineType="a3-megagpu-8g", capacity="flex-start", maxRunDuration="8d"),
        "gputrain:maxRunDuration = '8d': Flex-start VMs run at most 7 days; allowed: up to 7d",
    ),
    (
        "a4-on-demand",
        _base(machineType="a4-highgpu-8g", capacity="on-demand"),
        "gputrain:capacity = 'on-demand': a4-highgpu-8g is not offered as on-demand; allowed "
        "capacity: spot, flex-start, reservation",
    ),
    (
        "n1-flex-start",
        _base(
            machineType="n1-standard-8",
            gpuType="nvidia-tesla-t4",
            gpuCount="1",
            capacity="flex-start",
        ),
        "gputrain:capacity = 'flex-start': n1-standard-8 is not offered as flex-start",
    ),
    (
        "spot-contradicts-capacity",
        _base(capacity="on-demand", spot="true"),
        "gputrain:spot = 'true': contradicts gputrain:capacity = 'on-demand'; remove spot",
    ),
    (
        "compact-with-reservation",
        _base(
            machineType="a4-highgpu-8g",
            nodes="2",
            capacity="reservation",
            reservation="a4-res",
            placement="compact",
        ),
        "gputrain:placement = 'compact': capacity reservation: the reservation decides where",
    ),
    (
        "gpu-direct-choice",
        _base(gpuDirect="on"),
        "gputrain:gpuDirect = 'on': allowed: auto, off",
    ),
    (
        "subnet-range-not-cidr",
        _base(subnetRange="10.42.0.1/16"),
        "gputrain:subnetRange = '10.42.0.1/16': allowed: an IPv4 CIDR like 10.42.0.0/16",
    ),
    (
        "subnet-range-too-small-for-a4",
        _base(machineType="a4-highgpu-8g", nodes="2", subnetRange="10.42.0.0/26"),
        "gputrain:subnetRange = '10.42.0.0/26': too small for the 10 subnet(s)",
    ),
    (
        "subnet-range-loopback",
        _base(subnetRange="127.0.0.0/16"),
        "gputrain:subnetRange = '127.0.0.0/16': overlaps 127.0.0.0/8",
    ),
    (
        "public-ip-choice",
        _base(publicIp="workers"),
        "gputrain:publicIp = 'workers': allowed: head, all, none",
    ),
    (
        "public-ip-none-unreachable",
        _base(publicIp="none"),
        "gputrain:publicIp = 'none': no node would be reachable",
    ),
    (
        "ssh-from-world-in-two-halves",
        _base(sshSourceRanges='["0.0.0.0/1", "128.0.0.0/1"]'),
        "gputrain:sshSourceRanges = '0.0.0.0/1, 128.0.0.0/1': together these cover 4,294,967,296 addresses",
    ),
    (
        "placement-n1",
        _base(
            machineType="n1-standard-8",
            gpuType="nvidia-tesla-t4",
            gpuCount="1",
            nodes="2",
            placement="compact",
        ),
        "gputrain:placement = 'compact': N1 does not support compact placement",
    ),
    (
        "placement-one-node",
        _base(placement="compact"),
        "gputrain:placement = 'compact': compact placement needs nodes >= 2",
    ),
    (
        "ssh-user-root",
        _base(sshUser="root"),
        "gputrain:sshUser = 'root': allowed: a Linux user name",
    ),
    (
        "label-reserved",
        _base(labels='["gputrain-stack=x"]'),
        "gputrain:labels = 'gputrain-stack': gputrain-stack, gputrain-project are set by gputrain",
    ),
    (
        "label-uppercase",
        _base(labels='["Team=ml"]'),
        "gputrain:labels = 'Team': label keys: lowercase letter first",
    ),
    (
        "label-no-equals",
        _base(labels='["team"]'),
        "gputrain:labels = 'team': allowed: key=value strings",
    ),
    (
        "typo-key",
        {**_base(), "gputrain:machinetype": "g2-standard-4"},
        "gputrain:machinetype: not a gputrain setting; allowed: ",
    ),
    (
        "network-name",
        _base(network="My_VPC"),
        "gputrain:network = 'My_VPC': allowed: an existing VPC name",
    ),
    (
        "bucket-no-scheme",
        _base(bucket="my-bucket"),
        "gputrain:bucket = 'my-bucket': allowed: gs://NAME[/PREFIX] with NAME 3-63 of",
    ),
    (
        "bucket-uppercase",
        _base(bucket="gs://My-Bucket/ckpt"),
        "gputrain:bucket = 'gs://My-Bucket/ckpt': allowed: gs://NAME[/PREFIX]",
    ),
    ("bucket-too-short", _base(bucket="gs://ab"), "gputrain:bucket = 'gs://ab': allowed: "),
    (
        "bucket-google",
        _base(bucket="gs://my-google-bucket"),
        "gputrain:bucket = 'gs://my-google-bucket': allowed: ",
    ),
    (
        "bucket-goog-prefix",
        _base(bucket="gs://goog-ckpt"),
        "gputrain:bucket = 'gs://goog-ckpt': allowed: ",
    ),
    (
        "bucket-ends-with-dash",
        _base(bucket="gs://ckpt-"),
        "gputrain:bucket = 'gs://ckpt-': allowed: ",
    ),
    (
        "bucket-empty-prefix-part",
        _base(bucket="gs://ckpt//runs"),
        "gputrain:bucket = 'gs://ckpt//runs': allowed: ",
    ),
    (
        "bucket-retention-zero",
        _base(bucketRetentionDays="0"),
        "gputrain:bucketRetentionDays = '0': allowed: 1..3650 days",
    ),
    (
        "bucket-retention-words",
        _base(bucketRetentionDays="a month"),
        "gputrain:bucketRetentionDays = 'a month': allowed: a whole number 1..3650 days",
    ),
]


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_fails_with_one_line_and_declares_nothing(
    config: dict[str, str], expected: str
) -> None:
    message = expect_declares_nothing(config, "dev")
    assert message.startswith(expected), message
    key = message.split(" ", 1)[0].rstrip(":")
    assert key.startswith(("gputrain:", "gcp:")), message  # every line starts with its key


@pulumi.runtime.test
def test_components_own_their_resources_and_alias_the_old_urns(mocks: GcpMocks) -> Any:
    """Each child component parents its resources; an alias names the URN each resource had when
    it was a direct child of GpuCluster, so existing stacks update in place."""
    from infra.components.cluster import GpuCluster

    # 2 nodes: compact placement, a created network; autodown's binding is new (no old URN)
    spec = dataclasses.replace(_spec("h100"), autodown_s=None)
    cluster = GpuCluster(spec.stack, spec)
    owned = {
        cluster.network: (
            "ClusterNetwork",
            {"h100-net", "h100-subnet", "h100-internal", "h100-ssh"},
        ),
        cluster.identity: (
            "NodeIdentity",
            {"gputrain-h100", "gputrain-h100-logwriter", "gputrain-h100-metricwriter"},
        ),
        cluster.nodes: ("GpuNodes", {"h100-compact", "h100-node-0", "h100-node-1"}),
    }
    # The bucket is new: its resources have no old URN to alias.
    bucket_names = {"gputrain-h100-gputrain-test-1", "gputrain-h100-gputrain-test-1-nodes"}
    assert {r._name for r in cluster.bucket._childResources} == bucket_names
    assert all(not r._aliases for r in cluster.bucket._childResources)
    assert set(cluster._childResources) == {*owned, cluster.bucket}
    for component, (_, names) in owned.items():
        assert {r._name for r in component._childResources} == names
    resources = [
        (r, f"gputrain:infra:{t}") for c, (t, _) in owned.items() for r in c._childResources
    ]

    def check(values: list[Any]) -> None:
        cluster_urn, values = values[0], values[1:]
        urns, aliases = values[: len(resources)], values[len(resources) :]
        for (r, component), urn, alias in zip(resources, urns, aliases, strict=True):
            assert f"{component}$" in urn and urn.endswith(f"::{r._name}")
            typ = urn.split("::")[2].split("$")[-1]
            # the URN it had as a direct child of GpuCluster
            assert alias == f"{cluster_urn.rsplit('::', 1)[0]}${typ}::{r._name}"

    return pulumi.Output.all(
        cluster.urn, *[r.urn for r, _ in resources], *[r._aliases[0] for r, _ in resources]
    ).apply(check)


PERMISSION_CASES = [f[1:] for f in FAMILIES] + [
    ("dev", {"network": "shared-vpc", "nodes": "2"}),
    ("dev", {"bucket": "gs://team-runs/gputrain"}),
]


@pytest.mark.parametrize(
    ("stack", "overrides"),
    PERMISSION_CASES,
    ids=[f[0] for f in FAMILIES] + ["existing-network", "existing-bucket"],
)
@pulumi.runtime.test
def test_the_permission_table_covers_every_type_the_program_declares(
    mocks: GcpMocks, stack: str, overrides: dict[str, str]
) -> Any:
    """`gputrain doctor` asks for the permissions of infra/permissions.py; they are derived from
    the types the program declares, which must be exactly what `resource_types` says."""
    from infra.components.cluster import GpuCluster
    from infra.permissions import RESOURCE_PERMISSIONS, required_permissions, spec_resource_types

    spec = _spec(stack, **overrides)
    cluster = GpuCluster(spec.stack, spec)

    def check(_: object) -> None:
        declared = {r.typ for r in mocks.resources if r.custom}
        expected = spec_resource_types(spec)
        assert declared == set(expected) and declared <= set(RESOURCE_PERMISSIONS)
        assert ("gcp:storage/bucket:Bucket" in declared) == (spec.existing_bucket is None)
        needed = required_permissions(declared)
        assert "compute.instances.create" in needed and "iam.serviceAccounts.actAs" in needed
        assert ("compute.networks.create" in needed) == (spec.network is None)

    return pulumi.Output.all(**cluster.exports()).apply(check)
