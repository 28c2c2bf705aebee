"""Who may see what: the data identity, run ids and where the owner's private state lives.

The adversary privseed defends against holds every file written for the recipient and knows every private
document but one (docs/privacy.md, "Threat model"). An unkeyed digest of the corpus in a released file would
let them test a guess about the last document exactly, so the corpus is identified by an HMAC-SHA256 under a
random key that is created in the owner's private state and never leaves it. The identity is used for one
thing: refusing to reuse values drawn for one corpus as another's (resume checks), and telling which runs of
a state folder touched overlapping data (the cumulative budget). It is never written to a release. It is
combinable (``IdentityPart``): the Dask workers compute it unit by unit where the rows are, with the key, and
the parts add up to the same identity however the corpus was split.

Private state (``--state``, default ``OUT.private`` beside the release folder ``OUT``)::

    identity.key                        32 random bytes (secrets.token_bytes), created once per state folder
    runs/<run_id>/run.json              the run's data identity (HMAC) and creation time
    runs/<run_id>/rows.npy              keyed 64-bit identities of the run's rows, sorted: overlap checks only
    runs/<run_id>/entries, values/      the draw-once store (tasks/dp/ledger.py)
    runs/<run_id>/ledger.json           the owner's full ledger: identities and the cumulative total, written
                                        when the run publishes (a run with values and without it is unfinished)
    llm-cache/                          the LLM call cache
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import posixpath
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from privseed.tasks import storage
from privseed.tasks.errors import ConfigError, LedgerMismatchError

KEY_FILE = "identity.key"
KEY_BYTES = 32
PRIVATE_SUFFIX = ".private"


@dataclass(frozen=True)
class DataIdentity:
    """The keyed identity of a corpus: ``digest`` names the multiset of (label, text) rows; ``rows`` holds one
    keyed 64-bit identity per distinct row (sorted), so two runs can be shown to share no row. Both are
    HMACs under the state folder's key: without the key they are random-looking and test no guess."""

    digest: str = field(repr=False)
    rows: np.ndarray = field(repr=False, compare=False)

    def __repr__(self) -> str:  # never print the digest by accident (logs, tracebacks, task parameters)
        return "DataIdentity(<keyed>)"

    __str__ = __repr__


def default_state_uri(out: str) -> str:
    """The private state beside the release folder: ``OUT.private`` (``runs/x`` -> ``runs/x.private``).

    Outside OUT on purpose: whoever copies the release folder to a recipient cannot take the key, the
    drawn values or the LLM cache along by accident."""
    base = out.rstrip("/")
    if storage.is_remote(base):
        rest = base.split("://", 1)[1]
        if "/" not in rest:
            raise ConfigError(f"--out {out} is a bucket root: the private state cannot live beside it; give --state "
                              "(a private location outside the release folder, e.g. s3://other-bucket/privseed-state)")
    if not base:
        raise ConfigError("--out is empty")
    return base + PRIVATE_SUFFIX


def check_state_outside_release(out: str, state: str) -> None:
    """Refuse a private state inside the release folder (or the other way round): the release is what the
    owner hands over, and the state holds the identity key, the drawn values and the LLM cache."""
    a, b = _normalised(out), _normalised(state)
    if a == b or _inside(b, a) or _inside(a, b):
        raise ConfigError(
            f"--state {state} lies inside the release folder {out} (or contains it): the private state (identity "
            "key, drawn values, LLM cache) must stay out of what is shared; omit --state to use "
            f"{default_state_uri(out)}, or choose a folder outside {out}")


def check_outside_private_corpus(data: str, out: str, state: str | None = None) -> None:
    """Refuse a release folder (or a private state) that is the private corpus DATA, holds it or lies inside it:
    the release and the README written for its recipient would sit among the private files (and a folder DATA
    would read a release's parts as corpus on the next run). Paths only, nothing is read: local paths are compared
    resolved (symbolic links followed), URIs by their normalised prefixes."""
    corpus = _normalised(data)
    for flag, folder in (("--out", out), ("--state", state)):
        if folder is None:
            continue
        place = _normalised(folder)
        relation = ("is" if place == corpus else "holds" if _inside(corpus, place)
                    else "lies inside" if _inside(place, corpus) else None)
        if relation is not None:
            raise ConfigError(f"{flag} {folder} {relation} the private corpus {data}: what privseed writes there "
                              "would sit among the private files; choose a new folder outside the corpus's folder")


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _normalised(uri: str) -> str:
    if storage.is_remote(uri):
        scheme, rest = uri.split("://", 1)
        return f"{scheme.lower()}://" + posixpath.normpath("/" + rest).lstrip("/")
    return os.path.realpath(uri.removeprefix("file://")).rstrip("/") or "/"


