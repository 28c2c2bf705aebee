import pytest

from tasks.config import DpKpsConfig, build_config, validate_config
from tasks.errors import ConfigError


def base(**overrides):
    values = {"data": "corpus.parquet", "out": "out"}
    values.update(overrides)
    return values


def test_defaults_are_the_documented_ones():
    cfg = validate_config(DpKpsConfig, base())
    assert (cfg.eps_voc, cfg.eps_kde, cfg.length, cfg.first_terms, cfg.vocab_size) == (1.0, 10.0, 10, 10, 1000)
    assert cfg.method == "independent" and cfg.llm == "none" and cfg.state_uri == "out/_state"


@pytest.mark.parametrize("field", ["eps_voc", "eps_kde"])
@pytest.mark.parametrize("value", [0, -1.0, float("inf")])
def test_epsilon_must_be_positive_and_finite(field, value):
    with pytest.raises(ConfigError, match=field.replace("_", "-")):
        validate_config(DpKpsConfig, base(**{field: value}))


def test_unknown_method_and_backend_are_named():
    with pytest.raises(ConfigError, match="--method"):
        validate_config(DpKpsConfig, base(method="recursive"))
    with pytest.raises(ConfigError, match="unknown LLM backend 'gpt'"):
        validate_config(DpKpsConfig, base(llm="gpt"))


def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="--eps-total"):  # (--epsilon is the histogram methods' budget)
        validate_config(DpKpsConfig, base(eps_total=1.0))


def test_gaussian_needs_delta():
    with pytest.raises(ConfigError, match="delta"):
        validate_config(DpKpsConfig, base(mechanism="gaussian"))
    assert validate_config(DpKpsConfig, base(mechanism="gaussian", delta=1e-6)).delta == 1e-6


def test_precedence_file_then_env_then_flags(tmp_path, monkeypatch):
    file = tmp_path / "c.toml"
    file.write_text('eps_voc = 2.0\neps_kde = 3.0\nmethod = "iterative-log"\nlength = 4\n')
    monkeypatch.setenv("PRIVSEED_EPS_KDE", "5.0")
    cfg = build_config(DpKpsConfig, base(length=7, eps_voc=None), str(file))
    assert (cfg.eps_voc, cfg.eps_kde, cfg.method, cfg.length) == (2.0, 5.0, "iterative-log", 7)


def test_yaml_config_and_bad_files(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("per_class: 7\n")
    assert build_config(DpKpsConfig, base(), str(good)).per_class == 7
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(DpKpsConfig, base(), str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("eps_voc = = 1")
    with pytest.raises(ConfigError, match="cannot parse"):
        build_config(DpKpsConfig, base(), str(bad))


def test_run_id_depends_on_privacy_fields_not_on_output():
    a = validate_config(DpKpsConfig, base())
    b = validate_config(DpKpsConfig, base(out="elsewhere", per_class=5, llm="local"))
    c = validate_config(DpKpsConfig, base(eps_kde=5.0))
    d = validate_config(DpKpsConfig, base(seed=1))
    assert a.privacy_key("fp") == b.privacy_key("fp")
    assert len({a.privacy_key("fp"), c.privacy_key("fp"), d.privacy_key("fp"), a.privacy_key("other")}) == 4


def test_public_dict_redacts_storage_secrets():
    cfg = validate_config(DpKpsConfig, base(storage_options={"key": "AKIA123", "secret": "s3cr3t", "anon": False}))
    public = cfg.public_dict()
    assert public["storage_options"] == {"key": "***", "secret": "***", "anon": False}


def test_literal_credentials_in_storage_flags_are_refused():
    from tasks.storage import parse_storage_options, refuse_literal_secrets

    refuse_literal_secrets(parse_storage_options(["endpoint_url=http://127.0.0.1:9000", "secret=prefect-secret:s3"]))
    with pytest.raises(ConfigError, match="secret=... would store a credential"):
        refuse_literal_secrets(parse_storage_options(["secret=hunter2"]))


def test_selection_rule_flags_reach_the_sampler():
    from flows.dpkps import selection_rule

    assert selection_rule(validate_config(DpKpsConfig, base())) == "power-2"
    assert selection_rule(validate_config(DpKpsConfig, base(method="iterative-log"))) == "top-5"
    assert selection_rule(validate_config(DpKpsConfig, base(selection="power", power=3))) == "power-3"
    assert selection_rule(validate_config(DpKpsConfig, base(selection="top-k", top_k=7))) == "top-7"
    with pytest.raises(ConfigError, match="--power"):
        validate_config(DpKpsConfig, base(selection="power", power=0))
