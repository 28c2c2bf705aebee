import base64
import re

import numpy as np
import pandas as pd

from privseed.tasks.evaluation import report


def _images(html_text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r"src='data:image/png;base64,([^']+)'", html_text)]


def test_run_report_renders_every_section_offline():
    rng = np.random.default_rng(0)
    real_xy, syn_xy = report.project_2d(rng.normal(size=(40, 8)), rng.normal(size=(30, 8)) + 1, method="tsne")
    figures = {
        "map": report.figure_to_data_uri(report.plot_embedding_map(real_xy, syn_xy, method="tsne")),
        "lengths": report.figure_to_data_uri(report.plot_length_histograms([10, 20, 30], [12, 15, 40])),
        "confusion": report.figure_to_data_uri(report.plot_confusion(np.array([[3, 1], [0, 4]]), ["a", "b"],
                                                                     title="c")),
        "training": report.figure_to_data_uri(report.plot_training_curve(
            [{"epoch": 1, "train_loss": 1.0, "val_accuracy": 0.5},
             {"epoch": 2, "train_loss": 0.5, "val_accuracy": 0.7}],
            title="t")),
    }
    ledger = {"entries": [{"name": "vocabulary", "mechanism": "laplace", "epsilon": 1.0, "stage": "vocabulary",
                           "params": {"S": 10}}], "total": {"epsilon": 11.0, "delta": 0.0}}
    result = {"title": "t", "synthetic": "/out", "test": "/test.parquet", "n_train": 8, "n_test": 8,
              "scores": {"MLP on MiniLM": {"accuracy": 0.875, "macro_f1": 0.87, "n_test": 8}},
              "fid": 0.12, "corpus": {"synthetic": {"distinct_2": 0.5}}, "usage": {"llm_calls": 8.0},
              "privacy": "epsilon = 11"}
    examples = [{"label_name": "Athlete", "keyphrases": np.array(["football", "league"]), "seed": 3,
                 "text": "A <b>footballer</b> of the league."}]
    html_text = report.render_run_report(result, figures=figures, ledger=ledger,
                                         manifest={"config": {"eps_voc": 1}}, examples=examples)
    for section in report.RUN_SECTIONS:
        assert f"<section id='{section}'>" in html_text
    pngs = _images(html_text)
    assert len(pngs) == 4 and all(p.startswith(b"\x89PNG") for p in pngs)
    assert "http://" not in html_text and "https://" not in html_text and "<script" not in html_text  # offline
    assert "&lt;b&gt;footballer&lt;/b&gt;" in html_text  # document text is escaped, never raw HTML
    assert "football, league" in html_text and "generation seed 3" in html_text
    assert "87.5%" in html_text and "epsilon = 11" in html_text and "laplace" in html_text


def test_experiment_report_renders_every_section():
    table = pd.DataFrame({"method": ["independent", "independent", "real"], "eps_total": [6.0, 11.0, np.nan],
                          "accuracy_mean": [0.6, 0.7, 0.85], "accuracy_std": [0.02, 0.01, 0.0]})
    paper = pd.DataFrame({"label": ["Table 5 no LLM"] * 2, "eps_total": [6.0, 11.0], "accuracy": [71.7, 80.6]})
    figures = {"acc": report.figure_to_data_uri(report.plot_accuracy_vs_epsilon(table, paper, title="x"))}
    html_text = report.render_experiment_report(
        title="exp", table_markdown="| a |", table_rows=[{"method": "independent", "accuracy %": "60.0 ± 2.0"}],
        figures=figures, paper_rows=[{"table": "Table 5", "row": "eps 6", "accuracy": 71.7}],
        cells=[{"cell": "x/independent/none/eps1+5/seed0", "accuracy": 0.6}], config={"seeds": [0, 1, 2]},
        summary="3 runs")
    for section in report.EXPERIMENT_SECTIONS:
        assert f"<section id='{section}'>" in html_text
    assert len(_images(html_text)) == 1 and "Table 5" in html_text and "60.0 ± 2.0" in html_text


