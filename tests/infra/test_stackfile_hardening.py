"""Stack files the Pulumi CLI reads differently or would take silently: each one line, exit 2,
before anything else (issue 27, classes 2 and 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.spec import parse_spec, stack_file_spec
from infra.stackfile import SpecError, load_stack_config, read_stack_file, read_yaml
from tests.support.pulumi_mocks import ROOT, deployable_config


def _load(tmp_path: Path, body: str) -> dict[str, str]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text(body)
    return load_stack_config(tmp_path, "s")


def _refused(tmp_path: Path, body: str) -> str:
    with pytest.raises(SpecError) as err:
        _load(tmp_path, body)
    text = str(err.value)
    assert "\n" not in text and err.value.exit_code == 2
    return text


def test_a_duplicate_key_names_the_file_the_key_and_both_lines(tmp_path: Path) -> None:
    text = _refused(
        tmp_path, "config:\n  gputrain:gpus: L4:1\n  gputrain:nodes: 1\n  gputrain:gpus: H100:8\n"
    )
    assert "Pulumi.s.yaml" in text and "'gputrain:gpus'" in text
    assert "line 4" in text and "line 2" in text


def test_a_duplicate_key_deeper_down_is_refused_too(tmp_path: Path) -> None:
    text = _refused(tmp_path, "config:\n  gputrain:labels:\n    a: 1\n    a: 2\n")
    assert "'a'" in text and "line 4" in text


@pytest.mark.parametrize("namespace", ["gputrian", "gputran", "gpu-train", "Gputrain"])
def test_a_misspelt_namespace_is_refused_with_the_right_key(tmp_path: Path, namespace: str) -> None:
    text = _refused(tmp_path, f"config:\n  {namespace}:gpus: H100:8\n")
    assert f"{namespace}:gpus" in text and "gputrain:gpus" in text


def test_other_providers_namespaces_are_left_alone(tmp_path: Path) -> None:
    assert _load(tmp_path, "config:\n  aws:region: us-east-1\n")["aws:region"] == "us-east-1"


@pytest.mark.parametrize("key", ["gputrain:nodes", "gputrain:sshSourceRanges", "gcp:project"])
def test_secure_on_a_setting_that_is_not_a_secret_is_refused(tmp_path: Path, key: str) -> None:
    text = _refused(tmp_path, f"config:\n  {key}:\n    secure: AAABAxyz\n")
    assert key in text and "not a secret" in text and "gputrain:sshPrivateKey" in text


def test_secure_private_key_is_fine_and_never_read(tmp_path: Path) -> None:
    loaded = _load(tmp_path, "config:\n  gputrain:sshPrivateKey:\n    secure: AAABAxyz\n")
    assert "gputrain:sshPrivateKey" not in loaded or loaded["gputrain:sshPrivateKey"] == ""
    assert read_stack_file(tmp_path, "s").secrets.secure_keys == ("gputrain:sshPrivateKey",)


def test_a_plaintext_private_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    secret = "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n"
    text = _refused(tmp_path, f'config:\n  gputrain:sshPrivateKey: "{secret}"\n')
    assert "plain text" in text and "keygen" in text and "b3BlbnNza" not in text


def test_gpus_equal_to_its_default_beside_machine_type_is_refused(tmp_path: Path) -> None:
    text = _refused(
        tmp_path, "config:\n  gputrain:gpus: L4:1\n  gputrain:machineType: g2-standard-8\n"
    )
    assert "gputrain:gpus" in text and "gputrain:machineType" in text


@pytest.mark.parametrize("gpus", ["''", "[]", "['']", "' '", "null"])
def test_an_empty_gpus_beside_machine_type_counts_as_unset(tmp_path: Path, gpus: str) -> None:
    body = f"config:\n  gputrain:gpus: {gpus}\n  gputrain:machineType: g2-standard-8\n"
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text(body)
    assert stack_file_spec(read_stack_file(tmp_path, "s")).machine_type == "g2-standard-8"


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ("gputrain:gpuDirect: off", "gputrain:gpuDirect", "off"),
        ("gputrain:maxRunDuration: 1:30", "gputrain:maxRunDuration", "1:30"),
        ("gputrain:spot: true", "gputrain:spot", "true"),
        ("gputrain:nodes: 2", "gputrain:nodes", "2"),
    ],
)
def test_yaml_reads_as_the_pulumi_cli_reads_it(
    tmp_path: Path, line: str, key: str, value: str
) -> None:
    """YAML 1.2 core, not 1.1: `off` and `1:30` stay what the user wrote, never false or 5400."""
    assert _load(tmp_path, f"config:\n  {line}\n")[key] == value


def test_gpu_direct_off_as_the_readme_writes_it_validates(tmp_path: Path) -> None:
    body = (ROOT / "Pulumi.a3mega.yaml").read_text() + "  gputrain:gpuDirect: off\n"
    config = deployable_config("a3mega") | _load(tmp_path, body)
    assert config["gputrain:gpuDirect"] == "off"
    spec = parse_spec(config, "s")
    assert spec.fabric is not None and not spec.fabric.enabled


def test_sexagesimal_duration_is_refused_naming_the_value(tmp_path: Path) -> None:
    config = deployable_config("dev") | _load(
        tmp_path, "config:\n  gputrain:maxRunDuration: 1:30\n"
    )
    with pytest.raises(SpecError, match=r"maxRunDuration.*1:30"):
        parse_spec(config, "s")


@pytest.mark.parametrize("stack", ["../../x", "a/b", ".hidden", "Dev", "x" * 22, "dev "])
def test_a_stack_name_that_is_not_one_is_refused_before_it_becomes_a_path(
    tmp_path: Path, stack: str
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    with pytest.raises(SpecError) as err:
        read_stack_file(tmp_path, stack)
    assert str(err.value) == (
        f"stack = {stack!r}: allowed: 1-21 of a-z 0-9 -, starting with a letter "
        "(it names the VMs and the service account)"
    )


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ("config:\n  ? [a, b]\n  : x\n", "list"),
        ("config:\n  gputrain:labels: {? [a]: b}\n", "list"),
        ("config:\n  gputrain:data: {? {a: 1}: b}\n", "mapping"),
    ],
)
def test_a_key_that_is_no_name_is_one_line_naming_its_line(
    tmp_path: Path, body: str, shape: str
) -> None:
    text = _refused(tmp_path, body)
    assert (
        text
        == f"stack = 's': cannot read Pulumi.s.yaml: the key on line 2 is a {shape}; keys are names"
    )


@pytest.mark.parametrize(
    ("written", "read"), [("09", 9.0), ("-09", -9.0), ("010", 8), ("0o17", 15), ("2e0", 2.0)]
)
def test_an_integer_reads_as_go_yaml_reads_it(written: str, read: float) -> None:
    """The CLI's YAML takes a leading 0 as octal and `09`, no octal number, as the float 9."""
    value = read_yaml(f"a: {written}\n")["a"]
    assert value == read and type(value) is type(read)


