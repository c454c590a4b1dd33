"""The stack file's one schema (infra/schema.py): wrong YAML shapes are one line at load, before
anything; the declared defaults are the ones every reader uses; Pulumi.yaml agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra import schema, stackfile
from infra.keys import parse_duration
from infra.spec import parse_spec
from infra.stackfile import SpecError, load_stack_config
from tests.support.pulumi_mocks import ROOT, deployable_config

#: Pulumi's project config type for each kind of value the schema declares.
PULUMI_TYPE = {
    "text": "string",
    "text-or-texts": "string",  # gpus and capacity: Pulumi has no union type
    "whole": "integer",
    "flag": "boolean",
    "texts": "array",
    "labels": "array",
}


def _load(tmp_path: Path, body: str) -> dict[str, str]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text(body)
    return load_stack_config(tmp_path, "s")


@pytest.mark.parametrize(
    ("line", "key", "allowed"),
    [
        ("gputrain:secrets: HF_TOKEN", "gputrain:secrets = 'HF_TOKEN'", "a list of strings"),
        ("gputrain:image: [a, b]", 'gputrain:image = ["a", "b"]', "a string"),
        ("gputrain:budget: .nan", "gputrain:budget = nan", "a string"),  # no JSON text
        ("gputrain:nodes: '٣'", "gputrain:nodes = '٣'", "a whole number"),
        ("gputrain:nodes: two", "gputrain:nodes = 'two'", "a whole number"),
        ("gputrain:nodes: true", "gputrain:nodes = True", "a whole number"),
        ("gputrain:allowSshFromAnywhere: yes", "allowSshFromAnywhere = 'yes'", "true or false"),
        ("gputrain:zones: us-central1-a", "gputrain:zones = 'us-central1-a'", "a list"),
        ("gputrain:notify: {a: b}", 'gputrain:notify = {"a": "b"}', "a list of strings"),
        ("gputrain:data: [gs://b/x]", 'gputrain:data = ["gs://b/x"]', "a mapping of NAME"),
        ("gputrain:labels: {spot: true}", 'gputrain:labels = {"spot": true}', "a list of key="),
        ("gputrain:labels: {v: 1.5}", 'gputrain:labels = {"v": 1.5}', "a list of key="),
    ],
)
def test_a_value_of_the_wrong_shape_is_one_line_naming_key_value_and_allowed(
    tmp_path: Path, line: str, key: str, allowed: str
) -> None:
    with pytest.raises(SpecError) as err:
        _load(tmp_path, f"config:\n  {line}\n")
    text = str(err.value)
    assert "\n" not in text and err.value.exit_code == 2
    assert "Pulumi.s.yaml" in text and key in text and f"allowed: {allowed}" in text


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ("gputrain:nodes: '2'", "gputrain:nodes", "2"),  # as `pulumi config set` writes it
        ("gputrain:nodes: 2", "gputrain:nodes", "2"),
        ("gputrain:spot: 'true'", "gputrain:spot", "true"),
        ("gputrain:capacity: [spot, on-demand]", "gputrain:capacity", '["spot", "on-demand"]'),
        ("gputrain:labels: {team: ml}", "gputrain:labels", '{"team": "ml"}'),
        ("gputrain:data: {d: gs://b/x}", "gputrain:data", '{"d": "gs://b/x"}'),
        (
            "gputrain:setup: |\n    pip install x\n    echo y",
            "gputrain:setup",
            "pip install x\necho y\n",
        ),
        ("gputrain:zone:", "gputrain:zone", ""),
    ],
)
def test_the_shapes_a_key_takes_load_as_the_cli_hands_them_on(
    tmp_path: Path, line: str, key: str, value: str
) -> None:
    assert _load(tmp_path, f"config:\n  {line}\n")[key] == value


@pytest.mark.parametrize(
    ("written", "text"),
    [("100", "100"), ("5.5", "5.5"), ("1e3", "1000"), ("false", "false"), ("010", "8")],
)
def test_a_number_in_a_string_key_is_the_text_pulumi_hands_the_program(
    tmp_path: Path, written: str, text: str
) -> None:
    """The CLI takes `budget: 100` for a `type: string` key and hands on its JSON text (a plain
    string): the file's typed settings, its strings and the program's strings agree."""
    from infra.spec import stack_file_spec

    config = _load(
        tmp_path, f"config:\n  gputrain:budget: {written}\n  gputrain:setup: {written}\n"
    )
    loaded = stackfile.read_stack_file(tmp_path, "s")
    assert config["gputrain:budget"] == loaded.settings.budget == text
    assert loaded.settings.setup == text
    if text != "false":  # the budget's own rule takes a number of dollars
        assert stack_file_spec(loaded) == parse_spec(loaded.config, "s")
        assert stack_file_spec(loaded).budget == float(text)


def test_a_number_in_a_string_key_meets_the_keys_own_rule(tmp_path: Path) -> None:
    from infra.spec import stack_file_spec

    _load(tmp_path, "config:\n  gputrain:maxRunDuration: 6\n")
    with pytest.raises(SpecError) as e:
        stack_file_spec(stackfile.read_stack_file(tmp_path, "s"))
    assert str(e.value) == (
        "gputrain:maxRunDuration = '6': allowed: durations like 90m, 6h, 2d, 1h30m"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1000.0, "1000"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (1.5e-5, "0.000015"),
        (-0.0, "-0"),
        (True, "true"),
        (float("inf"), None),
    ],
)
def test_a_scalar_is_spelt_as_gos_json_spells_it(value: float, text: str | None) -> None:
    assert schema.scalar_text(value) == text


def test_one_load_gives_the_typed_settings_beside_the_strings(tmp_path: Path) -> None:
    """Each key typed once at load (the project's defaults, then the stack's values): readers
    take `secrets` as a list and `nodes` as a number, never parsing the CLI's strings again."""
    _load(tmp_path, "config:\n  gputrain:nodes: '2'\n  gputrain:secrets: [HF_TOKEN]\n")
    loaded = stackfile.read_stack_file(tmp_path, "s")
    typed = loaded.settings
    assert (typed.nodes, typed.secrets, typed.spot) == (2, ["HF_TOKEN"], None)
    assert (typed.maxRunDuration, typed.backend) == ("6h", "gce")  # Pulumi.yaml's defaults
    assert loaded.config["gputrain:secrets"] == '["HF_TOKEN"]'  # the program's string view