def test_method_comparison_figure_draws_one_bar_per_method_and_budget():
    table = pd.DataFrame({"method": ["independent", "augpe", "secpe"], "eps_voc": [1.0, 1.0, np.nan],
                          "eps_kde": [10.0, 10.0, np.nan], "accuracy_mean": [0.3, 0.08, 0.07],
                          "accuracy_std": [0.02, 0.01, np.nan], "llm_calls": [168.0, 168.0, 168.0],
                          "values": [[0.28, 0.3, 0.32], [0.07, 0.09], [0.07]]})
    fig = report.plot_method_comparison(table, chance=1 / 14, title="t")
    ax = fig.axes[0]
    assert len(ax.patches) == 3 and [round(p.get_height(), 6) for p in ax.patches] == [30.0, 8.0, 7.0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "independent\neps 1+10\n168 calls" and labels[2] == "secpe\n168 calls"
    from matplotlib.collections import PathCollection

    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in dots] == [3, 2]  # seed dots for the methods with more than one seed
    assert report.figure_to_data_uri(fig).startswith("data:image/png;base64,")


def test_ledger_rows_reads_the_foundation_ledger_format():
    rows, total = report.ledger_rows({"entries": [{"name": "kde-0", "mechanism": "laplace", "epsilon": 10.0,
                                                    "partition": "3", "params": {"I": 300}}],
                                      "total": {"epsilon": 11.0, "delta": 0.0}})
    assert rows[0]["name"] == "kde-0" and rows[0]["partition"] == "3" and '"I": 300' in rows[0]["params"]
    assert "epsilon = 11" in total
    assert report.ledger_rows(None) == ([], "no ledger in this release")
    # the guarantee (a mapping) is written as its statement on the one-line total, not printed as a dict
    _, total = report.ledger_rows({"entries": [], "total": {
        "epsilon": 11.0, "delta": 0.0, "guarantee": {"kind": "(epsilon, delta)-differential privacy",
                                                     "statement": "per document"}}})
    assert total == "epsilon = 11, delta = 0 (guarantee: per document)"


def test_the_ledger_total_reads_as_words_not_as_a_python_dict():
    """The demo's report printed the guarantee as ``{'kind': ..., 'statement': ...}`` and ``secure: True``."""
    statement = "(epsilon, delta)-differential privacy per document (add or remove one labelled document)"
    _, total = report.ledger_rows({"entries": [], "total": {
        "epsilon": 11.0, "delta": 0.0, "composition": "basic across stages",
        "guarantee": {"kind": "(epsilon, delta)-differential privacy", "statement": statement}, "secure": True}})
    assert total == f"epsilon = 11, delta = 0 (composition: basic across stages; guarantee: {statement}; secure: yes)"
    assert "{" not in total and "True" not in total


def test_run_report_of_an_insecure_release_is_stamped_and_a_secure_one_is_not():
    from privseed.tasks.dp.mechanisms import INSECURE_STAMP

    result = {"title": "t", "scores": {}, "privacy": "epsilon = 11"}
    secure = {"entries": [], "total": {"epsilon": 11.0, "delta": 0.0, "secure": True}}
    insecure = {"entries": [], "total": {"epsilon": 11.0, "delta": 0.0, "secure": False}, "stamp": INSECURE_STAMP}
    plain = report.render_run_report(result, figures={}, ledger=secure, manifest={"privacy": {"secure": True}},
                                     examples=[])
    assert INSECURE_STAMP not in plain
    for ledger, manifest in ((insecure, {}), (secure, {"privacy": {"secure": False}, "stamp": INSECURE_STAMP})):
        stamped = report.render_run_report(result, figures={}, ledger=ledger, manifest=manifest, examples=[])
        assert f"<title>privseed evaluation report ({INSECURE_STAMP})</title>" in stamped
        assert stamped.count(INSECURE_STAMP) >= 2  # title and the banner above the summary


