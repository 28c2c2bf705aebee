"""Prompt templates, the released-value types and the prompt builder."""
import json
import pickle

import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm import (LLMSpec, PromptTemplate, RecipientExample, ReleasedSeed, ReleasedVocabulary,
                                UnreleasedValueError, build_messages, build_request, load_few_shot, parse_llm_spec,
                                term_coverage)
from privseed.tasks.llm.prompting import available_templates

VOCAB = ReleasedVocabulary(["river", "village", "football club", "church", "album"], "test-vocabulary")


def test_generic_template_is_the_papers_prompt():
    t = PromptTemplate.load("generic")
    seed = VOCAB.seed(["river", "football club"], label=3, seed=7)
    msgs = build_messages(t, seed, "summary of a Wikipedia-style article")
    assert [m.role for m in msgs] == ["user"]
    assert msgs[0].content == ("Write a summary of a Wikipedia-style article that contains the following terms: "
                               "river, football club.")
    assert t.version == "dpkps-generic-v1"
    assert {"generic", "coverage"} <= set(available_templates())


def test_coverage_template_has_a_system_prompt_and_the_same_information():
    t = PromptTemplate.load("coverage")
    msgs = build_messages(t, VOCAB.seed(["church"], 0, 1), "news article")
    assert msgs[0].role == "system" and "every one of the given terms" in msgs[0].content
    assert "news article" in msgs[0].content and "church" in msgs[-1].content
    assert t.version != PromptTemplate.load("generic").version


def test_label_never_reaches_the_prompt():
    t = PromptTemplate.load("generic")
    seed = VOCAB.seed(["church"], label="SECRET_CLASS_NAME", seed=1)
    assert all("SECRET_CLASS_NAME" not in m.content for m in build_messages(t, seed, "document"))


def test_template_cannot_ask_for_other_fields(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: v1\nuser: 'Write about {label}: {terms}'\n")
    with pytest.raises(ConfigError, match="unknown placeholders"):
        PromptTemplate.load(str(bad))
    nover = tmp_path / "nover.yaml"
    nover.write_text("name: x\nversion: ''\nuser: '{terms}'\n")
    with pytest.raises(ConfigError, match="no version"):
        PromptTemplate.load(str(nover))
    with pytest.raises(ConfigError, match="unknown prompt template"):
        PromptTemplate.load("no-such-template")
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: mine\nversion: mine-v3\nuser: 'Terms: {terms}. Type: {doc_type}.'\nterms_separator: '; '\n")
    t = PromptTemplate.load(str(ok))
    messages = build_messages(t, VOCAB.seed(["river", "album"], 0, 0), "memo")
    assert messages[-1].content == "Terms: river; album. Type: memo."


def test_released_seed_cannot_be_made_directly():
    with pytest.raises(UnreleasedValueError):
        ReleasedSeed(("river",), 0, 1)
    with pytest.raises(UnreleasedValueError):
        build_messages(PromptTemplate.load("generic"), "river village", "document")  # type: ignore[arg-type]


def test_vocabulary_refuses_unreleased_terms_without_echoing_them():
    with pytest.raises(UnreleasedValueError) as e:
        VOCAB.seed(["river", "patient john doe"], 0, 1)
    assert "john doe" not in str(e.value)
    with pytest.raises(UnreleasedValueError):
        VOCAB.seed([99], 0, 1)
    assert VOCAB.seed([0, 2], 1, 5).keyphrases == ("river", "football club")


def test_released_seed_survives_pickling():
    s = VOCAB.seed(["river", "church"], 2, 11)
    back = pickle.loads(pickle.dumps(s))
    assert isinstance(back, ReleasedSeed) and back == s
    assert build_messages(PromptTemplate.load("generic"), back, "document")


def test_few_shot_examples_become_prior_turns(tmp_path):
    path = tmp_path / "fs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"text": "The Ouse is a river in England.", "keyphrases": ["river", "england"]},
        {"document": "St Mary's is a church.", "keyphrases": "church, village"},
    ]))
    examples = load_few_shot(str(path))
    assert examples[1].keyphrases == ("church", "village")
    msgs = build_messages(PromptTemplate.load("generic"), VOCAB.seed(["album"], 0, 0), "article", examples)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[0].content.endswith("terms: river, england.") and msgs[1].content == "The Ouse is a river in England."
    assert msgs[-1].content.endswith("terms: album.")
    assert examples[0].topic is None
    topical = tmp_path / "topic.jsonl"
    topical.write_text(json.dumps({"topic": "Rivers", "text": "The Ouse is a river.", "keyphrases": ["river"]}))
    assert load_few_shot(str(topical))[0].topic == "Rivers"
    topical.write_text(json.dumps({"topic": " ", "text": "The Ouse is a river.", "keyphrases": ["river"]}))
    with pytest.raises(ConfigError, match="topic is empty"):
        load_few_shot(str(topical))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no keyphrases"}))
    with pytest.raises(ConfigError, match="keyphrases"):
        load_few_shot(str(bad))
    with pytest.raises(UnreleasedValueError):
        build_messages(PromptTemplate.load("generic"), VOCAB.seed(["album"], 0, 0), "article",
                       [{"document": "x", "keyphrases": ["y"]}])  # type: ignore[list-item]


