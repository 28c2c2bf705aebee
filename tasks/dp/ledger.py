"""The privacy ledger and the draw-once store of privatized values.

Guarantee this module enforces (docs/privacy.md, "Draw once, charge once"): a privatized value is drawn
**once**, by applying a mechanism of privseed.tasks.dp.mechanisms to the exact value, and persisted with the parameters
and
the data identity it was drawn under. A retry or a resumed run (same ``--run-id``) re-reads it and charges
nothing; the same name asked for under other parameters, or for another corpus, is refused with
:class:`LedgerMismatchError` (silently redrawing would spend the budget twice, silently reusing would misreport
the guarantee or release corpus A's value as corpus B's). Storing a value is create-if-absent, so two processes
racing on one run id release one value and both return it. Every release is recorded with what its mechanism
reports (epsilon, delta, sensitivity, scale, noise source and whether that source is secure) and its
parameters; a run with any release from reproducible noise is stamped NOT DIFFERENTIALLY PRIVATE.

Two views of the account: the recipient's ``ledger.json`` in the release (mechanisms, parameters,
(epsilon, delta), the noise report and the run's total; no identity, no value checksum, no timing) and the
owner's full ledger in the private state (identities, value checksums, times, and the cumulative total of
every run in the state folder).

Composition: releases of different stages compose by basic composition (sum of epsilons and deltas).
Within a stage, releases on disjoint parts of the corpus (``partition``, e.g. one per class) compose in
parallel: the stage costs the maximum over partitions of the sum within each partition.

Layout under ``state_uri`` (the owner's private state, tasks/dp/identity.py; one folder per run id)::

    runs/<run_id>/run.json                the run's data identity (keyed HMAC), created with the run
    runs/<run_id>/rows.npy                keyed row identities (sorted uint64): disjointness checks only
    runs/<run_id>/entries/<name>.json     one file per release: no read-modify-write races between tasks
    runs/<run_id>/values/<name>.npz       the released arrays, with their parameters and data identity embedded
    runs/<run_id>/ledger.json             the owner's full ledger, written when the run publishes
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import io
import json
import logging
import math
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from privseed.tasks import storage
from privseed.tasks.errors import LedgerMismatchError, PrivseedError
from privseed.tasks.dp.identity import DataIdentity
from privseed.tasks.jsonable import to_jsonable
from privseed.tasks.dp.mechanisms import INSECURE_STAMP, Mechanism, NoiseSource, as_noise_source, mechanism_kind

log = logging.getLogger(__name__)

LEDGER_FORMAT = "privseed-ledger/1"
_NAME = re.compile(r"^[A-Za-z0-9_.=-]+$")


#: The guarantee of a release whose ledger declares no other (tasks/dp/ledger.py ``PrivacyLedger.guarantee``).
DP_GUARANTEE = {"kind": "(epsilon, delta)-differential privacy",
                "statement": "(epsilon, delta)-differential privacy per document (add or remove one labelled "
                             "document), epsilon and delta as in the total"}


def plain_guarantee(privacy: Mapping[str, Any]) -> str:
    """The release's guarantee in one plain sentence for its recipient: the one wording the report, the dataset card
    and the Prefect artifacts use. ``privacy`` is the manifest's ``privacy`` section or the ledger.json's ``total``
    (both hold ``epsilon``, ``delta``, ``secure`` and the ``guarantee`` of :meth:`PrivacyLedger.guarantee`).

    (epsilon, delta)-DP: what one document's presence can change, as a factor e^epsilon and its size; SecPE's (p,
    r)-secret protection: what an adversary gains on a detected secret; reproducible noise: that nothing holds."""
    stated = privacy.get("guarantee")
    guarantee: Mapping[str, Any] = stated if isinstance(stated, Mapping) else {}
    if privacy.get("secure") is False or privacy.get("stamp") or guarantee.get("kind") == "none":
        return ("This release guarantees no privacy: its noise was drawn from the public --seed, so anyone who reads "
                "its manifest can reproduce the noise and remove it.")
    if guarantee.get("kind") == "(p, r)-secret protection":
        p, r = float(guarantee.get("p", float("nan"))), float(guarantee.get("r", float("nan")))
        return (f"An adversary who would guess one of the detected secrets with probability {p:g} without this "
                f"release guesses it with probability at most {r:g} with it; this protects the detected secrets "
                "only, not whole documents, and is not differential privacy.")
    epsilon, delta = float(privacy.get("epsilon", float("nan"))), float(privacy.get("delta", 0.0) or 0.0)
    factor = f"e^{epsilon:g} (about {_about(math.exp(epsilon))})" if epsilon < 700 else f"e^{epsilon:g}"
    sentence = ("Whether or not any single document was in the private corpus changes the probability of any output "
                f"of this release by at most a factor {factor}")
    return sentence + (f", except with probability {_short_float(delta)}." if delta > 0 else ".")


def _about(value: float) -> str:
    """A positive number to two significant figures, as a reader takes it in at a glance: 2.7, 150, 60,000, 4.8e8."""
    if value >= 1e7:
        return _short_float(value)
    rounded = float(f"{value:.2g}")
    return f"{rounded:,.0f}" if rounded >= 100 else f"{rounded:g}"


def _short_float(value: float) -> str:
    """A number to two significant figures, its exponent without padding: 7.2e-8, 1.1e13, 0.05."""
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", f"{value:.2g}")


def public_rng(seed: int, *names: str) -> np.random.Generator:
    """An independent stream of PUBLIC randomness for (seed, stage names): random features, sampling from
    released sketches, selection from released histograms, LLM call seeds, masks.

    ``--seed`` is published in the manifest, so nothing drawn from this stream is secret: it is never noise.
    The mechanisms of privseed.tasks.dp.mechanisms refuse a Generator; noise comes from
    ``privseed.tasks.dp.mechanisms.secure_noise()`` (or, opted in and stamped, ``insecure_noise``). Streams are
    independent per name, so changing how many sequences are sampled never changes the features."""
    words = [int.from_bytes(hashlib.sha256(n.encode()).digest()[:4], "little") for n in names]
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *words]))


def canonical_params(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=to_jsonable)


class PrivacyLedger:
    """Records every privatized release of one run and stores its values so they are drawn once.

    ``data_identity`` is the keyed identity of the corpus (:func:`privseed.tasks.dp.identity.data_identity`); a plain
    string is accepted for tests and tools that have no corpus. It lives in the private state only."""

    def __init__(
        self,
        state_uri: str,
        data_identity: DataIdentity | str,
        run_id: str,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _NAME.match(run_id):
            raise PrivseedError(f"run id {run_id!r} may only contain letters, digits and _.=-")
        self.state_uri = state_uri
        self.identity = data_identity if isinstance(data_identity, DataIdentity) else None
        self.data_identity = data_identity.digest if isinstance(data_identity, DataIdentity) else str(data_identity)
        self.run_id = run_id
        self.storage_options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self._open_run()
        self._load_entries()

    # -- paths -----------------------------------------------------------------------------------
    @property
    def run_uri(self) -> str:
        return storage.join(self.state_uri, "runs", self.run_id)

    def _entry_uri(self, name: str) -> str:
        return storage.join(self.run_uri, "entries", f"{name}.json")

    def _value_uri(self, name: str) -> str:
        return storage.join(self.run_uri, "values", f"{name}.npz")

    def private_uri(self, name: str) -> str:
        """A file of this run in the owner's private state (operator timings, the full ledger)."""
        return storage.join(self.run_uri, name)

    def _mismatch(self) -> LedgerMismatchError:
        # Names no digest: the identity is keyed, but an error message is no place for it either.
        return LedgerMismatchError(
            f"run {self.run_id!r} in {self.state_uri} was made on another corpus (its data identity differs); "
            "values drawn for one corpus are never reused for another: omit --run-id to start a new run, or "
            "resume with the corpus the run was started on")

    def _open_run(self) -> None:
        """Create ``run.json`` with this corpus's identity, or check the one a previous process wrote."""
        meta_uri = storage.join(self.run_uri, "run.json")
        meta = {"format": LEDGER_FORMAT, "run_id": self.run_id, "data_identity": self.data_identity,
                "created_at": dt.datetime.now(dt.timezone.utc).isoformat()}
        if storage.exists(meta_uri, self.storage_options) or not storage.create_exclusive(
                meta_uri, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), self.storage_options):
            stored = json.loads(storage.read_bytes(meta_uri, self.storage_options))
            if not hmac.compare_digest(str(stored.get("data_identity")), self.data_identity):
                raise self._mismatch()
        if self.identity is not None:
            rows_uri = storage.join(self.run_uri, "rows.npy")
            if not storage.exists(rows_uri, self.storage_options):
                buffer = io.BytesIO()
                np.save(buffer, self.identity.rows, allow_pickle=False)
                storage.create_exclusive(rows_uri, buffer.getvalue(), self.storage_options)

    def _load_entries(self) -> None:
        for entry in _read_entries(self.run_uri, self.storage_options):
            if not hmac.compare_digest(str(entry.get("data_identity")), self.data_identity):
                raise self._mismatch()
            self._entries[entry["name"]] = entry

    # -- the two ways to spend budget ------------------------------------------------------------
    def draw_once(
        self,
        name: str,
        *,
        mechanism: Mechanism,
        noise: NoiseSource,
        params: Mapping[str, Any],
        exact: Callable[[], np.ndarray],
        postprocess: Callable[[np.ndarray], Mapping[str, np.ndarray]] | None = None,
        partition: str | None = None,
        stage: str | None = None,
        accounted_in: str | None = None,
    ) -> dict[str, np.ndarray]:
        """The privatized value of ``name``: ``mechanism.release(exact(), noise)`` the first time, re-read after.

        The ledger applies the mechanism itself, so what it records (``mechanism.describe(noise)``: epsilon,
        delta, sensitivity, scale, noise source, secure) is what was applied; a caller cannot declare one
        guarantee and draw another. ``exact`` is called only when a value must be drawn (the private
        intermediate is then never needed on a re-read). The stored arrays are ``{"noisy": released}`` plus
        ``postprocess(released)`` (e.g. the top-N ids of a noisy histogram), so every released value can be
        checked against the mechanism. ``accounted_in`` names an earlier :meth:`charge` that already paid for
        this release (one round of a schedule composed by an accountant): it is then recorded, not charged."""
        self._check_name(name)
        description = self._describe(name, mechanism, noise)
        if accounted_in is not None:
            charged = self._entries.get(accounted_in)
            if charged is None:
                raise PrivseedError(f"release {name!r} is accounted in {accounted_in!r}, which was never charged; "
                                    "charge the schedule before drawing its rounds")
            # A round paid for by a schedule must be a draw of the mechanism that schedule charged.
            for key in ("mechanism", "sensitivity", "scale", "secure"):
                if charged.get(key) != description[key]:
                    raise LedgerMismatchError(
                        f"release {name!r} uses another {key} ({_short(description[key])}) than the schedule "
                        f"{accounted_in!r} charged ({_short(charged.get(key))})")
            # The schedule's epsilon covers its number of releases, and no more (issue 30: a T = 1 charge, then
            # 10 rounds, left the total at the one-round figure). Counted per partition: parallel classes each
            # get the schedule's rounds. A re-read of a drawn round is not a new release.
            drawn = [e["name"] for e in self._entries.values()
                     if e.get("accounted_in") == accounted_in and e.get("partition") == partition and e["name"] != name]
            paid = charged.get("releases")
            if name not in self._entries and isinstance(paid, int) and len(drawn) >= paid:
                raise LedgerMismatchError(
                    f"release {name!r} would be release {len(drawn) + 1} of schedule {accounted_in!r}"
                    f"{f' (partition {partition})' if partition is not None else ''}, which was charged for {paid}; "
                    "charge a schedule for as many rounds as are drawn (a new run for a longer schedule)")
        record = self._record(name, description["mechanism"], params, description["epsilon"], description["delta"],
                              description["sensitivity"], partition, stage)
        record.update(self._noise_fields(description, accounted_in=accounted_in, releases=1))

        def draw() -> dict[str, np.ndarray]:
            released = np.asarray(mechanism.release(np.asarray(exact()), noise))
            arrays = {"noisy": released}
            for key, value in (postprocess(released) if postprocess is not None else {}).items():
                if key in arrays:
                    raise PrivseedError(f"release {name!r}: post-processing may not overwrite {key!r}")
                arrays[key] = np.asarray(value)
            return arrays

        return self._draw_and_record(name, record, draw)

    def draw_once_unverified(
        self,
        name: str,
        *,
        mechanism: str,
        params: Mapping[str, Any],
        epsilon: float,
        delta: float = 0.0,
        sensitivity: float | None = None,
        partition: str | None = None,
        stage: str | None = None,
        draw: Callable[[], Mapping[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """Transitional, for SecPE only until its noise is drawn through privseed.tasks.dp.mechanisms: the caller draws
        the
        value and declares its guarantee. Recorded with ``secure: None`` (the ledger cannot vouch for noise it
        did not apply) and listed as unverified in ``ledger.json``."""
        self._check_name(name)
        record = self._record(name, mechanism, params, epsilon, delta, sensitivity, partition, stage)
        record.update(noise_source="drawn by the caller (not verified by the ledger)", secure=None,
                      guarantee=None, scale=None, accounted_in=None, releases=1)
        return self._draw_and_record(name, record, lambda: {k: np.asarray(v) for k, v in draw().items()})

    def _draw_and_record(self, name: str, record: dict,
                         draw: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                self._check_same(existing, record)
                return self._read_value(name, existing)
            arrays = self._stored_value(name, record)
            if arrays is not None:
                # Drawn before a crash, or by another process with this run id: reuse it, never redraw.
                log.info("ledger: %s was already drawn for this run; reusing it", name)
            else:
                arrays = self._store_value(name, record, draw())
            data = storage.read_bytes(self._value_uri(name), self.storage_options)
            record["value"] = {"path": f"values/{name}.npz", "sha256": hashlib.sha256(data).hexdigest(),
                               "arrays": {k: list(v.shape) for k, v in arrays.items()}}
            self._commit_entry(record)
            log.info("ledger: released %s (%s, epsilon=%g, delta=%g, noise %s)", name, record["mechanism"],
                     record["epsilon"], record["delta"], record["noise_source"])
            if record.get("secure") is False:
                log.warning("ledger: %s was drawn from reproducible noise: %s", name, INSECURE_STAMP)
            return arrays

    def charge(
        self,
        name: str,
        *,
        mechanism: Mechanism,
        noise: NoiseSource,
        params: Mapping[str, Any],
        releases: int = 1,
        stage: str | None = None,
        partition: str | None = None,
    ) -> None:
        """Charge a schedule of ``releases`` draws of ``mechanism`` up front, with no stored value (Aug-PE's T
        rounds); each round is then drawn with ``draw_once(..., accounted_in=name)`` and charges nothing.

        The charge is what the mechanism's kind says ``releases`` draws cost (``MechanismKind.compose``): for a
        Gaussian mechanism the (epsilon, delta) its sigma was calibrated for over all ``releases`` by the
        accountant; a Laplace mechanism's epsilon is per release and ``releases`` of them compose by basic
        composition. Idempotent per name: the same charge
        twice is recorded once; other parameters are refused."""
        self._check_name(name)
        if int(releases) != releases or releases < 1:
            raise PrivseedError(f"charge {name!r}: releases must be a whole number >= 1, got {releases!r}")
        description = self._describe(name, mechanism, noise)
        # The kind owns its composition rule (basic for pure DP, the accountant's calibration for Gaussian).
        kind = getattr(mechanism, "kind", None) or mechanism_kind(description["mechanism"])
        epsilon, delta = kind.compose(float(description["epsilon"]), float(description["delta"]), int(releases))
        record = self._record(name, description["mechanism"], params, epsilon, delta, description["sensitivity"],
                              partition, stage)
        record.update(self._noise_fields(description, accounted_in=None, releases=int(releases)))
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                self._check_same(existing, record)
                return
            self._commit_entry(record)

    def charge_unverified(
        self,
        name: str,
        *,
        mechanism: str,
        params: Mapping[str, Any],
        epsilon: float,
        delta: float = 0.0,
        stage: str | None = None,
        partition: str | None = None,
        sensitivity: float | None = None,
    ) -> None:
        """Transitional, for SecPE only (see :meth:`draw_once_unverified`): a declared charge, ``secure: None``."""
        self._check_name(name)
        record = self._record(name, mechanism, params, epsilon, delta, sensitivity, partition, stage)
        record.update(noise_source="drawn by the caller (not verified by the ledger)", secure=None,
                      guarantee=None, scale=None, accounted_in=None, releases=None)
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                self._check_same(existing, record)
                return
            self._commit_entry(record)

    # -- what the noise was ----------------------------------------------------------------------
    def noise_report(self) -> dict[str, Any]:
        """Whether every release came from the secure sampler: ``secure`` is False as soon as one entry was
        drawn from reproducible (insecure) noise; entries the ledger did not draw itself are ``unverified``."""
        insecure = sorted(n for n, e in self._entries.items() if e.get("secure") is False)
        unverified = sorted(n for n, e in self._entries.items() if e.get("secure") is None)
        report: dict[str, Any] = {"secure": not insecure, "insecure_entries": insecure,
                                  "unverified_entries": unverified}
        if insecure:
            report["stamp"] = INSECURE_STAMP
        return report

    def is_secure(self) -> bool:
        """False when any release of this run was drawn from reproducible noise (not differentially private)."""
        return not any(e.get("secure") is False for e in self._entries.values())

    def has(self, name: str) -> bool:
        return name in self._entries

    # -- reading the account ---------------------------------------------------------------------
    def entries(self) -> list[dict]:
        return [self._entries[k] for k in sorted(self._entries, key=lambda n: (self._entries[n]["created_at"], n))]

    def total(self) -> tuple[float, float]:
        """Composed (epsilon, delta) of this run: sum over stages, max over partitions within a stage."""
        return compose_entries(self._entries.values())

    def cumulative_total(self) -> dict[str, Any]:
        """What every run recorded in this state folder spent, this run's releases included
        (:func:`cumulative_total`). Owner-only: never written to a release."""
        return cumulative_total(self.state_uri, self.storage_options, current=(self.run_id, self.entries()))

    def state_dict(self) -> dict:
        return {"format": LEDGER_FORMAT, "run_id": self.run_id,
                "data_identity": self.data_identity, "entries": self.entries()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Adopt a saved state; refuses a state of another format, run or corpus, and any entry that
        disagrees with one already recorded here."""
        if state.get("format") != LEDGER_FORMAT:
            raise LedgerMismatchError(f"not a privseed ledger state (format {state.get('format')!r})")
        if not hmac.compare_digest(str(state.get("data_identity")), self.data_identity):
            raise LedgerMismatchError("the saved ledger belongs to another corpus (its data identity differs)")
        if state.get("run_id") != self.run_id:
            raise LedgerMismatchError(f"the saved ledger belongs to run {state.get('run_id')!r}, not {self.run_id!r}")
        with self._lock:
            for entry in state.get("entries", []):
                existing = self._entries.get(entry["name"])
                if existing is not None:
                    self._check_same(existing, entry)
                else:
                    self._write_entry(dict(entry))

    def to_json(self) -> str:
        """The recipient's ledger (``ledger.json`` of the release): what was released under which mechanism,
        parameters and (epsilon, delta), and the run's total. No data identity, no checksum of stored values,
        no times (the gaps between releases grow with the corpus), nothing about other runs."""
        entries = [{k: v for k, v in e.items() if k not in _OWNER_ONLY}
                   for e in sorted(self._entries.values(), key=lambda e: e["name"])]
        document = {"format": LEDGER_FORMAT, "run_id": self.run_id, "entries": entries, **self._totals()}
        return json.dumps(document, indent=2, sort_keys=True, default=to_jsonable) + "\n"

    def guarantee(self) -> dict[str, Any]:
        """What the run's releases guarantee: per-document (epsilon, delta)-DP, unless an entry's parameters declare
        another guarantee (``release_guarantee``: SecPE's (p, r)-secret protection), or none at all when a release
        was drawn from reproducible noise."""
        if not self.is_secure():
            return {"kind": "none", "statement": f"{INSECURE_STAMP}: noise reproducible from the public --seed"}
        declared = [e["params"]["release_guarantee"] for e in self.entries()
                    if isinstance(e.get("params"), dict) and "release_guarantee" in e["params"]]
        if declared:
            return dict(declared[0])
        return dict(DP_GUARANTEE)

    def _totals(self) -> dict[str, Any]:
        """The run's total and noise report (with the NOT DIFFERENTIALLY PRIVATE stamp when it applies)."""
        epsilon, delta = self.total()
        noise = self.noise_report()
        document: dict[str, Any] = {
            "total": {"epsilon": epsilon, "delta": delta, "secure": noise["secure"],
                      "composition": "basic across stages, parallel across partitions (classes)",
                      "guarantee": self.guarantee()},
            "noise": noise}
        if not noise["secure"]:
            document["stamp"] = INSECURE_STAMP
        return document

    def owner_json(self) -> str:
        """The owner's full ledger: every entry as stored (identity, value checksums, times), this run's total
        and the cumulative total of the state folder. Stays in the private state."""
        document = {**self.state_dict(), **self._totals()}
        document["cumulative"] = self.cumulative_total()
        return json.dumps(document, indent=2, sort_keys=True, default=to_jsonable) + "\n"

    def write_owner_ledger(self) -> str:
        """Write :meth:`owner_json` to ``runs/<run_id>/ledger.json`` in the private state; returns its URI."""
        uri = self.private_uri(OWNER_LEDGER)
        storage.write_bytes(uri, self.owner_json().encode(), self.storage_options)
        return uri

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _check_name(name: str) -> None:
        if not _NAME.match(name):
            raise PrivseedError(f"ledger name {name!r} may only contain letters, digits and _.=-")

    def _record(self, name, mechanism, params, epsilon, delta, sensitivity, partition, stage) -> dict:
        if not (epsilon >= 0 and np.isfinite(epsilon)) or not (0 <= delta < 1):
            raise PrivseedError(f"ledger entry {name!r}: epsilon must be finite and >= 0, delta in [0, 1)")
        return {
            "name": name,
            "mechanism": mechanism,
            "params": json.loads(canonical_params(params)),
            "params_canonical": canonical_params(params),
            "epsilon": float(epsilon),
            "delta": float(delta),
            "sensitivity": None if sensitivity is None else float(sensitivity),
            "partition": partition,
            "stage": stage,
            "charged": True,
            "run_id": self.run_id,
            "data_identity": self.data_identity,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }

    @staticmethod
    def _describe(name: str, mechanism: Any, noise: Any) -> dict[str, Any]:
        if isinstance(mechanism, str) or not callable(getattr(mechanism, "describe", None)):
            raise TypeError(f"ledger entry {name!r}: pass a mechanism object of privseed.tasks.dp.mechanisms, "
                            f"not {mechanism!r}")
        noise = as_noise_source(noise)
        description = dict(mechanism.describe(noise))
        for key in ("mechanism", "epsilon", "delta", "sensitivity", "scale", "noise_source", "secure"):
            if key not in description:
                raise PrivseedError(f"ledger entry {name!r}: the mechanism's description lacks {key!r}")
        return description

    @staticmethod
    def _noise_fields(description: Mapping[str, Any], *, accounted_in: str | None, releases: int) -> dict[str, Any]:
        return {"guarantee": json.loads(json.dumps(description, default=to_jsonable)),
                "scale": float(description["scale"]), "noise_source": str(description["noise_source"]),
                "secure": bool(description["secure"]), "accounted_in": accounted_in,
                "charged": accounted_in is None, "releases": releases}

    def _check_same(self, existing: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        for key in ("mechanism", "params_canonical", "epsilon", "delta", "partition", "stage", "sensitivity", "scale",
                    "secure", "noise_source", "accounted_in", "releases"):
            if key == "scale" and _same_scale(existing.get(key), record.get(key)):
                continue
            if existing.get(key) != record.get(key):
                raise LedgerMismatchError(
                    f"release {existing['name']!r} of run {self.run_id!r} was made with another "
                    f"{key.replace('_canonical', '')} ({_short(existing.get(key))} != {_short(record.get(key))}); "
                    "omit --run-id to draw a new release (and spend new budget), or restore the original configuration"
                )

    def _stored_value(self, name: str, record: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """The value already stored for ``name`` (None if none), checked against the parameters and the data
        identity it must have been drawn under."""
        uri = self._value_uri(name)
        if not storage.exists(uri, self.storage_options):
            return None
        arrays, stored_params, stored_identity = self._load_npz(storage.read_bytes(uri, self.storage_options))
        if stored_identity is None or not hmac.compare_digest(stored_identity, self.data_identity):
            raise self._mismatch()
        if stored_params != record["params_canonical"]:
            raise LedgerMismatchError(
                f"a value for {name!r} was drawn under other parameters in run {self.run_id!r}; omit --run-id to "
                "start a new run, or restore the original configuration")
        return arrays

    def _store_value(self, name: str, record: Mapping[str, Any],
                     arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Store a freshly drawn value create-if-absent; if another process stored one first, that value is
        the release and this one is discarded unseen (discarding a draw nobody saw costs no privacy)."""
        data = self._npz_bytes(arrays, record["params_canonical"], self.data_identity)
        if storage.create_exclusive(self._value_uri(name), data, self.storage_options):
            return arrays
        log.info("ledger: another process released %s first; using its value", name)
        winner = self._stored_value(name, record)
        assert winner is not None  # create_exclusive returned False: the object exists
        return winner

    def _commit_entry(self, record: dict) -> None:
        """Record an entry create-if-absent; a racing process's identical entry is adopted."""
        data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
        if storage.create_exclusive(self._entry_uri(record["name"]), data, self.storage_options):
            self._entries[record["name"]] = record
            return
        existing = json.loads(storage.read_bytes(self._entry_uri(record["name"]), self.storage_options))
        if not hmac.compare_digest(str(existing.get("data_identity")), self.data_identity):
            raise self._mismatch()
        self._check_same(existing, record)
        self._entries[record["name"]] = existing

    def _write_entry(self, record: dict) -> None:
        storage.write_bytes(self._entry_uri(record["name"]),
                            (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), self.storage_options)
        self._entries[record["name"]] = record

    def _read_value(self, name: str, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
        uri = self._value_uri(name)
        data = storage.read_bytes(uri, self.storage_options)
        if hashlib.sha256(data).hexdigest() != entry["value"]["sha256"]:
            raise LedgerMismatchError(f"stored value of {name!r} does not match its ledger checksum")
        arrays, _, stored_identity = self._load_npz(data)
        if stored_identity is None or not hmac.compare_digest(stored_identity, self.data_identity):
            raise self._mismatch()
        return arrays

    @staticmethod
    def _npz_bytes(arrays: Mapping[str, np.ndarray], params_canonical: str, data_identity: str) -> bytes:
        buffer = io.BytesIO()
        # numpy's stub gives savez a typed allow_pickle keyword, so any **mapping of arrays is flagged
        np.savez(buffer, __params__=np.array(params_canonical), __identity__=np.array(data_identity),
                 **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @staticmethod
    def _load_npz(data: bytes) -> tuple[dict[str, np.ndarray], str, str | None]:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files if k not in ("__params__", "__identity__")}
            identity = str(npz["__identity__"]) if "__identity__" in npz.files else None
            return arrays, str(npz["__params__"]), identity


#: Fields of an entry that stay in the private state: the keyed data identity, the checksum and path of the
#: stored value, and the time (gaps between releases grow with |D|).
_OWNER_ONLY = frozenset({"data_identity", "value", "created_at", "params_canonical", "run_id"})


def _read_entries(run_uri: str, storage_options: Mapping[str, Any] | None) -> list[dict]:
    entries = []
    for uri in storage.listdir(storage.join(run_uri, "entries"), storage_options):
        if uri.endswith(".json"):
            entries.append(json.loads(storage.read_bytes(uri, storage_options)))
    return entries


#: The owner's full ledger of a run (``PrivacyLedger.write_owner_ledger``), written when the run publishes: a run
#: whose folder holds entries and not this file drew values and did not publish (:func:`unfinished_runs`).
OWNER_LEDGER = "ledger.json"


def cumulative_total(state_uri: str, storage_options: Mapping[str, Any] | None = None,
                     current: tuple[str, list[dict]] | None = None) -> dict[str, Any]:
    """What every run recorded in the state folder ``state_uri`` spent, composed conservatively; ``current`` is
    (run id, entries) of a run whose entries are held in memory.

    Runs compose by basic composition (their totals add up) unless their keyed row identities prove
    their corpora disjoint; disjoint groups compose in parallel (the maximum over groups), because one
    document then contributes to one group only. A run with no row identities (made from a plain
    identity string) is taken to overlap every other. Owner-only: whether two corpora overlap depends on
    the private data, so this figure is never written to a release."""
    runs: list[dict[str, Any]] = []
    for uri in storage.listdir(storage.join(state_uri, "runs"), storage_options):
        run_id = uri.rstrip("/").rsplit("/", 1)[-1]
        entries = current[1] if current is not None and run_id == current[0] else _read_entries(uri, storage_options)
        if not entries:
            continue
        meta_uri = storage.join(uri, "run.json")
        digest = (json.loads(storage.read_bytes(meta_uri, storage_options)).get("data_identity")
                  if storage.exists(meta_uri, storage_options) else None)
        rows_uri = storage.join(uri, "rows.npy")
        rows = (np.load(io.BytesIO(storage.read_bytes(rows_uri, storage_options)), allow_pickle=False)
                if storage.exists(rows_uri, storage_options) else None)
        eps, delta = compose_entries(entries)
        runs.append({"run_id": run_id, "digest": digest, "rows": rows, "epsilon": eps, "delta": delta})
    groups = _overlap_groups(runs)
    sums = [(sum(runs[i]["epsilon"] for i in g), sum(runs[i]["delta"] for i in g)) for g in groups]
    return {
        "epsilon": max((e for e, _ in sums), default=0.0),
        "delta": max((d for _, d in sums), default=0.0),
        "runs": [{"run_id": r["run_id"], "epsilon": r["epsilon"], "delta": r["delta"]} for r in runs],
        "groups": [[runs[i]["run_id"] for i in g] for g in groups],
        "composition": "basic (sum) across runs whose corpora may overlap; parallel (max) across groups of runs "
                       "whose keyed row identities prove them disjoint",
    }


def unfinished_runs(state_uri: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The runs of the state folder ``state_uri`` that drew or charged something and did not publish (no
    :data:`OWNER_LEDGER`), oldest first. Resuming one (``--run-id``) re-reads its values and charges nothing;
    a new run charges the budget again. Reads the folder's listing and the runs' ``run.json`` only."""
    found: list[tuple[str, str]] = []
    for uri in storage.listdir(storage.join(state_uri, "runs"), storage_options):
        run_id = uri.rstrip("/").rsplit("/", 1)[-1]
        if storage.exists(storage.join(uri, OWNER_LEDGER), storage_options):
            continue
        if not storage.listdir(storage.join(uri, "entries"), storage_options):
            continue  # opened, nothing drawn: nothing to resume and nothing spent
        meta_uri = storage.join(uri, "run.json")
        created = (str(json.loads(storage.read_bytes(meta_uri, storage_options)).get("created_at", ""))
                   if storage.exists(meta_uri, storage_options) else "")
        found.append((created, run_id))
    return [run_id for _, run_id in sorted(found)]


def compose_entries(entries: Iterable[Mapping[str, Any]]) -> tuple[float, float]:
    """Sum over stages, max over partitions within a stage (releases on disjoint classes)."""
    per_stage: dict[str, dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for entry in entries:
        if not entry.get("charged", True):
            continue
        stage = entry.get("stage") or f"__{entry['name']}"
        bucket = per_stage[stage][entry.get("partition")]
        bucket[0] += float(entry["epsilon"])
        bucket[1] += float(entry["delta"])
    epsilon = delta = 0.0
    for partitions in per_stage.values():
        unpartitioned = partitions.pop(None, [0.0, 0.0])
        epsilon += unpartitioned[0] + max((p[0] for p in partitions.values()), default=0.0)
        delta += unpartitioned[1] + max((p[1] for p in partitions.values()), default=0.0)
    return epsilon, delta


def _overlap_groups(runs: list[dict[str, Any]]) -> list[list[int]]:
    """Connected components of "may share a document": the same identity, no row identities to compare, or
    a common keyed row identity. Any one document's runs lie in one component, so a component's sum bounds
    what that document spent."""
    parent = list(range(len(runs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            a, b = runs[i], runs[j]
            overlap = (a["rows"] is None or b["rows"] is None or a["digest"] == b["digest"]
                       or np.intersect1d(a["rows"], b["rows"], assume_unique=True).size > 0)
            if overlap:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(runs)):
        groups[find(i)].append(i)
    return list(groups.values())


#: How far a re-read's noise scale may lie from the stored release's and still be the same calibration: a calibrated
#: Gaussian's sigma rose by 2^-30 of itself when it moved to OpenDP's coarser lattice (5c05971,
#: ``GAUSSIAN_LATTICE_SLACK``), so a run drawn before resumes on its draws; any change of the configuration moves a
#: scale by far more.
SCALE_REL_TOLERANCE = 2.0 ** -28


def _same_scale(stored: Any, now: Any) -> bool:
    """Whether two recorded noise scales are the same calibration (``SCALE_REL_TOLERANCE``)."""
    if not isinstance(stored, (int, float)) or not isinstance(now, (int, float)):
        return stored == now
    return math.isclose(float(stored), float(now), rel_tol=SCALE_REL_TOLERANCE, abs_tol=0.0)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
