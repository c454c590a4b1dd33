"""scripts/targets/hosts_file.py: hosts files -> Fleet, and every bad file -> one UserError line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from infra.base.errors import UserError
from scripts.targets.hosts_file import load_hosts_file
from tests.support.fake_compute import ssh_host_keys

HEAD, WORKER = "203.0.113.5", "203.0.113.6"


@pytest.fixture
def site(tmp_path: Path) -> dict[str, object]:
    """A directory with a private key, a known_hosts pinning both hosts (the worker hashed and on
    port 2222, as ssh writes them), and the keys themselves."""
    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    (tmp_path / "keys" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3Nza... me@laptop\n")
    head_keys, worker_keys = ssh_host_keys(), ssh_host_keys()
    lines = [f"{HEAD} {t} {b}" for t, b in head_keys.items()]
    hashed = paramiko.HostKeys.hash_host(f"[{WORKER}]:2222")
    lines.append(f"{hashed} ssh-ed25519 {worker_keys['ssh-ed25519']}")
    (tmp_path / "known_hosts").write_text("\n".join(lines) + "\n")
    return {"dir": tmp_path, "head_keys": head_keys, "worker_keys": worker_keys}


GOOD = """\
user: ubuntu
identity_file: keys/id_ed25519
known_hosts: known_hosts
python: /opt/conda/bin/python
gpus: {model: NVIDIA A100-SXM4-40GB, count: 8, min_memory_gb: 38}
hosts:
  - address: 203.0.113.5
    internal_address: 10.0.0.5
    name: gpu-a
  - address: 203.0.113.6
    port: 2222