def test_build_request_validates_and_keys_by_everything():
    t = PromptTemplate.load("generic")
    s = VOCAB.seed(["river"], 0, 1)
    r = build_request(t, s, "doc", max_tokens=10, temperature=0.5, call_seed=3)
    assert (r.max_tokens, r.temperature, r.seed) == (10, 0.5, 3)
    with pytest.raises(ConfigError):
        build_request(t, s, "doc", max_tokens=0, temperature=0.5, call_seed=3)
    with pytest.raises(ConfigError):
        build_request(t, s, "", max_tokens=5, temperature=0.5, call_seed=3)
    variants = {
        build_request(t, s, "doc", max_tokens=10, temperature=0.5, call_seed=3).cache_key("local", "m"),
        build_request(t, s, "doc", max_tokens=11, temperature=0.5, call_seed=3).cache_key("local", "m"),
        build_request(t, s, "doc", max_tokens=10, temperature=0.6, call_seed=3).cache_key("local", "m"),
        build_request(t, s, "doc", max_tokens=10, temperature=0.5, call_seed=4).cache_key("local", "m"),
        build_request(t, s, "memo", max_tokens=10, temperature=0.5, call_seed=3).cache_key("local", "m"),
        build_request(t, s, "doc", max_tokens=10, temperature=0.5, call_seed=3).cache_key("local", "m2"),
        build_request(t, s, "doc", max_tokens=10, temperature=0.5, call_seed=3).cache_key("anthropic", "m"),
    }
    assert len(variants) == 7


def test_term_coverage_counts_whole_words_and_phrases():
    terms = ["river", "football club", "cat", "Church"]
    text = "The river flows past the church; the Football  Club plays in a category of its own."
    assert term_coverage(text, terms) == pytest.approx(3 / 4)  # "cat" inside "category" does not count
    assert term_coverage("", terms) == 0.0
    assert term_coverage("river river", ["river", "river"]) == 1.0


def test_parse_llm_spec():
    assert parse_llm_spec("local") == LLMSpec("local")
    assert parse_llm_spec("local:/m/x.gguf").model == "/m/x.gguf"
    assert parse_llm_spec("anthropic:claude-haiku-4-5").model == "claude-haiku-4-5"
    s = parse_llm_spec("openai-compatible:http://127.0.0.1:8000/v1#qwen")
    assert (s.url, s.model) == ("http://127.0.0.1:8000/v1", "qwen")
    assert str(s) == "openai-compatible:http://127.0.0.1:8000/v1#qwen"
    assert parse_llm_spec("none").kind == "none"
    for bad in ("anthropic", "gpt", "openai-compatible:", "none:x"):
        with pytest.raises(ConfigError):
            parse_llm_spec(bad)


@pytest.mark.slow
def test_few_shot_file_on_s3_is_read_through_storage_retries(s3_bucket, monkeypatch):
    import io

    import pandas as pd
    import s3fs

    records = [{"text": "The Ouse is a river in England.", "keyphrases": ["river", "england"]}]
    buffer = io.BytesIO()
    pd.DataFrame(records).to_parquet(buffer, index=False)
    client = s3_bucket.server.client()
    client.put_object(Bucket=s3_bucket.name, Key="fs.parquet", Body=buffer.getvalue())
    client.put_object(Bucket=s3_bucket.name, Key="fs.jsonl", Body=json.dumps(records[0]).encode())
    original, reads = s3fs.S3FileSystem.cat_file, []

    def flaky_cat_file(self, path, *args, **kwargs):
        reads.append(path)
        if len(reads) % 2 == 1:  # every first attempt drops its connection
            raise ConnectionResetError("simulated reset")
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "cat_file", flaky_cat_file)
    for name in ("fs.parquet", "fs.jsonl"):
        examples = load_few_shot(f"{s3_bucket.url}/{name}")
        assert [(e.document, e.keyphrases) for e in examples] == [(records[0]["text"], ("river", "england"))]
    assert len(reads) == 4
    with pytest.raises(ConfigError, match="not found"):
        load_few_shot(f"{s3_bucket.url}/missing.jsonl")


