import pytest

from privseed.tasks.config.commands import DpKpsConfig, build_config, validate_config
from privseed.tasks.errors import ConfigError


def base(**overrides):
    values = {"data": "corpus.parquet", "out": "out", "labels": ["a", "b"]}
    values.update(overrides)
    return values


def test_defaults_are_the_documented_ones():
    cfg = validate_config(DpKpsConfig, base())
    assert (cfg.eps_voc, cfg.eps_kde, cfg.first_terms, cfg.vocab_size) == (1.0, 10.0, 10, 1000)
    assert cfg.method == "histogram" and cfg.llm == "none" and cfg.state_uri == "out.private"
    # contribution, K and L are derived from the released corpus profile (docs/dpkps.md)
    assert (cfg.mechanism, cfg.histogram_epsilon) == ("gaussian", 11.0)
    assert (cfg.hist_contribution, cfg.hist_top_k, cfg.length) == ("auto", "auto", "auto")


def test_per_class_default_follows_whether_an_llm_writes():
    # --llm none releases the seed sequences, and more of them are free (post-processing): 500 a class; with an
    # LLM the default is the documents written, 100 a class; a value given wins either way
    assert validate_config(DpKpsConfig, base()).per_class == 500
    assert validate_config(DpKpsConfig, base(llm="local")).per_class == 100
    assert validate_config(DpKpsConfig, base(per_class=7)).per_class == 7
    assert validate_config(DpKpsConfig, base(llm="local", per_class=700)).per_class == 700


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
    # the paper's samplers: a Gaussian sketch needs a declared delta; the histogram methods default to 1/(n ln n)
    with pytest.raises(ConfigError, match="delta"):
        validate_config(DpKpsConfig, base(method="independent", mechanism="gaussian"))
    assert validate_config(DpKpsConfig, base(method="independent", mechanism="gaussian", delta=1e-6)).delta == 1e-6
    assert 0 < validate_config(DpKpsConfig, base(mechanism="gaussian")).delta < 1e-7


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


def test_labels_must_be_declared_and_the_error_says_how():
    values = base()
    del values["labels"]
    with pytest.raises(ConfigError) as refused:
        validate_config(DpKpsConfig, values)
    message = str(refused.value)
    assert "--labels" in message and "--labels-file" in message and "config file" in message
    with pytest.raises(ConfigError, match="repeats"):
        validate_config(DpKpsConfig, base(labels=["a", "a"]))
    with pytest.raises(ConfigError, match="empty"):
        validate_config(DpKpsConfig, base(labels=[]))


def test_labels_from_a_file_a_flag_or_the_config_file(tmp_path, monkeypatch):
    file = tmp_path / "labels.txt"
    file.write_text("# the classes\n0  # Company\n1\n\n2\n")
    values = base(labels_file=str(file))
    del values["labels"]
    cfg = validate_config(DpKpsConfig, values)
    assert cfg.labels == ["0", "1", "2"] and cfg.labels_file is None  # the manifest shows the labels themselves
    assert validate_config(DpKpsConfig, base(labels=[0, 1])).labels == ["0", "1"]  # TOML/YAML integers
    with pytest.raises(ConfigError, match="not both"):
        validate_config(DpKpsConfig, base(labels_file=str(file)))
    with pytest.raises(ConfigError, match="does not exist"):
        validate_config(DpKpsConfig, {**values, "labels_file": str(tmp_path / "missing.txt")})
    toml = tmp_path / "c.toml"
    toml.write_text("labels = [3, 4]\n")
    assert build_config(DpKpsConfig, {"data": "c.parquet", "out": "o"}, str(toml)).labels == ["3", "4"]


def test_private_state_defaults_beside_the_release_and_never_inside_it(tmp_path):
    assert validate_config(DpKpsConfig, base(out="runs/x/")).state_uri == "runs/x.private"
    assert validate_config(DpKpsConfig, base(out="s3://b/releases/x")).state_uri == "s3://b/releases/x.private"
    for inside in ("out/_state", "out", str(tmp_path / "out" / "state")):
        out = str(tmp_path / "out") if inside.startswith("/") else "out"
        with pytest.raises(ConfigError, match="inside the release folder"):
            validate_config(DpKpsConfig, base(out=out, state=inside))
    assert validate_config(DpKpsConfig, base(state="elsewhere")).state_uri == "elsewhere"
    with pytest.raises(ConfigError, match="bucket root"):
        _ = validate_config(DpKpsConfig, base(out="s3://bucket")).state_uri  # the property is what raises


def test_public_dict_redacts_storage_secrets():
    cfg = validate_config(DpKpsConfig, base(storage_options={"key": "AKIA123", "secret": "s3cr3t", "anon": False}))
    public = cfg.public_dict()
    assert public["storage_options"] == {"key": "***", "secret": "***", "anon": False}


def test_literal_credentials_in_storage_flags_are_refused():
    from privseed.tasks.storage import parse_storage_options, refuse_literal_secrets

    refuse_literal_secrets(parse_storage_options(["endpoint_url=http://127.0.0.1:9000", "secret=prefect-secret:s3"]))
    with pytest.raises(ConfigError, match="secret=... would store a credential"):
        refuse_literal_secrets(parse_storage_options(["secret=hunter2"]))


