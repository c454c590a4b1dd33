"""On Vertex the job's body names its secrets only as Secret Manager versions; gputrain_node.vertex_entry
reads the values inside the job (the real client against the fake Secret Manager) into its own
environment, which torchrun and the ranks inherit."""

from __future__ import annotations

import json

import pytest

from gputrain_node.vertex_entry import SECRET_ENDPOINT_ENV, SECRET_REFS_ENV, resolve_secrets
from gputrain_node.vertex_mirror import InputError
from scripts.job.environment import parse_secrets, secret_references, secret_refs_env
from tests.support.fake_secretmanager import FakeSecretManager


def test_the_body_carries_references_and_the_entry_resolves_them() -> None:
    refs = secret_references(parse_secrets(["HF=sm://hf-token", "W=sm://wandb/2"], "s"), "proj")
    env = secret_refs_env(refs)
    assert json.loads(env[SECRET_REFS_ENV]) == {
        "HF": "projects/proj/secrets/hf-token/versions/latest",
        "W": "projects/proj/secrets/wandb/versions/2",
    }
    with FakeSecretManager() as fake:
        fake.add("proj", "hf-token", "hf-value")
        fake.add("proj", "wandb", "w1")
        fake.add("proj", "wandb", "w2")
        assert resolve_secrets({**env, SECRET_ENDPOINT_ENV: fake.url}) == {
            "HF": "hf-value",
            "W": "w2",
        }
        missing = secret_refs_env({"X": "projects/proj/secrets/nope/versions/latest"})
        with pytest.raises(InputError) as e:
            resolve_secrets({**missing, SECRET_ENDPOINT_ENV: fake.url})
        assert str(e.value).startswith("secret X: cannot read projects/proj/secrets/nope")
    assert resolve_secrets({}) == {}


def test_environment_secrets_cannot_reach_a_vertex_job() -> None:
    from infra.base.errors import UserError

    with pytest.raises(UserError) as e:
        secret_references(parse_secrets(["TOKEN"], "secrets"), "proj")
    assert "must come from Secret Manager" in str(e.value)
