"""Aug-PE / SecPE math: votes, sensitivity, selection, secrets, the SecretNoise LP, SecretClustering."""

import numpy as np
import pytest
from scipy import sparse

from privseed.tasks.pe import evolution as ev
from privseed.tasks.errors import ConfigError
from tests.noise_checks import assert_noise_is


def _unit(rng, n, d):
    x = rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_gemm_votes_equal_naive_votes():
    rng = np.random.default_rng(0)
    private, synthetic = _unit(rng, 700, 16), _unit(rng, 37, 16)
    fast = ev.nearest_neighbour_votes(private, synthetic, chunk_rows=64)  # several chunks
    assert fast.tolist() == ev.naive_nearest_neighbour_votes(private, synthetic).tolist()
    assert fast.sum() == 700  # every document votes exactly once


def test_votes_use_euclidean_distance_for_unnormalised_vectors():
    synthetic = np.array([[10.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    private = np.array([[1.2, 0.0]], dtype=np.float32)  # inner product prefers row 0, distance prefers row 1
    assert ev.nearest_neighbour_votes(private, synthetic).tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_one_document_changes_each_rounds_votes_by_at_most_l2_one(seed):
    rng = np.random.default_rng(seed)
    n, m, classes = 300, 24, 3
    private, labels = _unit(rng, n, 8), rng.integers(0, classes, size=n)
    synthetic, syn_labels = _unit(rng, m, 8), np.repeat(np.arange(classes), m // classes)
    full = ev.class_votes(private, labels, synthetic, syn_labels)
    for drop in rng.choice(n, size=20, replace=False):
        keep = np.arange(n) != drop
        neighbour = ev.class_votes(private[keep], labels[keep], synthetic, syn_labels)
        diff = (full - neighbour).astype(float)
        assert np.linalg.norm(diff) == pytest.approx(1.0)  # exactly one unit vector: remove one document
        assert np.abs(diff).sum() == 1
    # an adversarial duplicate of an existing document, and a document of a class with no candidates
    extra = ev.class_votes(np.vstack([private, private[:1]]), np.append(labels, labels[0]), synthetic, syn_labels)
    assert np.linalg.norm((extra - full).astype(float)) == pytest.approx(1.0)
    orphan = ev.class_votes(np.vstack([private, private[:1]]), np.append(labels, 99), synthetic, syn_labels)
    assert np.linalg.norm((orphan - full).astype(float)) <= 1.0


def test_votes_stay_within_class():
    rng = np.random.default_rng(1)
    private = _unit(rng, 50, 4)
    synthetic = np.vstack([private[:5], private[5:10]])  # class 1's candidates are identical to class 0 docs
    syn_labels = np.array([0] * 5 + [1] * 5)
    votes = ev.class_votes(private[:5], np.zeros(5, int), synthetic, syn_labels)
    assert votes[:5].tolist() == [1] * 5 and votes[5:].sum() == 0


def test_vote_mechanism_adds_sigma_on_sensitivity_one():
    from privseed.tasks.dp.mechanisms import secure_noise

    mech = ev.vote_mechanism(3.0, epsilon=4.0, delta=1e-5)
    assert (mech.sensitivity, mech.sigma, mech.epsilon, mech.delta) == (1.0, 3.0, 4.0, 1e-5)
    noisy = mech.release(np.zeros(20000), secure_noise())
    assert_noise_is(noisy, "gaussian", 3.0)
    with pytest.raises(ConfigError):
        ev.vote_mechanism(0.0, epsilon=1.0, delta=1e-5)


def test_threshold_and_rank_selection():
    scores = ev.apply_threshold(np.array([5.0, -1.0, 2.0, 7.0, 1.9]), 2.0)
    assert scores.tolist() == [5.0, 0.0, 2.0, 7.0, 0.0]
    assert ev.select_population(scores, 2, "rank", np.random.default_rng(0)).tolist() == [0, 3]
    with pytest.raises(ConfigError):
        ev.select_population(scores, 9, "rank", np.random.default_rng(0))


def test_sample_selection_is_proportional_and_uniform_without_signal():
    rng = np.random.default_rng(3)
    picks = ev.select_population(np.array([0.0, 1.0, 3.0]), 40000, "sample", rng)
    freq = np.bincount(picks, minlength=3) / picks.size
    assert freq == pytest.approx([0.0, 0.25, 0.75], abs=0.01)
    flat = np.bincount(ev.select_population(np.zeros(4), 40000, "sample", rng), minlength=4) / 40000
    assert flat == pytest.approx([0.25] * 4, abs=0.01)


def test_mask_words():
    rng = np.random.default_rng(0)
    out = ev.mask_words("a b c d e f g h i j", 0.3, rng)
    assert out.split().count("_") == 3 and len(out.split()) == 10


def test_quantile_secret_words_and_incidence():
    words = [f"w{i}" for i in range(10)] + ["apple", "banana", "cherry", "damson", "elder", "fig", "grape"]
    secrets = ev.quantile_secret_words(words, 0.5, 3)
    assert secrets == ["cherry", "damson", "elder"]  # centred on the median of the alphabetic words (w0.. skipped)
    inc = ev.word_secret_incidence(["Cherry bread.", "damson, cherry", "nothing"], secrets)
    assert inc.toarray().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 0]]


def test_file_secrets_match_multiword_terms():
    inc = ev.file_secret_incidence(["Heart failure, congestive.", "congestive heart failure here"],
                                   ["congestive heart failure", "here"])
    assert inc.toarray().tolist() == [[0, 0], [1, 1]]


def test_pii_secrets_with_presidio_offline():
    texts = ["Write to jane.roe@example.org today.", "nothing to see", "JANE.ROE@example.org or 192.168.0.7"]
    inc, types = ev.pii_secret_incidence(texts, entities=("EMAIL_ADDRESS", "IP_ADDRESS"))
    dense = inc.toarray()
    email = types.index("EMAIL_ADDRESS")
    assert dense[:, email].tolist() == [1, 0, 1]  # the same address (case-folded) is one secret
    assert "IP_ADDRESS" in types and dense[1].sum() == 0


@pytest.mark.parametrize("seed", range(4))
def test_lp_respects_every_secret_capacity(seed):
    rng = np.random.default_rng(seed)
    n, m = 400, 30
    inc = sparse.random(n, m, density=0.03, random_state=seed, format="csr")
    inc.data[:] = 1.0
    eta = rng.uniform(0.2, 2.0, size=m)
    w = ev.secret_weights_lp(inc, eta)
    assert np.all((w >= 0) & (w <= 1))
    load = inc.T @ w
    assert np.all(load <= eta + 1e-12)
    free = np.asarray(inc.sum(axis=1)).ravel() == 0
    assert np.all(w[free] == 1.0)  # documents with no secret are unconstrained
    # optimality against a feasible alternative: uniform scaling to the tightest capacity
    holders = ~free
    per_doc_cap = np.array([min(eta[inc[i].indices] / np.maximum(1, (inc.T @ holders.astype(float))[inc[i].indices]))
                            if holders[i] else 1.0 for i in range(n)])
    alt = np.where(holders, np.minimum(1.0, per_doc_cap), 1.0)
    if np.all(inc.T @ alt <= eta + 1e-12):
        assert w.sum() >= alt.sum() - 1e-6


def test_sampling_probabilities():
    w = np.array([1.0, 0.5, 0.25, 0.25])
    assert ev.sampling_probabilities(w, "max").tolist() == [1.0, 0.5, 0.25, 0.25]
    assert ev.sampling_probabilities(w, "paper") == pytest.approx(w / 2.0)
    assert ev.sampling_probabilities(w, "paper").sum() == pytest.approx(1.0)  # ~one document per round
    with pytest.raises(ConfigError):
        ev.sampling_probabilities(w, "other")


def test_holder_probabilities():
    inc = sparse.csr_matrix(np.array([[1, 0], [1, 1], [0, 0]], dtype=float))
    rho = np.array([0.1, 0.2, 0.3])
    hp = ev.holder_probabilities(inc, rho)
    assert hp[0].tolist() == [0.1, 0.2] and hp[1].tolist() == [0.2]


def test_secret_clustering_without_noise_is_the_weighted_mean_and_count():
    centres = np.array([[1.0, 0.0], [0.0, 1.0]])
    clusters = ev.PublicClusters(centres, np.array([2, 4]))
    private = np.array([[2.0, 0.0], [0.9, 0.1], [0.0, 0.5]])  # the first is clipped to norm 1
    sampled = np.array([True, True, False])  # the third is not sampled
    c, s = ev.secret_clustering_exact(clusters, private, sampled, radius=1.0)
    assert s.tolist() == [4.0, 4.0]
    assert c[0] == pytest.approx((2 * np.array([1.0, 0.0]) + [1.0, 0.0] + [0.9, 0.1]) / 4)
    assert c[1] == pytest.approx([0.0, 1.0])


def test_centre_noise_scale_bounds_one_document_for_every_radius():
    """One document moves centre k by at most c_k = (R + max(R, ||e_k||)) / n_k, also for R < 1, where the paper's
    2R / n_k fails because public centres are (near-)unit vectors the clipping does not reach."""
    rng = np.random.default_rng(7)
    worst_new = worst_old = 0.0
    for _ in range(300):
        radius = float(rng.choice([0.05, 0.2, 0.5, 0.9, 1.0, 1.5, 3.0]))
        k, d = int(rng.integers(1, 5)), 3
        centres = _unit(rng, k, d).astype(np.float64) * rng.uniform(0.3, 1.0, size=(k, 1))
        clusters = ev.PublicClusters(centres, rng.integers(1, 6, size=k))
        base = _unit(rng, int(rng.integers(0, 6)), d).astype(np.float64) * rng.uniform(0.2, 3.0)
        # the added document points away from its nearest centre: the largest move
        target = centres[int(rng.integers(k))]
        extra = -target / np.linalg.norm(target) * 5.0
        with_doc = np.vstack([base, extra])
        c0, s0 = ev.secret_clustering_exact(clusters, base, np.ones(len(base), bool), radius=radius)
        c1, s1 = ev.secret_clustering_exact(clusters, with_doc, np.ones(len(with_doc), bool), radius=radius)
        scales = ev.centre_noise_scales(clusters, radius)
        moved = np.linalg.norm(c1 - c0, axis=1)
        worst_new = max(worst_new, float((moved / scales).max()))
        worst_old = max(worst_old, float((moved / (2 * radius / clusters.sizes)).max()))
        # the whole round in noise units moves by at most sqrt(2): size 1, centre 1
        shift = ev.joint_statistics(c1, s1, scales) - ev.joint_statistics(c0, s0, scales)
        assert np.abs(s1 - s0).sum() == 1.0
        assert np.linalg.norm(shift) <= np.sqrt(2) + 1e-9
    assert worst_new <= 1 + 1e-9
    assert worst_old > 1.2  # the paper's 2R / n_k under-covers some R < 1 case


def test_centre_noise_scale_values():
    clusters = ev.PublicClusters(np.array([[0.6, 0.8], [0.3, 0.0]]), np.array([4, 2]))
    assert ev.centre_noise_scales(clusters, 1.0).tolist() == pytest.approx([2.0 / 4, 2.0 / 2])  # 2R / n_k
    assert ev.centre_noise_scales(clusters, 0.5).tolist() == pytest.approx([1.5 / 4, 1.0 / 2])  # (R + ||e_k||) / n_k
    with pytest.raises(ConfigError):
        ev.centre_noise_scales(clusters, 0.0)


def test_joint_statistics_round_trip():
    rng = np.random.default_rng(1)
    centres, sizes, scales = rng.normal(size=(3, 4)), np.array([5.0, 6.0, 7.0]), np.array([0.5, 0.25, 2.0])
    joint = ev.joint_statistics(centres, sizes, scales)
    assert joint.shape == (3 + 12,) and joint[:3].tolist() == sizes.tolist()
    c, s = ev.split_joint_statistics(joint, scales)
    assert c == pytest.approx(centres) and s.tolist() == sizes.tolist()


def _clustering_noise(sigma: float, noise=None, sampling=None, k: int = 1000, d: int = 8):
    """(released - exact) of sizes and of centres in noise units, from the code path the flow uses."""
    from privseed.tasks.dp.mechanisms import GaussianMechanism, secure_noise

    rng = np.random.default_rng(3)
    clusters = ev.PublicClusters(_unit(rng, k, d).astype(np.float64), rng.integers(1, 20, size=k))
    private = _unit(rng, 200, d)
    rho = np.ones(200)  # every document sampled: the exact statistics are known without the (private) mask
    mech = GaussianMechanism(sensitivity=np.sqrt(2), sigma=sigma, epsilon=1.0, delta=1e-5)
    c, s = ev.secret_clustering(clusters, private, rho, radius=0.5, mechanism=mech,
                                sampling=sampling or secure_noise(), noise=noise or secure_noise())
    c0, s0 = ev.secret_clustering_exact(clusters, private, np.ones(200, bool), radius=0.5)
    scales = ev.centre_noise_scales(clusters, 0.5)
    return s - s0, ((c - c0) / scales[:, None]).ravel()


def test_secret_clustering_adds_the_mechanisms_gaussian_to_sizes_and_centres():
    sigma = 2.0
    size_noise, centre_noise = _clustering_noise(sigma)
    for sample in (size_noise, centre_noise):
        assert_noise_is(sample, "gaussian", sigma)  # and refuted at half or twice the scale: the test can fail


def test_secret_clustering_noise_and_sampling_are_secret_by_default():
    from privseed.tasks.dp.mechanisms import insecure_noise

    a, _ = _clustering_noise(2.0)
    b, _ = _clustering_noise(2.0)
    assert not np.allclose(a, b)  # OS entropy: never the same twice
    # only the explicit insecure source reproduces, and sampling and noise streams differ
    c, _ = _clustering_noise(2.0, noise=insecure_noise(3, "noise"), sampling=insecure_noise(3, "sample"))
    d, _ = _clustering_noise(2.0, noise=insecure_noise(3, "noise"), sampling=insecure_noise(3, "sample"))
    assert np.array_equal(c, d)


def test_secret_clustering_samples_with_the_given_source():
    from privseed.tasks.dp.mechanisms import GaussianMechanism, secure_noise

    class Counting:
        name, secure = "counting", True

        def __init__(self):
            self.asked = None

        def bernoulli(self, p):
            self.asked = np.asarray(p).copy()
            return np.asarray(p) > 0.5

    rng = np.random.default_rng(0)
    clusters = ev.PublicClusters(_unit(rng, 3, 4).astype(np.float64), np.array([3, 3, 3]))
    sampling = Counting()
    rho = np.array([0.9, 0.1, 0.7, 0.2])
    mech = GaussianMechanism(sensitivity=np.sqrt(2), sigma=1.0, epsilon=1.0, delta=1e-5)
    _, s = ev.secret_clustering(clusters, _unit(rng, 4, 4), rho, radius=1.0, mechanism=mech, sampling=sampling,
                                noise=secure_noise())
    assert sampling.asked.tolist() == rho.tolist()
    assert abs(s.sum() - (9 + 2)) < 10 * np.sqrt(3)  # two documents joined, plus noise


def test_cluster_votes_weight_by_noisy_size():
    synthetic = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    hist = ev.cluster_votes(np.array([[0.9, 0.1], [0.8, 0.0], [0.1, 0.9]]), np.array([3.0, 2.0, 5.5]), synthetic)
    assert hist.tolist() == [5.0, 5.5, 0.0]


def test_public_kmeans():
    rng = np.random.default_rng(0)
    pts = np.vstack([rng.normal(0, 0.05, (30, 2)) + [1, 0], rng.normal(0, 0.05, (20, 2)) + [0, 1]])
    pc = ev.public_kmeans(pts, 2, seed=0)
    assert sorted(pc.sizes.tolist()) == [20, 30]
    with pytest.raises(ConfigError):
        ev.public_kmeans(pts[:1], 2, seed=0)


def test_pe_prompt_templates_take_only_public_placeholders():
    import string

    allowed = {"doc_type", "words", "text"}
    for name in ("pe_random", "pe_random_words", "pe_paraphrase", "pe_fill_blanks"):
        template = ev.load_pe_template(name)
        fields = {f for part in (template.system or "", template.user)
                  for _, f, _, _ in string.Formatter().parse(part) if f}
        assert fields <= allowed, (name, fields)  # no class / label placeholder exists
        system, user = template.render(doc_type="Wikipedia article", words="river, lake", text="A _ text.")
        assert "Wikipedia article" in user and "{" not in user
        assert template.version.startswith(name + "@")
    with pytest.raises(ConfigError):
        ev.load_pe_template("no-such-template")


def test_selection_takes_documents_first():
    from privseed.tasks.pe.evolution import select_population

    rng = np.random.default_rng(0)
    scores = np.array([9.0, 1.0, 8.0, 0.5, 7.0])
    documents = np.array([False, True, False, True, True])
    # rank: the three documents, although two non-documents have higher noisy counts
    assert select_population(scores, 3, "rank", rng, documents).tolist() == [1, 3, 4]
    # too few documents: they come first, the best non-document fills the rest
    assert select_population(scores, 4, "rank", rng, documents).tolist() == [0, 1, 3, 4]
    # sample: only documents are drawn while there are any
    drawn = select_population(scores, 200, "sample", rng, documents)
    assert set(drawn.tolist()) <= {1, 3, 4}
    # no document at all: the rule falls back to every candidate
    assert select_population(scores, 2, "rank", rng, np.zeros(5, bool)).tolist() == [0, 2]
    with pytest.raises(ConfigError):
        select_population(scores, 2, "rank", rng, np.ones(3, bool))


def test_non_documents_receive_no_votes():
    from privseed.tasks.pe.evolution import class_votes

    rng = np.random.default_rng(1)
    private = rng.normal(size=(50, 8))
    private /= np.linalg.norm(private, axis=1, keepdims=True)
    synthetic = private[:4].copy()  # every candidate is some private document's exact neighbour
    labels = np.zeros(50, dtype=np.int64)
    all_votes = class_votes(private, labels, synthetic, np.zeros(4, dtype=np.int64))
    masked = class_votes(private, labels, synthetic, np.array([0, -1, 0, -1]))
    assert all_votes.sum() == masked.sum() == 50  # each document still casts exactly one vote
    assert masked[1] == masked[3] == 0 and all_votes[1] > 0


def test_is_document_matches_the_release_gate():
    from privseed.tasks.quality import DocumentRules, is_document

    assert not is_document("Lullaby.")
    assert not is_document("Write a Wikipedia article about a river in the north.")  # prompt echo
    assert not is_document(None)
    assert is_document("The river rises in the hills and flows north to the sea.")
    assert is_document("one two three", rules=DocumentRules(min_words=3))
