import numpy as np
import pytest
import torch

from privseed.tasks.evaluation import classify
from privseed.tasks.quality import metrics

TOPICS = {
    "sport": ["football", "striker", "goal", "league", "coach", "stadium", "match", "tennis"],
    "music": ["album", "guitar", "band", "song", "singer", "concert", "record", "drummer"],
    "nature": ["river", "mountain", "forest", "lake", "glacier", "valley", "island", "waterfall"],
}


def tiny_corpus(n_per_class: int, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label, words in TOPICS.items():
        for _ in range(n_per_class):
            w = rng.choice(words, size=3, replace=False)
            texts.append(f"The {w[0]} and the {w[1]} were known for the {w[2]}.")
            labels.append(label)
    return texts, labels


def test_coral_loss_on_known_covariances():
    # Columns with exactly known sample covariances: diag(1, 1) vs diag(4, 1) -> ||diff||_F^2 = 9, d = 2
    base = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])
    source = base * torch.sqrt(torch.tensor(3.0 / 4.0))  # unbiased cov = 4/3 * 3/4 = 1 per axis
    target = source * torch.tensor([2.0, 1.0])
    assert torch.cov(source.T) == pytest.approx(torch.eye(2), abs=1e-6)
    loss = classify.coral_loss(source, target)
    assert float(loss) == pytest.approx(9.0 / (4 * 2 * 2))
    assert float(classify.coral_loss(source, source + 5.0)) == pytest.approx(0.0, abs=1e-7)  # shift-invariant


def test_coral_loss_matches_numpy_and_has_gradient():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(50, 6)), rng.normal(size=(30, 6)) * 3
    expected = ((np.cov(a.T) - np.cov(b.T)) ** 2).sum() / (4 * 36)
    ta = torch.tensor(a, requires_grad=True)
    loss = classify.coral_loss(ta, torch.tensor(b))
    assert float(loss.detach()) == pytest.approx(expected)
    loss.backward()
    assert ta.grad is not None and torch.isfinite(ta.grad).all()


