"""GPU verification against test hosts whose fake nvidia-smi says what each test needs."""

from __future__ import annotations

import time

import pytest

from infra.base.records import GpuExpectation
from scripts.targets.session import close_all, connect
from scripts.verify.nodes import VerificationError, verify_gpus
from tests.support.testbed import GpuConfig, TestBed

pytestmark = pytest.mark.testbed

L4 = GpuExpectation(model="NVIDIA L4", count=2, min_memory_mib=22000)


def test_verification_passes_on_matching_hosts(tb: TestBed) -> None:
    hosts = [tb.add_host(gpus=GpuConfig(count=2)) for _ in range(2)]
    fleet = tb.fleet(hosts, expect=L4)
    ts = connect(fleet, deadline_s=10)
    reports = verify_gpus(fleet, ts, deadline_s=10)
    assert [r.ok for r in reports] == [True, True]
    assert all(len(r.gpus) == 2 and r.gpus[0].name == "NVIDIA L4" and r.torch for r in reports)
    close_all(ts)


def test_every_failing_node_is_listed_with_why(tb: TestBed) -> None:
    good = tb.add_host(gpus=GpuConfig(count=2))
    wrong_model = tb.add_host(gpus=GpuConfig(count=2, model="Tesla T4", memory_mib=15360))
    too_few = tb.add_host(gpus=GpuConfig(count=1))
    ecc = tb.add_host(gpus=GpuConfig(count=2, ecc_errors=3))
    fleet = tb.fleet([good, wrong_model, too_few, ecc], expect=L4)
    ts = connect(fleet, deadline_s=10)
    with pytest.raises(VerificationError) as e:
        verify_gpus(fleet, ts, deadline_s=5)
    msg = str(e.value)
    assert "3 of 4 node(s)" in msg and f"{good.name}:" not in msg
    assert f"{wrong_model.name}: GPU 0 is 'Tesla T4', expected 'NVIDIA L4'" in msg
    assert "15360 MiB, expected at least 22000 MiB" in msg
    assert f"{too_few.name}: found 1 GPU(s), expected 2" in msg
    assert f"{ecc.name}: GPU 0 has 3 uncorrected ECC error(s)" in msg
    close_all(ts)


def test_waits_while_driver_installs_then_passes(
    tb: TestBed, capsys: pytest.CaptureFixture[str]
) -> None:
    h = tb.add_host(gpus=GpuConfig(count=2, installing_calls=3))
    fleet = tb.fleet([h], expect=L4)
    ts = connect(fleet, deadline_s=10)
    reports = verify_gpus(fleet, ts, deadline_s=20)
    assert reports[0].ok and len(reports[0].gpus) == 2
    assert (
        "waiting for the GPU driver (nvidia-smi exit 9: NVIDIA-SMI has failed"
        in capsys.readouterr().out
    )
    close_all(ts)


def test_old_driver_without_a_queried_field_fails_at_once(tb: TestBed) -> None:
    old = tb.add_host(
        gpus=GpuConfig(count=2, invalid_fields=("ecc.errors.uncorrected.volatile.total",))
    )
    good = tb.add_host(gpus=GpuConfig(count=2))
    fleet = tb.fleet([old, good], expect=L4)
    ts = connect(fleet, deadline_s=10)
    start = time.monotonic()
    with pytest.raises(VerificationError) as e:
        verify_gpus(fleet, ts, deadline_s=60)
    assert time.monotonic() - start < 5  # not the 60 s a driver still installing may take
    msg = str(e.value)
    assert "1 of 2 node(s)" in msg and f"{good.name}:" not in msg
    assert (
        f'{old.name}: nvidia-smi does not know the field "ecc.errors.uncorrected.volatile.total"'
        in msg
    )
    close_all(ts)


def test_missing_driver_fails_at_deadline(tb: TestBed) -> None:
    h = tb.add_host(gpus=GpuConfig(missing=True))
    fleet = tb.fleet([h], expect=L4)
    ts = connect(fleet, deadline_s=10)
    start = time.monotonic()
    with pytest.raises(
        VerificationError, match=r"driver not ready after 3 s \(nvidia-smi not found\)"
    ):
        verify_gpus(fleet, ts, deadline_s=3)
    assert time.monotonic() - start < 6
    # a CPU expectation does not need nvidia-smi
    cpu = tb.fleet([h])
    assert verify_gpus(cpu, ts, deadline_s=3)[0].ok
    close_all(ts)


def test_sshd_late_then_driver_late(tb: TestBed) -> None:
    h = tb.add_host(gpus=GpuConfig(count=2, installing_calls=1), sshd_delay_s=1.5)
    fleet = tb.fleet([h], expect=L4)
    ts = connect(fleet, deadline_s=15)
    assert verify_gpus(fleet, ts, deadline_s=15)[0].ok
    close_all(ts)
