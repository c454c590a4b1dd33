"""`plan_run`: every bad input is one line before anything exists, in the README's order, and a
good plan holds what the run needs. Real targets (a stack file, a hosts file, this machine) and
no sshd, no cloud: nothing here may reach either."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain_node.contract import HEALTHCHECK_ENTRY
from infra.base.errors import UserError
from scripts.cli_options import open_target
from scripts.run_plan import RunPlan, plan_run
from scripts.settings import Settings
from scripts.targets.base import Feature, RunOptions, Target
from tests.support import ROOT

GCE = "  gcp:project: proj-test\n  gputrain:machineType: g2-standard-8\n  gputrain:zones: [us-central1-a]\n"
VERTEX = GCE + "  gputrain:backend: vertex\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with a job script (the entry), and the working directory."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "job.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    for var in ("GPUTRAIN_NOTIFY", "GPUTRAIN_WATCH_POLL_S", "UNSET_SECRET_X_FOR_TESTS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def target(project: Path, *, stack: str | None = None, config: str = GCE) -> Target:
    """`--stack NAME` (the stack file written from `config`), else `--local`."""
    if stack:
        (project / f"Pulumi.{stack}.yaml").write_text("config:\n" + config)
    settings = Settings(root=project, runs_dir=project / "runs")
    return open_target(stack=stack, hosts=None, settings=settings)


def plan(t: Target, project: Path, *, create: bool = True, **options: object) -> RunPlan:
    opts = RunOptions(**{"entry": ("job.py",), **options})  # type: ignore[arg-type]
    return plan_run(t, opts, Settings(root=project, runs_dir=project / "runs"), create=create)


def refused(t: Target, project: Path, **options: object) -> str:
    with pytest.raises(UserError) as e:
        plan(t, project, **options)
    assert "\n" not in str(e.value)  # one line
    assert not (project / "runs").exists()  # nothing was made
    return str(e.value)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"max_recoveries": 2},
            "--max-recoveries 2: stack v runs on Vertex AI, where gputrain re-creates no VMs; "
            "allowed only for backend gce stacks",
        ),
        ({"resume": "20261124-183000-ab12"}, "--resume 20261124-183000-ab12: stack v runs on"),
        ({"autodown": "5m"}, "--autodown 5m: stack v runs on Vertex AI"),
    ],
)
def test_an_option_vertex_lacks_is_refused_naming_it(
    project: Path, options: dict[str, object], expected: str
) -> None:
    assert refused(target(project, stack="v", config=VERTEX), project, **options).startswith(
        expected
    )


def test_machines_that_exist_lack_build_recreate_and_autodown(project: Path) -> None:
    local = target(project)
    assert {Feature.DETACH, Feature.RESUME, Feature.SSH} <= {
        f for f in Feature if f in local.capabilities
    }
    (project / "Dockerfile").write_text("FROM x\n")
    assert refused(local, project, build="Dockerfile").startswith(
        "--build Dockerfile: only for --stack targets"
    )
    assert "only --stack targets" in refused(local, project, max_recoveries=1)
    assert "only --stack targets" in refused(local, project, autodown="5m")


def test_gce_can_do_everything_a_target_can_but_export_a_job(project: Path) -> None:
    gce = target(project, stack="dev")
    assert [f for f in Feature if f not in gce.capabilities] == [Feature.EXPORT_JOB]


@pytest.mark.parametrize(
    ("files", "options", "env", "expected"),
    [
        ({}, {"max_recoveries": 101}, {}, "--max-recoveries 101: allowed 0..100"),
        ({}, {"build": "Dockerfile", "image": "r.io/a:1"}, {}, "--build and --image are both set"),
        ({"requirements.txt": "torch\nnot valid ==\n"}, {}, {}, "requirements.txt line 2"),
        ({}, {"secrets": ("UNSET_SECRET_X_FOR_TESTS",)}, {}, "secret UNSET_SECRET_X_FOR_TESTS"),
        ({}, {"setup_timeout_s": 0.0}, {}, "--setup-timeout 0: not allowed"),
        ({}, {"image": "ubuntu:22.04"}, {}, "--image: 'ubuntu:22.04' is not allowed"),
        ({}, {"entry": ("missing.py",)}, {}, "missing.py"),
        ({}, {}, {"GPUTRAIN_NOTIFY": "ftp://x"}, "GPUTRAIN_NOTIFY"),
        ({}, {}, {"GPUTRAIN_WATCH_POLL_S": "soon"}, "GPUTRAIN_WATCH_POLL_S='soon'"),
    ],
)
def test_bad_input_is_one_line_before_anything(
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str],
    options: dict[str, object],
    env: dict[str, str],
    expected: str,
) -> None:
    for name, text in files.items():
        (project / name).write_text(text)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert expected in refused(target(project, stack="dev"), project, **options)


def test_a_stack_file_error_and_a_missing_dockerfile_come_before_the_run(project: Path) -> None:
    bad = target(project, stack="bad", config=GCE + "  gputrain:data: {train: 'gs://b/x:fast'}\n")
    assert "mode 'fast'" in refused(bad, project)
    assert "nope/Dockerfile" in refused(
        target(project, stack="dev"), project, build="nope/Dockerfile"
    )


def test_the_first_bad_input_in_the_readme_order_is_the_one_named(project: Path) -> None:
    """What the target lacks comes before the environment, the environment before the entry."""
    (project / "requirements.txt").write_text("not valid ==\n")
    vertex = target(project, stack="v", config=VERTEX)
    assert refused(vertex, project, autodown="5m").startswith("--autodown 5m")
    gce = target(project, stack="dev")
    assert "requirements.txt" in refused(gce, project, entry=("missing.py",))


def test_a_good_plan_holds_what_the_run_needs_and_makes_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUTRAIN_NOTIFY", "https://hooks.example/env")
    config = GCE + "  gputrain:notify: [https://hooks.example/file]\n"
    p = plan(
        target(project, stack="dev", config=config),
        project,
        notify=("https://hooks.example/flag", "https://hooks.example/file"),
        env={"A": "1"},
    )
    assert p.notify == (
        "https://hooks.example/flag",
        "https://hooks.example/file",
        "https://hooks.example/env",
    )  # the flag's, the environment's, the file's: each once
    assert p.spec is not None and p.spec.stack == "dev" and p.label == "dev"
    assert p.stack_settings is not None and p.stack_settings.notify == [
        "https://hooks.example/file"
    ]  # the stack file's keys, typed at its one load
    assert p.selector == "stack-dev" and p.entry == ("job.py",) and p.max_recoveries == 3
    assert p.autodown_s == p.spec.autodown_s and p.autodown_s
    assert p.results_dir == project / "runs" / "stack-dev" / p.run_id
    assert not (project / "runs").exists()  # made when the job starts
    job = p.job(None)
    assert (job.run_id, job.entry, dict(job.env), job.watch) == (
        p.run_id,
        p.entry,
        {"A": "1"},
        p.watch,
    )
    kept = plan(target(project, stack="dev"), project, keep=True)
    assert kept.autodown_s is None  # --keep: nothing deletes the VMs
    assert plan(target(project, stack="dev"), project, autodown="5m").autodown_s == 300
    resumed = plan(target(project), project, resume="20261124-183000-ab12", create=False)
    assert resumed.run_id == "20261124-183000-ab12" and resumed.autodown_s is None
    assert resumed.job(None).resumed and not job.resumed  # its mirrored state comes back


@pytest.mark.parametrize(
    ("runs_dir", "why"),
    [
        ("job.py/runs", "{project}/job.py is not a directory"),
        ("r" * 300, "not a usable path (File name too long)"),
    ],
    ids=["under a file", "name too long"],
)
def test_results_that_could_not_be_made_are_refused_before_anything(
    project: Path, runs_dir: str, why: str
) -> None:
    """Made only when the job starts, so checked here: otherwise a stack run would create its
    VMs, verify them and only then fail."""
    settings = Settings(root=project, runs_dir=project / runs_dir)
    with pytest.raises(UserError) as e:
        plan_run(target(project), RunOptions(entry=("job.py",)), settings, create=True)
    assert str(e.value) == (
        f"results directory {project / runs_dir}: {why.format(project=project)}; "
        "allowed: a directory you can write, other than the working directory "
        "(--runs-dir, GPUTRAIN_RUNS_DIR)"
    )


def test_healthcheck_plans_no_data(project: Path) -> None:
    """`healthcheck` reads no data: the stack's datasets are not listed (nor needed)."""
    config = GCE + "  gputrain:data: {train: 'gs://no-such-bucket-here/x'}\n"
    t = target(project, stack="dev", config=config)
    (project / "trainer").mkdir()
    (project / "trainer" / "__init__.py").write_text("")
    (project / "trainer" / "healthcheck.py").write_text("")
    assert plan(t, project, entry=HEALTHCHECK_ENTRY).datasets == ()