def test_a_bad_default_in_pulumi_yaml_names_that_file(tmp_path: Path) -> None:
    project = (ROOT / "Pulumi.yaml").read_text().replace("default: L4:1", "default: 5", 1)
    (tmp_path / "Pulumi.yaml").write_text(project)
    (tmp_path / "Pulumi.s.yaml").write_text("config:\n  gputrain:nodes: 1\n")
    with pytest.raises(SpecError) as err:
        stackfile.read_stack_file(tmp_path, "s")
    assert str(err.value) == (
        "stack = 's': Pulumi.yaml: gputrain:gpus = 5: allowed: a string or a list of strings"
    )


def test_an_unknown_key_is_left_to_the_did_you_mean_line(tmp_path: Path) -> None:
    config = deployable_config("dev") | _load(tmp_path, "config:\n  gputrain:node: 5\n")
    with pytest.raises(SpecError, match=r"gputrain:node: not a gputrain setting.*did you mean"):
        parse_spec(config, "s")


@pytest.mark.parametrize("text", ["٣h", "1h٣٠m", "١d", "6h\u0663"])
def test_durations_take_ascii_digits_only(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("key", "value"), [("bootDiskGb", "٣٠٠"), ("nodes", "1_0")])
def test_whole_numbers_take_ascii_digits_only_at_parse_time(key: str, value: str) -> None:
    """Values that reach parse_spec without the file (the Pulumi engine hands strings)."""
    config = deployable_config("dev") | {f"gputrain:{key}": value}
    if key == "nodes":
        config |= {"gputrain:gpus": "", "gputrain:machineType": "g2-standard-4"}
    with pytest.raises(SpecError, match=rf"gputrain:{key} = '{value}': allowed: a whole number"):
        parse_spec(config, "s")


