"""The privacy ledger and the draw-once store of privatized values.

Guarantee this module enforces (docs/privacy.md, "Draw once, charge once"): a privatized value is drawn
**once**, by applying a mechanism of tasks.mechanisms to the exact value, and persisted with the parameters it
was drawn under. A retry, a resumed run or a re-run with the
same run id re-reads it and charges nothing; the same name asked for under other parameters is refused
with :class:`LedgerMismatchError` (silently redrawing would spend the budget twice, silently reusing would
misreport the guarantee). Every release is recorded with what its mechanism reports (epsilon, delta,
sensitivity, scale, noise source and whether that source is secure), its parameters and the dataset
fingerprint; a run with any release from reproducible noise is stamped NOT DIFFERENTIALLY PRIVATE.

Composition: releases of different stages compose by basic composition (sum of epsilons and deltas).
Within a stage, releases on disjoint parts of the corpus (``partition``, e.g. one per class) compose in
parallel: the stage costs the maximum over partitions of the sum within each partition.

Layout under ``state_uri`` (one folder per run id)::

    runs/<run_id>/entries/<name>.json     one file per release: no read-modify-write races between tasks
    runs/<run_id>/values/<name>.npz       the released arrays, with their parameters embedded
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tasks import storage
from tasks.errors import LedgerMismatchError, PrivseedError
from tasks.mechanisms import INSECURE_STAMP, Mechanism, NoiseSource, as_noise_source

log = logging.getLogger(__name__)

LEDGER_FORMAT = "privseed-ledger/1"
_NAME = re.compile(r"^[A-Za-z0-9_.=-]+$")


def public_rng(seed: int, *names: str) -> np.random.Generator:
    """An independent stream of PUBLIC randomness for (seed, stage names): random features, sampling from
    released sketches, selection from released histograms, LLM call seeds, masks.

    ``--seed`` is published in the manifest, so nothing drawn from this stream is secret: it is never noise.
    The mechanisms of tasks.mechanisms refuse a Generator; noise comes from ``tasks.mechanisms.secure_noise()``
    (or, opted in and stamped, ``insecure_noise``). Streams are independent per name, so changing how many
    sequences are sampled never changes the features."""
    words = [int.from_bytes(hashlib.sha256(n.encode()).digest()[:4], "little") for n in names]
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *words]))


def canonical_params(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=_jsonable)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


class PrivacyLedger:
    """Records every privatized release of one run and stores its values so they are drawn once."""

    def __init__(
        self,
        state_uri: str,
        dataset_fingerprint: str,
        run_id: str,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _NAME.match(run_id):
            raise PrivseedError(f"run id {run_id!r} may only contain letters, digits and _.=-")
        self.state_uri = state_uri
        self.dataset_fingerprint = dataset_fingerprint
        self.run_id = run_id
        self.storage_options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self._load_entries()

    # -- paths -----------------------------------------------------------------------------------
    @property
    def run_uri(self) -> str:
        return storage.join(self.state_uri, "runs", self.run_id)

    def _entry_uri(self, name: str) -> str:
        return storage.join(self.run_uri, "entries", f"{name}.json")

    def _value_uri(self, name: str) -> str:
        return storage.join(self.run_uri, "values", f"{name}.npz")

    def _load_entries(self) -> None:
        for uri in storage.listdir(storage.join(self.run_uri, "entries"), self.storage_options):
            if not uri.endswith(".json"):
                continue
            entry = json.loads(storage.read_bytes(uri, self.storage_options))
            if entry.get("dataset_fingerprint") != self.dataset_fingerprint:
                raise LedgerMismatchError(
                    f"run {self.run_id!r} in {self.state_uri} was made on another dataset "
                    f"(fingerprint {entry.get('dataset_fingerprint', '?')[:12]}..., this corpus is "
                    f"{self.dataset_fingerprint[:12]}...); choose another --run-id or output"
                )
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
        """Transitional, for SecPE only until its noise is drawn through tasks.mechanisms: the caller draws the
        value and declares its guarantee. Recorded with ``secure: None`` (the ledger cannot vouch for noise it
        did not apply) and listed as unverified in ``ledger.json``."""
        self._check_name(name)
        record = self._record(name, mechanism, params, epsilon, delta, sensitivity, partition, stage)
        record.update(noise_source="drawn by the caller (not verified by the ledger)", secure=None,
                      guarantee=None, scale=None, accounted_in=None, releases=1)
        return self._draw_and_record(name, record, lambda: {k: np.asarray(v) for k, v in draw().items()})

    def _draw_and_record(self, name: str, record: dict, draw: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                self._check_same(existing, record)
                return self._read_value(name, existing)
            value_uri = self._value_uri(name)
            if storage.exists(value_uri, self.storage_options):
                # Drawn before a crash but not yet recorded: reuse it (never redraw) and record it now.
                arrays, stored_params = self._read_npz(value_uri)
                if stored_params != record["params_canonical"]:
                    raise LedgerMismatchError(
                        f"a value for {name!r} was drawn under other parameters in run {self.run_id!r}"
                    )
                log.info("ledger: %s was drawn before an interruption; reusing it", name)
            else:
                arrays = draw()
                data = self._npz_bytes(arrays, record["params_canonical"])
                storage.write_bytes(value_uri, data, self.storage_options)
            data = storage.read_bytes(value_uri, self.storage_options)
            record["value"] = {"path": f"values/{name}.npz", "sha256": hashlib.sha256(data).hexdigest(),
                               "arrays": {k: list(v.shape) for k, v in arrays.items()}}
            self._write_entry(record)
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

        The charge is the mechanism's (epsilon, delta) as it reports them: for a Gaussian mechanism that is what
        its sigma was calibrated for over all ``releases`` by the accountant; a Laplace mechanism's epsilon is
        per release and ``releases`` of them compose by basic composition. Idempotent per name: the same charge
        twice is recorded once; other parameters are refused."""
        self._check_name(name)
        if int(releases) != releases or releases < 1:
            raise PrivseedError(f"charge {name!r}: releases must be a whole number >= 1, got {releases!r}")
        description = self._describe(name, mechanism, noise)
        epsilon, delta = float(description["epsilon"]), float(description["delta"])
        if description["mechanism"] == "laplace":
            epsilon *= int(releases)
        record = self._record(name, description["mechanism"], params, epsilon, delta, description["sensitivity"],
                              partition, stage)
        record.update(self._noise_fields(description, accounted_in=None, releases=int(releases)))
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                self._check_same(existing, record)
                return
            self._write_entry(record)

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
            self._write_entry(record)

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
        """Composed (epsilon, delta): sum over stages, max over partitions within a stage."""
        per_stage: dict[str, dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        for entry in self._entries.values():
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

    def state_dict(self) -> dict:
        return {"format": LEDGER_FORMAT, "run_id": self.run_id,
                "dataset_fingerprint": self.dataset_fingerprint, "entries": self.entries()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Adopt a saved state; refuses a state of another format, run or dataset, and any entry that
        disagrees with one already recorded here."""
        if state.get("format") != LEDGER_FORMAT:
            raise LedgerMismatchError(f"not a privseed ledger state (format {state.get('format')!r})")
        if state.get("dataset_fingerprint") != self.dataset_fingerprint:
            raise LedgerMismatchError("the saved ledger belongs to another dataset")
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
        epsilon, delta = self.total()
        document = self.state_dict()
        document["total"] = {"epsilon": epsilon, "delta": delta,
                             "composition": "basic across stages, parallel across partitions (classes)"}
        document["noise"] = self.noise_report()
        document["total"]["secure"] = document["noise"]["secure"]
        if not document["noise"]["secure"]:
            document["stamp"] = INSECURE_STAMP
        document["previous_runs"] = self._previous_runs()
        return json.dumps(document, indent=2, sort_keys=True, default=_jsonable) + "\n"

    def _previous_runs(self) -> list[dict]:
        """Other runs on the same dataset in the same state folder: their budget was spent too."""
        runs = []
        for uri in storage.listdir(storage.join(self.state_uri, "runs"), self.storage_options):
            run_id = uri.rstrip("/").rsplit("/", 1)[-1]
            if run_id == self.run_id:
                continue
            try:
                other = PrivacyLedger(self.state_uri, self.dataset_fingerprint, run_id, self.storage_options)
            except LedgerMismatchError:
                continue
            if other._entries:
                eps, delta = other.total()
                runs.append({"run_id": run_id, "epsilon": eps, "delta": delta})
        return runs

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
            "dataset_fingerprint": self.dataset_fingerprint,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }

    @staticmethod
    def _describe(name: str, mechanism: Any, noise: Any) -> dict[str, Any]:
        if isinstance(mechanism, str) or not callable(getattr(mechanism, "describe", None)):
            raise TypeError(f"ledger entry {name!r}: pass a mechanism object of tasks.mechanisms, not {mechanism!r}")
        noise = as_noise_source(noise)
        description = dict(mechanism.describe(noise))
        for key in ("mechanism", "epsilon", "delta", "sensitivity", "scale", "noise_source", "secure"):
            if key not in description:
                raise PrivseedError(f"ledger entry {name!r}: the mechanism's description lacks {key!r}")
        return description

    @staticmethod
    def _noise_fields(description: Mapping[str, Any], *, accounted_in: str | None, releases: int) -> dict[str, Any]:
        return {"guarantee": json.loads(json.dumps(description, default=_jsonable)),
                "scale": float(description["scale"]), "noise_source": str(description["noise_source"]),
                "secure": bool(description["secure"]), "accounted_in": accounted_in,
                "charged": accounted_in is None, "releases": releases}

    def _check_same(self, existing: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        for key in ("mechanism", "params_canonical", "epsilon", "delta", "partition", "stage", "sensitivity", "scale",
                    "secure", "noise_source", "accounted_in", "releases"):
            if existing.get(key) != record.get(key):
                raise LedgerMismatchError(
                    f"release {existing['name']!r} of run {self.run_id!r} was made with another {key.replace('_canonical', '')}"
                    f" ({_short(existing.get(key))} != {_short(record.get(key))}); use another --run-id "
                    "to draw a new release (and spend new budget), or restore the original configuration"
                )

    def _write_entry(self, record: dict) -> None:
        storage.write_bytes(self._entry_uri(record["name"]), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
                            self.storage_options)
        self._entries[record["name"]] = record

    def _read_value(self, name: str, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
        uri = self._value_uri(name)
        data = storage.read_bytes(uri, self.storage_options)
        if hashlib.sha256(data).hexdigest() != entry["value"]["sha256"]:
            raise LedgerMismatchError(f"stored value of {name!r} does not match its ledger checksum")
        arrays, _ = self._load_npz(data)
        return arrays

    def _read_npz(self, uri: str) -> tuple[dict[str, np.ndarray], str]:
        return self._load_npz(storage.read_bytes(uri, self.storage_options))

    @staticmethod
    def _npz_bytes(arrays: Mapping[str, np.ndarray], params_canonical: str) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, __params__=np.array(params_canonical), **arrays)
        return buffer.getvalue()

    @staticmethod
    def _load_npz(data: bytes) -> tuple[dict[str, np.ndarray], str]:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files if k != "__params__"}
            return arrays, str(npz["__params__"])


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
