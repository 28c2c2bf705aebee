"""The release's dataset card (README.md): what makes ``datasets.load_dataset(OUT)`` open a release folder.

Its YAML header has a ``configs:`` block whose one split names exactly the synthetic parts of this release (the
manifest's, so the ledger, the reports, older releases' parts and quarantined candidates are never read as data),
and, when every column's Arrow type has a ``datasets`` feature, the features, with the label column as a
``ClassLabel`` whose names are the declared class names (``--class-names``) when the labels are the integers
0..n-1, else the declared labels themselves.

Privacy: the card says nothing the release does not already publish: the release id, the synthetic row counts
(per class, from the configuration), the columns, the declared labels and class names, and the manifest's
``privacy`` section: the guarantee the ledger states (``PrivacyLedger.guarantee``: (epsilon, delta)-DP, SecPE's
(p, r)-secret protection, or none for reproducible noise) with the totals. The card words that one statement and
never one of its own, so it cannot promise differential privacy where the manifest says otherwise. Pure: no I/O, no
``datasets`` import (a release writer does not need it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import yaml

from privseed.tasks.dp.ledger import DP_GUARANTEE, plain_guarantee

#: Arrow types with the same name as a ``datasets`` Value dtype
_VALUE_TYPES = {"string", "large_string", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float", "double", "null"}
_RENAMED = {"float": "float32", "double": "float64", "large_string": "large_string"}


def feature_of(kind: pa.DataType) -> str | dict[str, Any] | None:
    """The ``datasets`` feature (as its YAML) of an Arrow type: a dtype name, ``{"list": ...}``, or None when there is
    none this module knows."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = feature_of(kind.value_type)
        return {"list": inner} if isinstance(inner, str) else None
    name = str(kind)
    if name in _VALUE_TYPES:
        return _RENAMED.get(name, name)
    return None


def class_label_names(labels: Sequence[Any], class_names: Mapping[str, str] | None) -> list[str] | None:
    """The names of a ClassLabel over the released labels: for the integers 0..n-1, the declared class names (the
    label itself where none is declared); for text labels, the labels (a ClassLabel stores a text label by its
    position among its names); None for any other integers (a ClassLabel cannot hold them)."""
    as_text = [str(label) for label in labels]
    if all(isinstance(label, (int,)) and not isinstance(label, bool) for label in labels):
        if sorted(labels) != list(range(len(labels))):
            return None
        return [str((class_names or {}).get(str(i), i)) for i in range(len(labels))]
    return as_text


def features_yaml(schema: pa.Schema, label_column: str, label_names: list[str] | None) -> list[dict] | None:
    """The ``dataset_info.features`` list of a release's parts, or None when a column has no known feature."""
    features: list[dict[str, Any]] = []
    for field in schema:
        if field.name == label_column and label_names is not None:
            features.append({"name": field.name, "dtype": {"class_label": {"names": dict(enumerate(label_names))}}})
            continue
        feature = feature_of(field.type)
        if feature is None:
            return None
        features.append({"name": field.name, **({"list": feature["list"]} if isinstance(feature, dict)
                                                 else {"dtype": feature})})
    return features


def differentially_private(privacy: Mapping[str, Any]) -> bool:
    """Whether the manifest's ``privacy`` section states (epsilon, delta)-DP (not SecPE's secret protection, not a
    release drawn from reproducible noise)."""
    guarantee = privacy.get("guarantee") or {}
    return bool(privacy.get("secure", False)) and guarantee.get("kind") == DP_GUARANTEE["kind"]


def guarantee_text(privacy: Mapping[str, Any]) -> str:
    """The card's privacy paragraph: the manifest's ``privacy.guarantee`` statement, word for word, with the
    ledger's totals (called the guarantee only when the statement is (epsilon, delta)-DP), then what it means in
    one plain sentence (``privseed.tasks.dp.ledger.plain_guarantee``, the report's and the artifacts' wording)."""
    guarantee = privacy.get("guarantee") or {}
    statement = str(guarantee.get("statement") or "no guarantee stated")
    epsilon, delta = float(privacy.get("epsilon", float("nan"))), float(privacy.get("delta", 0.0))
    totals = f"epsilon = {epsilon:g}, delta = {delta:g}"
    if differentially_private(privacy):
        return f"Privacy guarantee: {statement}; the total is {totals} (`ledger.json`). {plain_guarantee(privacy)}"
    kind = "none" if not privacy.get("secure", False) else str(guarantee.get("kind") or "none")
    return (f"Privacy guarantee: {kind}. {statement}. The ledger's total ({totals}, `ledger.json`) is not a "
            "differential privacy guarantee of this release; `manifest.json` (`privacy.guarantee`) states what is "
            f"guaranteed. {plain_guarantee(privacy)}")


def dataset_card(*, release_id: str, part_paths: Sequence[str], schema: pa.Schema | None, rows: int,
                 rows_per_label: Mapping[str, int], labels: Sequence[Any], class_names: Mapping[str, str] | None,
                 privacy: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """README.md of a release: the YAML header ``datasets`` reads, then a short human description. ``privacy`` is
    the manifest's ``privacy`` section (its ``guarantee`` is the one statement of what the release guarantees)."""
    tags = ["synthetic", "differential-privacy", "privseed"] if differentially_private(privacy) else \
        ["synthetic", "privseed"]
    header: dict[str, Any] = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": list(part_paths)}]}],
        "tags": tags,
    }
    features = features_yaml(schema, "label", class_label_names(list(labels), class_names)) if schema else None
    if features is not None:
        header["dataset_info"] = {"config_name": "default", "features": features}
    names = class_names or {}
    classes = "\n".join(f"| {label} | {names.get(str(label), '')} | {rows_per_label.get(str(label), 0)} |"
                        for label in labels)
    body = f"""# Synthetic corpus, privseed release {release_id}

{rows} synthetic documents written by privseed from noisy statistics of a private corpus.

{guarantee_text(privacy)}

`manifest.json` names every file of this release with its sha256 and the method's settings; `quality.json` holds
the release gate's checks.

Open it with `datasets.load_dataset("path/to/this/folder")` (one `train` split) or with
`pandas.read_parquet("path/to/this/folder/synthetic")`.

| label | class name | synthetic documents |
|---|---|---|
{classes}
"""
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n\n" + body
