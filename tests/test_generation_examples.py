"""The example library (tasks/generation/examples.py, tasks/demo_data/example_library.toml): which kind a --doc-type
selects, when params_from_config shows it, and that its documents are documents that do not block normal ones."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from privseed.tasks.config.commands import DpKpsConfig
from privseed.tasks.generation.params import GenerationParams, document_rules
from privseed.tasks.stages.generation import params_from_config
from privseed.tasks.errors import ConfigError
from privseed.tasks.generation.examples import (OWNER_EXAMPLES, ExampleKind, answer_openings,
                                                answers_open_with_subject, example_kind_for, example_library,
                                                examples_for_doc_type, prompt_examples)
from privseed.tasks.llm.released import load_few_shot
from privseed.tasks.quality.predicate import document_rejection
from privseed.tasks.quality.shapes import example_coinages, example_figures

DEMO_DATA = Path(__file__).resolve().parent.parent / "tasks" / "demo_data"


@pytest.mark.parametrize("doc_type, kind", [
    ("Wikipedia article", "encyclopedia_article"),
    ("Wikipedia abstract", "encyclopedia_article"),  # a tie: the first word of the doc type decides
    ("encyclopedia entries", "encyclopedia_article"),
    ("medical abstract", "abstract"),
    ("scientific article", "abstract"),
    ("Yelp review", "review"),
    ("restaurant reviews", "review"),
    ("Usenet newsgroup post", "forum_post"),
    ("forum thread", "forum_post"),
    ("discharge summary", "clinical_note"),
    ("clinical progress note", "clinical_note"),
    ("customer support ticket", "support_ticket"),
    ("bug report", "support_ticket"),
    ("news article", "news_article"),  # a tie: "news" comes before "article"
    ("Reuters newswire", "news_article"),
    ("news wires", "news_article"),
    ("newspaper stories", "news_article"),
    ("e-mail", "email"),
    ("business emails", "email"),
    ("document", None),
    ("poem", None),
])
def test_the_doc_type_words_select_a_kind(doc_type, kind):
    assert example_kind_for(doc_type) == kind


def test_every_kind_has_one_or_two_examples_that_are_documents_of_the_predicate():
    """Each example, with the keyphrases it was written from, passes the document predicate (the release gate's) and
    uses all of them; 60-120 words for the new kinds (the two reused sets are shorter, as the demo's corpus is)."""
    kinds = example_library()
    assert {k.name for k in kinds} == {"encyclopedia_article", "abstract", "review", "forum_post", "clinical_note",
                                       "support_ticket", "email", "news_article"}
    for kind in kinds:
        examples = load_few_shot(str(DEMO_DATA / kind.file))
        assert 1 <= len(examples) <= 2, kind.name
        for example in examples:
            assert document_rejection(example.document, example.keyphrases) is None, (kind.name, example.document)
            assert all(k.lower() in example.document.lower() for k in example.keyphrases), kind.name
            if kind.file not in ("few_shot_wikipedia.jsonl", "few_shot_medical_abstract.jsonl"):
                assert 60 <= len(example.document.split()) <= 120, kind.name


def test_the_copy_test_does_not_reject_other_documents():
    """With a kind's examples in the prompt, the copy test (copies_example, borrows_example_name) rejects no other
    kind's examples and no real encyclopedia article of the demo's test split; a copy of an example it rejects."""
    kinds = example_library()
    by_kind = {k.name: load_few_shot(str(DEMO_DATA / k.file)) for k in kinds}
    real = pd.read_parquet(DEMO_DATA / "dbpedia14_demo_test.parquet")["text"].head(300).tolist()
    for name, examples in by_kind.items():
        rules = document_rules(GenerationParams(few_shot=tuple(examples)))
        others = [e.document for other, es in by_kind.items() if other != name for e in es]
        for text in others + (real if name == "encyclopedia_article" else []):
            assert document_rejection(text, (), rules=rules) not in ("copies_example", "borrows_example_name"), text
        assert document_rejection(examples[0].document, (), rules=rules) == "copies_example", name


def test_the_made_up_names_of_the_library_are_its_coinages_and_real_places_are_not():
    """The encyclopedia examples' made-up names are what the copy test looks for on another subject ("The Saltmarsh
    Lake", 15 of 280 rows of a DBPedia-14 release); the real region and country they name are the model's to use."""
    examples = load_few_shot(str(DEMO_DATA / "few_shot_wikipedia.jsonl"))
    assert [example_coinages(e.document) for e in examples] == [{"saltmarsh", "kellby"}, {"ruskapiirakka"}]
    rules = document_rules(GenerationParams(few_shot=tuple(examples)))
    village = "Korvus is a village in the Karelia region of Russia, with a population of about 300 people."
    assert document_rejection(village, ("village", "population"), rules=rules) is None
    lake = "The Saltmarsh Lake is a volcano in the southern part of the region, and it holds ice for 12 years."
    assert document_rejection(lake, ("lake", "volcano", "ice"), rules=rules) == "copies_example"
    other_kinds = [load_few_shot(str(DEMO_DATA / k.file)) for k in example_library()
                   if k.file != "few_shot_wikipedia.jsonl"]
    assert all(not example_coinages(e.document) for es in other_kinds for e in es)


def test_an_example_figure_repeated_on_another_subject_is_a_copy():
    """The example abstract's "960 outpatient appointments" on 6 of 460 rows of three medical releases: a figure of
    three or more digits that is neither a year nor round is the example's; a year, a round figure, a longer number
    that holds it and a decimal are not."""
    abstracts = load_few_shot(str(DEMO_DATA / "few_shot_medical_abstract.jsonl"))
    assert [sorted(example_figures(e.document)) for e in abstracts] == [["412"], ["960"]]
    assert example_figures("Released in 1962, it sold 20,000 copies and 500 more.") == frozenset()
    rules = document_rules(GenerationParams(few_shot=tuple(abstracts)))
    copied = ("The clinical study of 960 outpatient appointments was developed by a team at the hospital, and the "
              "report found significant improvements in outcomes for hypertension in these patients.")
    assert document_rejection(copied, ("study", "hospital", "patients"), rules=rules) == "copies_example"
    for figure in ("1960", "9,600", "960.5", "3,960"):
        other = copied.replace("960", figure, 1)
        assert document_rejection(other, ("study", "hospital", "patients"), rules=rules) is None, figure


def test_the_library_is_shown_to_local_models_only_and_the_owners_few_shot_wins(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"text": "A club won the league in its first season.", "keyphrases": ["club"]}) + "\n")

    def params(**kw) -> GenerationParams:
        return params_from_config(DpKpsConfig(data="d.parquet", out=str(tmp_path / "out"), labels=["0", "1"],
                                              **{"llm": "local", "doc_type": "restaurant review", **kw}))

    review = examples_for_doc_type("restaurant review")
    assert review and params().few_shot == review
    assert params(few_shot=str(own)).few_shot == tuple(load_few_shot(str(own)))
    assert params(examples="none").few_shot == ()
    assert params(doc_type="document").few_shot == ()
    assert params(llm="anthropic:claude-haiku-4-5").few_shot == ()  # examples cost input tokens on every call
    assert params(llm="none").few_shot == ()


