"""infra/gcp/compute.py: host keys from guest attributes and sweep, through the real google-cloud-compute
clients against the local fake of the Compute REST API."""

from __future__ import annotations

import base64

import pytest

from infra.base.errors import GputrainError
from infra.gcp.compute import ComputeApi, ComputeApiError, fetch_host_keys, parse_host_key_items
from infra.gcp.sweep import owned_by_name, sweep
from tests.support.fake_compute import PAGE_SIZE, FakeCompute, ssh_host_keys

ZONE = "us-central1-a"


class FakeClock:
    """Deterministic time for polling loops: sleep() advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


# ---- host keys: pure parsing -----------------------------------------------------------------


def test_parse_keeps_accepted_types_in_preference_order_and_strips_comments() -> None:
    keys = ssh_host_keys()
    items = [
        ("hostkeys", "ecdsa-sha2-nistp256", keys["ecdsa-sha2-nistp256"] + " root@vm"),
        ("hostkeys", "ssh-ed25519", keys["ssh-ed25519"]),
        ("hostkeys", "ssh-dss", keys["ssh-ed25519"]),  # type we never pin
        ("other", "ssh-ed25519", "AAAA"),  # other namespace
    ]
    pinned, rejected = parse_host_key_items(items)
    assert pinned == (
        f"ssh-ed25519 {keys['ssh-ed25519']}",
        f"ecdsa-sha2-nistp256 {keys['ecdsa-sha2-nistp256']}",
    )
    assert rejected == []


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("not base64!!", "not valid base64"),
        ("QUJD", "truncated"),  # "ABC": valid base64, too short to be a key blob
        (None, "blob is a 'ecdsa-sha2-nistp256' key"),  # ecdsa blob published as ed25519
    ],
)
def test_parse_rejects_keys_that_do_not_round_trip_or_lie_about_their_type(
    value: str | None, why: str
) -> None:
    keys = ssh_host_keys()
    value = value if value is not None else keys["ecdsa-sha2-nistp256"]
    pinned, rejected = parse_host_key_items([("hostkeys", "ssh-ed25519", value)])
    assert pinned == ()
    assert len(rejected) == 1 and why in rejected[0]


def test_parse_rejects_non_canonical_base64() -> None:
    blob = ssh_host_keys()["ssh-ed25519"]
    raw = base64.b64decode(blob)
    padded_wrong = base64.b64encode(raw).decode().rstrip("=") + "=" * 4  # over-padded
    _, rejected = parse_host_key_items([("hostkeys", "ssh-ed25519", padded_wrong)])
    assert rejected and "ssh-ed25519" in rejected[0]


# ---- host keys: polling the fake ---------------------------------------------------------------


def test_fetch_host_keys_polls_until_published(fake: FakeCompute, api: ComputeApi) -> None:
    keys = ssh_host_keys()
    fake.add_instance("dev-node-0", ZONE, host_keys=keys, publish_after=3)
    clock, progress = FakeClock(), []
    pinned = fetch_host_keys(
        fake.project,
        ZONE,
        "dev-node-0",
        deadline_s=60,
        poll_s=6,
        api=api,
        on_progress=progress.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert pinned[0] == f"ssh-ed25519 {keys['ssh-ed25519']}"
    assert set(pinned) == {f"{k} {v}" for k, v in keys.items()}
    assert fake.guest_attribute_queries("dev-node-0", ZONE) == 4
    assert clock.sleeps == [6, 6, 6]
    assert sum("waiting for SSH host keys" in p for p in progress) == 3
    assert "pinned 2 host key(s)" in progress[-1]
    # The client asked with the hostkeys/ query path the guest agent publishes under.
    (req,) = {tuple(r[2]["queryPath"]) for r in fake.requests_matching("getGuestAttributes$")}
    assert req == ("hostkeys/",)


def test_fetch_host_keys_without_ed25519_waits_for_a_stable_set(
    fake: FakeCompute, api: ComputeApi
) -> None:
    ecdsa = {"ecdsa-sha2-nistp256": ssh_host_keys()["ecdsa-sha2-nistp256"]}
    fake.add_instance("n", ZONE, host_keys=ecdsa)
    clock = FakeClock()
    pinned = fetch_host_keys(
        fake.project, ZONE, "n", deadline_s=60, poll_s=1, api=api, clock=clock, sleep=clock.sleep
    )
    assert pinned == (f"ecdsa-sha2-nistp256 {ecdsa['ecdsa-sha2-nistp256']}",)
    assert fake.guest_attribute_queries("n", ZONE) == 2  # same set twice in a row


def test_fetch_host_keys_deadline_is_an_error_naming_the_instance(
    fake: FakeCompute, api: ComputeApi
) -> None:
    fake.add_instance("dev-node-1", ZONE, host_keys=None)  # agent never publishes
    clock = FakeClock()
    with pytest.raises(
        GputrainError, match=r"no SSH host keys for dev-node-1 .*enable-guest-attributes"
    ):
        fetch_host_keys(
            fake.project,
            ZONE,
            "dev-node-1",
            deadline_s=30,
            poll_s=6,
            api=api,
            clock=clock,
            sleep=clock.sleep,
        )
    assert clock.now <= 30
    assert fake.guest_attribute_queries("dev-node-1", ZONE) == 6  # t = 0, 6, ..., 30


def test_fetch_host_keys_only_bad_keys_fails_and_says_why(
    fake: FakeCompute, api: ComputeApi
) -> None:
    fake.add_instance("n", ZONE, host_keys={"ssh-ed25519": "@@@@"})
    clock = FakeClock()
    with pytest.raises(GputrainError, match=r"only rejected keys were published.*not valid base64"):
        fetch_host_keys(
            fake.project,
            ZONE,
            "n",
            deadline_s=10,
            poll_s=5,
            api=api,
            clock=clock,
            sleep=clock.sleep,
        )


def test_fetch_host_keys_for_a_missing_instance_fails_at_once(
    fake: FakeCompute, api: ComputeApi
) -> None:
    with pytest.raises(ComputeApiError, match="instance ghost not found in zone us-central1-a"):
        fetch_host_keys(fake.project, ZONE, "ghost", deadline_s=60, poll_s=6, api=api)
    assert len(fake.requests_matching("getGuestAttributes")) == 1


# ---- API errors ----------------------------------------------------------------------------------


def test_permission_error_becomes_one_line(fake: FakeCompute, api: ComputeApi) -> None:
    fake.inject_error(
        r"/regions/us-central1$", 403, "Required 'compute.regions.get' permission", "forbidden"
    )
    with pytest.raises(
        ComputeApiError, match=r"regions.get us-central1: 403 .*compute.regions.get"
    ):
        api.region_quotas(fake.project, "us-central1")


def test_deleting_a_vm_that_is_gone_already_is_no_error(fake: FakeCompute, api: ComputeApi) -> None:
    """A reconcile pass deletes what it listed; autodown may have deleted one meanwhile."""
    fake.add_instance("s-node-1", "us-central1-a")
    api.delete_instance(fake.project, "us-central1-a", "s-node-1")
    api.delete_instance(fake.project, "us-central1-a", "s-node-1")  # 404: gone, as wanted
    assert [n for _, n, _ in fake.deletes].count("s-node-1") >= 1


def test_missing_region_is_none_not_an_error(fake: FakeCompute, api: ComputeApi) -> None:
    assert api.region_quotas(fake.project, "mars-north1") is None


def test_accelerator_pager_follows_next_page_token(fake: FakeCompute, api: ComputeApi) -> None:
    offered = api.accelerator_types(fake.project, ZONE)
    assert len(offered) > PAGE_SIZE
    assert {a.name for a in offered} == set(fake.accelerator_types[ZONE])
    pages = fake.requests_matching(f"zones/{ZONE}/acceleratorTypes$")
    assert len(pages) == -(-len(offered) // PAGE_SIZE)
    assert pages[1][2]["pageToken"] == [str(PAGE_SIZE)]


# ---- sweep -----------------------------------------------------------------------------------------


def test_owned_by_name_rule() -> None:
    assert owned_by_name("dev-net", "dev")
    assert owned_by_name("dev", "dev")
    assert not owned_by_name("devbox-net", "dev")
    assert not owned_by_name("prod-dev-net", "dev")


def _seed_stack(fake: FakeCompute, stack: str, zone: str = ZONE) -> None:
    labels = {"gputrain-stack": stack}
    for i in range(2):
        fake.add_instance(f"{stack}-node-{i}", zone, labels=labels)
    fake.add_resource("addresses", f"{stack}-head-ip", region="us-central1", labels=labels)
    fake.add_resource("networks", f"{stack}-net")
    fake.add_resource(
        "subnetworks", f"{stack}-subnet", region="us-central1", network=f"{stack}-net"
    )
    fake.add_resource("firewalls", f"{stack}-ssh", network=f"{stack}-net")
    fake.add_resource("firewalls", f"{stack}-internal", network=f"{stack}-net")
    fake.add_resource("resourcePolicies", f"{stack}-placement", region="us-central1")


def test_sweep_finds_every_kind_and_nothing_of_other_stacks(
    fake: FakeCompute, api: ComputeApi
) -> None:
    _seed_stack(fake, "dev")
    _seed_stack(fake, "prod", zone="europe-west4-a")
    fake.add_resource("networks", "devbox-net")  # shares letters, not the prefix rule
    fake.add_resource("disks", "scratch", zone=ZONE, labels={"gputrain-stack": "dev"})
    found = sweep(fake.project, "dev", api=api)
    assert {(x.kind, x.name) for x in found} == {
        ("instance", "dev-node-0"),
        ("instance", "dev-node-1"),
        ("disk", "dev-node-0"),
        ("disk", "dev-node-1"),
        ("disk", "scratch"),
        ("address", "dev-head-ip"),
        ("network", "dev-net"),
        ("subnetwork", "dev-subnet"),
        ("firewall", "dev-ssh"),
        ("firewall", "dev-internal"),
        ("resource-policy", "dev-placement"),
    }
    scratch = next(x for x in found if x.name == "scratch")
    assert scratch.location == ZONE and scratch.matched_by == "label gputrain-stack=dev"
    assert str(scratch) == "disk scratch (us-central1-a; label gputrain-stack=dev)"
    net = next(x for x in found if x.kind == "network")
    assert net.location == "global" and net.matched_by == "name prefix dev-"


def test_sweep_after_teardown_is_empty_and_sees_unlabelled_boot_disks(
    fake: FakeCompute, api: ComputeApi
) -> None:
    _seed_stack(fake, "dev")
    for i in range(2):
        fake.remove_instance(f"dev-node-{i}", ZONE)
    for kind, name in [
        ("addresses", "dev-head-ip"),
        ("firewalls", "dev-ssh"),
        ("firewalls", "dev-internal"),
        ("subnetworks", "dev-subnet"),
        ("networks", "dev-net"),
        ("resourcePolicies", "dev-placement"),
    ]:
        fake.remove_resource(kind, name)
    assert sweep(fake.project, "dev", api=api) == []
    fake.add_resource("disks", "dev-node-0", zone="us-west1-b")  # no labels: found by name
    assert [(x.kind, x.location) for x in sweep(fake.project, "dev", api=api)] == [
        ("disk", "us-west1-b")
    ]


def test_list_stack_instances_filters_by_label_server_side(
    fake: FakeCompute, api: ComputeApi
) -> None:
    _seed_stack(fake, "dev")
    _seed_stack(fake, "prod", zone="europe-west4-a")
    found = api.list_stack_instances(fake.project, "dev")
    assert sorted((i["name"], i["zone"]) for i in found) == [
        ("dev-node-0", ZONE),
        ("dev-node-1", ZONE),
    ]
    filters = {r[2]["filter"][0] for r in fake.requests_matching("aggregated/instances$")}
    assert filters == {'labels.gputrain-stack = "dev"'}
