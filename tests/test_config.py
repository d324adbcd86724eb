"""RunConfig: defaults, one-line errors naming key/value/allowed, cross-field rules, exit code."""

import pytest
from flwr.app import Context, RecordDict

from server_app.app import main
from strategies.shared.settings import ConfigError
from strategies.shared.run_config import RunConfig
from strategies.shared.run_config import default_run_config


def test_pyproject_defaults_validate_and_equal_the_model_defaults():
    # every pyproject key is a RunConfig field and vice versa, with the same default (no drift)
    assert set(default_run_config()) == set(RunConfig().flat())
    assert RunConfig.from_flower(default_run_config()) == RunConfig()


def test_pyproject_config_is_what_the_settings_models_generate():
    """Every key of pyproject.toml's [tool.flwr.app.config] has the default (value and type) of its
    settings model, and every setting has its key; a disagreement names the key."""
    from strategies.shared.generate import config_defaults

    written, expected = default_run_config(), config_defaults()
    problems = [f"{key}: pyproject.toml has {written[key]!r}, the settings model {expected[key]!r}"
                for key in expected.keys() & written.keys()
                if written[key] != expected[key] or type(written[key]) is not type(expected[key])]
    problems += [f"{key}: missing from pyproject.toml" for key in expected.keys() - written.keys()]
    problems += [f"{key}: in pyproject.toml but no setting" for key in written.keys() - expected.keys()]
    assert not problems, ("run `python -m strategies.shared.generate`; " + "; ".join(sorted(problems)))


def test_sections_and_types():
    cfg = RunConfig.from_flower({**default_run_config(), "fedprox.mu": 0.5, "ditto.lambda": 1,
                                 "data-root": ""})
    assert cfg.fedprox.mu == 0.5
    assert cfg.ditto.lambda_ == 1.0
    assert cfg.data_root is None
    assert cfg.data_spec.partition.num_clients == cfg.num_clients
    assert cfg.rotations == (0.0, 90.0, 180.0, 270.0)


def test_the_default_method_is_the_one_its_package_declares():
    from dataclasses import replace

    from strategies.shared import registry

    default = registry.default_method()
    assert RunConfig().method == default and registry.METHODS[default].default
    other = next(m for m in registry.METHODS.values() if not m.default)
    with pytest.raises(ValueError, match="already the default"):
        registry.register(replace(other, default=True))
    assert not registry.METHODS[other.name].default


def test_config_is_frozen():
    cfg = RunConfig()
    with pytest.raises(Exception):
        cfg.num_rounds = 3


def test_unknown_key_is_one_line_naming_key_and_allowed_keys():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({"num-roundz": 3})
    message = str(err.value)
    assert "\n" not in message
    assert "unknown key 'num-roundz'" in message
    assert "num-rounds" in message


def test_unknown_section_key():
    with pytest.raises(ConfigError, match=r"unknown key 'fedprox\.nu'; did you mean 'fedprox\.mu'\?"):
        RunConfig.from_flower({"fedprox.nu": 0.1})


def test_bad_value_names_key_value_and_range():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({"num-rounds": 0})
    assert str(err.value) == (
        "run config: key 'num-rounds' = 0 is invalid: Input should be greater than or equal to 1"
    )


def test_unknown_method_lists_allowed_methods():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({"method": "fedsgd"})
    message = str(err.value)
    assert "key 'method' = 'fedsgd'" in message
    for name in ("'fedavg'", "'fedprox'", "'local'", "'ditto'"):
        assert name in message


def test_wrong_type_and_bad_choice():
    with pytest.raises(ConfigError, match="key 'lr' = 'fast'"):
        RunConfig.from_flower({"lr": "fast"})
    with pytest.raises(ConfigError, match="key 'device' = 'tpu'.*'auto', 'cpu' or 'cuda'"):
        RunConfig.from_flower({"device": "tpu"})
    with pytest.raises(ConfigError, match="key 'dataset' = 'imagenet'.*'mnist'"):
        RunConfig.from_flower({"dataset": "imagenet"})
    with pytest.raises(ConfigError, match="key 'domain-rotations' = '0,ninety'"):
        RunConfig.from_flower({"domain-rotations": "0,ninety"})


def test_fraction_times_clients_must_select_a_client():
    with pytest.raises(ConfigError, match="fraction-train × num-clients = 0.05 × 10 selects no client"):
        RunConfig.from_flower({"fraction-train": 0.05, "num-clients": 10})


class _UntouchableGrid:
    def __getattr__(self, name):
        raise AssertionError(f"a client was contacted ({name}) despite an invalid config")


def test_server_app_fails_before_contacting_clients(caplog):
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config={**default_run_config(), "lr": -1.0})
    with pytest.raises(ConfigError, match="key 'lr' = -1.0 is invalid"):
        main(_UntouchableGrid(), context)  # Flower turns this into a failed run, exit code 200
    assert "key 'lr' = -1.0 is invalid" in caplog.text