def test_the_manifest_records_which_examples_the_prompts_showed():
    assert prompt_examples(None, "library", True, "Yelp review") == "review"
    assert prompt_examples("mine.jsonl", "library", True, "Yelp review") == OWNER_EXAMPLES
    assert prompt_examples("mine.jsonl", "none", False, "Yelp review") == OWNER_EXAMPLES
    assert prompt_examples(None, "none", True, "Yelp review") is None
    assert prompt_examples(None, "library", False, "Yelp review") is None
    assert prompt_examples(None, "library", True, "document") is None


def test_answers_open_with_the_library_kinds_openings_where_the_library_shows_its_examples(tmp_path):
    """The openings follow the library's examples (not the owner's --few-shot, nor --examples none) and reach only
    backends that continue a given opening; a kind with no openings (encyclopedia articles open with their subject)
    leaves the answer to the model. The library's openings are words with no space around them."""
    review = next(k for k in example_library() if k.name == "review").openings
    assert review and all(o == o.strip() and o for o in review)
    assert answer_openings(None, "library", True, "Yelp review") == review
    assert answer_openings("mine.jsonl", "library", True, "Yelp review") == ()
    assert answer_openings(None, "none", True, "Yelp review") == ()
    assert answer_openings(None, "library", False, "Yelp review") == ()
    assert answer_openings(None, "library", True, "Wikipedia article") == ()
    assert answer_openings(None, "library", True, "document") == ()
    # a research record opens with its title; not with "The" (77-89 % of the model's own abstracts, 3.8 % of real
    # ones) nor with "To", "A" or "Response to", which drew the request into the answer ("To prepare a medical
    # abstract ...", "Response to the question: ...")
    abstract = answer_openings(None, "library", True, "medical abstract")
    assert "Effects of" in abstract and not {o.split()[0] for o in abstract} & {"The", "To", "A", "Response"}

    def params(**kw) -> GenerationParams:
        return params_from_config(DpKpsConfig(data="d.parquet", out=str(tmp_path / "out"), labels=["0", "1"],
                                              **{"llm": "local", "doc_type": "Yelp review", **kw}))

    assert params().openings == review and params(examples="none").openings == ()
    assert params(llm="anthropic:claude-haiku-4-5").openings == ()
    with pytest.raises(ConfigError, match="opening"):
        ExampleKind("review", frozenset({"review"}), "few_shot_review.jsonl", openings=("I ",))
    # a news story opens with its subject, a word of its seed (rounds.subject_opening), not from a list
    assert answers_open_with_subject(None, "library", True, "news article")
    assert answer_openings(None, "library", True, "news article") == ()
    assert not answers_open_with_subject(None, "library", True, "Yelp review")
    assert not answers_open_with_subject("mine.jsonl", "library", True, "news article")
    assert not answers_open_with_subject(None, "none", True, "news article")
    assert not answers_open_with_subject(None, "library", False, "news article")
    assert params(doc_type="news article").subject_openings and not params().subject_openings
    with pytest.raises(ConfigError, match="not both"):
        ExampleKind("news", frozenset({"news"}), "few_shot_news.jsonl", openings=("Oil",), subject_openings=True)


