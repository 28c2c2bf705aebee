"""What a configuration field carries besides its type: its command-line metadata (:func:`cli`) and the budget
bounds shared by the option groups (options.py) and the command models (commands.py). Imports pydantic only."""

from __future__ import annotations

from typing import Any


def cli(*, flag: str | None = None, aliases: tuple[str, ...] = (), default_text: str | None = None,
        default_note: str | None = None, metavar: str | None = None, positional: bool = False,
        group: str | None = None, either: str | None = None) -> dict[str, Any]:
    """A field's command-line metadata, kept in its ``json_schema_extra`` (so it is plain data):

    ``flag``: the flag's name when it is not the field's name with dashes (``n_features`` -> ``--features``);
    ``aliases``: further names of the same flag (``--population`` for ``--per-class``);
    ``default_text``: what an unset field (default None) means, shown as its default ("a LocalCluster"; "required"
    for a value a run refuses to go without although the model's default is None);
    ``default_note``: when another setting changes a non-None default, appended to it;
    ``metavar``: the value's placeholder in --help; ``positional``: an argument without a flag (DATA);
    ``group``: the --help section, when not the one of the model that declares the field (``cli_group``);
    ``either``: fields that share this key are alternatives, one of which a run needs (--labels, --labels-file)."""
    meta = {"flag": flag, "aliases": list(aliases) or None, "default_text": default_text,
            "default_note": default_note, "metavar": metavar, "positional": positional or None, "group": group,
            "either": either}
    return {key: value for key, value in meta.items() if value is not None}


#: A budget's JSON-schema bound, for the fields whose own validator words the error for the command line
#: (:func:`positive_epsilon`): a deployment's server refuses epsilon 0 when the run is submitted, before it starts.
POSITIVE: dict[str, Any] = {"exclusiveMinimum": 0}


def positive_epsilon(value: float | None) -> float | None:
    """An epsilon as a validator checks it: None (unset) or a finite number > 0, with a message for a person."""
    if value is None:
        return value
    if not value > 0:
        raise ValueError(f"epsilon must be > 0 (got {value}); epsilon = 0 would release nothing useful")
    if value != value or value == float("inf"):
        raise ValueError("epsilon must be a finite number")
    return value