def test_run_report_lists_the_prompts_class_names_in_label_order():
    """The manifest's JSON keys come back as text ("10" sorts before "2"); the report lists labels 0, 1, 2, ..."""
    names = {str(i): f"class {i}" for i in range(12)}
    manifest = {"privacy": {"secure": True}, "config": {"prompt_class_names": dict(sorted(names.items()))}}
    html_text = report.render_run_report({"title": "t", "scores": {}}, figures={}, ledger=None, manifest=manifest,
                                         examples=[])
    assert "0: class 0, 1: class 1, 2: class 2, " in html_text and "9: class 9, 10: class 10, 11: class 11" in html_text


def test_run_report_says_the_answers_opened_with_the_kinds_public_words():
    manifest = {"privacy": {"secure": True}, "config": {"answer_openings": ["I went", "I went", "We", "My"]}}
    html_text = report.render_run_report({"title": "t", "scores": {}}, figures={}, ledger=None, manifest=manifest,
                                         examples=[])
    assert "Answers opened with public words" in html_text and "I went, We, My." in html_text
    plain = report.render_run_report({"title": "t", "scores": {}}, figures={}, ledger=None,
                                     manifest={"privacy": {"secure": True}, "config": {"answer_openings": []}},
                                     examples=[])
    assert "Answers opened" not in plain
    news = report.render_run_report({"title": "t", "scores": {}}, figures={}, ledger=None, examples=[],
                                    manifest={"privacy": {"secure": True},
                                              "config": {"answer_openings": [], "answer_opens_with_subject": True}})
    assert "Answers opened with their subject" in news and "Answers opened with public words" not in news


def _kps_ledger(classes: int = 14) -> dict:
    entries = [{"name": "vocabulary", "stage": "vocabulary", "mechanism": "laplace", "epsilon": 1.0, "delta": 0.0,
                "noise_source": "opendp", "secure": True, "charged": True, "params": {"S": 10}}]
    for c in range(classes):
        for sketch in range(2):  # two sketches per class: they add up within the class
            entries.append({"name": f"kde-class{c}-sketch{sketch}", "stage": "kde", "partition": f"class{c}",
                            "mechanism": "laplace", "epsilon": 5.0, "delta": 0.0, "noise_source": "opendp",
                            "secure": True, "charged": True, "params": {"I": 300}})
    return {"entries": entries, "total": {"epsilon": 11.0, "delta": 0.0, "secure": True}}


def test_ledger_collapses_to_one_row_per_stage():
    rows = report.ledger_stage_rows(_kps_ledger())
    assert [r["stage"] for r in rows] == ["vocabulary", "kde"]
    vocabulary, kde = rows
    assert (vocabulary["releases"], vocabulary["partitions"], vocabulary["epsilon"]) == (1, "–", 1.0)
    # parallel across the 14 classes, basic composition of each class's two sketches
    assert (kde["releases"], kde["partitions"], kde["epsilon"], kde["delta"]) == (28, 14, 10.0, 0.0)
    assert kde["mechanism"] == "laplace" and kde["noise source"] == "opendp" and kde["secure"] == "yes"
    # a round accounted in an earlier charge is listed, not charged twice; reproducible noise says so
    pe = {"entries": [{"name": "pe", "stage": "pe", "mechanism": "gaussian", "epsilon": 4.0, "delta": 1e-5,
                       "noise_source": "numpy", "secure": False, "charged": True},
                      {"name": "pe-round1", "stage": "pe", "mechanism": "gaussian", "epsilon": 4.0, "delta": 1e-5,
                       "noise_source": "numpy", "secure": False, "charged": False, "accounted_in": "pe"}]}
    (row,) = report.ledger_stage_rows(pe)
    assert (row["releases"], row["epsilon"], row["delta"], row["secure"]) == (2, 4.0, 1e-5, "NO")
    assert report.ledger_stage_rows(None) == []