def load_or_create_key(state_uri: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The state folder's HMAC key: created once with OS entropy, create-if-absent so two runs starting
    together agree on one key."""
    uri = storage.join(state_uri, KEY_FILE)
    if not storage.exists(uri, storage_options):
        storage.create_exclusive(uri, secrets.token_bytes(KEY_BYTES), storage_options)
    key = storage.read_bytes(uri, storage_options)
    if len(key) != KEY_BYTES:
        raise LedgerMismatchError(f"{uri} is not a privseed identity key ({KEY_BYTES} bytes expected); restore it "
                                  "from a backup or point --state at a fresh folder (earlier runs then cannot resume)")
    return key


def existing_or_new_key(state_uri: str, storage_options: Mapping[str, Any] | None = None) -> tuple[bytes, bool]:
    """The state folder's key and True when it is stored; else a new key, not yet stored, and False. A run that is
    refused before it draws anything (an undeclared label found by pass 1) then leaves no state folder behind:
    the key is stored (:func:`store_new_key`) only once the scan that used it succeeded."""
    uri = storage.join(state_uri, KEY_FILE)
    if storage.exists(uri, storage_options):
        return load_or_create_key(state_uri, storage_options), True
    return secrets.token_bytes(KEY_BYTES), False


def store_new_key(state_uri: str, key: bytes, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Store ``key`` as the state folder's key unless one appeared meanwhile (another run of the same state started
    together with this one): True when ``key`` is now the stored key, False when the other run's is."""
    storage.create_exclusive(storage.join(state_uri, KEY_FILE), key, storage_options)
    return load_or_create_key(state_uri, storage_options) == key


#: Version tag of the combinable data identity (2: a keyed sum over rows, so units combine in any order).
_IDENTITY_TAG = b"privseed-data-identity/2"
_SUM_MODULUS = 1 << 256


@dataclass(frozen=True)
class IdentityPart:
    """The identity of a part of the corpus (one work unit, or several combined), computed where the rows are.

    ``total`` is the sum modulo 2^256 of every row's HMAC-SHA256 under the key (a multiset hash: independent of
    row order and of how the rows were split into units; a duplicated row counts twice); ``rows`` the sorted
    distinct keyed 64-bit row identities. Parts combine by adding totals and merging rows, so the driver never
    needs the rows themselves. Everything in it is keyed: without the key it tests no guess."""

    total: int = field(repr=False)
    rows: np.ndarray = field(repr=False)

    def __repr__(self) -> str:
        return "IdentityPart(<keyed>)"

    __str__ = __repr__

    @staticmethod
    def combine(parts: Sequence[IdentityPart]) -> IdentityPart:
        total = sum(p.total for p in parts) % _SUM_MODULUS
        return IdentityPart(total, functools.reduce(np.union1d, [p.rows for p in parts],
                                                    np.zeros(0, dtype=np.uint64)).astype(np.uint64))

    def finish(self, key: bytes) -> DataIdentity:
        """The corpus's identity from the combination of all its parts."""
        digest = hmac.new(key, _IDENTITY_TAG + self.total.to_bytes(32, "little"), hashlib.sha256).hexdigest()
        return DataIdentity(digest, self.rows)


def identity_part(texts: Iterable[str], labels: Iterable[Any], key: bytes) -> IdentityPart:
    """The identity part of these (text, label) rows. A row is HMAC-SHA256(key, SHA-256(repr(label) US text)): its
    first 8 bytes are the row's 64-bit identity (the same as before the identity became combinable, so overlap
    checks against older runs of a state folder still hold), the whole of it goes into the keyed sum."""
    total = 0
    row_ids = []
    for text, label in zip(texts, labels, strict=True):
        if isinstance(label, np.generic):  # numpy scalars print as np.int64(3); pandas hands out Python ones
            label = label.item()
        mac = hmac.digest(key, hashlib.sha256(f"{label!r}\x1f{text}".encode()).digest(), "sha256")
        total += int.from_bytes(mac, "little")
        row_ids.append(int.from_bytes(mac[:8], "little"))
    return IdentityPart(total % _SUM_MODULUS, np.unique(np.array(row_ids, dtype=np.uint64)))


def data_identity(corpus: pd.DataFrame, key: bytes) -> DataIdentity:
    """The keyed identity of the multiset of (label, text) rows of a corpus in memory: independent of row order
    and sharding, so one corpus always has one identity in one state folder, whether it was read whole or
    streamed unit by unit (``IdentityPart``)."""
    return identity_part(corpus["text"], corpus["label"], key).finish(key)


def new_run_id() -> str:
    """A random run id (``run-`` + 16 hex digits of OS entropy): nothing about the data, the configuration or
    the time is in it. The ledger opens after pass 1 and the release id is minted after the last private pass,
    so two clock readings in released ids would time the private stages (their duration grows with |D|)."""
    return f"run-{secrets.token_hex(8)}"
