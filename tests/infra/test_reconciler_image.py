"""The reconcile job's image (infra/reconciler_image.py): what goes into it, its Dockerfile, and
the tag, which the program in the image computes the same as the controller that built it."""

from __future__ import annotations

from pathlib import Path

from infra.reconciler_image import (
    context_entries,
    dockerfile,
    image_reference,
    image_tag,
    write_context,
)
from tests.support import ROOT

VERSIONS = ("3.272.0", "10.2.0")


def test_the_context_is_gputrains_own_files_and_a_generated_dockerfile() -> None:
    names = [rel for rel, _, _ in context_entries(ROOT, VERSIONS)]
    assert names[:4] == ["Pulumi.yaml", "__main__.py", "pyproject.toml", "README.md"]
    assert names[-1] == "Dockerfile"
    for wanted in ("infra/reconciler.py", "infra/prices.csv", "scripts/cli.py"):
        assert wanted in names
    assert any(n.startswith("gputrain_node/") for n in names)
    assert any(n.startswith("trainer/") for n in names)
    # never the user's stack files, tests, runs, virtualenvs or compiled files
    assert not [n for n in names if n.startswith(("Pulumi.dev", "tests/", "runs/", ".venv"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_dockerfile_pins_pulumi_and_the_provider_and_runs_gputrain() -> None:
    text = dockerfile(*VERSIONS)
    assert "FROM docker.io/pulumi/pulumi-python-3.12:3.272.0\n" in text
    assert "pip install --no-cache-dir /app pulumi==3.272.0 pulumi-gcp==10.2.0" in text
    assert "python -m venv /app/.venv" in text  # Pulumi.yaml's runtime virtualenv
    assert "pulumi plugin install resource gcp v10.2.0" in text
    assert text.endswith('ENTRYPOINT ["gputrain"]\n')
    assert "virtualenv: .venv" in (ROOT / "Pulumi.yaml").read_text()


def test_the_image_computes_its_own_tag(tmp_path: Path) -> None:
    """/app in the image holds the context, plus what the install and a pass add there (the
    virtualenv, pip's build files, the stack file, runs): the tag stays the one it was built
    under, so a pass's own `up` keeps the job on its image. A changed file changes it."""
    entries = context_entries(ROOT, VERSIONS)
    app = tmp_path / "app"
    write_context(entries, app)
    for extra in (".venv/bin/python", "build/lib/x.py", "gputrain.egg-info/PKG-INFO",
                  "Pulumi.dev.yaml", "runs/r/log", "infra/__pycache__/spec.cpython-312.pyc"):  # fmt: skip
        (app / extra).parent.mkdir(parents=True, exist_ok=True)
        (app / extra).write_text("x")
    tag = image_tag(ROOT, VERSIONS)
    assert tag.startswith("ctx-") and image_tag(app, VERSIONS) == tag
    assert image_tag(app, ("3.273.0", "10.2.0")) != tag  # another Pulumi: another image
    (app / "infra" / "reconciler.py").write_text("changed")
    assert image_tag(app, VERSIONS) != tag
    assert image_reference(ROOT, "europe-west4", "p", "s", VERSIONS) == (
        f"europe-west4-docker.pkg.dev/p/gputrain-s/gputrain-reconcile:{tag}"
    )