def test_mlp_beats_chance_on_tiny_corpus():
    from privseed.tasks.data.embedding import embed_texts
    train_t, train_y = tiny_corpus(12, seed=0)
    test_t, test_y = tiny_corpus(8, seed=1)
    x_train, x_test = embed_texts(train_t), embed_texts(test_t)
    cfg = classify.TrainConfig(seed=0, progress=False, max_epochs=40)
    clf = classify.train_mlp(x_train, train_y, cfg=cfg)
    acc = metrics.classification_scores(test_y, classify.predict_mlp(clf, x_test))["accuracy"]
    assert acc > 0.8  # chance is 1/3
    # seeded: the same config gives the same predictions
    clf2 = classify.train_mlp(x_train, train_y, cfg=cfg)
    assert classify.predict_mlp(clf2, x_test) == classify.predict_mlp(clf, x_test)
    # with CORAL against unlabelled client features it still learns
    clf3 = classify.train_mlp(x_train, train_y, client_features=x_test[: len(x_train) // 2], cfg=cfg)
    assert metrics.classification_scores(test_y, classify.predict_mlp(clf3, x_test))["accuracy"] > 0.8


def test_a_release_of_a_few_documents_per_class_still_gets_enough_updates():
    """56 documents (4 per class, 14 classes) fit in one batch: with one step per epoch early stopping ends
    training after a handful of updates at chance; min_steps_per_epoch keeps it learning."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(14, 384))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(14), n)
        x = centres[y] + rng.normal(scale=0.06, size=(len(y), 384))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), y

    x_train, y_train = sample(4)
    x_test, y_test = sample(20)
    accuracy = {}
    for steps in (1, classify.TrainConfig().min_steps_per_epoch):
        # no minimum keeps early stopping on its 6-document split (the default refuses a split that small)
        cfg = classify.TrainConfig(seed=0, progress=False, min_val_size=0, min_val_per_class=0,
                                   min_steps_per_epoch=steps)
        clf = classify.train_mlp(x_train, y_train, cfg=cfg)
        accuracy[steps] = metrics.classification_scores(y_test, classify.predict_mlp(clf, x_test))["accuracy"]
    assert accuracy[1] < 0.3 and accuracy[10] > 0.95  # chance is 1/14


def test_validation_split_too_small_to_mean_anything_is_not_used():
    cfg = classify.TrainConfig()  # 10 %, at least 20 documents and two per class
    assert classify.validation_plan(42, 14, cfg) == classify.ValidationPlan(wanted=4, minimum=28, used=0)
    assert classify.validation_plan(280, 14, cfg).used == 28
    assert classify.validation_plan(190, 2, cfg).used == 0 and classify.validation_plan(200, 2, cfg).used == 20
    assert classify.validation_plan(200, 2, classify.TrainConfig(val_fraction=0.0)).wanted == 0


def test_a_demo_sized_release_does_not_collapse_to_one_class():
    """The demo's shape: 3 documents per class of 14 classes, hard to tell apart. A 10 % validation split is 4
    documents whose accuracy stays at 0, so early stopping kept the weights of epoch 1 and the MLP predicted one
    class for nearly every test document; without a split it trains every epoch and learns the classes."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(14, 384))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(14), n)
        x = centres[y] * 0.5 + rng.normal(scale=0.05, size=(len(y), 384)) + 0.4  # one shared direction
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), y

    x_train, y_train = sample(3)
    x_test, y_test = sample(30)
    results = {}
    for name, cfg in (("no minimum", classify.TrainConfig(seed=0, progress=False, min_val_size=0,
                                                          min_val_per_class=0)),
                      ("default", classify.TrainConfig(seed=0, progress=False))):
        clf = classify.train_mlp(x_train, y_train, cfg=cfg)
        predicted = np.asarray(classify.predict_mlp(clf, x_test))
        top_share = np.bincount(predicted).max() / len(predicted)
        accuracy = metrics.classification_scores(y_test, predicted)["accuracy"]
        results[name] = (top_share, accuracy, clf.validation.used, len(clf.history))
    top_share, accuracy, used, epochs = results["no minimum"]  # what the demo did: one class, stopped at epoch 7
    assert used == 4 and top_share > 0.9 and accuracy < 0.1 and epochs < 10
    top_share, accuracy, used, epochs = results["default"]
    assert used == 0 and epochs == 60 and top_share < 0.2 and accuracy > 0.8  # chance is 1/14


def test_early_stopping_uses_synthetic_split_and_stops():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)
    clf = classify.train_mlp(x, y, cfg=classify.TrainConfig(max_epochs=200, patience=3, progress=False))
    assert len(clf.history) < 200 and "val_accuracy" in clf.history[0]
    assert clf.best_epoch == max(range(len(clf.history)), key=lambda i: clf.history[i]["val_accuracy"]) + 1


def test_finetune_runs_on_cpu_and_beats_chance():
    from privseed.tasks.data.embedding import load_embedder
    train_t, train_y = tiny_corpus(6, seed=2)
    test_t, test_y = tiny_corpus(4, seed=3)
    encoder = load_embedder()
    before = [p.detach().clone() for p in encoder.parameters()][:2]
    cfg = classify.TrainConfig(max_epochs=3, batch_size=6, lr=3e-3, encoder_lr=5e-5, val_fraction=0.0,
                               max_seq_length=32, progress=False)
    clf = classify.train_finetune(train_t, train_y, encoder, client_texts=test_t[:6], cfg=cfg, device="cpu")
    acc = metrics.classification_scores(test_y, classify.predict_finetune(clf, test_t))["accuracy"]
    assert acc > 0.6
    # the shared (cached) encoder was copied, never modified
    assert all(torch.equal(a, b) for a, b in zip(before, list(encoder.parameters())[:2]))


def test_tfidf_baseline_beats_chance():
    train_t, train_y = tiny_corpus(10, seed=4)
    test_t, test_y = tiny_corpus(6, seed=5)
    pred = classify.tfidf_logreg_predict(train_t, train_y, test_t)
    assert metrics.classification_scores(test_y, pred)["accuracy"] > 0.8