def test_a_stall_timeout_in_other_digits_is_refused() -> None:
    from infra.keys import parse_stall_timeout

    with pytest.raises(ValueError):
        parse_stall_timeout("٦٠")
    assert parse_stall_timeout("60") == 60


def test_pulumi_yaml_declares_each_key_with_the_schemas_type_and_default() -> None:
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    for key in schema.StackSettings.model_fields:
        if key in stackfile.MAP_KEYS:
            assert key not in declared  # Pulumi has no map type: a comment declares it
            continue
        assert declared[key]["type"] == PULUMI_TYPE[schema.kind(key)], key
        if "default" in declared[key]:
            assert schema.config_string(declared[key]["default"]) == stackfile.DEFAULTS[key], key


def test_every_default_passes_the_schema() -> None:
    schema.load_settings(
        {
            k: f.default
            for k, f in schema.StackSettings.model_fields.items()
            if f.default is not None
        }
    )


def test_the_cli_strings_load_into_the_same_settings_as_the_yaml() -> None:
    yaml_values = {
        "gpus": ["H100:8", "A100:8"],
        "zones": ["us-central1-a"],
        "nodes": 2,
        "spot": True,
        "labels": {"team": "ml", "cost": None},
        "chief": {"machineType": "a2-highgpu-1g"},
        "data": {"train": "gs://b-1/w"},
        "maxRunDuration": "2h",
    }
    strings = schema.config_strings({f"gputrain:{k}": v for k, v in yaml_values.items()})
    typed = stackfile.load_config_strings(strings, "gputrain:")
    assert typed == schema.load_settings(yaml_values)
    assert typed.nodes == 2 and typed.spot is True and typed.bootDiskGb == 200


def test_the_cli_strings_take_comma_lists_and_empty_as_unset() -> None:
    typed = stackfile.load_config_strings(
        {
            "gputrain:zones": " us-central1-a, us-central1-b ",
            "gputrain:labels": "team=ml,env=dev",
            "gputrain:capacity": "spot,on-demand",
            "gputrain:bootDiskGb": "",
            "gputrain:data": "",
            "other:key": "ignored",
        },
        "gputrain:",
    )
    assert typed.zones == ["us-central1-a", "us-central1-b"]
    assert typed.labels == ["team=ml", "env=dev"]
    assert typed.capacity == "spot,on-demand"  # capacity's own rules read the ladder
    assert typed.bootDiskGb == 200 and typed.data is None


@pytest.mark.parametrize(
    ("key", "text", "allowed"),
    [
        ("nodes", "many", "a whole number 1..64"),
        ("bootDiskGb", "1e3", "a whole number 50..65536 GB"),
        ("gpuCount", "two", "a whole number (ASCII digits)"),
        ("spot", "yes", "true or false"),
        ("zones", '["a", 1]', "a list of strings"),
        ("labels", '{"team":', schema.ALLOWED["labels"]),
        ("labels", '{"spot": true}', schema.ALLOWED["labels"]),  # never the label spot=1
    ],
)
def test_a_cli_string_of_the_wrong_shape_is_one_line(key: str, text: str, allowed: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(deployable_config("dev", **{key: text}), "dev")
    assert str(e.value) == f"gputrain:{key} = {text!r}: allowed: {allowed}"


@pytest.mark.parametrize("stack", sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml")))
def test_the_typed_entry_and_the_string_entry_give_one_spec(stack: str) -> None:
    from infra.spec import stack_file_spec

    stack_file = stackfile.read_stack_file(ROOT, stack)
    assert stack_file_spec(stack_file) == parse_spec(stack_file.config, stack)
