"""Private-evolution math: Aug-PE votes and selection, SecPE secrets, SecretNoise weights, SecretClustering, and
the round loop's public bookkeeping (prompts, call seeds, which candidates are documents).

Pure functions (numpy / torch / scipy / sklearn), no I/O, no Prefect, no logging of private values. Accounting
(sigma calibration, blow-up) lives in tasks/dp/accounting.py. The private statistics (votes, cluster counts and sums)
add up over disjoint parts of the corpus, which is how the flows compute them per work unit (tasks/pe/pe_units.py).

Privacy unit: one document; adjacent corpora differ by adding or removing one document.

Aug-PE (DP nearest-neighbour histogram). In a round every private document casts exactly one vote, for its
nearest synthetic sample (within its own class's population). Adding or removing one document therefore
changes the concatenated vote vector of all classes by one unit vector: L2 sensitivity 1. Gaussian noise
N(0, sigma^2) is added to every bin (including bins with no votes); thresholding and selection are
post-processing of the noisy histogram.

SecPE. Votes come from K noisy cluster centres instead of from every private document. Which documents may
move a centre is governed by SecretNoise (a linear program bounding, for every secret, the total weight of
the documents that hold it) and the noise sigma is calibrated to (p, r)-secret protection (accounting.py).
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import sparse

from privseed.tasks.dp import accounting
from privseed.tasks.errors import ConfigError
from privseed.tasks.dp.ledger import public_rng
from privseed.tasks.dp.mechanisms import GaussianMechanism, NoiseSource

if TYPE_CHECKING:
    from privseed.tasks.config.options import DocumentOptions

#: One LLM call: (system message or None, user message, call seed).
Prompt = tuple[str | None, str, int]


#: The per-round wall times of a PE run (the histogram step grows with |D|): under the operator's private state
#: folder, never in a release.
OPERATOR_TIMINGS = "operator/round-timings.json"


def evolution_call_plan(classes: int, population: int, variations: int, iterations: int) -> dict[str, int]:
    """LLM calls of a private-evolution run, from public settings only: per class, RANDOM_API writes the first
    N (K + 1) candidates and each of the T - 1 later rounds asks K variations of the N kept samples.
    Per released text that is 1 + T K calls (the number DP-KPS's best-of is matched to in Table 2 grids)."""
    if min(classes, population, variations, iterations) < 1:
        raise ConfigError("classes, population, variations and iterations must all be >= 1")
    random_api = classes * population * (variations + 1)
    variation_api = classes * (iterations - 1) * population * variations
    return {"random": random_api, "variation": variation_api, "total": random_api + variation_api}


# ----------------------------------------------------------------------------------------------------------
# Nearest-neighbour votes
# ----------------------------------------------------------------------------------------------------------


def _torch_device(device: str | None):
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def nearest_synthetic(private: np.ndarray, synthetic: np.ndarray, *, chunk_rows: int = 16384,
                      device: str | None = None) -> np.ndarray:
    """Index of the nearest synthetic row (Euclidean) for every private row, by chunked GEMM.

    argmin_j ||x - s_j||^2 = argmax_j (2 x.s_j - ||s_j||^2), so a chunk of B private rows against all M
    synthetic rows is one (B x d) @ (d x M) product; memory is O(B * M), never O(n * M). float32 products
    (float32 rounding only matters for exact ties, which are broken towards the lower index).
    """
    import torch

    private = np.asarray(private, dtype=np.float32)
    synthetic = np.asarray(synthetic, dtype=np.float32)
    if synthetic.ndim != 2 or synthetic.shape[0] == 0:
        raise ConfigError("nearest-neighbour voting needs at least one synthetic sample")
    if private.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if private.shape[1] != synthetic.shape[1]:
        raise ConfigError(f"embedding dimensions differ: private {private.shape[1]}, synthetic {synthetic.shape[1]}")
    dev = _torch_device(device)
    syn = torch.from_numpy(synthetic).to(dev)
    bias = (syn * syn).sum(dim=1)  # ||s_j||^2
    out = np.empty(private.shape[0], dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, private.shape[0], chunk_rows):
            block = torch.from_numpy(private[start:start + chunk_rows]).to(dev)
            scores = torch.addmm(bias.unsqueeze(0), block, syn.T, beta=-1.0, alpha=2.0)  # 2 x.s - ||s||^2
            out[start:start + block.shape[0]] = scores.argmax(dim=1).cpu().numpy()
    return out


def nearest_neighbour_votes(private: np.ndarray, synthetic: np.ndarray, *, chunk_rows: int = 16384,
                            device: str | None = None) -> np.ndarray:
    """Vote counts (int64, length M): every private row votes once for its nearest synthetic row.

    Sensitivity: adding or removing one private row changes the result by one unit vector (L2 norm 1).
    """
    nn = nearest_synthetic(private, synthetic, chunk_rows=chunk_rows, device=device)
    return np.bincount(nn, minlength=np.asarray(synthetic).shape[0]).astype(np.int64)


def naive_nearest_neighbour_votes(private: np.ndarray, synthetic: np.ndarray) -> np.ndarray:
    """Reference implementation: one distance vector per private document (what brute-force PE voting does).

    Used by tests (same answer as the GEMM version) and by benchmarks/bench_pe_histogram.py (speed).
    """
    private = np.asarray(private, dtype=np.float32)
    synthetic = np.asarray(synthetic, dtype=np.float32)
    counts = np.zeros(synthetic.shape[0], dtype=np.int64)
    for x in private:
        d = ((synthetic - x) ** 2).sum(axis=1)
        counts[int(np.argmin(d))] += 1
    return counts


def class_votes(private_emb: np.ndarray, private_labels: np.ndarray, synthetic_emb: np.ndarray,
                synthetic_labels: np.ndarray, *, chunk_rows: int = 16384, device: str | None = None) -> np.ndarray:
    """Votes over the whole candidate set, where private documents vote only within their class.

    Returns int64 counts aligned with ``synthetic_emb``. A private document whose class has no synthetic
    candidate casts no vote (so the sensitivity stays <= 1). Private labels are only compared, never reported.
    A candidate labelled -1 takes part in no class's vote (it receives noise only): how callers keep
    non-documents out of the vote without changing the histogram's shape.
    """
    private_labels = np.asarray(private_labels)
    synthetic_labels = np.asarray(synthetic_labels)
    votes = np.zeros(synthetic_emb.shape[0], dtype=np.int64)
    for label in np.unique(synthetic_labels):
        if label == -1:
            continue
        syn_idx = np.flatnonzero(synthetic_labels == label)
        priv_idx = np.flatnonzero(private_labels == label)
        if priv_idx.size == 0:
            continue
        votes[syn_idx] += nearest_neighbour_votes(private_emb[priv_idx], synthetic_emb[syn_idx],
                                                  chunk_rows=chunk_rows, device=device)
    return votes


def voting_classes(candidate_class: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """The class each candidate is voted for in (``class_votes``' synthetic labels): its own, or -1 for a
    candidate that is not a document, so that it takes no vote and the histogram keeps its shape."""
    return np.where(np.asarray(documents, dtype=bool), np.asarray(candidate_class), -1)


def vote_mechanism(sigma: float, epsilon: float, delta: float) -> GaussianMechanism:
    """One round's noisy vote histogram: votes + N(0, sigma^2) on every candidate.

    Sensitivity 1 in L2 under add/remove of one private document: the document casts one vote, for one
    candidate of its class (``class_votes``). ``epsilon`` and ``delta`` are what sigma was calibrated for over
    all T rounds by dp-accounting (privseed.tasks.dp.accounting); they are recorded with the mechanism."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ConfigError(f"noise multiplier must be a finite number > 0, got {sigma}")
    return GaussianMechanism(sensitivity=1.0, sigma=float(sigma), epsilon=float(epsilon), delta=float(delta))


def secpe_round_mechanism(sigma: float, epsilon: float, delta: float) -> GaussianMechanism:
    """One SecPE round's mechanism on a class's (sizes, centres) in noise units (``joint_statistics``): N(0, sigma^2)
    on every value. Sensitivity sqrt(2) in L2 (``accounting.SECPE_HOLDER_SHIFT``): a sampled document moves one size
    by 1 and one centre by at most one noise unit. ``epsilon`` and ``delta`` are the per-document DP epsilon of the
    T rounds with rho and sigma fixed, recorded with the mechanism."""
    return GaussianMechanism(sensitivity=accounting.SECPE_HOLDER_SHIFT, sigma=float(sigma), epsilon=float(epsilon),
                             delta=float(delta))


def apply_threshold(noisy: np.ndarray, threshold: float) -> np.ndarray:
    """Aug-PE's threshold H: bins with a noisy count below H become 0 (post-processing)."""
    noisy = np.asarray(noisy, dtype=np.float64)
    return np.where(noisy >= threshold, noisy, 0.0).clip(min=0.0)


def select_population(scores: np.ndarray, n: int, mode: str, rng: np.random.Generator,
                      eligible: np.ndarray | None = None) -> np.ndarray:
    """Pick n candidate indices from thresholded noisy scores.

    rank:   the n highest scores (ties towards the lower index), distinct candidates.
    sample: n draws with replacement in proportion to the scores (Aug-PE's original rule). If every score is
            0 (all votes thresholded away) the draw is uniform: the noisy histogram carried no signal.
    eligible: optional mask of candidates that are documents (``privseed.tasks.quality.is_document``, public). rank
    takes
            eligible candidates first and the others only to fill n; sample draws from the eligible ones when
            there are any.
    """
    scores = np.asarray(scores, dtype=np.float64)
    m = scores.shape[0]
    if n < 1 or m < 1:
        raise ConfigError(f"selection needs n >= 1 and at least one candidate, got n={n}, m={m}")
    ok = np.ones(m, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    if ok.shape != (m,):
        raise ConfigError(f"eligible mask has shape {ok.shape}, expected ({m},)")
    if mode == "rank":
        if n > m:
            raise ConfigError(f"rank selection of {n} from {m} candidates: the candidate pool is too small")
        order = np.lexsort((np.arange(m), -scores, ~ok))
        return np.sort(order[:n])
    if mode == "sample":
        pool = ok if ok.any() else np.ones(m, dtype=bool)
        weights = np.where(pool, scores, 0.0)
        total = weights.sum()
        probs = weights / total if total > 0 else pool / pool.sum()
        return np.sort(rng.choice(m, size=n, replace=True, p=probs))
    raise ConfigError(f"unknown selection mode {mode!r} (expected 'rank' or 'sample')")


# ----------------------------------------------------------------------------------------------------------
# Fill-in-the-blanks masking (VARIATION_API input); the text masked is synthetic, never private
# ----------------------------------------------------------------------------------------------------------

_WORD_RE = re.compile(r"\S+")


def mask_words(text: str, fraction: float, rng: np.random.Generator, blank: str = "_") -> str:
    """Replace a random fraction of the words of a *synthetic* text by a blank."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"mask fraction must lie in [0, 1), got {fraction}")
    words = _WORD_RE.findall(text)
    if not words:
        return text
    k = int(round(fraction * len(words)))
    if k == 0:
        return " ".join(words)
    idx = set(rng.choice(len(words), size=k, replace=False).tolist())
    return " ".join(blank if i in idx else w for i, w in enumerate(words))


# ----------------------------------------------------------------------------------------------------------
# SecPE: secrets
# ----------------------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[^\W_]+")


def quantile_secret_words(public_words: Sequence[str], quantile: float, count: int,
                          min_length: int = 3) -> list[str]:
    """Secrets "near a frequency quantile": ``count`` words around rank quantile * |list| of a public
    frequency-ranked word list (most frequent first). Depends on public data only."""
    if not 0.0 <= quantile <= 1.0:
        raise ConfigError(f"secret quantile must lie in [0, 1], got {quantile}")
    words = [w for w in public_words if w.isalpha() and len(w) >= min_length]
    if count < 1 or not words:
        raise ConfigError("secret word selection needs count >= 1 and a non-empty public word list")
    centre = int(round(quantile * (len(words) - 1)))
    lo = max(0, min(centre - count // 2, len(words) - count))
    return words[lo:lo + count]


def word_secret_incidence(texts: Sequence[str], secrets: Sequence[str]) -> sparse.csr_matrix:
    """Boolean (documents x secrets) matrix: document i holds secret j when the token appears in it."""
    index = {w.lower(): j for j, w in enumerate(secrets)}
    rows: list[int] = []
    cols: list[int] = []
    for i, text in enumerate(texts):
        found = {index[t] for t in _TOKEN_RE.findall(text.lower()) if t in index}
        rows.extend([i] * len(found))
        cols.extend(found)
    data = np.ones(len(rows), dtype=np.float64)
    return sparse.csr_matrix((data, (rows, cols)), shape=(len(texts), len(secrets)))


PII_ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IP_ADDRESS", "IBAN_CODE", "US_SSN", "URL")


def pii_secret_keys(texts: Sequence[str], entities: Sequence[str] = PII_ENTITIES,
                    score_threshold: float = 0.4) -> list[list[str]]:
    """PII secrets with Presidio's pattern recognizers (offline, no NLP model): per document, the keys
    ``TYPE\x00value`` of the PII values it holds, in the order found. Each distinct value is one secret (the value
    itself is what must not be reconstructed). Private: the keys hold the values."""
    recognizers = _presidio_pattern_recognizers(entities)
    out: list[list[str]] = []
    for text in texts:
        found: dict[str, None] = {}
        for rec in recognizers:
            for res in rec.analyze(text, entities=list(rec.supported_entities), nlp_artifacts=None) or []:
                if res.score >= score_threshold:
                    found.setdefault(f"{res.entity_type}\x00{text[res.start:res.end].strip().lower()}")
        out.append(list(found))
    return out


def incidence_from_keys(keys: Sequence[Sequence[Any]]) -> tuple[sparse.csr_matrix, list[Any]]:
    """(documents x secrets) incidence of per-document secret keys, a column per distinct key in the order the
    keys first appear; returns the matrix and the column keys."""
    columns: dict[Any, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    for i, held in enumerate(keys):
        for key in held:
            rows.append(i)
            cols.append(columns.setdefault(key, len(columns)))
    data = np.ones(len(rows), dtype=np.float64)
    return sparse.csr_matrix((data, (rows, cols)), shape=(len(keys), len(columns))), list(columns)


def pii_secret_incidence(texts: Sequence[str], entities: Sequence[str] = PII_ENTITIES,
                         score_threshold: float = 0.4) -> tuple[sparse.csr_matrix, list[str]]:
    """The (documents x secrets) incidence of ``pii_secret_keys`` and the secret *types* (never the values:
    they are private)."""
    incidence, keys = incidence_from_keys(pii_secret_keys(texts, entities, score_threshold))
    return incidence, [key.split("\x00", 1)[0] for key in keys]


def _presidio_pattern_recognizers(entities: Sequence[str]):
    try:
        from presidio_analyzer import predefined_recognizers as pr
    except ImportError as exc:  # pragma: no cover - depends on the optional install
        raise ConfigError("PII secrets need presidio-analyzer (pip install 'privseed[pii]')") from exc
    import tldextract

    # The e-mail recognizer validates domains with tldextract, whose default extractor fetches the public
    # suffix list over the network; use the snapshot shipped inside the package instead (offline, no delay).
    if tldextract.tldextract.TLD_EXTRACTOR.suffix_list_urls:
        tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    by_entity = {
        "EMAIL_ADDRESS": "EmailRecognizer", "PHONE_NUMBER": "PhoneRecognizer", "CREDIT_CARD": "CreditCardRecognizer",
        "IP_ADDRESS": "IpRecognizer", "IBAN_CODE": "IbanRecognizer", "US_SSN": "UsSsnRecognizer",
        "URL": "UrlRecognizer",
    }
    out = []
    for e in entities:
        if e not in by_entity:
            raise ConfigError(f"unknown PII entity {e!r}; known: {sorted(by_entity)}")
        out.append(getattr(pr, by_entity[e])())
    return out


def file_secret_incidence(texts: Sequence[str], secret_terms: Sequence[str]) -> sparse.csr_matrix:
    """Secrets from a user file: each line a (possibly multi-word) term, matched on token boundaries."""
    keys = [tuple(_TOKEN_RE.findall(t.lower())) for t in secret_terms]
    keys = [k for k in keys if k]
    if not keys:
        raise ConfigError("the secrets file has no usable terms")
    single = {k[0]: j for j, k in enumerate(keys) if len(k) == 1}
    multi = [(j, k) for j, k in enumerate(keys) if len(k) > 1]
    rows: list[int] = []
    cols: list[int] = []
    for i, text in enumerate(texts):
        toks = _TOKEN_RE.findall(text.lower())
        found = {single[t] for t in toks if t in single}
        if multi:
            joined = " " + " ".join(toks) + " "
            found.update(j for j, k in multi if " " + " ".join(k) + " " in joined)
        rows.extend([i] * len(found))
        cols.extend(found)
    data = np.ones(len(rows), dtype=np.float64)
    return sparse.csr_matrix((data, (rows, cols)), shape=(len(texts), len(keys)))


# ----------------------------------------------------------------------------------------------------------
# SecPE: SecretNoise (Algorithm 1, the linear program)
# ----------------------------------------------------------------------------------------------------------


def secret_weights_lp(incidence: sparse.spmatrix, eta: Sequence[float] | float) -> np.ndarray:
    """Solve max sum_i w_i s.t. sum_{i holds j} w_i <= eta_j for every secret j, 0 <= w_i <= 1 (LP (6)).

    scipy.optimize.linprog with HiGHS on the sparse constraint matrix. Documents holding no secret get w = 1.
    """
    from scipy.optimize import linprog

    inc = sparse.csr_matrix(incidence, dtype=np.float64)
    n, m = inc.shape
    eta_arr = np.broadcast_to(np.asarray(eta, dtype=np.float64), (m,)).copy()
    if np.any(eta_arr < 0):
        raise ConfigError("secret capacities eta_j must be >= 0")
    w = np.ones(n)
    holders = np.flatnonzero(np.asarray(inc.sum(axis=1)).ravel() > 0)
    if holders.size == 0 or m == 0:
        return w
    sub = inc[holders].T.tocsr()  # (secrets x holders)
    active = np.flatnonzero(np.asarray(sub.sum(axis=1)).ravel() > 0)
    res = linprog(c=-np.ones(holders.size), A_ub=sub[active], b_ub=eta_arr[active],
                  bounds=(0.0, 1.0), method="highs")
    if res.status != 0:
        raise ConfigError(f"the SecretNoise linear program failed: {res.message}")
    # HiGHS may overshoot a bound by ~1e-9; clip and rescale so every capacity holds exactly.
    x = np.clip(res.x, 0.0, 1.0)
    load = sub[active] @ x
    over = load > eta_arr[active]
    if np.any(over):
        scale = np.ones(holders.size)
        for j in np.flatnonzero(over):
            cols = sub[active][j].indices
            scale[cols] = np.minimum(scale[cols], eta_arr[active][j] / load[j])
        x = x * scale
    w[holders] = x
    return w


def sampling_probabilities(w: np.ndarray, normalization: str = "max") -> np.ndarray:
    """rho_i from the LP weights.

    "paper": rho_i = w_i / (max w * sum w), Algorithm 1 line 4 as printed; the expected number of sampled
             documents per round is then 1 / max w (about one document).
    "max":   rho_i = w_i / max w (the HUSH reading: weights are inclusion probabilities, the largest is 1).
    Either is valid for the guarantee, because sigma is calibrated on the rho actually used.
    """
    w = np.asarray(w, dtype=np.float64)
    wmax = float(w.max()) if w.size else 0.0
    if wmax <= 0:
        return np.zeros_like(w)
    if normalization == "paper":
        return w / (wmax * float(w.sum()))
    if normalization == "max":
        return w / wmax
    raise ConfigError(f"unknown rho normalization {normalization!r} (expected 'max' or 'paper')")


def holder_probabilities(incidence: sparse.spmatrix, rho: np.ndarray) -> list[np.ndarray]:
    """For every secret j, the sampling probabilities of the documents holding it."""
    csc = sparse.csc_matrix(incidence)
    return [rho[csc.indices[csc.indptr[j]:csc.indptr[j + 1]]] for j in range(csc.shape[1])]


@dataclass(frozen=True)
class SecPeNoise:
    """SecretNoise's outcome. ``rho`` and ``worst_blow_up`` are functions of the private secret incidence: they
    stay in memory (neither is logged or written). ``sigma`` is the public ``--noise-multiplier`` and
    ``protection`` holds only values of the public configuration: those two are what the ledger and
    evolution.json publish (issue 30: a sigma calibrated on the incidence is never released)."""

    sigma: float
    rho: np.ndarray
    worst_blow_up: float
    protection: dict


@dataclass(frozen=True)
class SecretProtection:
    """SecPE's public target and how it is checked, values of the configuration only: the adversary's prior
    success ``p``, r = min(1, p ``r_over_p``) the bound on its reconstruction success, over ``rounds`` (T) noisy
    rounds; ``rho_norm``: how the LP weights become sampling probabilities (:func:`sampling_probabilities`);
    ``value_discretization``: the PLD accountant's interval."""

    p: float
    r_over_p: float
    rounds: int
    rho_norm: str = "max"
    value_discretization: float = 1e-2

    @property
    def r(self) -> float:
        return min(1.0, self.p * self.r_over_p)


def _secret_budget(protection: SecretProtection, incidence: sparse.spmatrix
                   ) -> tuple[float | None, list[np.ndarray], np.ndarray]:
    """eta, the holders' sampling probabilities per secret and rho (the last two private)."""
    eta: float | None
    if protection.r < 1.0:
        eta = accounting.gdp_mu_for_secret(protection.p, protection.r)
        weights = secret_weights_lp(incidence, eta)
    else:
        # r = 1 asks for no protection: no capacity constraint, every document weighs 1. (The capacity is not
        # replaced by a number such as |D|: nothing released may depend on the corpus size.)
        eta = None
        weights = np.ones(incidence.shape[0])
    rho = sampling_probabilities(weights, protection.rho_norm)
    return eta, holder_probabilities(incidence, rho), rho


def secpe_noise(protection: SecretProtection, sigma: float | None, incidence: sparse.spmatrix) -> SecPeNoise:
    """SecretNoise with a public sigma: LP weights -> rho, and a check that ``sigma`` (``--noise-multiplier``)
    meets (p, r) for every detected secret on the blow-up of the round's joint (sizes, centres) mechanism (one
    Bernoulli draw drives both: a sampled holder shifts it by sqrt(2)) composed T times. A sigma that falls short is
    refused; the exact bound is private and not shown. Nothing released depends on the incidence but through the
    noisy rounds (sigma is the owner's; ``advise_secpe_sigma`` is the data-calibrated advice, never released)."""
    if sigma is None:
        raise ConfigError("SecPE releases need a public noise level: give --noise-multiplier SIGMA "
                          "(--advise-sigma prints what the corpus's secrets need, for the owner only)")
    r = protection.r
    eta, holders, rho = _secret_budget(protection, incidence)
    sigma = float(sigma)
    worst = max((accounting.secret_blow_up(sigma, h, protection.p, protection.rounds,
                                           protection.value_discretization)
                 for h in holders), default=protection.p)
    if worst > r:
        # The exact bound is a function of the private secret incidence: it is not put in the message.
        raise ConfigError(f"--noise-multiplier {sigma:g} gives a reconstruction bound above r = {r:.3g} for at "
                          "least one detected secret; raise it (--advise-sigma prints what the corpus needs)")
    record = {
        "p": protection.p, "r": r, "eta": eta if eta is not None else "none (r = 1: no capacity constraint)",
        "rounds": protection.rounds, "holder_shift_l2": accounting.SECPE_HOLDER_SHIFT,
        "adjacency": accounting.SECPE_ADJACENCY,
        "calibration": "B(p) <= r checked for every detected secret, B the blow-up of sum_k P(S=k) N(sqrt(2) k, "
                       "sigma^2) vs N(0, sigma^2) composed T times (dp-accounting PLD, pessimistic, "
                       f"value_discretization_interval {protection.value_discretization:g})",
        "sigma_source": "config (public --noise-multiplier)"}
    return SecPeNoise(sigma, rho, float(worst), record)


#: The data-calibrated sigma is advice, rounded up to a multiple of this, so that most adjacent corpora get the
#: same number (it is still a function of the private data: the owner decides whether to use it).
ADVICE_STEP = 0.5


def advise_secpe_sigma(protection: SecretProtection, incidence: sparse.spmatrix) -> float:
    """``--advise-sigma``: SecPE's Algorithm 1, line 6 (the smallest sigma with B_j(p) <= r for every detected
    secret j) rounded up to ``ADVICE_STEP``. A function of the private secret incidence (with ``--rho-norm paper``
    of |D| too): printed for the owner, never logged to a release, written or charged."""
    _, holders, _ = _secret_budget(protection, incidence)
    cal = accounting.calibrate_secret_sigma(holders, protection.p, protection.r, protection.rounds,
                                            protection.value_discretization)
    return float(math.ceil(cal.sigma / ADVICE_STEP) * ADVICE_STEP) if cal.sigma > 0 else 0.0


def lone_holder_sigma(protection: SecretProtection) -> float:
    """The sigma a secret held by one document needs at (p, r, T), from the configuration alone (public): its LP
    weight is min(1, eta), so its rho is min(1, eta) under ``--rho-norm max``. A corpus whose secrets have more
    holders may need more; the run checks. (Under ``--rho-norm paper`` rho depends on |D|: no public figure.)"""
    if protection.r >= 1.0:
        return 0.0
    rho = min(1.0, accounting.gdp_mu_for_secret(protection.p, protection.r))
    return accounting.calibrate_secret_sigma([np.array([rho])], protection.p, protection.r, protection.rounds,
                                             protection.value_discretization).sigma


# ----------------------------------------------------------------------------------------------------------
# SecPE: SecretClustering (Algorithm 2) and cluster votes (Algorithm 3)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicClusters:
    centres: np.ndarray  # (K, d) float64, public k-means centres
    sizes: np.ndarray    # (K,) int64, public cluster sizes n_k (>= 1)


def public_kmeans(public_emb: np.ndarray, k: int, seed: int) -> PublicClusters:
    """k-means on the public corpus (no privacy cost). Empty clusters are dropped so every n_k >= 1."""
    from sklearn.cluster import KMeans

    public_emb = np.asarray(public_emb, dtype=np.float64)
    if k < 1 or public_emb.shape[0] < k:
        raise ConfigError(f"k-means needs 1 <= K <= |public| (K={k}, |public|={public_emb.shape[0]})")
    km = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(public_emb)
    sizes = np.bincount(km.labels_, minlength=k)
    keep = sizes > 0
    return PublicClusters(km.cluster_centers_[keep], sizes[keep].astype(np.int64))


def clip_rows(x: np.ndarray, radius: float) -> np.ndarray:
    """Clip_R: scale every row to L2 norm at most R."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, radius / np.maximum(norms, 1e-300))


def centre_noise_scales(clusters: PublicClusters, radius: float) -> np.ndarray:
    """c_k: how far one document can move the centre of cluster k, the unit of that centre's noise.

    Adding a document with clipped embedding x (||x|| <= R) to cluster k moves its centre from c to
    c + (x - c) / (N + 1), where N >= n_k counts the public points and the other sampled documents. c is a convex
    combination of the public centre e_k and clipped documents, so ||c|| <= max(R, ||e_k||) and the move is at
    most (R + max(R, ||e_k||)) / n_k. That is the paper's 2R / n_k when ||e_k|| <= R, but public centres are
    means of unit vectors, so for R < 1 the paper's bound fails; this one holds for every R."""
    if not radius > 0 or not math.isfinite(radius):
        raise ConfigError(f"clipping radius must be a finite number > 0, got {radius}")
    norms = np.linalg.norm(clusters.centres, axis=1)
    return (radius + np.maximum(radius, norms)) / clusters.sizes.astype(np.float64)


@dataclass(frozen=True)
class ClusterSums:
    """SecretClustering's private input, per class and public cluster: how many sampled private points joined the
    cluster (``counts``, (C, K)) and the sum of their clipped embeddings (``sums``, (C, K, d)). The parts of
    disjoint slices of the corpus add up (``+``): that is how the work units' parts are reduced before the noise.
    Private: only the round mechanism may release what is made of it."""

    counts: np.ndarray
    sums: np.ndarray

    def __add__(self, other: ClusterSums) -> ClusterSums:
        return ClusterSums(self.counts + other.counts, self.sums + other.sums)


def cluster_sums(clusters: PublicClusters, private_emb: np.ndarray, private_class: np.ndarray, sampled: np.ndarray,
                 *, radius: float, classes: int) -> ClusterSums:
    """The sampled private points, clipped to R, each joined to its nearest public centre and summed per (class,
    cluster); ``private_class`` holds class indices 0..classes-1."""
    private_emb = np.asarray(private_emb)
    sampled = np.asarray(sampled, dtype=bool)
    if sampled.shape != (private_emb.shape[0],):
        raise ConfigError(f"sampling mask has shape {sampled.shape}, expected ({private_emb.shape[0]},)")
    k, d = clusters.centres.shape
    chosen = clip_rows(private_emb[sampled], radius) if sampled.any() else np.zeros((0, d))
    counts = np.zeros(classes * k, dtype=np.int64)
    sums = np.zeros((classes * k, d), dtype=np.float64)
    if chosen.shape[0]:
        cell = np.asarray(private_class, dtype=np.int64)[sampled] * k + nearest_synthetic(chosen, clusters.centres)
        counts = np.bincount(cell, minlength=classes * k).astype(np.int64)
        members = sparse.csr_matrix((np.ones(cell.size), (cell, np.arange(cell.size))), shape=(classes * k, cell.size))
        sums = np.asarray(members @ chosen)
    return ClusterSums(counts.reshape(classes, k), sums.reshape(classes, k, d))


def clustering_from_sums(clusters: PublicClusters, counts: np.ndarray, sums: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """One class's (centres (K, d), sizes (K,)) once its sampled points joined the public clusters: centre k is
    (n_k e_k + the sum of its m_k points) / (n_k + m_k), size k is n_k + m_k."""
    sizes = (clusters.sizes + np.asarray(counts)).astype(np.float64)
    return (clusters.centres * clusters.sizes[:, None] + np.asarray(sums)) / sizes[:, None], sizes


def secret_clustering_exact(clusters: PublicClusters, private_emb: np.ndarray, sampled: np.ndarray, *,
                            radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2 before noise: (centres (K, d), sizes (K,)) after the sampled private points, clipped to R, join
    their nearest public centre. Private: only ``secret_clustering`` (which adds the noise) may release it."""
    one_class = np.zeros(np.asarray(private_emb).shape[0], dtype=np.int64)
    part = cluster_sums(clusters, private_emb, one_class, sampled, radius=radius, classes=1)
    return clustering_from_sums(clusters, part.counts[0], part.sums[0])


def joint_statistics(centres: np.ndarray, sizes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """One round's (sizes, centres) as one vector in noise units: sizes as they are (one document moves one size
    by 1), centre k divided by c_k (one document moves it by at most 1). One document moves this vector by at most
    sqrt(2) in L2, S sampled holders of a secret by at most sqrt(2) S."""
    return np.concatenate([np.asarray(sizes, dtype=np.float64),
                           (np.asarray(centres, dtype=np.float64) / np.asarray(scales)[:, None]).ravel()])


def split_joint_statistics(joint: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``joint_statistics``: (centres (K, d), sizes (K,))."""
    k = np.asarray(scales).shape[0]
    joint = np.asarray(joint, dtype=np.float64)
    if (joint.size - k) % k:
        raise ConfigError(f"a joint vector of {joint.size} values does not hold {k} sizes and {k} centres")
    return joint[k:].reshape(k, -1) * np.asarray(scales)[:, None], joint[:k].copy()


def sampled_joint_statistics(clusters: PublicClusters, private_emb: np.ndarray, rho: np.ndarray, *, radius: float,
                             sampling: NoiseSource) -> np.ndarray:
    """The exact input of one round's Gaussian mechanism: every private point joins with probability rho_i
    (``sampling.bernoulli``: the OS CSPRNG by default; the mask is private and never returned or stored), then
    ``secret_clustering_exact`` and ``joint_statistics``. Private: release it only through the mechanism."""
    sampled = sampling.bernoulli(np.asarray(rho, dtype=np.float64))
    centres, sizes = secret_clustering_exact(clusters, private_emb, sampled, radius=radius)
    return joint_statistics(centres, sizes, centre_noise_scales(clusters, radius))


def secret_clustering(clusters: PublicClusters, private_emb: np.ndarray, rho: np.ndarray, *, radius: float,
                      mechanism: GaussianMechanism, sampling: NoiseSource, noise: NoiseSource
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2: noisy centres and sizes of one round (one class).

    Each private point joins with probability rho_i, is clipped to radius R and added to its nearest public
    centre. The sizes and the centres, in noise units (``joint_statistics``), go through ``mechanism`` (a Gaussian
    mechanism with noise multiplier sigma) as ONE vector: released n~_k = n_k + m_k + N(0, sigma^2) and
    e~_k = (n_k e_k + sum ê_i) / (n_k + m_k) + c_k N(0, sigma^2 I), c_k from ``centre_noise_scales``.
    Guarantee ((p, r)-secret protection): a secret whose holders are sampled S times moves the joint vector by at
    most sqrt(2) S, which is what accounting.calibrate_secret_sigma calibrates sigma for.
    The flow runs the same two steps through ``PrivacyLedger.draw_once`` (exact = ``sampled_joint_statistics``,
    post-processing = ``split_joint_statistics``). Returns (noisy centres (K, d), noisy sizes (K,))."""
    exact = sampled_joint_statistics(clusters, private_emb, rho, radius=radius, sampling=sampling)
    return split_joint_statistics(mechanism.release(exact, noise), centre_noise_scales(clusters, radius))


def cluster_votes(noisy_centres: np.ndarray, noisy_sizes: np.ndarray, synthetic_emb: np.ndarray, *,
                  radius: float = 1.0) -> np.ndarray:
    """Algorithm 3 lines 6-11: each noisy centre adds its noisy size to its nearest (clipped) synthetic sample.
    Post-processing of the released centres and sizes."""
    syn = clip_rows(synthetic_emb, radius)
    nearest = nearest_synthetic(noisy_centres, syn)
    hist = np.zeros(syn.shape[0], dtype=np.float64)
    np.add.at(hist, nearest, np.asarray(noisy_sizes, dtype=np.float64))
    return hist



# ----------------------------------------------------------------------------------------------------------
# Candidates: which class, which are documents, and the prompts that write them (public text only)
# ----------------------------------------------------------------------------------------------------------


def class_index(labels: Sequence[Any], values: Iterable[Any]) -> np.ndarray:
    """Index in ``labels`` (the declared label set) of every value, compared as text."""
    index = {str(label): i for i, label in enumerate(labels)}
    try:
        return np.array([index[str(v)] for v in values], dtype=np.int64)
    except KeyError:
        # Which label, and how many rows carry it, is deliberately not said (docs/privacy.md).
        raise ConfigError("a row carries a label that is not in the declared label set") from None


def candidate_documents(options: DocumentOptions, min_words: int, candidates: pd.DataFrame) -> np.ndarray:
    """Which candidates are documents (privseed.tasks.quality.is_document, with the run's document test and at least
    ``min_words`` words): a failed or degenerate LLM answer ("Lullaby.", a prompt echo) would otherwise collect votes
    and end up in the release, where the gate rejects it."""
    from privseed.tasks.quality import DocumentRules, is_document

    rules = DocumentRules(min_words=min_words, language=options.language).with_settings(options.document_rules)
    return np.array([is_document(t, rules=rules) for t in candidates["text"]], dtype=bool)


def candidate_digest(candidates: pd.DataFrame) -> str:
    """sha256 of the candidates' (label, text) pairs: what a round's histogram was drawn over."""
    h = hashlib.sha256()
    for text, label in zip(candidates["text"], candidates["label"]):
        h.update(f"{label!r}\x1f{text}\x1e".encode())
    return h.hexdigest()


def call_seed(seed: int, *names: str) -> int:
    """The seed of one LLM call, from the public ``--seed`` and the call's place in the run."""
    return int(public_rng(seed, "llm-call", *names).integers(0, 2**31 - 1))


def random_prompts(labels: Sequence[Any], per_class: int, *, seed: int, doc_type: str,
                   words: Sequence[str] | None = None, words_per_prompt: int = 0) -> tuple[list[Prompt], pd.DataFrame]:
    """RANDOM_API: ``per_class`` unconditional prompts per class (with ``words_per_prompt`` random words of the
    released vocabulary V~ each, for AugPE+V~), and a row of metadata per prompt (label, seed, version, origin).
    Every class gets the same prompt text; only the call seeds differ."""
    template = load_pe_template("pe_random_words" if words else "pe_random")
    prompts, rows = [], []
    for ci, label in enumerate(labels):
        for i in range(per_class):
            call = call_seed(seed, "random", str(ci), str(i))
            values = {"doc_type": doc_type}
            if words:
                pick = public_rng(seed, "pe-words", str(ci), str(i)).choice(
                    len(words), size=min(words_per_prompt, len(words)), replace=False)
                values["words"] = ", ".join(words[j] for j in pick)
            system, user = template.render(**values)
            prompts.append((system, user, call))
            rows.append({"label": label, "seed": call, "prompt_version": template.version, "origin": "random"})
    return prompts, pd.DataFrame(rows)


def variation_prompts(kept: pd.DataFrame, round_index: int, *, seed: int, doc_type: str, variations: int,
                      variation: str, mask_fraction: float) -> tuple[list[Prompt], pd.DataFrame]:
    """VARIATION_API: K (``variations``) paraphrase or fill-in-the-blanks prompts per kept (synthetic) sample, and
    their metadata; ``seed`` is the run's public seed."""
    paraphrase, fill = load_pe_template("pe_paraphrase"), load_pe_template("pe_fill_blanks")
    prompts, rows = [], []
    for slot, (text, label) in enumerate(zip(kept["text"], kept["label"])):
        for k in range(variations):
            use_fill = variation == "fill-blanks" or (variation == "mixed" and k % 2 == 1)
            call = call_seed(seed, "variation", str(round_index), str(slot), str(k))
            if use_fill:
                masked = mask_words(text, mask_fraction,
                                    public_rng(seed, "mask", str(round_index), str(slot), str(k)))
                system, user = fill.render(doc_type=doc_type, text=masked)
                version = fill.version
            else:
                system, user = paraphrase.render(doc_type=doc_type, text=text)
                version = paraphrase.version
            prompts.append((system, user, call))
            rows.append({"label": label, "seed": call, "prompt_version": version, "origin": f"variation-{round_index}"})
    return prompts, pd.DataFrame(rows)


def select_per_class(scores: np.ndarray, candidate_class: np.ndarray, documents: np.ndarray, classes: int, n: int,
                     mode: str, seed: int, *stream: str) -> np.ndarray:
    """``select_population`` within each class's candidates (public randomness ``stream`` + class index);
    returns the kept candidates' indices, class by class."""
    keep: list[int] = []
    for ci in range(classes):
        idx = np.flatnonzero(candidate_class == ci)
        chosen = select_population(scores[idx], n, mode, public_rng(seed, *stream, str(ci)), documents[idx])
        keep.extend(idx[chosen].tolist())
    return np.asarray(keep, dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------
# RANDOM_API / VARIATION_API prompt templates (tasks/llm/prompts/pe_*.txt)
# ----------------------------------------------------------------------------------------------------------

PROMPT_DIR = __import__("pathlib").Path(__file__).resolve().parents[1] / "llm" / "prompts"


@dataclass(frozen=True)
class PeTemplate:
    """A PE prompt file: optional system message and a user message with {placeholders}.

    ``version`` is the file name plus a hash of its content, so a changed prompt never reuses cached calls
    or gets mistaken for the old one in an output row."""

    name: str
    system: str | None
    user: str
    version: str

    def render(self, **values: str) -> tuple[str | None, str]:
        system = self.system.format(**values) if self.system else None
        return system, self.user.format(**values)


def load_pe_template(name: str) -> PeTemplate:
    path = PROMPT_DIR / f"{name}.txt"
    if not path.exists():
        raise ConfigError(f"no prompt template {name!r} in {PROMPT_DIR}")
    text = path.read_text(encoding="utf-8")
    system: list[str] | None = None
    user: list[str] | None = None
    current: list[str] | None = None
    for line in text.splitlines():
        if current is None and (line.startswith("#") or not line.strip()):
            continue
        if line.startswith("system:"):
            system = [line[len("system:"):].strip()]
            current = system
        elif line.startswith("user:"):
            user = [line[len("user:"):].strip()]
            current = user
        elif current is not None:
            current.append(line)
    if user is None:
        raise ConfigError(f"prompt template {name!r} has no 'user:' message")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return PeTemplate(name, "\n".join(system).strip() if system else None, "\n".join(user).strip(),
                      f"{name}@{digest}")