def test_selection_rule_flags_reach_the_sampler():
    from privseed.tasks.stages.dpkps import selection_rule

    assert selection_rule(validate_config(DpKpsConfig, base())) == "power-1"  # histogram, the default method
    assert selection_rule(validate_config(DpKpsConfig, base(method="independent"))) == "power-2"
    assert selection_rule(validate_config(DpKpsConfig, base(method="iterative-log"))) == "top-5"
    assert selection_rule(validate_config(DpKpsConfig, base(selection="power", power=3))) == "power-3"
    assert selection_rule(validate_config(DpKpsConfig, base(selection="top-k", top_k=7))) == "top-7"
    with pytest.raises(ConfigError, match="--power"):
        validate_config(DpKpsConfig, base(selection="power", power=0))


def test_insecure_reproducible_noise_is_an_explicit_opt_in_on_every_release_command():
    from privseed.flows.cli import build_parser
    from privseed.tasks.config.commands import AugPeConfig, SecPeConfig, config_from_args
    from privseed.tasks.dp.mechanisms import secure_noise

    parser = build_parser()
    cfg = config_from_args(DpKpsConfig, parser.parse_args(["dpkps", "d.parquet", "--out", "o", "--labels", "a,b"]))
    assert not cfg.insecure_reproducible_noise and not cfg.allow_insecure_release
    assert cfg.noise("vocabulary") is secure_noise()  # the default never derives noise from --seed
    for command, model, extra in (("dpkps", DpKpsConfig, []), ("augpe", AugPeConfig, []),
                                  ("secpe", SecPeConfig, ["--public", "p.parquet", "--noise-multiplier", "3"])):
        args = parser.parse_args([command, "d.parquet", "--out", "o", "--seed", "4", *extra, "--labels", "a,b",
                                  "--insecure-reproducible-noise", "--allow-insecure-release"])
        cfg = config_from_args(model, args)
        assert cfg.insecure_reproducible_noise and cfg.allow_insecure_release
        noise = cfg.noise("vocabulary")
        assert noise.secure is False and "seed=4" in noise.name and "vocabulary" in noise.name
    # run ids are random, so another noise source is another run unless --run-id resumes one; the ledger then
    # refuses to re-read an insecure value as a secure one (tests/test_ledger.py)
    experiment = parser.parse_args(["experiment", "--config", "x.toml", "--insecure-reproducible-noise"])
    assert experiment.insecure_reproducible_noise and experiment.allow_insecure_release is None


def test_document_rules_by_name_reach_generation_and_the_release_gate():
    """--document-rule NAME=VALUE (text on the command line) sets the same threshold for the candidates and for the
    gate; a name that is not a rule, or a value of the wrong type, is refused before anything runs."""
    from privseed.tasks.generation.params import document_rules
    from privseed.tasks.stages.generation import params_from_config
    from privseed.tasks.quality import DEFAULT_RULES
    from privseed.tasks.stages.release import gate_from_config

    cfg = validate_config(DpKpsConfig, base(llm="local", document_rules={"max_seed_line_labels": "4",
                                                                          "reject_truncated": "false"}))
    rules = document_rules(params_from_config(cfg))
    assert (rules.max_seed_line_labels, rules.reject_truncated) == (4, False)
    gate = gate_from_config(cfg, cfg.labels)
    assert (gate.rules.max_seed_line_labels, gate.rules.reject_truncated) == (4, False)
    assert document_rules(params_from_config(validate_config(DpKpsConfig, base(llm="local")))) == DEFAULT_RULES
    for bad, message in [({"max_labels": 4}, "unknown document rule 'max_labels'"),
                         ({"max_seed_line_labels": "2.5"}, "expected int"),
                         ({"max_seed_line_labels": 1}, "must be >= 2"),
                         ({"language": "de"}, "unknown document rule 'language'")]:
        with pytest.raises(ConfigError, match=message):
            validate_config(DpKpsConfig, base(document_rules=bad))


def test_the_manifest_config_names_no_path_of_the_owner():
    # Issue 30, item 5: the manifest published the corpus and state paths (and the Dask scheduler's address).
    import json

    from privseed.tasks.config.commands import DpKpsConfig, SecPeConfig, validate_config

    owner = {"data": "/home/owner/private/corpus.parquet", "out": "/srv/releases/x", "state": "/srv/vault/x",
             "labels": ["a", "b"], "dask_address": "tls://10.1.2.3:8786", "dask_tls_ca_file": "/etc/tls/ca.pem",
             "dask_tls_cert": "/etc/tls/cert.pem", "dask_tls_key": "/etc/tls/key.pem"}
    dpkps = validate_config(DpKpsConfig, {**owner, "vocab": "/home/owner/vocab.txt"}).public_dict()
    secpe = validate_config(SecPeConfig, {**owner, "public": "s3://owner-bucket/public/", "noise_multiplier": 3.0,
                                          "secrets": "/home/owner/secrets.txt", "llm": "local"}).public_dict()
    for public in (dpkps, secpe):
        text = json.dumps(public)
        assert not any(where in text for where in ("/home/owner", "/srv/", "/etc/tls", "10.1.2.3", "owner-bucket"))
    assert dpkps["vocab"] == "vocab.txt" and secpe["secrets"] == "secrets.txt" and dpkps["data"] is None