def test_run_report_puts_warnings_first_the_ledger_in_stages_and_prdc_beside_accuracy():
    result = {"title": "t", "n_train": 42, "n_test": 2100, "privacy": "epsilon = 11",
              "scores": {"MLP on MiniLM": {"accuracy": 0.0714, "macro_f1": 0.01, "n_test": 2100}},
              "warnings": [{"classifier": "MLP on MiniLM", "kind": "one-class",
                            "message": "MLP on MiniLM predicts one class (Album) for 100% of the test documents"}],
              "prdc": {"precision": 0.61, "recall": 0.12, "density": 0.43, "coverage": 0.18, "nearest_k": 5.0},
              "corpus": {"synthetic": {"distinct_2": 0.5, "words_mean": 10.0}, "real test": {"distinct_2": 0.8}}}
    html_text = report.render_run_report(result, figures={}, ledger=_kps_ledger(), manifest={"config": {}},
                                         examples=[])
    warning = html_text.index("predicts one class (Album)")
    assert warning < html_text.index("<section id='scores'>") and warning < html_text.index("Best classifier")
    assert "Read this before the scores" in html_text
    for name, value in (("precision", "0.61"), ("recall", "0.12"), ("density", "0.43"), ("coverage", "0.18")):
        assert f"{name} <b>{value}</b>" in html_text  # in the summary
    scores = html_text[html_text.index("<section id='scores'>"):html_text.index("<section id='figures'>")]
    assert "<th>precision</th><th>recall</th><th>density</th><th>coverage</th>" in scores
    ledger = html_text[html_text.index("<section id='ledger'>"):html_text.index("<section id='config'>")]
    shown = ledger.split("<details>")[0]  # what the page shows before anything is unfolded
    assert shown.count("<tr>") == 3 and "kde-class3-sketch1" not in shown  # a header and one row per stage
    assert "kde-class3-sketch1" in ledger and "every release (29)" in ledger  # the detail, folded away
    corpus = html_text[html_text.index("<section id='corpus'>"):html_text.index("<section id='usage'>")]
    assert "<th>metric</th><th>synthetic</th><th>real test</th>" in corpus  # a row per metric fits the width
    assert corpus.count("<tr>") == 3 and "<td>words_mean</td>" in corpus
    clean = report.render_run_report({**result, "warnings": [], "prdc": None}, figures={}, ledger=None,
                                     manifest=None, examples=[])
    assert "Read this before the scores" not in clean and "<th>density</th>" not in clean


