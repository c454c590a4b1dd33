"""Messages that misled (issue 27, class 3): each now says what is true and what to do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.base.errors import UserError
from infra.offers import parse_request, resolve
from infra.plan import build_plan
from infra.spec import parse_spec
from scripts.cli import main
from scripts.job.launch import _stop_summary
from scripts.targets.hosts_file import load_hosts_file
from tests.support.pulumi_mocks import ROOT, deployable_config


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_a_dir_that_does_not_exist_is_refused_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _error(capsys, ["plan", "--stack", "dev", "--dir", str(tmp_path / "nope")])
    assert "--dir" in line and "no such directory" in line
    line = _error(capsys, ["plan", "--stack", "dev", "--dir", str(tmp_path)])
    assert "no Pulumi.yaml there or in a directory above it" in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["plan", "--stack", "dev", "--dir", "LONG"], "--dir LONG: no such directory"),
        (["run", "--hosts", "LONG"], "LONG: cannot read the hosts file (File name too long)"),
        (["run", "--local", "--yes", "--", "LONG.py"], "ENTRY LONG.py: no such file in"),
        (["cost", "--runs-dir", "/LONG"], "--runs-dir /LONG: not a usable path (File name too"),
        (["logs", "--local", "--runs-dir", "/LONG"], "--runs-dir /LONG: not a usable path"),
        (["report", "--local", "LONG"], "RUN 'LONG'"),
    ],
    ids=["--dir", "--hosts", "ENTRY", "cost --runs-dir", "logs --runs-dir", "report RUN"],
)
def test_a_name_the_system_refuses_is_one_line_not_a_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    expected: str,
) -> None:
    """A path longer than the system allows (ENAMETOOLONG) made pathlib raise OSError."""
    monkeypatch.chdir(tmp_path)
    long = "z" * 300
    assert expected.replace("LONG", long) in _error(capsys, [a.replace("LONG", long) for a in argv])


def test_a_dir_below_the_project_finds_it(tmp_path: Path) -> None:
    from scripts.cli import _project_dir

    (tmp_path / "Pulumi.yaml").write_text("name: x\n")
    (tmp_path / "sub").mkdir()
    assert _project_dir(tmp_path / "sub") == tmp_path.resolve()


@pytest.mark.parametrize("name", ["PATH", "RANK", "GPUTRAIN_OUT", "HOME"])
def test_env_that_would_break_the_run_script_is_refused(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    line = _error(capsys, ["train", "--local", "--env", f"{name}=/opt/bin"])
    assert line.startswith(f"gputrain: error: --env {name}=...: {name} is set on the node")
    assert "/opt/bin" not in line


def test_a_two_node_run_whose_other_node_ended_first_says_so() -> None:
    text = _stop_summary({}, "n0", {"n0": 1, "n1": 1})
    assert text == "the other node(s) had ended already (n1 exit code 1)"
    assert "no other node to stop" not in text
    assert _stop_summary({"n1": "terminated"}, "n0", {"n0": 1, "n1": None}) == "stopped n1"
    assert (
        _stop_summary(
            {},
            "n0",
            {"n0": 1, "n1": 1},
        )
        != ""
    )
    assert _stop_summary({}, "n0", {"n0": 1}) == ""  # one node: no other to speak of
    assert _stop_summary({}, "n0") == "no other node to stop"


def test_a_one_node_run_speaks_of_no_other_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed `--local` run: no "stopping the other node(s)", no "no other node to stop", and
    the worker's own exit code; lost results name no other nodes' directory."""
    from scripts.job.download import not_home_message
    from scripts.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT", raising=False)
    (tmp_path / "boom.py").write_text("raise SystemExit(3)\n")
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["run", "--local", "--", "boom.py"], settings) == 1
    out, err = capsys.readouterr()
    assert "node local failed (exit code 3)\n" in out and "other node" not in out + err
    assert "failed on node local (exit code 3). Root cause:" in err
    lost = not_home_message("r1", {"local": "gone"}, tmp_path, 1)
    assert lost.endswith("`gputrain results r1` with the run's target tries again")
    assert "(the other nodes' are in" in not_home_message("r1", {"n1": "gone"}, tmp_path, 2)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["status", "--local"], "status: --local: only a stack has this command; choose --stack"),
        (["down", "--hosts", "h.yaml"], "down: --hosts: only a stack has this command"),
        (["verify", "--local", "--fabric"], "--fabric: only a --stack has a GPU network"),
    ],
)
def test_a_target_a_command_cannot_use_is_one_line(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.settings import Settings

    assert main(argv, Settings(root=tmp_path, runs_dir=tmp_path / "runs")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"gputrain: error: {says}" or line.startswith(f"gputrain: error: {says}")


def test_an_encrypted_identity_file_is_named_at_once(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret pass", "-f", str(key)], check=True
    )
    hosts = tmp_path / "lab.yaml"
    hosts.write_text(
        "user: u\nidentity_file: id_ed25519\nknown_hosts: kh\ncpu: true\nhosts: [10.0.0.5]\n"
    )
    (tmp_path / "kh").write_text("")
    with pytest.raises(UserError, match=r"identity_file.*encrypted \(passphrase-protected\)"):
        load_hosts_file(hosts)


def test_not_sold_in_this_mode_names_capacity_and_the_modes_that_work() -> None:
    from infra.offers import GpuRequestError

    with pytest.raises(GpuRequestError) as e:
        resolve(parse_request("B200:8"), spot=False)
    text = str(e.value)
    assert "gputrain:spot" not in text and "set gputrain:capacity to spot or flex-start" in text
    with pytest.raises(GpuRequestError) as e:
        resolve(parse_request("B200:8"), spot=True, zones=("europe-north1-a",))
    assert "gputrain:spot" not in str(e.value) and "()" not in str(e.value)


def test_vertex_candidates_carry_the_premium_the_headline_has() -> None:
    cfg = deployable_config("vertex")
    for key in ("gputrain:machineType", "gputrain:nodes"):
        cfg.pop(key, None)
    cfg["gputrain:gpus"] = "L4:4"
    plan = build_plan(parse_spec(cfg, "vertex"))
    assert plan.candidates is not None
    (chosen,) = [row for row in plan.candidates.rows if row[-1]]
    assert chosen[4] == f"${plan.hourly_total:.2f}"
    gce = build_plan(parse_spec(deployable_config("dev") | {"gputrain:gpus": "L4:4"}, "dev"))
    assert gce.candidates is not None
    assert gce.candidates.rows[0][4] != chosen[4]  # Compute Engine's price, without the premium
    assert ROOT.is_dir()