def test_a_name_both_env_and_a_secret_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job saw --env's plain value and the secret was dropped, silently."""
    monkeypatch.setenv("TOKEN_X_FOR_TESTS", "s3cret")
    both = {"env": {"TOKEN_X_FOR_TESTS": "plain"}}
    assert refused(target(project), project, secrets=("TOKEN_X_FOR_TESTS",), **both) == (
        "--env TOKEN_X_FOR_TESTS=...: TOKEN_X_FOR_TESTS is also a secret (--secret "
        "TOKEN_X_FOR_TESTS); allowed: a name in only one of them"
    )
    in_file = target(project, stack="s", config=GCE + "  gputrain:secrets: [TOKEN_X_FOR_TESTS]\n")
    assert "(gputrain:secrets TOKEN_X_FOR_TESTS)" in refused(in_file, project, **both)


def test_a_secret_on_the_command_line_replaces_the_files_of_that_name(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both were kept: the file's Secret Manager reference was still read (and granted) though
    the command line named another source for the same variable."""
    monkeypatch.setenv("TOKEN_X_FOR_TESTS", "s3cret")
    in_sm = GCE + "  gputrain:secrets: [TOKEN_X_FOR_TESTS=sm://file-token]\n"
    planned = plan(
        target(project, stack="s", config=in_sm), project, secrets=("TOKEN_X_FOR_TESTS",)
    )
    assert planned.secrets.values == {"TOKEN_X_FOR_TESTS": "s3cret"}
    assert planned.secrets.refs == {}
