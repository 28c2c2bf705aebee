"""Downstream classifiers for the client side, and Deep CORAL domain adaptation.

The client (the data recipient) trains on the synthetic release only and is scored on its own real
test set. Everything here is pure: arrays or texts in, a trained model / predictions out; no I/O,
no Prefect. Test labels never enter this module: every training function takes training data (and
optionally unlabelled client data) and returns a model; `predict_*` returns labels for texts or
features. Scoring happens elsewhere (privseed.tasks.quality.metrics.classification_scores) with the labels.

Classifiers
- `train_mlp`: a 3-layer MLP over frozen sentence embeddings (fast; CPU default).
- `train_finetune`: the sentence-transformers encoder fine-tuned end to end with the same 3-layer head
  (the paper's Table 2 classifier; meant for a GPU, runs on CPU for tiny data).
- `tfidf_logreg_predict`: TF-IDF + logistic regression from scikit-learn, an evaluator that is not
  ours, reported beside the others so utility can be re-measured independently.

Deep CORAL (Sun & Saenko 2016): loss = CE(synthetic) + lambda * (1 / (4 d^2)) ||C_s - C_t||_F^2, where
C_s, C_t are the covariances of the last hidden layer's d features on a synthetic batch and on a batch of
unlabelled client documents (kept apart from the test set by the caller).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, asdict
from typing import Any

import numpy as np
import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from torch import nn
from tqdm.auto import tqdm


# ---------------------------------------------------------------- CORAL
def coral_loss(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Deep CORAL loss (1 / (4 d^2)) * ||C_source - C_target||_F^2 between two feature batches.

    source: (n_s, d), target: (n_t, d). C is the unbiased covariance (divide by n - 1), as in the paper.
    """
    if source.ndim != 2 or target.ndim != 2 or source.shape[1] != target.shape[1]:
        raise ValueError(f"feature shapes {tuple(source.shape)} and {tuple(target.shape)} do not match")
    if source.shape[0] < 2 or target.shape[0] < 2:
        raise ValueError("CORAL needs at least two rows on each side to form a covariance")
    d = source.shape[1]
    c_s = torch.cov(source.T)
    c_t = torch.cov(target.T)
    return ((c_s - c_t) ** 2).sum() / (4.0 * d * d)