def test_the_embedded_model_is_told_where_it_works_poorly_or_was_never_measured():
    """Issue 48's envelope: the library's published figures say, before generation starts, where SmolLM2-135M's
    documents trailed their seeds by more than the margin (forum posts, reviews) or were never measured (emails)."""
    from privseed.tasks.generation.examples import ENVELOPE_MARGIN, envelope_warning, example_library

    forum = envelope_warning("local", None, "Usenet newsgroup post")
    assert forum is not None and "14.7 %" in forum and "20.2 %" in forum and "qwen2.5-coder-0.5b" in forum
    # reviews: star ratings trail their seeds even with the seed pool, the openings, the other classes' words kept out
    # and the own class's words pushed (42.1 vs 48.0 %, three runs); both local kinds continue the openings
    for kind in ("local", "local-server"):
        review = envelope_warning(kind, None, "restaurant review")
        assert review is not None and "42.1 %" in review and "48.0 %" in review and "42.8 vs 48.0" in review
    assert "never measured" in (envelope_warning("local-server", "smollm2", "customer support email") or "")
    assert "writing an email" in (envelope_warning("local", None, "email") or "")
    assert "never measured" in (envelope_warning("local", None, "document") or "")
    assert envelope_warning("local", None, "Wikipedia article") is None  # 90.9 vs 91.3 %: inside the envelope
    assert envelope_warning("local", "qwen2.5-coder-0.5b", "Usenet newsgroup post") is None  # 16.1 vs 9.0 %
    assert envelope_warning("local", "qwen2.5-coder-0.5b", "abstract") is None  # never measured: no claim either way
    assert envelope_warning("local", "/models/mine.gguf", "restaurant review") is None
    assert envelope_warning("anthropic", "claude-haiku-4-5", "Usenet newsgroup post") is None
    measured = {k.name: k.embedded for k in example_library() if k.embedded is not None}
    assert {"encyclopedia_article", "abstract", "review", "forum_post"} <= set(measured)
    outside = {name for name, m in measured.items() if m.seeds - m.documents > ENVELOPE_MARGIN}
    assert outside == {"forum_post", "review"} == {name for name, m in measured.items() if not m.inside_envelope}
    # abstracts: 46.3 vs 47.5 %, three runs of the owner's command on medical abstracts with the seed pool and the
    # title openings, at the temperature the rule gives their alike classes (0.4; 41.2 vs 44.6 % at 0.7, when a run
    # was warned): inside the envelope, no warning
    assert (measured["abstract"].documents, measured["abstract"].seeds) == (46.3, 47.5)
    assert envelope_warning("local", None, "medical abstract") is None


def test_the_envelope_suggests_no_local_model_measured_worse_for_the_kind():
    """The opt-in Qwen2.5-Coder-0.5B wrote Yelp reviews worse than the embedded model on the same seeds (24.8 against
    28.8 %, seeds 37.7 %): a review run is not sent there, and is told why; a Qwen run on reviews is warned itself.
    On forum posts Qwen beat its seeds (16.1 against 9.0 %), so it stays the first suggestion there."""
    from privseed.tasks.generation.examples import envelope_warning, example_library

    review = envelope_warning("local", None, "Yelp review") or ""
    advice = review.split("for better documents use ", 1)[1]
    assert "--llm local:qwen" not in advice and "vllm:URL" in advice and "anthropic:MODEL" in advice
    assert "the opt-in Qwen2.5-Coder-0.5B measured 24.8 % against 37.7 % here" in advice
    qwen = envelope_warning("local-server", "qwen2.5-coder-0.5b", "Yelp review") or ""
    assert qwen.startswith("the opt-in Qwen2.5-Coder-0.5B writes reviews poorly: its documents scored 24.8 %")
    assert "local:qwen" not in qwen and "anthropic:MODEL" in qwen
    forum = envelope_warning("local", None, "forum post") or ""
    assert forum.split("for better documents use ", 1)[1].startswith("--llm local:qwen2.5-coder-0.5b")
    review_kind = next(k for k in example_library() if k.name == "review")
    assert set(review_kind.measured) == {"smollm2", "qwen2.5-coder-0.5b"}
    assert "(" not in review_kind.measured["qwen2.5-coder-0.5b"].where  # the report's line nests no brackets