# -- public class names (--class-names) ------------------------------------------------------------------------
def _names_file(tmp_path, kind: str):
    if kind == "json":
        p = tmp_path / "names.json"
        p.write_text(json.dumps({"0": "Athlete", "1": "Natural place", "3": "Album"}))
    elif kind == "toml":
        p = tmp_path / "names.toml"
        p.write_text('[class_names]\n0 = "Athlete"\n1 = "Natural place"\n3 = "Album"\n')
    else:
        p = tmp_path / "names.csv"
        p.write_text("label,name\n0,Athlete\n1,Natural place\n3,Album\n")
    return str(p)


@pytest.mark.parametrize("kind", ["json", "toml", "csv"])
def test_class_names_load_from_json_toml_and_csv(tmp_path, kind):
    from privseed.tasks.llm import load_class_names

    names = load_class_names(_names_file(tmp_path, kind))
    assert names.to_dict() == {"0": "Athlete", "1": "Natural place", "3": "Album"}
    assert names.name_of(1) == names.name_of("1") == "Natural place"
    names.check_labels([0, 1, 3])
    names.check_labels(["3", "1", "0"])


def test_class_names_must_be_exactly_the_declared_labels(tmp_path):
    from privseed.tasks.llm import load_class_names

    names = load_class_names(_names_file(tmp_path, "json"))
    with pytest.raises(ConfigError, match=r"labels that are not declared: 3; no name for declared labels: 2"):
        names.check_labels([0, 1, 2])
    bad = tmp_path / "bad.json"
    for content, problem in [("[1, 2]", "map each label"), ('{"0": ""}', "non-empty"), ("{", "not valid JSON"),
                             ('{"0": 5}', "map each label"), ("{}", "names no class")]:
        bad.write_text(content)
        with pytest.raises(ConfigError, match=problem):
            load_class_names(str(bad))
    dup = tmp_path / "dup.csv"
    dup.write_text("label,name\n0,A\n0,B\n")
    with pytest.raises(ConfigError, match="more than once"):
        load_class_names(str(dup))
    with pytest.raises(ConfigError, match="needs the columns"):
        (tmp_path / "cols.csv").write_text("id,title\n0,A\n")
        load_class_names(str(tmp_path / "cols.csv"))
    with pytest.raises(ConfigError, match="must be .json, .toml or .csv"):
        (tmp_path / "names.txt").write_text("0 A")
        load_class_names(str(tmp_path / "names.txt"))
    with pytest.raises(ConfigError, match="not found"):
        load_class_names(str(tmp_path / "missing.json"))


def test_class_name_goes_into_the_prompt_only_when_declared(tmp_path):
    from privseed.tasks.llm import load_class_names

    names = load_class_names(_names_file(tmp_path, "json"))
    seed = VOCAB.seed(["river", "album"], label=3, seed=2)
    for template in ("generic", "coverage"):
        t = PromptTemplate.load(template)
        named = build_messages(t, seed, "Wikipedia article", class_names=names)[-1].content
        plain = build_messages(t, seed, "Wikipedia article")[-1].content
        # the topic in the only-LLM baseline's words, so the two arms differ only in the seed terms
        assert "about the following topic: Album." in named and "river, album" in named
        assert "Album" not in plain and "topic" not in plain
        assert t.version_for(True) == t.version + "+class-name-v2" and t.version_for(False) == t.version
    # an example without a topic keeps the plain prompt; only the seed's own turn names its class
    few = [RecipientExample("A river flows.", ("river",))]
    msgs = build_messages(PromptTemplate.load("generic"), seed, "memo", few, names)
    assert "topic" not in msgs[0].content and "topic: Album" in msgs[-1].content
    # an example with a public topic is asked in the same words as the seed, its own topic named; without class
    # names no prompt names a topic, the example's included
    few = [RecipientExample("A river flows.", ("river",), topic="Rivers"),
           RecipientExample("A church stands.", ("church",))]
    msgs = build_messages(PromptTemplate.load("generic"), seed, "memo", few, names)
    assert "about the following topic: Rivers. It contains the following terms: river." in msgs[0].content
    assert "topic" not in msgs[2].content and "topic: Album" in msgs[-1].content
    assert all("topic" not in m.content for m in build_messages(PromptTemplate.load("generic"), seed, "memo", few))
    request = build_request(PromptTemplate.load("generic"), seed, "memo", max_tokens=8, temperature=0.0,
                            call_seed=1, class_names=names)
    assert "topic: Album" in request.messages[-1].content
    with pytest.raises(UnreleasedValueError):
        build_messages(PromptTemplate.load("generic"), seed, "memo", class_names={"3": "Album"})  # type: ignore[arg-type]


