"""The whole-pipeline canary test (`privseed audit-release`, tasks/evaluation/canary.py, tasks/stages/canary.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.evaluation import canary
from privseed.tasks.config.commands import CanaryAuditConfig, validate_config
from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.ledger import public_rng
from privseed.tasks.stages.canary import plant, released_texts

PREFIXES = {"a": [("The", "club", "is", "a"), ("A", "player", "of", "the")],
            "b": [("The", "river", "runs", "through"), ("A", "lake", "in", "the")]}
CANDIDATES = [f"secret{chr(97 + i)}{chr(97 + j)}" for i in range(26) for j in range(26)]


def canaries(seed: int = 0, pairs: int = 2, length: int = 3) -> list[canary.Canary]:
    return canary.make_canaries(PREFIXES, CANDIDATES, pairs, length, public_rng(seed, "test"))


def test_canaries_come_in_pairs_of_one_template_one_inserted_and_secrets_are_never_reused():
    made = canaries()
    assert len(made) == 2 * 2 * len(PREFIXES)
    for first, second in zip(made[::2], made[1::2]):
        assert first.prefix == second.prefix and first.label == second.label
        assert first.inserted != second.inserted
    words = [w for c in made for w in c.secret]
    assert len(words) == len(set(words)) == 3 * len(made)
    assert made == canaries()  # public randomness: the same seed, the same canaries
    assert [c.inserted for c in canaries(1)] != [c.inserted for c in made] or \
        [c.secret for c in canaries(1)] != [c.secret for c in made]
    assert made[0].text == "The club is a " + " ".join(made[0].secret)


def test_too_few_secret_words_is_an_error_not_a_reused_secret():
    with pytest.raises(ValueError, match="secret words"):
        canary.make_canaries(PREFIXES, CANDIDATES[:20], 2, 3, public_rng(0, "test"))


def test_secret_candidates_are_rare_words_the_corpus_does_not_hold():
    terms = ["common", "often", "frequent", "ab", "rare1", "unusual", "zeppelin", "marmalade"]
    assert canary.secret_candidates(terms, exclude={"zeppelin"}, rare_share=0.5) == ["unusual", "marmalade"]


def test_canary_rows_repeat_only_the_inserted_canaries():
    made = canaries()
    rows = canary.canary_rows(made, repetitions=4)
    assert len(rows) == 4 * sum(c.inserted for c in made)
    assert {text for text, _ in rows} == {c.text for c in made if c.inserted}


def test_auc_counts_ties_one_half():
    assert canary.auc([3, 2], [1, 0]) == 1.0
    assert canary.auc([0, 0], [0, 0]) == 0.5
    assert canary.auc([1, 0], [0, 0]) == 0.75


def test_a_release_holding_the_inserted_secrets_is_exposed_and_one_holding_none_is_not():
    made = canaries(pairs=4)  # 8 inserted, 8 held out
    background = ["the club won the league", "the river runs through the valley"] * 20
    leaked = background + [" ".join(c.secret[:2]) for c in made if c.inserted]
    verdict = canary.judge_release(made, leaked, vocabulary_size=50_000, rng=public_rng(0, "p"), permutations=2000)
    assert verdict.exposed and verdict.auc == 1.0 and verdict.p_value < 0.001
    summary = verdict.summary()
    assert summary["inserted"]["with_a_secret_word_released"] == 8
    assert summary["held_out"]["with_a_secret_word_released"] == 0
    assert {e.longest_verbatim for e in verdict.group(True)} == {2}
    clean = canary.judge_release(made, background, vocabulary_size=50_000, rng=public_rng(0, "p"), permutations=2000)
    assert not clean.exposed and clean.auc == 0.5 and clean.p_value == 1.0
    assert "no exposure found" in clean.sentence() and "EXPOSED" in verdict.sentence()


def test_held_out_secrets_in_the_release_are_no_evidence_of_membership():
    made = canaries(pairs=4)
    both = [" ".join(c.secret) for c in made]  # every secret released, inserted or not: nothing to tell apart
    verdict = canary.judge_release(made, both, vocabulary_size=50_000, rng=public_rng(0, "p"), permutations=2000)
    assert not verdict.exposed and verdict.auc == 0.5
    assert verdict.summary()["held_out"]["whole_secret_verbatim"] == 8


def test_a_released_word_never_lowers_a_secret_s_score():
    release = canary.ReleasedText.from_texts(["alpha beta", "beta gamma"])
    none = canary.secret_log_likelihood(["omega", "sigma", "tau"], release, 100)
    first = canary.secret_log_likelihood(["alpha", "sigma", "tau"], release, 100)
    assert first > none
    assert canary.secret_log_likelihood(["alpha", "beta", "gamma"], release, 100) > first


def test_the_permutation_p_value_is_uniform_ish_under_exchangeable_scores():
    rng = np.random.default_rng(3)
    p_values = [canary.permutation_p_value(rng.normal(size=10), rng.normal(size=10), rng, permutations=200)
                for _ in range(200)]
    assert 0.0 <= np.mean(np.asarray(p_values) <= 0.05) <= 0.12


def audit_config(tmp_path, **values) -> CanaryAuditConfig:
    return validate_config(CanaryAuditConfig, {"data": "unused.parquet", "out": str(tmp_path / "audit"),
                                               "labels": ["0", "1"], **values})


def test_plant_samples_each_class_and_appends_the_inserted_canaries(tmp_path):
    frame = pd.DataFrame({"text": [f"document number {i} about the club" for i in range(30)] +
                          [f"document number {i} about the river" for i in range(30)],
                          "label": [0] * 30 + [1] * 30})
    cfg = audit_config(tmp_path, sample_per_class=10, canary_pairs=2, repetitions=3)
    vocabulary = ["club", "river"] + CANDIDATES
    planted, made = plant(frame, cfg, vocabulary)
    assert len(made) == 8 and sum(c.inserted for c in made) == 4
    assert len(planted) == 20 + 4 * 3
    assert planted["label"].dtype == frame["label"].dtype  # the copy keeps the corpus's label type
    assert (planted["label"].value_counts() == 10 + 2 * 3).all()
    assert all(w.startswith("secret") for c in made for w in c.secret)
    again, made_again = plant(frame, cfg, vocabulary)
    assert made_again == made and again.equals(planted)


def test_released_texts_are_the_documents_and_the_seeds():
    synthetic = pd.DataFrame({"text": ["a b", "c d"], "keyphrases": [np.array(["x", "y"]), ["z"]], "label": [0, 1]})
    assert released_texts(synthetic) == ["a b", "c d", "x y", "z"]


def test_the_audit_refuses_options_that_do_not_apply(tmp_path):
    with pytest.raises(ConfigError, match="run-id"):
        audit_config(tmp_path, run_id="run-1")
    with pytest.raises(ConfigError, match="dry-run"):
        audit_config(tmp_path, dry_run=True)
    with pytest.raises(ConfigError, match="state"):
        audit_config(tmp_path, state=str(tmp_path / "state"))
    assert audit_config(tmp_path, sample_per_class=0).sample_per_class is None


def test_the_audit_s_own_run_gets_the_method_settings_and_none_of_the_audit_s(tmp_path):
    cfg = audit_config(tmp_path, eps_voc=2.0, per_class=7, repetitions=5)
    values = cfg.release_config("planted.parquet", "release", "state").model_dump()  # a validated DpKpsConfig
    assert values["eps_voc"] == 2.0 and values["per_class"] == 7
    assert values["data"] == "planted.parquet" and values["out"] == "release" and values["state"] == "state"
    assert "repetitions" not in values
    assert values["gate"] is False  # scored and deleted, never published: a gate refusal would lose the measurement


def test_the_report_with_the_canaries_goes_to_the_private_state_never_into_out(tmp_path):
    # Issue 46: canary-audit.json (the canaries: first words of private documents) went into any --out, a
    # release folder included.
    from privseed.tasks.stages.canary import write_canary_report

    made = canaries()
    verdict = canary.judge_release(made, ["the club is a place"], 1000, public_rng(0, "test"), permutations=99)
    release = tmp_path / "audit"
    release.mkdir()
    (release / "manifest.json").write_text("{}")  # the owner pointed --out at a release folder
    cfg = audit_config(tmp_path)
    paths = write_canary_report.fn(verdict, {"rows": 4, "privacy": {"epsilon": 11.0}}, cfg, {"method": "dpkps"})
    private = tmp_path / "audit.private" / "canary-audit.json"
    assert paths["json"] == str(private)
    assert [c["text"] for c in json.loads(private.read_text())["canaries"]] == [c.text for c in made]
    assert sorted(p.name for p in release.rglob("*")) == ["canary-audit.png", "manifest.json"]  # the plot only


# ---------------------------------------------------------------------------------------------------------
# End to end: the method's flow on the bundled DBpedia-14 sample, no LLM (the local LLM run is in docs/privacy.md)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("noise", ["secure", "none"])
def test_the_canary_audit_flags_a_release_without_noise_and_passes_a_secure_one(prefect_harness, tmp_path, noise):
    from privseed.flows.canary import canary_audit_flow
    from privseed.flows.demo import DEMO_LABELS, demo_corpus_path

    # An epsilon of 1e9 is a release with no noise: discrete Laplace of scale 1e-8 on counts draws 0.
    epsilons = {"eps_voc": 1e9, "eps_kde": 1e9} if noise == "none" else {}
    out = tmp_path / "audit"
    result = canary_audit_flow({"data": demo_corpus_path(), "labels_file": demo_corpus_path(DEMO_LABELS),
                                "out": str(out), "llm": "none", "per_class": 10, "sample_per_class": 10,
                                "canary_pairs": 1, "repetitions": 3, "method": "independent", "n_features": 64,
                                "n_workers": 1,
                                **epsilons})
    report = json.loads((tmp_path / "audit.private" / "canary-audit.json").read_text())
    assert (out / "canary-audit.png").stat().st_size > 0 and not (out / "canary-audit.json").exists()
    assert report["verdict"] == result["verdict"] and len(report["canaries"]) == 28
    if noise == "none":
        assert result["verdict"] == "EXPOSED" and result["p_value"] <= 0.01
        assert report["inserted"]["with_a_secret_word_released"] > report["held_out"]["with_a_secret_word_released"]
    else:
        assert result["verdict"] == "no exposure found"