def test_a_number_that_is_no_octal_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    text = _refused(tmp_path, "config:\n  gputrain:nodes: 09\n")
    assert text.startswith("stack = 's': Pulumi.s.yaml: gputrain:nodes = 9.0: allowed: a whole")


@pytest.mark.parametrize(
    "body",
    [
        "config:\n  gputrain:gpus: L4:2\ngputrain:maxRunDuration: 3h\n",  # one indent too few
        "gputrain:gpus: L4:2\n",  # no config: at all
    ],
)
def test_a_setting_outside_config_is_refused_not_ignored(tmp_path: Path, body: str) -> None:
    text = _refused(tmp_path, body)
    assert "is a top-level key, which Pulumi ignores; put it under config:, indented" in text
    assert "allowed at the top level: config, secretsprovider" in text


def test_a_setting_at_the_top_level_with_a_dot_for_a_colon_names_the_key(tmp_path: Path) -> None:
    text = _refused(tmp_path, "gputrain.gpus: L4:2\n")
    assert "put it under config:, indented, as gputrain:gpus (allowed" in text


def test_a_misspelt_top_level_key_gets_the_right_one(tmp_path: Path) -> None:
    text = _refused(tmp_path, "confg:\n  gputrain:gpus: L4:2\n")
    assert "confg is a top-level key" in text and "did you mean config?" in text


def test_pulumis_own_top_level_keys_are_taken(tmp_path: Path) -> None:
    body = "secretsprovider: passphrase\nencryptionsalt: v1:abc\nenvironment: [e]\nconfig: {}\n"
    assert _load(tmp_path, body)["gputrain:gpus"] == "L4:1"
    assert read_stack_file(tmp_path, "s").secrets.encrypted


@pytest.mark.parametrize(
    ("key", "name"), [("gcp:gpus", "gpus"), ("gcp:machineType", "machineType")]
)
def test_our_setting_under_another_namespace_is_refused(
    tmp_path: Path, key: str, name: str
) -> None:
    text = _refused(tmp_path, f"config:\n  {key}: L4:2\n")
    assert (
        f"{key}: {name} is a gputrain setting" in text and f"did you mean gputrain:{name}?" in text
    )


def test_the_gcp_providers_own_keys_are_left_alone(tmp_path: Path) -> None:
    body = "config:\n  gcp:zone: us-central1-a\n  gcp:region: us-central1\n  gcp:project: p-1\n"
    assert _load(tmp_path, body)["gcp:zone"] == "us-central1-a"


def test_one_setting_with_and_without_its_namespace_is_refused(tmp_path: Path) -> None:
    text = _refused(tmp_path, "config:\n  gputrain:gpus: L4:2\n  gpus: L4:4\n")
    assert text == (
        "stack = 's': Pulumi.s.yaml: gputrain:gpus is given twice, as gputrain:gpus and as "
        "gpus; set it once"
    )
