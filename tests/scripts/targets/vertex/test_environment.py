"""What a CustomJob's env carries of the job's environment: the requirement files to install and the
setup commands, as data, under the names gputrain_node/vertex_setup.py reads."""

from __future__ import annotations

import json
from pathlib import Path

from gputrain_node import vertex_setup as entry
from scripts.job.environment import plan_environment
from scripts.targets.vertex import environment as controller


def test_both_sides_use_the_same_names() -> None:
    assert (controller.SETUP_ENV, controller.SETUP_TIMEOUT_ENV, controller.REQUIREMENTS_ENV) == (
        entry.SETUP_ENV,
        entry.SETUP_TIMEOUT_ENV,
        entry.REQUIREMENTS_ENV,
    )


def test_requirements_and_setup_travel_as_data(tmp_path: Path) -> None:
    assert controller.environment_env(None) == {}
    (tmp_path / "requirements.txt").write_text("tiny==1.0\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["b>=2"]\n')
    setup = 'echo \'a "quoted" $HOME\'; touch "$(date)"\n'
    env = plan_environment(tmp_path, setup=setup, setup_timeout_s=90.5)
    out = controller.environment_env(env)
    assert out[controller.SETUP_ENV] == setup  # unquoted, unparsed: the entry runs it as sh -c
    assert out[controller.SETUP_TIMEOUT_ENV] == "90"
    assert json.loads(out[controller.REQUIREMENTS_ENV]) == {
        "requirements_txt": True,
        "pyproject_deps": ["b>=2"],
        "uv_lock": False,
    }
    without_requirements = plan_environment(tmp_path, requirements=False, setup=setup)
    assert controller.REQUIREMENTS_ENV not in controller.environment_env(without_requirements)
    only_requirements = controller.environment_env(plan_environment(tmp_path))
    assert set(only_requirements) == {controller.REQUIREMENTS_ENV}
