"""Stack files, the config parser and its rules, without Pulumi."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import paramiko
import pytest
import yaml

from infra import catalog, stackfile
from infra.base.errors import UserError
from infra.keys import format_duration, parse_duration
from infra.spec import SpecError, missing_settings, parse_spec, require_deployable
from infra.stackfile import load_stack_config
from scripts.targets.gce.keys import generate_ssh_keypair
from tests.support.pulumi_mocks import ROOT, TEST_PUBLIC_KEY, deployable_config

SHIPPED = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))


def _cfg(**overrides: str) -> dict[str, str]:
    """The dev stack written with its machine type (most cases here are about machineType)."""
    return deployable_config("dev", **{"machineType": "g2-standard-24", **overrides})


# ---- Pulumi.yaml ----------------------------------------------------------------------------


def test_project_file_declares_every_key_with_type_description_default() -> None:
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert doc["name"] == "gputrain"
    assert doc["runtime"] == {
        "name": "python",
        "options": {"toolchain": "pip", "virtualenv": ".venv"},
    }
    config = doc["config"]
    # gcp:project is a provider key and the map keys have no Pulumi type: comments only
    assert set(config) == set(stackfile.DEFAULTS) - set(stackfile.MAP_KEYS)
    for key, decl in config.items():
        assert decl["type"] in ("string", "boolean", "integer", "array"), key
        assert len(decl["description"]) > 20, key
        # spot is capacity's alias: a default would reach the program as if set (issue 16)
        assert ("default" in decl) == (key != "spot"), key
        if decl["type"] == "array":
            assert decl["items"] == {"type": "string"}
        assert "secret" not in decl  # pulumi/pulumi#21865: a defaulted secret key breaks `up`


def test_project_defaults_equal_the_parser_defaults(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.empty.yaml").write_text("config: {}\n")
    loaded = load_stack_config(tmp_path, "empty")
    for key, default in stackfile.DEFAULTS.items():
        value = loaded.get(f"gputrain:{key}", "")  # spot has no default: absent
        if default.startswith("["):
            assert json.loads(value) == json.loads(default), key
        else:
            assert value == default, key
    # and the defaults alone parse (no stack overrides at all)
    spec = parse_spec(loaded, "empty")
    assert (spec.machine_type, spec.nodes, spec.spot, spec.max_run_duration_s) == (
        "g2-standard-4",
        1,
        True,
        6 * 3600,
    )
    assert "gputrain:spot" not in loaded and spec.capacity == "spot"


# ---- shipped stack files -------------------------------------------------------------------


def test_at_least_three_stack_files_are_shipped() -> None:
    assert {"dev", "a100", "h100"} <= set(SHIPPED)


@pytest.mark.parametrize("stack", SHIPPED)
def test_shipped_stack_validates_and_leaves_user_settings_unset(stack: str) -> None:
    raw = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    assert not {
        "gcp:project",
        "gputrain:sshPublicKey",
        "gputrain:sshSourceRanges",
        "gputrain:sshPrivateKey",
    } & set(raw)
    spec = parse_spec(load_stack_config(ROOT, stack), stack)
    missing = missing_settings(spec)
    # Vertex AI runs the replicas: no SSH keys or source ranges to set there.
    ssh = [] if spec.on_vertex else ["gputrain:sshPublicKey", "gputrain:sshSourceRanges"]
    assert [m.key for m in missing] == ["gcp:project", *ssh]
    if ssh:
        assert missing[1].command == f"gputrain keygen --stack {stack}"
    assert all(f"--stack {stack}" in m.command for m in missing)
    with pytest.raises(
        SpecError, match=r"^gcp:project is not set .*; run: pulumi config set gcp:project"
    ):
        require_deployable(spec)
    require_deployable(parse_spec(deployable_config(stack), stack))  # complete: no error


def test_dev_stack_is_one_g2_standard_24_spot_for_three_hours() -> None:
    spec = parse_spec(load_stack_config(ROOT, "dev"), "dev")
    assert (spec.nodes, spec.machine_type, spec.gpus_per_node, spec.accelerator) == (
        1,
        "g2-standard-24",
        2,
        "nvidia-l4",
    )
    assert spec.spot and spec.max_run_duration_s == 3 * 3600 and spec.gpu_model == "NVIDIA L4"


# ---- load_stack_config ---------------------------------------------------------------------


def test_load_stack_config_merges_and_stringifies(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(
        "name: gputrain\nconfig:\n  nodes: {type: integer, default: 1}\n  spot: {type: boolean, default: true}\n"
        "  zones: {type: array, items: {type: string}, default: [us-east1-b]}\n  gcp:region: us-east1\n"
        "  labels: {value: {team: ml}}\n"
    )
    (tmp_path / "Pulumi.s.yaml").write_text(
        "config:\n  gputrain:nodes: 3\n  gputrain:spot: false\n  gputrain:sshPrivateKey:\n    secure: v1:abc\n"
        "  machineType: g2-standard-8\n"
    )
    assert load_stack_config(tmp_path, "s") == {
        "gputrain:nodes": "3",
        "gputrain:spot": "false",
        "gputrain:zones": '["us-east1-b"]',
        "gcp:region": "us-east1",
        "gputrain:labels": '{"team": "ml"}',
        "gputrain:machineType": "g2-standard-8",
    }


def test_missing_stack_file_lists_the_stacks() -> None:
    with pytest.raises(SpecError) as exc:
        load_stack_config(ROOT, "prod")
    assert str(exc.value).startswith("stack = 'prod': there is no Pulumi.prod.yaml")
    assert "dev" in str(exc.value) and isinstance(exc.value, UserError) and exc.value.exit_code == 2


def test_unreadable_yaml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: gputrain\n")
    (tmp_path / "Pulumi.x.yaml").write_text("config:\n  a: b: c\n")
    with pytest.raises(SpecError) as exc:
        load_stack_config(tmp_path, "x")
    assert "\n" not in str(exc.value) and "Pulumi.x.yaml" in str(exc.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"- a\n- b\n", "Pulumi.x.yaml is a YAML list; allowed: a mapping with a config: section"),
        (b"config:\n  - gputrain:nodes\n", "config: in Pulumi.x.yaml is a YAML list"),
        (b"config:\n  1: 2\n", "config: in Pulumi.x.yaml has the key 1; allowed: setting names"),
        (b"config:\n  ~: 2\n", "config: in Pulumi.x.yaml has the key None"),
        (b"config:\n  gputrain:nodes: \xff\xfe\n", "Pulumi.x.yaml is not UTF-8 text (byte 26)"),
        (b"7\n", "Pulumi.x.yaml is a YAML int"),
    ],
)
def test_malformed_stack_files_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    from scripts.cli import main

    (tmp_path / "Pulumi.yaml").write_text("name: gputrain\nruntime: python\n")
    (tmp_path / "Pulumi.x.yaml").write_bytes(content)
    with pytest.raises(SpecError, match=re.escape(message)):
        load_stack_config(tmp_path, "x")
    assert main(["plan", "--stack", "x", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


# ---- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("6h", 21600),
        ("2d", 172800),
        ("1h30m", 5400),
        ("1d12h", 129600),
        ("600s", 600),
        (" 3h ", 10800),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "6", "6x", "1.5h", "-1h", "30m1h", "6 h", "6H"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    for s in (600, 5400, 10800, 129600, 120 * 86400, 3661):
        assert parse_duration(format_duration(s)) == s
    assert format_duration(5400) == "1h30m"


def test_duration_limits_are_inclusive() -> None:
    assert parse_spec(_cfg(maxRunDuration="10m"), "dev").max_run_duration_s == 600
    assert parse_spec(_cfg(maxRunDuration="120d"), "dev").max_run_duration_s == 120 * 86400


# ---- rules that accept -----------------------------------------------------------------------


def test_zone_defaults_to_first_and_failover_zone_is_used() -> None:
    assert parse_spec(_cfg(), "dev").zone == "us-central1-a"
    spec = parse_spec(_cfg(zone="us-central1-c"), "dev")
    assert (spec.zone, spec.region, spec.zones[0]) == (
        "us-central1-c",
        "us-central1",
        "us-central1-a",
    )


@pytest.mark.parametrize(
    ("machine", "gpu", "accelerator"),
    [
        ("n1-standard-8", "T4", "nvidia-tesla-t4"),
        ("n1-standard-8", "v100", "nvidia-tesla-v100"),
        ("g2-standard-8", "L4", "nvidia-l4"),
    ],
)
def test_gpu_type_takes_the_model_names_gpus_takes(
    machine: str, gpu: str, accelerator: str
) -> None:
    spec = parse_spec(_cfg(machineType=machine, gpuType=gpu, gpuCount="1"), "dev")
    assert spec.accelerator == accelerator and spec.gpus_per_node == 1


def test_an_unknown_gpu_type_lists_what_the_machine_takes() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(machineType="n1-standard-8", gpuType="X100", gpuCount="1"), "dev")
    assert str(e.value) == (
        "gputrain:gpuType = 'X100': unknown; allowed: nvidia-tesla-t4 (T4), nvidia-tesla-v100 "
        "(V100), nvidia-tesla-p100 (P100), nvidia-tesla-p4 (P4) (n1-standard-8 is N1)"
    )
    with pytest.raises(
        SpecError, match=r"^gputrain:gpuType = 'X100': unknown; allowed: empty or nvidia-l4 \(L4\)"
    ):
        parse_spec(_cfg(gpuType="X100"), "dev")


def test_agreeing_gpu_settings_on_a_g_series_are_accepted() -> None:
    spec = parse_spec(_cfg(gpuType="nvidia-l4", gpuCount="2"), "dev")
    assert (spec.gpus_per_node, spec.attach_gpus) == (2, False)
    a2 = parse_spec(_cfg(machineType="a2-highgpu-4g", gpuType="nvidia-a100-40gb"), "dev")
    assert (a2.accelerator, a2.gpus_per_node) == ("nvidia-tesla-a100", 4)


@pytest.mark.parametrize(
    ("machine", "gpu", "count", "ok"),
    [
        ("n1-standard-32", "nvidia-tesla-t4", "1", True),
        ("n1-standard-64", "nvidia-tesla-t4", "1", False),  # 64 vCPU > 48
        ("n1-standard-64", "nvidia-tesla-t4", "4", True),
        ("n1-standard-8", "nvidia-tesla-v100", "1", True),
        ("n1-standard-16", "nvidia-tesla-v100", "2", True),
        ("n1-highmem-16", "nvidia-tesla-v100", "1", False),  # 16 vCPU > 12
        ("n1-highmem-96", "nvidia-tesla-v100", "8", True),  # 624 GB == cap
        ("n1-highcpu-16", "nvidia-tesla-p100", "1", True),
        ("n1-highmem-16", "nvidia-tesla-p100", "1", True),  # 104 GB == cap
        ("n1-highmem-32", "nvidia-tesla-p100", "1", False),
        ("n1-standard-16", "nvidia-tesla-p4", "1", True),
    ],
)
def test_n1_caps(machine: str, gpu: str, count: str, ok: bool) -> None:
    cfg = _cfg(machineType=machine, gpuType=gpu, gpuCount=count)
    if ok:
        spec = parse_spec(cfg, "dev")
        assert (spec.attach_gpus, spec.gpus_per_node, spec.series) == (True, int(count), "n1")
    else:
        with pytest.raises(
            SpecError, match=rf"^gputrain:machineType = '{machine}': {count} x {gpu} allows at most"
        ):
            parse_spec(cfg, "dev")


def test_placement_auto() -> None:
    assert parse_spec(_cfg(nodes="2"), "dev").placement == "compact"
    assert parse_spec(_cfg(nodes="1"), "dev").placement == "none"
    assert parse_spec(_cfg(nodes="2", placement="none"), "dev").placement == "none"
    n1 = _cfg(machineType="n1-standard-8", gpuType="nvidia-tesla-t4", gpuCount="1", nodes="3")
    assert parse_spec(n1, "dev").placement == "none"


def test_source_ranges_are_normalised_and_world_needs_the_opt_in() -> None:
    spec = parse_spec(_cfg(sshSourceRanges='["198.51.100.4", "10.0.0.0/9"]'), "dev")
    assert spec.ssh_source_ranges == ("198.51.100.4/32", "10.0.0.0/9")
    world = parse_spec(_cfg(sshSourceRanges='["0.0.0.0/0"]', allowSshFromAnywhere="true"), "dev")
    assert world.ssh_source_ranges == ("0.0.0.0/0",) and world.allow_ssh_from_anywhere


def test_a_source_range_with_host_bits_names_the_network_and_the_address() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(sshSourceRanges='["1.2.3.5/24"]'), "dev")
    assert str(e.value) == (
        "gputrain:sshSourceRanges = '1.2.3.5/24': host bits set (the network: 1.2.3.0/24; the "
        "address: 1.2.3.5/32); allowed: IPv4 CIDRs like 203.0.113.7/32"
    )


@pytest.mark.parametrize(
    "ranges",
    [
        '["0.0.0.0/1", "128.0.0.0/1"]',  # the whole internet in two halves
        '["10.0.0.0/7"]',
        '["10.0.0.0/8", "198.51.100.4/32"]',  # one address more than a /8
        '["11.0.0.0/8", "12.0.0.0/8"]',
    ],
)
def test_source_ranges_wider_than_a_slash_8_need_the_opt_in(ranges: str) -> None:
    with pytest.raises(SpecError, match=r"^gputrain:sshSourceRanges = '.*': together these cover"):
        parse_spec(_cfg(sshSourceRanges=ranges), "dev")
    opted = parse_spec(_cfg(sshSourceRanges=ranges, allowSshFromAnywhere="true"), "dev")
    assert opted.allow_ssh_from_anywhere
    # exactly a /8, or overlapping ranges that add up to no more than one, are fine
    for fine in ('["10.0.0.0/8"]', '["10.0.0.0/8", "10.1.0.0/16", "10.2.3.4/32"]'):
        parse_spec(_cfg(sshSourceRanges=fine), "dev")


def test_public_ip_none_is_refused_before_anything_exists() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(publicIp="none"), "dev")
    msg = str(e.value)
    assert msg.startswith("gputrain:publicIp = 'none': no node would be reachable")
    assert "allowed: head (workers via the head) or all" in msg and "\n" not in msg


@pytest.mark.parametrize("machine", ["a3-highgpu-8g", "a3-megagpu-8g", "a3-highgpu-2g"])
def test_a3_high_and_mega_accept_pd_balanced_boot_disks(machine: str) -> None:
    spec = parse_spec(_cfg(machineType=machine, bootDiskType="pd-balanced"), "dev")
    assert spec.boot_disk_type == "pd-balanced"
    assert catalog.default_boot_disk_type(catalog.MACHINE_TYPES[machine]) == "pd-ssd"
    for ultra in ("a3-ultragpu-8g", "a4-highgpu-8g"):  # Hyperdisk only
        with pytest.raises(SpecError, match=r"allowed for .*: hyperdisk-balanced$"):
            parse_spec(_cfg(machineType=ultra, bootDiskType="pd-balanced"), "dev")


def test_labels_as_list_or_object_and_immutable() -> None:
    spec = parse_spec(_cfg(labels='["team=ml", "cost-center=42"]'), "dev")
    assert dict(spec.labels) == {"team": "ml", "cost-center": "42"}
    assert dict(parse_spec(_cfg(labels='{"team": "ml"}'), "dev").labels) == {"team": "ml"}
    with pytest.raises(TypeError):
        spec.labels["team"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nodes = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("GPUS", "gpus"),  # another case
        ("ttl", "maxRunDuration"),  # plan's TTL column
        ("gputrain-gpus", "gpus"),  # the namespace run into the name
        ("gputrain.gpus", "gpus"),
        ("node", "nodes"),
    ],
)
def test_an_unknown_key_names_the_one_it_likely_meant(written: str, meant: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(**{f"gputrain:{written}": "x"}), "dev")
    text = str(e.value)
    assert text.startswith(f"gputrain:{written}: not a gputrain setting; allowed: gpus, ")
    assert text.endswith(f"; did you mean gputrain:{meant}?")


def test_a_label_key_given_twice_is_refused() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(labels='["team=ml", "team=dl"]'), "dev")
    assert (
        str(e.value)
        == "gputrain:labels = 'team=ml, team=dl': given twice; allowed: each label key once"
    )


def test_stack_name_must_fit_gce_names() -> None:
    with pytest.raises(SpecError, match=r"^stack = 'Prod_1': allowed"):
        parse_spec(_cfg(), "Prod_1")
    assert parse_spec(_cfg(), "team-a-h100").node_names == ("team-a-h100-node-0",)


def test_gpu_expectation_for_the_fleet() -> None:
    exp = parse_spec(_cfg(), "dev").gpu_expectation()
    assert (exp.model, exp.count) == ("NVIDIA L4", 2)
    # one floor per GPU, the catalog's; an L4 passes it (nvidia-smi shows 23034 MiB there)
    assert exp.min_memory_mib == catalog.ACCELERATORS["nvidia-l4"].min_memory_mib == 22_118
    assert exp.min_memory_mib < 23_034


def test_quota_metrics_of_a_spec() -> None:
    spec = parse_spec(_cfg(), "dev")
    assert (spec.gpu_quota_metric, spec.cpu_quota_metric) == (
        "PREEMPTIBLE_NVIDIA_L4_GPUS",
        "PREEMPTIBLE_G2_CPUS",
    )
    od = parse_spec(_cfg(capacity="on-demand"), "dev")
    assert (od.gpu_quota_metric, od.cpu_quota_metric) == ("NVIDIA_L4_GPUS", "G2_CPUS")


# ---- SSH keys -----------------------------------------------------------------------------


def test_generated_key_pair_is_valid_and_accepted() -> None:
    private, public = generate_ssh_keypair("gputrain-dev")
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith("ssh-ed25519 AAAA") and public.endswith(" gputrain-dev")
    loaded = paramiko.Ed25519Key.from_private_key(io.StringIO(private))
    assert f"{loaded.get_name()} {loaded.get_base64()}" == public.rsplit(" ", 1)[0]
    assert parse_spec(_cfg(sshPublicKey=public), "dev").ssh_public_key == public
    assert generate_ssh_keypair("x")[1] != generate_ssh_keypair("x")[1]
    with pytest.raises(ValueError):
        generate_ssh_keypair("two words")


def test_public_key_type_must_match_its_data() -> None:
    blob = TEST_PUBLIC_KEY.split()[1]
    with pytest.raises(SpecError, match=r"does not encode a ssh-rsa key"):
        parse_spec(_cfg(sshPublicKey=f"ssh-rsa {blob}"), "dev")


def test_warnings_for_zones_without_the_gpu_and_single_nic_multi_node() -> None:
    from infra.spec_warnings import spec_warnings

    warned = spec_warnings(parse_spec(_cfg(zones='["us-central1-f", "us-central1-a"]'), "dev"))
    assert any(
        w.startswith("us-central1-f not among the zones known to offer nvidia-l4") for w in warned
    )
    assert not any("not among" in w for w in spec_warnings(parse_spec(_cfg(), "dev")))
    h100 = spec_warnings(parse_spec(deployable_config("h100"), "h100"))
    assert any(
        "GPUDirect-TCPX needs Container-Optimized OS" in w and "a3-megagpu-8g" in w for w in h100
    )
    assert not any(
        "gVNIC" in w
        for w in spec_warnings(
            parse_spec(deployable_config("h100", nodes="1", placement="none"), "h100")
        )
    )


# ---- capacity and the GPU fabric (issue 16) -------------------------------------------------


def test_capacity_reservation_on_a4_binds_to_it_without_a_placement_policy() -> None:
    spec = parse_spec(
        _cfg(machineType="a4-highgpu-8g", nodes="2", capacity="reservation", reservation="a4-res"),
        "dev",
    )
    assert (spec.capacity, spec.reservation, spec.spot) == ("reservation", "a4-res", False)
    ic = spec.instance_capacity
    assert ic.provisioning_model == "RESERVATION_BOUND" and ic.preemptible_quota is None
    assert ic.reservation_affinity is not None and ic.reservation_affinity.values == ("a4-res",)
    assert spec.placement == "none"  # auto: the reservation places the VMs densely
    assert spec.fabric is not None and spec.fabric.kind == "rdma"
    assert spec.fabric.networks_needed == 3 and len(spec.fabric.nics) == 10


def test_flex_start_uses_the_preemptible_quota_and_spot_alias_still_works() -> None:
    flex = parse_spec(_cfg(machineType="a3-megagpu-8g", capacity="flex-start"), "dev")
    assert flex.gpu_quota_metric.startswith("PREEMPTIBLE_") and not flex.spot
    assert flex.instance_capacity.provisioning_model == "FLEX_START"
    alias = parse_spec(_cfg(capacity="", spot="false"), "dev")
    assert (alias.capacity, alias.spot) == ("on-demand", False)
    assert not alias.gpu_quota_metric.startswith("PREEMPTIBLE_")


def test_gpu_direct_off_and_single_node_keep_one_nic_and_the_old_subnet() -> None:
    for overrides in ({"nodes": "2", "gpuDirect": "off"}, {"nodes": "1"}):
        spec = parse_spec(_cfg(machineType="a3-megagpu-8g", **overrides), "dev")
        assert spec.fabric is not None and not spec.fabric.enabled
        assert len(spec.fabric.nics) == 1 and spec.fabric.primary_cidr == "10.42.0.0/20"
    mega = parse_spec(_cfg(machineType="a3-megagpu-8g", nodes="2"), "dev")
    assert mega.fabric is not None and mega.fabric.networks_needed == 9


def test_flex_start_takes_compact_placement_when_asked_auto_adds_none() -> None:
    """Google's Flex-start create samples allow an optional compact policy on standalone VMs;
    DWS allocates densely, so auto adds none."""
    base = {"machineType": "a3-megagpu-8g", "nodes": "2", "capacity": "flex-start"}
    assert parse_spec(_cfg(**base), "dev").placement == "none"
    assert parse_spec(_cfg(**base, placement="compact"), "dev").placement == "compact"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"capacity": '["spot", "on-demand", "spot"]'},
            'gputrain:capacity = \'["spot", "on-demand", "spot"]\': spot is listed twice',
        ),
        (
            {"machineType": "a4-highgpu-8g", "capacity": '["spot", "on-demand"]'},
            "gputrain:capacity = 'on-demand': a4-highgpu-8g is not offered as on-demand",
        ),
        ({"capacity": "spot,on-demand", "spot": "true"}, "gputrain:spot = 'true': not with a"),
        (
            {"capacity": "spot,on-demand", "capacityInUse": "flex-start"},
            "gputrain:capacityInUse = 'flex-start': not in capacity; allowed: spot, on-demand",
        ),
        ({"waitForCapacity": "soon"}, "gputrain:waitForCapacity = 'soon': allowed: a duration"),
        ({"reservationBound": "MAYBE"}, "gputrain:reservationBound = 'MAYBE': allowed: true"),
    ],
)
def test_bad_capacity_lists_and_waits_are_one_line(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_cfg(**{"spot": "", **overrides}), "dev")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"capacity": "", "capacityInUse": "reservation"}, "spot"),  # was a traceback
        ({"capacity": "spot", "capacityInUse": "on-demand"}, "spot"),
        ({"capacity": "on-demand", "capacityInUse": "Spot"}, "on-demand"),
        ({"capacity": "", "capacityInUse": "bogus"}, "spot"),
        ({"capacity": "", "spot": "true", "capacityInUse": "on-demand"}, "spot"),
        ({"capacity": "", "spot": "false", "capacityInUse": "spot"}, "on-demand"),
    ],
)
def test_capacity_in_use_never_overrides_the_stacks_capacity(
    overrides: dict[str, str], allowed: str
) -> None:
    """capacityInUse is what `up` writes while stepping down a capacity list: outside the modes
    the stack allows it is one line, never the mode the VMs get."""
    with pytest.raises(SpecError) as err:
        parse_spec(_cfg(**{"spot": "", **overrides}), "dev")
    written = overrides["capacityInUse"]
    assert str(err.value).startswith(
        f"gputrain:capacityInUse = {written!r}: not in capacity; allowed: {allowed} or empty"
    )
    assert "\n" not in str(err.value)
    same = parse_spec(_cfg(**{"spot": "", **overrides, "capacityInUse": allowed}), "dev")
    assert same.capacity == allowed and same.capacity_ladder == ()


def test_a_capacity_list_uses_its_first_mode_until_up_writes_another() -> None:
    listed = {"spot": "", "capacity": '["spot", "on-demand"]', "waitForCapacity": "30m"}
    spec = parse_spec(_cfg(**listed), "dev")
    assert (spec.capacity, spec.capacity_ladder) == ("spot", ("spot", "on-demand"))
    assert spec.wait_for_capacity_s == 1800 and spec.spot
    stepped = parse_spec(_cfg(**listed, capacityInUse="on-demand"), "dev")
    assert stepped.capacity == "on-demand" and not stepped.spot
    assert not stepped.gpu_quota_metric.startswith("PREEMPTIBLE_")


@pytest.mark.parametrize("written", ["[]", "[ ]", ","])
def test_an_empty_capacity_list_names_capacity_not_another_key(written: str) -> None:
    config = deployable_config("dev") | {"gputrain:capacity": written}
    with pytest.raises(SpecError) as e:
        parse_spec(config, "dev")
    shown = written.replace(" ", "")  # the list as the typed settings hold it
    assert str(e.value).startswith(f"gputrain:capacity = {shown!r}: an empty list; allowed:")


@pytest.mark.parametrize("written", ['["spot", ""]', '["", "spot"]', "spot,", "spot,,on-demand"])
def test_an_empty_capacity_entry_is_refused_not_dropped(written: str) -> None:
    config = deployable_config("dev") | {"gputrain:capacity": written}
    with pytest.raises(SpecError) as e:
        parse_spec(config, "dev")
    message = str(e.value)
    assert message.startswith(f"gputrain:capacity = {written!r}: an empty entry; allowed:")
    assert "\n" not in message


def test_zones_and_regions_that_do_not_overlap_are_blamed_not_the_gpus() -> None:
    config = _cfg(
        machineType="", gpus="L4:2", zones='["us-central1-a"]', regions='["europe-west4"]'
    )
    with pytest.raises(SpecError) as e:
        parse_spec(config, "dev")
    assert str(e.value).startswith(
        "gputrain:regions = '[\"europe-west4\"]': none of gputrain:zones (us-central1-a) is in "
        "these regions; allowed: regions that hold a listed zone"
    )
    both = parse_spec(config | {"gputrain:zones": '["us-central1-a", "europe-west4-a"]'}, "dev")
    assert both.zone == "europe-west4-a"  # the zone in both


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"zones": '["us-central1-a", "us-central1-a"]'},
            'gputrain:zones = \'["us-central1-a", "us-central1-a"]\': us-central1-a is listed '
            "twice; list each zone once",
        ),
        (
            {"machineType": "", "gpus": "L4:2", "zones": '["us-central1-a", "us-central1-a"]'},
            'gputrain:zones = \'["us-central1-a", "us-central1-a"]\': us-central1-a is listed '
            "twice; list each zone once",
        ),
        (
            {"machineType": "", "gpus": "L4:2", "regions": '["us-east4", "us-east4"]'},
            'gputrain:regions = \'["us-east4", "us-east4"]\': us-east4 is listed twice; '
            "list each region once",
        ),
    ],
)
def test_a_zone_or_region_listed_twice_is_one_line_with_gpus_as_with_machine_type(
    overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(**overrides), "dev")
    assert str(e.value) == message


def test_a_gpus_candidate_must_be_sold_in_every_mode_of_a_capacity_list() -> None:
    """T4 is cheaper as Spot, but N1 has no Flex-start: with [spot, flex-start] the L4 (G2)
    serves both, and is chosen instead of a refusal of n1-standard-8."""
    both = _cfg(
        machineType="", gpus='["T4:1", "L4:1"]', capacity='["spot", "flex-start"]', zones="[]"
    )
    spec = parse_spec(both, "dev")
    assert spec.accelerator == "nvidia-l4" and spec.capacity_ladder == ("spot", "flex-start")
    assert {c.shape.accelerator for c in spec.candidates} == {"nvidia-l4"}
    spot_only = parse_spec(both | {"gputrain:capacity": "spot"}, "dev")
    assert "nvidia-tesla-t4" in {c.shape.accelerator for c in spot_only.candidates}
    with pytest.raises(SpecError) as e:
        parse_spec(_cfg(machineType="", gpus="T4:1", capacity="flex-start"), "dev")
    assert str(e.value).startswith(
        "gputrain:gpus = 'T4:1': T4 is not sold as flex-start (n1-standard-8: on-demand, spot, "
        "reservation only); allowed: GPUs sold in every mode of gputrain:capacity (flex-start)"
    )


def test_a_vertex_gpus_request_ranks_the_regions_known_to_offer_the_gpu_first() -> None:
    """The cheapest L4 zone (asia-northeast3) is not among the regions known to offer L4 on
    Vertex: the chosen candidate is in one that is, and plan has nothing to warn about."""
    from infra import vertex

    config = deployable_config("vertex", gpus="L4:4", machineType="", nodes="0", zones="[]")
    spec = parse_spec(config, "vertex")
    known = vertex.vertex_regions("nvidia-l4")
    assert known is not None and spec.region in known
    warnings = vertex.vertex_warnings(spec.machine_type, spec.accelerator, spec.region)
    assert not [w for w in warnings if "not among the regions" in w]
    inside = [c.region in known for c in spec.candidates]
    assert inside == sorted(inside, reverse=True) and not all(inside)  # known ones, then others
    gce = parse_spec(deployable_config("dev", gpus="L4:4", zones="[]"), "dev")
    assert gce.region not in known  # on GCE the cheapest zone wins: the ranking is Vertex's


def test_restart_job_on_worker_restart_is_a_vertex_flag_one_line_when_bad() -> None:
    key = "restartJobOnWorkerRestart"
    assert parse_spec(deployable_config("vertex"), "vertex").restart_job_on_worker_restart is False
    spec = parse_spec(deployable_config("vertex", **{key: "true"}), "vertex")
    assert spec.restart_job_on_worker_restart is True
    with pytest.raises(SpecError) as e:
        parse_spec(deployable_config("vertex", **{key: "often"}), "vertex")
    assert "\n" not in str(e.value) and f"gputrain:{key}" in str(e.value) and "'often'" in str(
        e.value
    ) and "true or false" in str(e.value)  # fmt: skip
    gce = parse_spec(deployable_config("dev", **{key: "true"}), "dev")  # ignored, named by plan
    assert gce.restart_job_on_worker_restart is False and key in gce.ignored


@pytest.mark.parametrize("written", ['" spot"', '[" spot", "on-demand "]'])
def test_capacity_modes_are_read_without_surrounding_spaces(tmp_path: Path, written: str) -> None:
    """As in the comma-separated form: ' spot' was refused as 'spot', 'did you mean spot?'."""
    from infra.spec import stack_file_spec

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    body = f"config:\n  gputrain:machineType: g2-standard-24\n  gputrain:capacity: {written}\n"
    (tmp_path / "Pulumi.s.yaml").write_text(body)
    assert stack_file_spec(stackfile.read_stack_file(tmp_path, "s")).capacity == "spot"