# ---------------------------------------------------------------- configuration
@dataclass
class TrainConfig:
    """Training settings shared by both neural classifiers. Defaults are chosen on public data only."""

    hidden: int = 256
    dropout: float = 0.2
    lr: float = 1e-3  # head learning rate
    encoder_lr: float = 2e-5  # fine-tuning only
    weight_decay: float = 1e-4
    batch_size: int = 64
    max_epochs: int = 60
    patience: int = 6  # epochs without validation improvement before stopping
    # A small release (the demo's 42 documents, a grid's 56) fits in one batch: one optimizer step per epoch
    # would stop early after a handful of updates, at chance. Every epoch takes at least this many steps,
    # cycling through the shuffled data; sets of >= min_steps_per_epoch * batch_size rows are unaffected.
    min_steps_per_epoch: int = 10
    val_fraction: float = 0.1  # split of the *synthetic* training data used for early stopping
    # Early stopping needs a split whose accuracy means something: at least min_val_size documents and
    # min_val_per_class per class. The demo's 42 documents gave a split of 4 (of 14 classes) whose accuracy stayed
    # at 0, so training stopped at epoch 1 and the MLP predicted one class for every test document. Below the
    # minimum the model trains on every synthetic document for max_epochs.
    min_val_size: int = 20
    min_val_per_class: int = 2
    coral_weight: float = 1.0  # lambda; used only when client data is given
    max_seq_length: int = 128  # fine-tuning only
    seed: int = 0
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ValidationPlan:
    """How early stopping was decided: the split the fraction asks for, the minimum a split must reach to be
    used, and the size actually used (0: no early stopping, the model trained for max_epochs)."""

    wanted: int
    minimum: int
    used: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def validation_plan(n: int, n_classes: int, cfg: TrainConfig) -> ValidationPlan:
    """The validation split for `n` training documents of `n_classes` classes: ``val_fraction`` of them when that
    reaches ``max(min_val_size, min_val_per_class * n_classes)`` documents (and leaves two to train on), else
    none."""
    wanted = int(round(n * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
    minimum = max(1, cfg.min_val_size, cfg.min_val_per_class * n_classes)
    used = wanted if wanted >= minimum and n - wanted >= 2 else 0
    return ValidationPlan(wanted=wanted, minimum=minimum, used=used)


@dataclass
class TrainedClassifier:
    """A trained model plus what is needed to map its outputs back to the release's labels."""

    kind: str
    classes: list[Any]
    model: nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    device: str = "cpu"
    validation: ValidationPlan | None = None


# ---------------------------------------------------------------- shared helpers
class _cpu_threads:
    """Run a block with `n` intra-op threads on CPU, then restore. The MLP is tiny: on a shared 2-core
    machine two spinning OpenMP threads made it ~10x slower than one (measured: 214 s vs 20 s)."""

    def __init__(self, device: str, n: int = 1) -> None:
        self.active = device == "cpu"
        self.n = n
        self.saved = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.active:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.set_num_threads(self.saved)


def _seed_everything(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _encode_labels(labels: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    values = list(labels)
    classes = sorted(set(values), key=lambda v: (str(type(v)), v))
    index = {c: i for i, c in enumerate(classes)}
    return classes, np.array([index[v] for v in values], dtype=np.int64)


def _validation_split(y: np.ndarray, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, val) of a stratified split of the synthetic data with `n_val` validation rows (0: none)."""
    n = len(y)
    idx = np.arange(n)
    if n_val < 1 or n - n_val < 2:
        return idx, idx[:0]
    counts = np.bincount(y)
    stratify = y if (counts[counts > 0].min() >= 2 and n_val >= len(counts[counts > 0])) else None
    tr, va = train_test_split(idx, test_size=n_val, random_state=seed, stratify=stratify)
    return np.sort(tr), np.sort(va)


def pick_device(device: str | None = None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class MlpHead(nn.Module):
    """3 fully connected layers: in -> hidden -> hidden -> classes. `features` is the CORAL layer."""

    def __init__(self, in_dim: int, hidden: int, n_classes: int, dropout: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
        )
        self.out = nn.Linear(hidden, n_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.features(x))


def _train_loop(
    *,
    n_train: int,
    step: Callable[[np.ndarray, np.ndarray | None], torch.Tensor],
    evaluate_val: Callable[[], float] | None,
    modules: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    n_client: int,
    desc: str,
) -> tuple[list[dict[str, float]], int]:
    """Epoch loop with early stopping on the synthetic validation split; restores the best weights.

    `step(batch_idx, client_idx)` returns the loss for one mini-batch. Validation accuracy is the stop
    criterion; without a validation split the model trains for max_epochs.
    """
    rng = np.random.default_rng(cfg.seed)
    best_state = copy.deepcopy(modules.state_dict())
    best_score, best_epoch, stale = -math.inf, 0, 0
    history: list[dict[str, float]] = []
    bar = tqdm(range(1, cfg.max_epochs + 1), desc=desc, unit="epoch", disable=not cfg.progress, leave=False)
    for epoch in bar:
        modules.train()
        order = rng.permutation(n_train)
        client_order = rng.permutation(n_client) if n_client else None
        batch_size = max(1, min(cfg.batch_size, n_train))
        n_batches = max(1, math.ceil(n_train / batch_size), cfg.min_steps_per_epoch)
        # Client batches are half the size of synthetic ones (the client set is half as large).
        client_bs = max(2, math.ceil(n_client / math.ceil(n_train / batch_size))) if n_client else 0
        total = 0.0
        for b in range(n_batches):
            if (b + 1) * batch_size <= n_train:
                batch = order[b * batch_size : (b + 1) * batch_size]
            else:  # past the end of the data (the last partial batch, or extra steps of a small set): wrap
                batch = np.take(order, np.arange(b * batch_size, (b + 1) * batch_size), mode="wrap")
                if b * batch_size < n_train:  # the last partial batch of a large set: no repeated rows
                    batch = order[b * batch_size :]
            if len(batch) < 2 and n_train >= 2:  # BatchNorm-free, but covariance needs 2 rows
                batch = np.concatenate([batch, order[:1]])
            client_batch = None
            if client_order is not None:
                start = (b * client_bs) % n_client
                client_batch = np.take(client_order, np.arange(start, start + client_bs), mode="wrap")
            optimizer.zero_grad()
            loss = step(batch, client_batch)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        record = {"epoch": float(epoch), "train_loss": total / n_batches}
        if evaluate_val is not None:
            modules.eval()
            with torch.no_grad():
                score = evaluate_val()
            record["val_accuracy"] = score
            if score > best_score + 1e-9:
                best_score, best_epoch, stale = score, epoch, 0
                best_state = copy.deepcopy(modules.state_dict())
            else:
                stale += 1
        else:
            best_epoch = epoch
            best_state = copy.deepcopy(modules.state_dict())
        history.append(record)
        bar.set_postfix({k: round(v, 4) for k, v in record.items() if k != "epoch"})
        if evaluate_val is not None and stale >= cfg.patience:
            break
    modules.load_state_dict(best_state)
    modules.eval()
    return history, best_epoch


# ---------------------------------------------------------------- (a) MLP over frozen embeddings
def train_mlp(
    features: np.ndarray,
    labels: Sequence[Any],
    *,
    client_features: np.ndarray | None = None,
    cfg: TrainConfig | None = None,
    device: str | None = None,
) -> TrainedClassifier:
    """Train the 3-layer MLP on synthetic embeddings; with client_features, add the CORAL term."""
    cfg = cfg or TrainConfig()
    dev = pick_device(device)
    _seed_everything(cfg.seed)
    classes, y = _encode_labels(labels)
    x = torch.as_tensor(np.asarray(features, dtype=np.float32), device=dev)
    yt = torch.as_tensor(y, device=dev)
    plan = validation_plan(len(y), len(classes), cfg)
    tr_idx, va_idx = _validation_split(y, plan.used, cfg.seed)
    xc = None
    if client_features is not None and len(client_features) >= 2:
        xc = torch.as_tensor(np.asarray(client_features, dtype=np.float32), device=dev)
    model = MlpHead(x.shape[1], cfg.hidden, len(classes), cfg.dropout).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ce = nn.CrossEntropyLoss()
    tr_t = torch.as_tensor(tr_idx, device=dev)

    def step(batch: np.ndarray, client_batch: np.ndarray | None) -> torch.Tensor:
        rows = tr_t[torch.as_tensor(batch, device=dev)]
        h = model.features(x[rows])
        loss = ce(model.out(h), yt[rows])
        if xc is not None and client_batch is not None and cfg.coral_weight > 0:
            h_client = model.features(xc[torch.as_tensor(client_batch, device=dev)])
            loss = loss + cfg.coral_weight * coral_loss(h, h_client)
        return loss

    evaluate_val = None
    if len(va_idx):
        va_t = torch.as_tensor(va_idx, device=dev)

        def evaluate_val() -> float:
            return float((model(x[va_t]).argmax(1) == yt[va_t]).float().mean())

    with _cpu_threads(dev):
        history, best_epoch = _train_loop(
            n_train=len(tr_idx), step=step, evaluate_val=evaluate_val, modules=model, optimizer=optimizer,
            cfg=cfg, n_client=0 if xc is None else len(xc), desc="mlp" + ("+coral" if xc is not None else ""),
        )
    return TrainedClassifier("mlp", classes, model, history, best_epoch, dev, plan)


def predict_mlp(clf: TrainedClassifier, features: np.ndarray, batch_size: int = 4096) -> list[Any]:
    """Predicted labels (the release's label values) for embedded documents."""
    x = np.asarray(features, dtype=np.float32)
    out: list[int] = []
    clf.model.eval()
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb = torch.as_tensor(x[i : i + batch_size], device=clf.device)
            out.extend(clf.model(xb).argmax(1).cpu().tolist())
    return [clf.classes[i] for i in out]


def hidden_features(clf: TrainedClassifier, features: np.ndarray) -> np.ndarray:
    """The MLP's last hidden layer (the CORAL-aligned features) for plotting or diagnostics."""
    with torch.no_grad():
        xb = torch.as_tensor(np.asarray(features, dtype=np.float32), device=clf.device)
        return clf.model.features(xb).cpu().numpy()


# ---------------------------------------------------------------- (b) fine-tuning end to end
class FineTuneClassifier(nn.Module):
    """A sentence-transformers encoder (pooled sentence embedding) composed with the 3-layer head."""

    def __init__(self, encoder: nn.Module, n_classes: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        dim_fn = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
        dim = dim_fn()
        self.head = MlpHead(dim, hidden, n_classes, dropout)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        device = next(self.parameters()).device
        feats = self.encoder.tokenize(list(texts))
        feats = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
        return self.encoder(feats)["sentence_embedding"]

    def features(self, texts: Sequence[str]) -> torch.Tensor:
        return self.head.features(self.embed(texts))

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        return self.head(self.embed(texts))


def train_finetune(
    texts: Sequence[str],
    labels: Sequence[Any],
    encoder: nn.Module,
    *,
    client_texts: Sequence[str] | None = None,
    cfg: TrainConfig | None = None,
    device: str | None = None,
) -> TrainedClassifier:
    """Fine-tune `encoder` (a SentenceTransformer; it is copied, never modified) with the 3-layer head.

    The encoder gets its own (small) learning rate; CORAL, when client texts are given, acts on the
    head's last hidden layer exactly as in `train_mlp`.
    """
    cfg = cfg or TrainConfig()
    dev = pick_device(device)
    _seed_everything(cfg.seed)
    classes, y = _encode_labels(labels)
    texts = [str(t) for t in texts]
    client = [str(t) for t in client_texts] if client_texts is not None and len(client_texts) >= 2 else None
    enc = copy.deepcopy(encoder)
    if hasattr(enc, "max_seq_length"):
        enc.max_seq_length = cfg.max_seq_length
    model = FineTuneClassifier(enc, len(classes), cfg.hidden, cfg.dropout).to(dev)
    optimizer = torch.optim.AdamW(
        [
            {"params": model.encoder.parameters(), "lr": cfg.encoder_lr},
            {"params": model.head.parameters(), "lr": cfg.lr},
        ],
        weight_decay=cfg.weight_decay,
    )
    ce = nn.CrossEntropyLoss()
    yt = torch.as_tensor(y, device=dev)
    plan = validation_plan(len(y), len(classes), cfg)
    tr_idx, va_idx = _validation_split(y, plan.used, cfg.seed)

    def step(batch: np.ndarray, client_batch: np.ndarray | None) -> torch.Tensor:
        rows = tr_idx[batch]
        h = model.features([texts[i] for i in rows])
        loss = ce(model.head.out(h), yt[torch.as_tensor(rows, device=dev)])
        if client is not None and client_batch is not None and cfg.coral_weight > 0:
            h_client = model.features([client[i] for i in client_batch])
            loss = loss + cfg.coral_weight * coral_loss(h, h_client)
        return loss

    evaluate_val = None
    if len(va_idx):
        def evaluate_val() -> float:
            preds = _predict_indices(model, [texts[i] for i in va_idx], cfg.batch_size)
            return float(np.mean(preds == y[va_idx]))

    history, best_epoch = _train_loop(
        n_train=len(tr_idx), step=step, evaluate_val=evaluate_val, modules=model, optimizer=optimizer,
        cfg=cfg, n_client=0 if client is None else len(client),
        desc="finetune" + ("+coral" if client is not None else ""),
    )
    return TrainedClassifier("finetune", classes, model, history, best_epoch, dev, plan)


def _predict_indices(model: FineTuneClassifier, texts: Sequence[str], batch_size: int) -> np.ndarray:
    out: list[int] = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            out.extend(model(list(texts[i : i + batch_size])).argmax(1).cpu().tolist())
    return np.asarray(out, dtype=np.int64)


def predict_finetune(clf: TrainedClassifier, texts: Sequence[str], batch_size: int = 64) -> list[Any]:
    clf.model.eval()
    idx = _predict_indices(clf.model, [str(t) for t in texts], batch_size)
    return [clf.classes[i] for i in idx]


# ---------------------------------------------------------------- independent check: TF-IDF + LR
def tfidf_logreg_predict(
    train_texts: Sequence[str], train_labels: Sequence[Any], test_texts: Sequence[str], *, seed: int = 0
) -> list[Any]:
    """scikit-learn TF-IDF (1-2 grams, sublinear tf) + multinomial logistic regression; no tuning."""
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, max_features=200_000)
    x_train = vectorizer.fit_transform([str(t) for t in train_texts])
    classes, y = _encode_labels(train_labels)
    if len(classes) < 2:
        return [classes[0]] * len(test_texts)
    model = LogisticRegression(max_iter=2000, C=10.0, random_state=seed)
    model.fit(x_train, y)
    pred = model.predict(vectorizer.transform([str(t) for t in test_texts]))
    return [classes[i] for i in pred]


# ---------------------------------------------------------------- the held-out test set
class HeldOutTestSet:
    """The client's real test set. Training code gets `texts` only; labels are read through
    `labels_for_scoring()`, which the evaluation calls once, after every model is trained.

    Keeping the labels behind one named method makes the rule checkable: tests wrap this method and
    assert that it is never called before training has finished and that permuting the labels leaves
    every prediction unchanged.
    """

    def __init__(self, texts: Sequence[str], labels: Sequence[Any]) -> None:
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} test texts but {len(labels)} labels")
        self.texts: list[str] = [str(t) for t in texts]
        self._labels = list(labels)

    def __len__(self) -> int:
        return len(self.texts)

    def labels_for_scoring(self) -> list[Any]:
        return list(self._labels)
