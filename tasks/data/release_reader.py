"""A published release as its recipient reads it: through ``manifest.json`` (every part's sha256 checked), with
the ledger it ships, and what a reader can tell from those two documents alone (how it was written, what it
cost in LLM calls and in privacy). Everything here reads released files only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from privseed.tasks.data import corpus
from privseed.tasks.quality import metrics
from privseed.tasks import storage
from privseed.tasks.errors import ConfigError, CorpusError

#: Written beside the rows of a PE release: the RANDOM and VARIATION calls that made its candidates.
EVOLUTION_INFO = "evolution.json"


@dataclass
class Release:
    """A published release: its synthetic rows, manifest and ledger (None for a release that ships none)."""

    path: str
    rows: pd.DataFrame
    manifest: dict[str, Any]
    ledger: dict[str, Any] | None


def read_release(out: str, storage_options: Mapping[str, Any] | None = None) -> Release:
    """The release at ``out``, read through its manifest (``privseed.tasks.data.corpus.read_release`` verifies each
    part).
    Rows without keyphrases (a release written without seeds) get empty ones."""
    manifest, rows = corpus.read_release(out, storage_options)
    for column in ("text", "label"):
        if column not in rows.columns:
            raise CorpusError(f"release {out} has no '{column}' column")
    if "keyphrases" not in rows.columns:
        rows = rows.assign(keyphrases=[[] for _ in range(len(rows))])
    ledger_uri = storage.join(out, "ledger.json")
    ledger = (json.loads(storage.read_bytes(ledger_uri, storage_options))
              if storage.exists(ledger_uri, storage_options) else None)
    return Release(out, rows.reset_index(drop=True), manifest, ledger)


def _config(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    config = manifest.get("config", {}) if isinstance(manifest, Mapping) else {}
    return config if isinstance(config, dict) else {}


def written_without_llm(rows: pd.DataFrame, manifest: Mapping[str, Any] | None) -> bool:
    """Whether the release's texts are keyphrase sequences (``--llm none``): from the manifest's configuration,
    else from the rows' ``backend`` column."""
    llm = str(_config(manifest).get("llm", "")).lower()
    if llm:
        return llm == "none"
    return "backend" not in rows.columns or (rows["backend"].astype(str).str.lower() == "none").all()


def release_vocabulary(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    """The public vocabulary V the release's extractor used (``vocab``, ``vocab_top``), from its manifest."""
    config = _config(manifest)
    vocab = config.get("vocab")
    if not isinstance(vocab, str):
        raise ConfigError("the release's manifest records no vocabulary; pass --test-view text")
    return {"vocab": vocab, "vocab_top": config.get("vocab_top")}


def release_llm_calls(release: Release) -> float:
    """LLM calls behind a release: PE records its RANDOM + VARIATION calls in evolution.json (the released rows
    are only the survivors); DP-KPS rows carry their best-of candidates."""
    info_uri = storage.join(release.path, EVOLUTION_INFO)
    if storage.exists(info_uri):
        calls = json.loads(storage.read_bytes(info_uri))["llm_calls"]
        return float(calls["random"] + calls["variation"])
    return float(metrics.llm_usage(release.rows)["llm_calls"])


def release_budget(release: Release | None) -> str:
    """The guarantee of a release in words, from its ledger (SecPE: the (p, r) statement, not an epsilon)."""
    if release is None or not release.ledger:
        return "none (not private)" if release is None else "no ledger"
    entries = release.ledger.get("entries", [])
    secpe = next((e for e in entries if e.get("name") == "secpe.schedule"), None)
    if secpe:
        protection = secpe["params"]["secret_protection"]
        return (f"(p, r) = ({protection['p']:g}, {protection['r']:g}), sigma {secpe['params']['sigma']:.3g}; "
                f"DP eps {secpe['epsilon']:.3g} only if rho, sigma are fixed")
    total = release.ledger.get("total", {})
    eps, delta = float(total.get("epsilon", float("nan"))), float(total.get("delta", 0.0))
    if total.get("secure") is False:
        from privseed.tasks.dp.mechanisms import INSECURE_STAMP

        return f"{INSECURE_STAMP} (reproducible noise; eps {eps:.3g} is not a guarantee)"
    return f"eps {eps:.3g}" + (f", delta {delta:.2g}" if delta > 0 else " (pure)")