def test_run_report_shows_the_reference_lines_the_per_class_table_and_the_guarantee_in_words():
    """Issue 47: accuracy alone does not compare; the report puts chance, the seeds alone and real documents beside
    it, a per-class table with the classes to distrust, real vs synthetic in words and the guarantee in a sentence."""
    from privseed.tasks.dp.ledger import plain_guarantee
    from privseed.tasks.evaluation import evaluation

    per_class = [{"class": "Athlete", "precision": 0.9, "recall": 0.95, "f1": 0.92, "support": 20},
                 {"class": "Village", "precision": 0.5, "recall": 0.2, "f1": 0.29, "support": 20}]
    guarantee = plain_guarantee({"epsilon": 11.0, "delta": 7.2e-8, "secure": True})
    result = {"title": "t", "n_train": 42, "n_test": 40,
              "scores": {"TF-IDF + LR": {"accuracy": 0.839, "macro_f1": 0.8, "n_test": 40}},
              "references": evaluation.reference_lines(["a"] * 30 + ["b"] * 10, {
                  evaluation.SEEDS_ALONE: {"accuracy": 0.789, "macro_f1": 0.77, "n_train": 42},
                  evaluation.REAL_DOCUMENTS: {"accuracy": 0.95, "macro_f1": 0.94, "n_train": 700}}),
              "per_class": {"TF-IDF + LR": per_class},
              "distrust": evaluation.distrust_sentence("TF-IDF + LR", per_class),
              "distinguishability": {"auc": 0.987, "sentence": evaluation.distinguishability_sentence(0.987)},
              "lengths": evaluation.length_comparison(["w " * 47] * 3, ["w " * 76] * 3),
              "guarantee": guarantee, "privacy": "epsilon = 11"}
    html_text = report.render_run_report(result, figures={}, ledger=None, manifest=None, examples=[])
    scores = html_text.split("<section id='scores'>")[1].split("</section>")[0]
    for line in ("chance: uniform guessing", "chance: the largest class", "seeds alone", "real documents"):
        assert f"<td>{line}</td>" in scores
    assert "<td class='num'>50</td>" in scores and "<td class='num'>75</td>" in scores  # 1/2 and 30/40, in percent
    assert "<td class='num'>78.9</td>" in scores and "<td class='num'>95</td>" in scores
    assert "<th>precision %</th><th>recall %</th><th>F1 %</th><th>support</th>" in scores
    assert "<td>Village</td><td class='num'>50</td><td class='num'>20</td>" in scores
    assert "Distrust the synthetic corpus for Village (20%): trained on it, TF-IDF + LR" in scores
    assert "AUC 0.987" in scores and "Synthetic documents are 1.6x longer than real ones (median 76 vs 47 words)." \
        in scores
    summary = html_text.split("<section id='summary'>")[1].split("</section>")[0]
    assert "e^11 (about 60,000), except with probability 7.2e-8." in summary
    assert "seeds alone <b>78.9%</b>" in summary and "real documents <b>95.0%</b>" in summary
    assert "e^11 (about 60,000)" in html_text.split("<section id='ledger'>")[1]
    # without them (an older result), the report renders as before
    bare = report.render_run_report({"title": "t", "scores": {}}, figures={}, ledger=None, manifest=None, examples=[])
    assert "id='references'" not in bare and "id='per-class'" not in bare and "e^" not in bare


def test_run_report_names_the_embedded_model_s_envelope_with_both_figures():
    """Issue 48 item 4: a release the embedded model wrote outside its measured envelope says so in the report, in
    the banner before the scores, with the library's figure, this release's own and the backends that do better."""
    from privseed.tasks.evaluation import evaluation

    assert (report.ENVELOPE_SCORE, report.ENVELOPE_REFERENCE) == (evaluation.classifier_label("tfidf", False),
                                                                  evaluation.SEEDS_ALONE)
    result = {"title": "t", "scores": {"TF-IDF + LR": {"accuracy": 0.161, "macro_f1": 0.1, "n_test": 40}},
              "references": evaluation.reference_lines(["a"] * 20 + ["b"] * 20, {
                  evaluation.SEEDS_ALONE: {"accuracy": 0.202, "macro_f1": 0.2, "n_train": 40}})}

    def rendered(llm: str, doc_type: str, method: str = "histogram") -> str:
        manifest = {"config": {"method": method, "llm": llm, "doc_type": doc_type}}
        html_text = report.render_run_report(result, figures={}, ledger=None, manifest=manifest, examples=[])
        return html_text.split("<section id='scores'>")[0]

    forum = rendered("local", "Usenet newsgroup post")
    assert "Read this before the scores" in forum and "writes forum posts poorly" in forum
    assert "14.7 % against 20.2 % for their own seeds" in forum  # the library's measured figure
    assert "This release: its documents 16.1 % against 20.2 % for their seeds alone" in forum and "trail" in forum
    assert "local:qwen2.5-coder-0.5b" in forum and "vllm:URL" in forum and "anthropic:MODEL" in forum
    assert "never measured writing a support ticket" in rendered("local-server", "support ticket")
    for inside in (rendered("local", "Wikipedia article"), rendered("anthropic:claude-haiku-4-5", "Usenet post"),
                   rendered("local:qwen2.5-coder-0.5b", "Usenet post"), rendered("none", "Usenet post"),
                   rendered("local", "Usenet post", method="augpe")):
        assert "Read this before the scores" not in inside