def test_class_name_slot_is_only_allowed_in_class_name_user(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: v1\nuser: 'Write about {class_name}: {terms}'\n")
    with pytest.raises(ConfigError, match="belongs in class_name_user"):
        PromptTemplate.load(str(bad))
    bad.write_text("name: bad\nversion: v1\nuser: '{terms}'\nclass_name_user: 'About {class_name}'\n")
    with pytest.raises(ConfigError, match="class_name_user must contain"):
        PromptTemplate.load(str(bad))
    plain = tmp_path / "plain.yaml"
    plain.write_text("name: plain\nversion: v1\nuser: 'Terms: {terms}'\n")
    from privseed.tasks.llm import load_class_names

    names = load_class_names(_names_file(tmp_path, "json"))
    with pytest.raises(ConfigError, match="has no class_name_user prompt"):
        build_messages(PromptTemplate.load(str(plain)), VOCAB.seed(["river"], 0, 1), "memo", class_names=names)


def test_a_user_template_versions_its_class_name_prompt(tmp_path):
    own = tmp_path / "own.yaml"
    own.write_text("name: own\nversion: memo-v3\nuser: 'Terms: {terms}'\n"
                   "class_name_user: 'A {doc_type} on {class_name}: {terms}'\n")
    assert PromptTemplate.load(str(own)).version_for(True) == "memo-v3+class-name"  # the default suffix
    own.write_text(own.read_text() + "class_name_version: named-v2\n")
    assert PromptTemplate.load(str(own)).version_for(True) == "memo-v3+named-v2"
    own.write_text(own.read_text().replace("named-v2", "''"))
    with pytest.raises(ConfigError, match="has no version"):
        PromptTemplate.load(str(own))


def test_flow_config_checks_class_names_against_declared_labels(tmp_path):
    from privseed.tasks.config.commands import DpKpsConfig
    from privseed.tasks.stages.generation import class_names_from_config, params_from_config

    path = _names_file(tmp_path, "csv")
    cfg = DpKpsConfig(data="d.parquet", out=str(tmp_path / "out"), labels=["0", "1", "3"], class_names=path)
    params = params_from_config(cfg)
    assert params.class_names is not None and params.class_names.name_of(3) == "Album"
    assert params_from_config(cfg.model_copy(update={"class_names": None})).class_names is None
    with pytest.raises(ConfigError, match="no name for declared labels: 2"):
        class_names_from_config(cfg.model_copy(update={"labels": ["0", "1", "2", "3"]}))
    undeclared = cfg.model_copy(update={"labels": None})
    assert class_names_from_config(undeclared).labels == ["0", "1", "3"]  # the file declares the label set


def test_only_llm_template_is_unseeded_and_names_the_class_by_its_public_name():
    from privseed.tasks.llm.prompting import build_unseeded_request
    from privseed.tasks.llm.released import PublicClassNames

    t = PromptTemplate.load("only_llm")
    assert not t.seeded and "only_llm" in available_templates()
    names = PublicClassNames((("0", "Athlete"), ("1", "Album")), source="test")
    request = build_unseeded_request(t, 1, "Wikipedia article", max_tokens=8, temperature=1.0, call_seed=3,
                                     class_names=names)
    assert [m.content for m in request.messages] == ["Write a Wikipedia article about the following topic: Album."]
    assert (request.seed, request.max_tokens, request.temperature) == (3, 8, 1.0)
    plain = build_unseeded_request(t, 1, "memo", max_tokens=8, temperature=0.0, call_seed=0)
    assert plain.messages[-1].content == "Write a memo." and t.version_for(True) == "only-llm-v1+class-name"
    # an unseeded template would drop a seed's terms, and a seeded one has no prompt without them
    with pytest.raises(ConfigError, match="unseeded"):
        build_messages(t, VOCAB.seed(["river"], 0, 1), "memo")
    with pytest.raises(ConfigError, match="needs seed terms"):
        build_unseeded_request(PromptTemplate.load("generic"), 0, "memo", max_tokens=8, temperature=0.0, call_seed=0)
    with pytest.raises(UnreleasedValueError):
        build_unseeded_request(t, 0, "memo", max_tokens=8, temperature=0.0, call_seed=0,
                               class_names={"0": "Athlete"})  # type: ignore[arg-type]


def test_unseeded_templates_may_not_use_terms(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: v1\nseeded: false\nuser: 'Write a {doc_type} with {terms}'\n")
    with pytest.raises(ConfigError, match="may not use"):
        PromptTemplate.load(str(bad))
    bad.write_text("name: bad\nversion: v1\nseeded: false\nuser: 'Write a {doc_type}'\nclass_name_user: 'About it'\n")
    with pytest.raises(ConfigError, match=r"class_name_user must contain \{class_name\}"):
        PromptTemplate.load(str(bad))
