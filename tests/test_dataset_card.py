"""The dataset card (README.md of a release) states the guarantee the manifest states, for every method: (epsilon,
delta)-DP with the differential-privacy tag for DP-KPS, the histogram methods and Aug-PE; SecPE's (p, r)-secret
protection without that tag; no guarantee for a release drawn from reproducible noise (issue 46: a SecPE card
claimed (epsilon, delta)-DP while its manifest said "not DP")."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import sparse

from privseed.tasks.config.commands import AugPeConfig, DpKpsConfig, SecPeConfig, validate_config
from privseed.tasks.data.corpus import publish_release
from privseed.tasks.seeds.kde import sketch_mechanism
from privseed.tasks.dp.ledger import PrivacyLedger, plain_guarantee
from privseed.tasks.dp.mechanisms import GaussianMechanism, insecure_noise, secure_noise
from privseed.tasks.stages.pe import charge_augpe_schedule, charge_secpe_schedule, secret_noise
from privseed.tasks.seeds.vocabulary import vocabulary_mechanism

OWNER = {"data": "d.parquet", "out": "o", "labels": ["0", "1"]}


def _dpkps(ledger: PrivacyLedger) -> dict:
    """DP-KPS's two releases: the vocabulary histogram (discrete Laplace) and a class's sketch (Laplace)."""
    cfg = validate_config(DpKpsConfig, OWNER)
    ledger.draw_once("vocabulary", mechanism=vocabulary_mechanism(1.0, 10), noise=secure_noise(), params={"S": 10},
                     exact=lambda: np.zeros(5), stage="vocabulary")
    ledger.draw_once("sketch.class-0", mechanism=sketch_mechanism("laplace", 8, 10.0), noise=secure_noise(),
                     params={"I": 8}, exact=lambda: np.zeros(8), stage="kde", partition="0")
    return cfg.public_dict()


def _histogram(ledger: PrivacyLedger) -> dict:
    """--method histogram with the Gaussian rank-l2 contribution: one Gaussian release per class."""
    cfg = validate_config(DpKpsConfig, {**OWNER, "method": "histogram"})
    mechanism = GaussianMechanism(sensitivity=1.0, sigma=4.0, epsilon=1.0, delta=1e-6)
    ledger.draw_once("histogram.class-0", mechanism=mechanism, noise=secure_noise(), params={"sigma": 4.0},
                     exact=lambda: np.zeros(5), stage="histogram", partition="0")
    return cfg.public_dict()


def _augpe(ledger: PrivacyLedger) -> dict:
    cfg = validate_config(AugPeConfig, OWNER)
    charge_augpe_schedule(ledger, cfg)
    return cfg.public_dict()


def _secpe(ledger: PrivacyLedger) -> dict:
    cfg = validate_config(SecPeConfig, {**OWNER, "public": "p.parquet", "noise_multiplier": 3.0})
    # No detected secret: the public sigma meets (p, r) trivially; the schedule declares its guarantee either way.
    charge_secpe_schedule(ledger, cfg, secret_noise(cfg, sparse.csr_matrix((6, 0))))
    return cfg.public_dict()


def _insecure(ledger: PrivacyLedger) -> dict:
    cfg = validate_config(DpKpsConfig, {**OWNER, "insecure_reproducible_noise": True})
    ledger.draw_once("vocabulary", mechanism=vocabulary_mechanism(1.0, 10), noise=insecure_noise(0, "vocabulary"),
                     params={"S": 10}, exact=lambda: np.zeros(5), stage="vocabulary")
    return cfg.public_dict()


def _card(tmp_path, charge) -> tuple[dict, dict, str]:
    """Publish a small release under the ledger ``charge`` fills; returns the card's YAML header, its text and the
    manifest."""
    ledger = PrivacyLedger(str(tmp_path / "out.private"), "id-of-the-corpus", "run1")
    config = charge(ledger)
    frame = pd.DataFrame({"text": ["a document", "another document"], "label": ["0", "1"],
                          "keyphrases": [["document"], ["document"]]})
    out = tmp_path / "out"
    manifest = publish_release(str(out), frame, ledger=ledger, config=config, allow_insecure=True)
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    return header, manifest, card


@pytest.mark.parametrize("charge", [_dpkps, _histogram, _augpe], ids=["dpkps", "histogram", "augpe"])
def test_a_dp_release_s_card_states_the_manifest_s_dp_guarantee_and_totals(tmp_path, charge):
    header, manifest, card = _card(tmp_path, charge)
    privacy = manifest["privacy"]
    assert privacy["guarantee"]["kind"] == "(epsilon, delta)-differential privacy"
    assert privacy["guarantee"]["statement"] in card
    assert f"epsilon = {privacy['epsilon']:g}, delta = {privacy['delta']:g}" in card
    assert "differential-privacy" in header["tags"]
    assert "not a differential privacy guarantee" not in card
    # the guarantee in one plain sentence, the report's and the artifacts' wording (issue 47)
    assert plain_guarantee(privacy) in card and f"at most a factor e^{privacy['epsilon']:g}" in card


def test_a_secpe_card_states_secret_protection_not_dp(tmp_path):
    header, manifest, card = _card(tmp_path, _secpe)
    guarantee = manifest["privacy"]["guarantee"]
    assert guarantee["kind"] == "(p, r)-secret protection"
    assert guarantee["statement"] in card and "(p, r)-secret protection" in card
    assert "differential-privacy" not in header["tags"]
    # The ledger's epsilon is shown only as what it is: not the release's guarantee.
    assert "-differential privacy with respect to" not in card
    assert "is not a differential privacy guarantee of this release" in card
    assert plain_guarantee(manifest["privacy"]) in card and "protects the detected secrets only" in card


def test_a_card_of_reproducible_noise_claims_no_guarantee(tmp_path):
    header, manifest, card = _card(tmp_path, _insecure)
    assert manifest["privacy"]["secure"] is False
    assert manifest["privacy"]["guarantee"]["statement"] in card and "NOT DIFFERENTIALLY PRIVATE" in card
    assert "Privacy guarantee: none." in card
    assert plain_guarantee(manifest["privacy"]) in card and "This release guarantees no privacy" in card
    assert "differential-privacy" not in header["tags"]
