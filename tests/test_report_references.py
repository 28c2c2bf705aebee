"""Issue 47: what a recipient reads the scores against. Chance and the seeds-alone / real-documents lines, the
per-class scores and the classes to distrust, how well synthetic texts are told from real ones and how their
lengths differ, and the guarantee in one plain sentence (the report's, the dataset card's and the artifacts')."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privseed.tasks.dp.ledger import PrivacyLedger, plain_guarantee
from privseed.tasks.evaluation import evaluation
from privseed.tasks.quality import metrics
from privseed.tasks.stages.artifacts import score_description


def test_the_guarantee_in_one_plain_sentence_for_each_kind():
    assert plain_guarantee({"epsilon": 11.0, "delta": 7.2e-8, "secure": True}) == (
        "Whether or not any single document was in the private corpus changes the probability of any output of this "
        "release by at most a factor e^11 (about 60,000), except with probability 7.2e-8.")
    pure = plain_guarantee({"epsilon": 1.0, "delta": 0.0, "secure": True})
    assert pure.endswith("by at most a factor e^1 (about 2.7).") and "except" not in pure
    assert "e^30 (about 1.1e13)" in plain_guarantee({"epsilon": 30.0, "delta": 1e-5, "secure": True})
    secpe = plain_guarantee({"epsilon": 3.0, "delta": 1e-5, "secure": True, "guarantee": {
        "kind": "(p, r)-secret protection", "p": 0.01, "r": 0.05, "statement": "..."}})
    assert "probability 0.01 without this release guesses it with probability at most 0.05" in secpe
    assert "not differential privacy" in secpe and "e^" not in secpe
    for insecure in ({"epsilon": 1.0, "delta": 0.0, "secure": False},
                     {"epsilon": 1.0, "delta": 0.0, "guarantee": {"kind": "none"}}):
        assert plain_guarantee(insecure).startswith("This release guarantees no privacy")


def test_the_plain_sentence_reads_a_ledger_s_own_total(tmp_path):
    import json

    from privseed.tasks.dp.mechanisms import LaplaceMechanism, insecure_noise, secure_noise

    for noise, start in ((secure_noise(), "Whether or not"), (insecure_noise(0, "x"), "This release guarantees no")):
        ledger = PrivacyLedger(str(tmp_path / f"state-{start[:4]}"), "identity", "run1")
        ledger.draw_once("x", mechanism=LaplaceMechanism(sensitivity=1.0, epsilon=2.0), noise=noise, params={},
                         exact=lambda: np.zeros(3))
        recipient = json.loads(ledger.to_json())
        assert evaluation.release_guarantee(recipient).startswith(start)
    assert evaluation.release_guarantee(None) == ""


def test_reference_lines_are_chance_and_the_reference_classifiers():
    lines = evaluation.reference_lines(["a", "a", "a", "b"], {
        evaluation.SEEDS_ALONE: {"accuracy": 0.5, "macro_f1": 0.4, "n_train": 12}})
    assert [(r["reference"], r["accuracy"]) for r in lines] == [
        ("chance: uniform guessing", 0.5), ("chance: the largest class", 0.75), (evaluation.SEEDS_ALONE, 0.5)]
    assert "12 documents" in lines[2]["what"] and lines[2]["macro_f1"] == 0.4
    assert evaluation.reference_lines([], {}) == []


def test_reference_training_sets_are_the_seeds_and_real_documents_not_in_the_test_split():
    rows = pd.DataFrame({"text": ["doc one", "doc two"], "label": [0, 1],
                         "keyphrases": [np.array(["river", "lake"]), ["album"]]})
    real = pd.DataFrame({"text": ["held out", "fresh", "new"], "label": [0, 1, 0]})
    sets = evaluation.reference_training_sets(rows, ["held out"], real)
    assert sets[evaluation.SEEDS_ALONE].to_dict("list") == {"text": ["river lake", "album"], "label": [0, 1]}
    assert sets[evaluation.REAL_DOCUMENTS].to_dict("list") == {"text": ["fresh", "new"], "label": [1, 0]}
    # real documents that are all test documents, or of one class, teach no classifier: no line, no failure
    assert evaluation.REAL_DOCUMENTS not in evaluation.reference_training_sets(rows, ["held out", "new"], real)
    assert evaluation.REAL_DOCUMENTS not in evaluation.reference_training_sets(rows, list(real["text"]), real)
    # a release without seeds (Aug-PE) has no seeds-alone line
    assert evaluation.reference_training_sets(rows.assign(keyphrases=[[], None]), []) == {}


def test_per_class_scores_and_the_classes_to_distrust():
    truth = [0] * 4 + [1] * 4 + [2] * 4
    predicted = [0, 0, 0, 0] + [1, 1, 1, 0] + [2, 0, 0, 0]
    table = metrics.per_class_scores(truth, predicted, ["0", "1", "2", "3"])
    assert [r["class"] for r in table] == ["0", "1", "2", "3"]
    assert table[0] == {"class": "0", "precision": pytest.approx(4 / 8), "recall": 1.0, "f1": pytest.approx(2 / 3),
                        "support": 4}
    assert table[2]["recall"] == 0.25 and table[3]["support"] == 0
    weak, mean = evaluation.classes_to_distrust(table)
    assert weak == ["2"] and mean == pytest.approx((1 + 0.75 + 0.25) / 3)  # a class without test documents is no class
    sentence = evaluation.distrust_sentence("TF-IDF + LR", table, {"2": "Village"})
    assert sentence == ("Distrust the synthetic corpus for Village (25%): trained on it, TF-IDF + LR recalls this "
                        "share of its real test documents, under half its mean per-class recall (67%).")
    two = evaluation.distrust_sentence("MLP", [*table, {"class": "4", "recall": 0.1, "support": 4}])
    assert two.startswith("Distrust the synthetic corpus for 2 classes, 2 (25%) and 4 (10%): trained on it, MLP")
    even = metrics.per_class_scores(truth, truth, ["0", "1", "2"])
    assert evaluation.distrust_sentence("MLP", even).startswith("No class stands out")


def test_real_vs_synthetic_auc_tells_apart_what_differs_and_not_what_does_not():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]

    def texts(vocabulary: list[str], n: int) -> list[str]:
        return [" ".join(rng.choice(vocabulary, size=8)) for _ in range(n)]

    real = texts(words, 60)
    assert evaluation.real_vs_synthetic_auc(real, texts(words[:20] + ["delve", "tapestry"] * 5, 30)) > 0.9
    assert abs(evaluation.real_vs_synthetic_auc(real, texts(words, 30)) - 0.5) < 0.2
    assert evaluation.real_vs_synthetic_auc(real, ["one"]) is None
    # a seeded sample above max_texts: the same answer twice
    big = texts(words, 50)
    assert evaluation.real_vs_synthetic_auc(big, real, max_texts=20) == evaluation.real_vs_synthetic_auc(
        big, real, max_texts=20)
    assert "from real test documents almost every time: AUC 0.987" in evaluation.distinguishability_sentence(0.987)
    assert evaluation.distinguishability_sentence(None) == ""


def test_length_comparison_says_how_much_longer_or_shorter():
    real = ["one two three four five"] * 3  # 5 words
    assert evaluation.length_comparison(real, ["a b c d e f g h"] * 2)["sentence"] == (
        "Synthetic documents are 1.6x longer than real ones (median 8 vs 5 words).")
    assert "2.5x shorter" in evaluation.length_comparison(real, ["a b"])["sentence"]
    assert "about as long" in evaluation.length_comparison(real, ["a b c d e"])["sentence"]
    assert evaluation.length_comparison([], ["a"])["sentence"] == ""


def test_the_scores_artifact_carries_the_reference_lines_and_the_guarantee():
    result = {"n_train": 14, "n_test": 20, "references": [{"reference": "seeds alone", "accuracy": 0.789}],
              "distrust": "Distrust the synthetic corpus for 1 class.", "guarantee": "Whether or not ...",
              "lengths": {"sentence": "Synthetic documents are 1.6x longer than real ones."}}
    text = score_description(result)
    assert "seeds alone 78.9%" in text and "Distrust the synthetic corpus for 1 class." in text
    assert text.endswith("Whether or not ...") and "1.6x longer" in text