"""


def write(site: dict[str, object], text: str, name: str = "lab.yaml") -> Path:
    path = Path(str(site["dir"])) / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_file_builds_the_fleet(site: dict[str, object]) -> None:
    target = load_hosts_file(write(site, GOOD))
    fleet = target.fleet
    base = Path(str(site["dir"]))
    assert fleet.target == "hosts-lab"
    assert fleet.identity_file == base / "keys" / "id_ed25519"  # relative to the hosts file
    assert target.known_hosts == base / "known_hosts"
    assert fleet.python == "/opt/conda/bin/python"
    assert (fleet.expect.model, fleet.expect.count, fleet.expect.min_memory_mib) == (
        "NVIDIA A100-SXM4-40GB",
        8,
        38 * 1024,
    )
    head, worker = fleet.nodes
    assert fleet.head is head and head.role == "head" and worker.role == "worker"
    assert (head.name, head.address, head.internal_address, head.port, head.user) == (
        "gpu-a",
        HEAD,
        "10.0.0.5",
        22,
        "ubuntu",
    )
    assert (worker.name, worker.internal_address, worker.port) == (WORKER, WORKER, 2222)
    head_keys = site["head_keys"]
    assert isinstance(head_keys, dict)
    assert set(head.host_keys) == {f"{t} {b}" for t, b in head_keys.items()}
    worker_keys = site["worker_keys"]
    assert isinstance(worker_keys, dict)
    assert worker.host_keys == (f"ssh-ed25519 {worker_keys['ssh-ed25519']}",)  # hashed entry
    assert target.unpinned == ()
    typed = target.settings  # the file's keys, typed at its one load, defaults filled in
    assert typed is not None and (typed.user, typed.port, typed.secrets) == ("ubuntu", 22, [])


def test_an_empty_secrets_key_is_none_and_one_name_is_a_list(site: dict[str, object]) -> None:
    assert load_hosts_file(write(site, GOOD + "secrets:\n")).environment.secrets == ()
    one = load_hosts_file(write(site, GOOD + "secrets: WANDB_API_KEY\n"))
    assert one.environment.secrets == ("WANDB_API_KEY",)


def test_cpu_hosts_with_trust_new_hosts_and_no_known_hosts_yet(site: dict[str, object]) -> None:
    path = write(
        site,
        """\
        user: gputrain
        identity_file: keys/id_ed25519
        known_hosts: new_known_hosts
        cpu: true
        hosts: [10.213.0.2, 10.213.0.3]
        """,
    )
    target = load_hosts_file(path, trust_new_hosts=True)
    assert target.fleet.expect.is_cpu
    assert [n.name for n in target.fleet.nodes] == ["10.213.0.2", "10.213.0.3"]
    assert target.unpinned == ("10.213.0.2", "10.213.0.3")
    assert all(n.host_keys == () for n in target.fleet.nodes)
    # Without the flag the same file is refused: nothing to pin against.
    with pytest.raises(UserError, match=r"known_hosts: .*new_known_hosts.* does not exist"):
        load_hosts_file(path)


GPUS_LINE = GOOD[GOOD.index("gpus:") : GOOD.index("\nhosts:") + 1]


def _variant(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


BAD_FILES: list[tuple[str, str | None, str]] = [
    # (case, file text; None = no file, expected fragments joined by "|")
    ("missing file", None, "hosts file not found"),
    ("not yaml", "user: [ubuntu\nhosts: x\n", "not valid YAML at line"),
    ("empty", "", "top level: the file is empty; expected a mapping"),
    (
        "duplicate key",
        _variant("user: ubuntu", "user: ubuntu\nuser: root"),
        "duplicate key 'user' on line 2 (first on line 1)|allowed: each key once",
    ),
    (
        "duplicate key deeper down",
        _variant("    port: 2222\n", "    port: 2222\n    port: 22\n"),
        "duplicate key 'port'|allowed: each key once",
    ),
    ("not a mapping", "- 203.0.113.5\n", "top level: ['203.0.113.5'] is not allowed"),
    (
        "unknown key",
        GOOD + "zone: us-central1-a\n",
        "key 'zone': 'us-central1-a' is not allowed|allowed keys: user",
    ),
    (
        "bad user",
        _variant("user: ubuntu", "user: Root Admin"),
        "user: 'Root Admin' is not allowed|login name",
    ),
    (
        "no hosts",
        _variant(GOOD[GOOD.index("\nhosts:") + 1 :], "hosts: []\n"),
        "hosts: [] is not allowed|non-empty list",
    ),
    (
        "bad address",
        _variant("203.0.113.6", "203.0.113.300"),
        "hosts[1].address: '203.0.113.300' is not allowed|IP address or host name",
    ),
    (
        "user@host",
        _variant("address: 203.0.113.6", "address: ubuntu@203.0.113.6"),
        "hosts[1].address|put the login name in `user`",
    ),
    (
        "host:port",
        _variant("address: 203.0.113.6", "address: 'gpu-b:2222'"),
        "hosts[1].address: 'gpu-b:2222'|put the port in `port`",
    ),
    ("bad internal address", _variant("10.0.0.5", "10.0.0"), "hosts[0].internal_address: '10.0.0'"),
    (
        "duplicate address",
        _variant("    port: 2222\n", "").replace("203.0.113.6", "203.0.113.5"),
        "hosts[1].address: '203.0.113.5' is not allowed|duplicates hosts[0]",
    ),
    (
        "one address on two ports, no names",
        _variant("    name: gpu-a\n", "").replace("203.0.113.6", "203.0.113.5"),
        "hosts[1]: hosts[0] and this host would both be named '203.0.113.5' (their address); "
        "give each a `name`",
    ),
    (
        "duplicate name",
        _variant("    port: 2222\n", "    port: 2222\n    name: gpu-a\n"),
        "hosts[1].name: 'gpu-a'|duplicates hosts[0]",
    ),
    ("bad name", _variant("name: gpu-a", "name: 'gpu a'"), "hosts[0].name: 'gpu a'"),
    (
        "port too big",
        _variant("port: 2222", "port: 70000"),
        "hosts[1].port: 70000 is not allowed|1-65535",
    ),
    ("port as text", "port: '22'\n" + GOOD, "port: '22' is not allowed|1-65535"),
    ("port as bool", "port: yes\n" + GOOD, "port: true is not allowed"),
    ("setup as bool", "setup: true\n" + GOOD, "setup: true is not allowed|shell commands"),
    ("bad secret name", "secrets: [1BAD]\n" + GOOD, "secrets: '1BAD' is not allowed|allowed: NAME"),
    (
        "unknown host key",
        _variant("name: gpu-a", "name: gpu-a\n    gpu: 1"),
        "hosts[0].gpu: 1|allowed keys: address",
    ),
    (
        "host entry type",
        _variant("  - address: 203.0.113.6\n    port: 2222\n", "  - [203.0.113.6]\n"),
        "hosts[1]: ['203.0.113.6'] is not allowed",
    ),
    (
        "missing identity file",
        _variant("keys/id_ed25519", "keys/id_rsa"),
        "identity_file:|keys/id_rsa' is not allowed|does not exist",
    ),
    (
        "no identity file",
        _variant("identity_file: keys/id_ed25519\n", ""),
        "identity_file: missing; expected the path of the SSH private key",
    ),
    (
        "identity file is a directory",
        _variant("keys/id_ed25519", "keys"),
        "identity_file:|keys' is not allowed; it is a directory; give the private key file",
    ),
    (
        "public key as identity",
        _variant("keys/id_ed25519", "keys/id_ed25519.pub"),
        "identity_file:|public key; give the private key",
    ),
    (
        "known_hosts absent",
        _variant("known_hosts: known_hosts", "known_hosts: nope/known_hosts"),
        "known_hosts:|does not exist|--trust-new-hosts",
    ),
    (
        "identity file name too long",
        _variant("keys/id_ed25519", "k" * 300),
        "identity_file:|not a usable path (File name too long)",
    ),
    (
        "known_hosts name too long",
        _variant("known_hosts: known_hosts", "known_hosts: " + "k" * 300),
        "known_hosts:|not a usable path (File name too long)",
    ),
    (
        "known_hosts is a dir",
        _variant("known_hosts: known_hosts", "known_hosts: keys"),
        "known_hosts:|expected a readable known_hosts file",
    ),
    (
        "host not pinned",
        _variant("203.0.113.6", "203.0.113.7"),
        "hosts[1].address: no pinned host key for [203.0.113.7]:|"
        "(add it to known_hosts: ssh-keyscan|or pass --trust-new-hosts)",
    ),
    ("gpus and cpu", GOOD + "cpu: true\n", "gpus/cpu: both are given"),
    (
        "neither gpus nor cpu",
        _variant(GPUS_LINE, ""),
        "gpus/cpu: neither is given",
    ),
    (
        "cpu false",
        _variant(GPUS_LINE, "cpu: false\n"),
        "cpu: false is not allowed|expected true",
    ),
    ("count zero", _variant("count: 8", "count: 0"), "gpus.count: 0 is not allowed|1-16"),
    ("count too big", _variant("count: 8", "count: 17"), "gpus.count: 17"),
    ("count as text", _variant("count: 8", "count: '8'"), "gpus.count: '8'"),
    ("no model", _variant("model: NVIDIA A100-SXM4-40GB, ", ""), "gpus.model: missing|nvidia-smi"),
    (
        "unknown gpu key",
        _variant("min_memory_gb: 38", "memory: 38"),
        "gpus.memory: 38|allowed keys: model",
    ),
    (
        "negative memory",
        _variant("min_memory_gb: 38", "min_memory_gb: -1"),
        "gpus.min_memory_gb: -1",
    ),
    (
        "infinite memory",
        _variant("min_memory_gb: 38", "min_memory_gb: .inf"),
        "gpus.min_memory_gb: inf",
    ),
    ("nan memory", _variant("min_memory_gb: 38", "min_memory_gb: .nan"), "gpus.min_memory_gb: nan"),
    (
        "absurd memory",
        _variant("min_memory_gb: 38", "min_memory_gb: 5000"),
        "gpus.min_memory_gb: 5000|0-1024",
    ),
    (
        "gpus not a mapping",
        _variant(GPUS_LINE, "gpus: 8\n"),
        "gpus: 8 is not allowed|mapping",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_hosts_files_are_one_line_errors(
    site: dict[str, object], text: str | None, expected: str
) -> None:
    path = Path(str(site["dir"])) / "lab.yaml" if text is None else write(site, text)
    with pytest.raises(UserError) as err:
        load_hosts_file(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    for fragment in expected.split("|"):
        assert fragment in message, (fragment, message)
    assert err.value.exit_code == 2


# ---------------------------------------------------------------- waiting for existing machines


def _refusing_host(site: dict[str, object]) -> Path:
    """A hosts file whose only host refuses connections: a closed port on this machine."""
    from tests.support.trainer_helpers import free_port

    port = free_port()
    base = Path(str(site["dir"]))
    keys = site["head_keys"]
    assert isinstance(keys, dict)
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} ssh-ed25519 {keys['ssh-ed25519']}\n")
    return write(
        site,
        f"{GOOD.split('gpus:')[0]}cpu: true\nhosts:\n  - address: 127.0.0.1\n    port: {port}\n",
    )


@pytest.mark.parametrize("wait", [None, "2"], ids=["default", "--wait 2"])
def test_a_refusing_host_fails_after_a_short_grace(
    site: dict[str, object], capsys: pytest.CaptureFixture[str], wait: str | None
) -> None:
    """Existing machines get the short grace (the default, settings.existing_wait_s, or --wait),
    never the 15 minutes new cloud VMs get; off a terminal the wait prints one line per node and
    5 s, not one per attempt."""
    import time

    from scripts.cli import main
    from scripts.settings import Settings

    path = _refusing_host(site)
    base = Path(str(site["dir"]))
    settings = Settings(root=base, runs_dir=base / "runs", existing_wait_s=3)
    argv = ["verify", "--hosts", str(path)] + (["--wait", wait] if wait else [])
    started = time.monotonic()
    assert main(argv, settings) == 1
    assert time.monotonic() - started < 8
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert f"not reachable within {wait or 3} s (last: connection refused)" in err
    assert "--wait SECONDS waits longer" in err
    waiting = [ln for ln in captured.out.splitlines() if "waiting for SSH" in ln]
    assert len(waiting) == 1, captured.out
    assert "127.0.0.1: not reachable (connection refused)" in captured.out


def test_the_data_key_names_datasets_and_a_bad_entry_is_one_line(site: dict[str, object]) -> None:
    from scripts.settings import Settings
    from scripts.targets.hosts import HostsTarget

    path = write(site, GOOD + "data:\n  train: gs://lab-data/owt\n  web: gs://lab-data/fw:mount\n")
    hosts = load_hosts_file(path)
    assert [d.spec() for d in hosts.datasets] == [
        "train=gs://lab-data/owt/:copy",
        "web=gs://lab-data/fw/:mount",
    ]
    assert HostsTarget(str(path), Settings(root=path.parent)).declared().datasets == hosts.datasets
    bad = write(site, GOOD + "data:\n  train: gs://lab-data/owt:fast\n", "bad.yaml")
    with pytest.raises(UserError) as e:
        load_hosts_file(bad)
    assert str(e.value) == (
        f"{bad}: data.train: mode 'fast' in 'gs://lab-data/owt:fast' is not allowed; use copy or mount"
    )
