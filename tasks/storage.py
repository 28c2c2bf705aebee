"""Paths on local disk, ``file://`` or ``s3://`` through fsspec, with the retries object storage needs.

Storage options (endpoint, credentials) come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) or from ``--storage-option
KEY=VALUE`` flags. Credentials are never logged: :func:`redact_options` is what goes into manifests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs

from privseed.tasks.errors import ConfigError, StorageAccessError, StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")

_SECRET_KEYS = ("secret", "key", "token", "password", "credential")


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def parse_storage_options(pairs: Iterable[str] = (), flag: str = "--storage-option") -> dict[str, Any]:
    """``["endpoint_url=http://127.0.0.1:9000", "anon=false"]`` -> options for fsspec (or, named by ``flag``,
    any other repeatable ``KEY=VALUE`` option).

    Values "true"/"false" and numbers are converted, because s3fs expects booleans and ints."""
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{flag} expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"{flag} has an empty key in {pair!r}")
        options[key] = _coerce(value.strip())
    return options


def _coerce(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def resolve_storage_options(uri: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Options for ``uri``: explicit ones win over the environment.

    s3fs does not read ``AWS_ENDPOINT_URL`` on every version, so it is passed explicitly; the region is
    left to ``AWS_DEFAULT_REGION`` (setting it through client_kwargs breaks ``mkdir`` on s3fs)."""
    resolved = {k: _resolve_secret_reference(k, v) for k, v in (options or {}).items()}
    if uri.startswith(("s3://", "s3a://")):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in resolved and "client_kwargs" not in resolved:
            resolved["endpoint_url"] = endpoint
        # with_retries is the one retry loop with backoff; botocore's default (5 attempts with its own
        # backoff, inside each of ours) made a dead endpoint take ~40 s per operation instead of ~8 s.
        resolved.setdefault("config_kwargs", {"retries": {"max_attempts": 2, "mode": "standard"}})
    return resolved


SECRET_BLOCK_PREFIX = "prefect-secret:"


def _resolve_secret_reference(key: str, value: Any) -> Any:
    """``secret=prefect-secret:NAME`` -> the value of the Prefect Secret block NAME, read when storage is
    opened. Configs, manifests and flow-run parameters then carry only the block's name."""
    if not (isinstance(value, str) and value.startswith(SECRET_BLOCK_PREFIX)):
        return value
    name = value[len(SECRET_BLOCK_PREFIX):]
    from prefect.blocks.system import Secret

    try:
        # Prefect's sync/async dual API types the result as maybe-a-coroutine; _sync=True returns the block
        return Secret.load(name, _sync=True).get()  # type: ignore[call-arg, union-attr]
    except ValueError as exc:
        raise ConfigError(f"storage option {key!r} names Prefect Secret block {name!r}, which cannot be loaded: "
                          f"{exc}") from exc


def refuse_literal_secrets(options: Mapping[str, Any]) -> None:
    """Flow parameters are stored and shown by the Prefect server, so a credential given as a flag would
    leak there. Credentials come from the AWS_* environment variables or a Prefect Secret block."""
    for key, value in options.items():
        if any(s in key.lower() for s in _SECRET_KEYS) and not (
            isinstance(value, str) and value.startswith(SECRET_BLOCK_PREFIX)
        ):
            raise ConfigError(
                f"--storage-option {key}=... would store a credential in the flow run's parameters; set it in the "
                f"environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or write {key}={SECRET_BLOCK_PREFIX}BLOCK"
            )


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Storage options safe to write into a manifest or a log."""
    return {
        k: ("***" if any(s in k.lower() for s in _SECRET_KEYS) else v)
        for k, v in (options or {}).items()
    }


def filesystem(uri: str, options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and the path inside it."""
    try:
        return url_to_fs(uri, **resolve_storage_options(uri, options))
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot open storage for {uri!r}: {exc}") from exc


def join(uri: str, *parts: str) -> str:
    base = uri.rstrip("/")
    return "/".join([base, *[p.strip("/") for p in parts if p]])


def with_retries(action: Callable[[], T], *, what: str, attempts: int = 3, base_delay: float = 0.5) -> T:
    """Run ``action`` with exponential backoff on transient I/O errors; raise StorageError at the end.

    Object stores drop connections and throttle; a write that fails after every attempt is reported
    with what was being done, never with the data."""
    last: BaseException | None = None
    for attempt in range(attempts):
        try:
            return action()
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except (OSError, ConnectionError, TimeoutError) as exc:
            last = exc
            if attempt + 1 < attempts:
                delay = base_delay * 2**attempt
                log.warning("storage: %s failed (%s); retrying in %.1fs", what, type(exc).__name__, delay)
                time.sleep(delay)
        except Exception as exc:  # botocore/aiohttp errors do not all derive from OSError
            if not _looks_transient(exc):
                raise classified(exc, f"{what} failed") from exc
            last = exc
            if attempt + 1 < attempts:
                time.sleep(base_delay * 2**attempt)
    raise StorageError(f"{what} failed after {attempts} attempts: {type(last).__name__}: {last}") from last


#: Errors of botocore and the stores that a repeat cannot fix (by class name: this module imports no botocore).
_ACCESS_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoSuchBucket",
                  "InvalidAccessKeyId", "SignatureDoesNotMatch", "ProfileNotFound")
CREDENTIALS_HELP = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, give "
                    "--storage-option key=prefect-secret:BLOCK, or --storage-option anon=true for a public bucket")


def classified(exc: BaseException, what: str) -> StorageError | StorageAccessError:
    """A foreign storage failure as privseed's error: missing or refused credentials and missing buckets are a
    StorageAccessError (deterministic, never retried), anything else a StorageError (transient)."""
    response = getattr(exc, "response", None)
    code = str(((response.get("Error") or {}) if isinstance(response, dict) else {}).get("Code", ""))
    names = {cls.__name__ for cls in type(exc).__mro__} | {code}
    text = f"{type(exc).__name__}: {exc}"
    if names & set(_ACCESS_ERRORS):
        hint = f"; {CREDENTIALS_HELP}" if "Credential" in text or "AccessKey" in text or "Signature" in text else ""
        return StorageAccessError(f"{what}: {text}{hint}")
    return StorageError(f"{what}: {text}")


def _looks_transient(exc: BaseException) -> bool:
    name = type(exc).__name__
    return any(s in name for s in ("Connect", "Timeout", "EndpointConnection", "ServerDisconnected", "Throttl"))


def write_bytes(uri: str, data: bytes, options: Mapping[str, Any] | None = None) -> None:
    """Write a whole object atomically: a temporary name then a rename on local disk; one PUT on S3
    (an S3 object is never visible half-written)."""
    fs, path = filesystem(uri, options)
    write_atomic(fs, path, data, what=f"writing {uri}")


def is_local_fs(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes, *, what: str) -> None:
    """:func:`write_bytes` on an already opened filesystem (for callers that write many objects and
    should resolve their storage options once): temp + rename locally, one PUT elsewhere, with retries."""

    def _write() -> None:
        if not is_local_fs(fs):
            fs.pipe_file(path, data)
            return
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    with_retries(_write, what=what)


def create_exclusive(uri: str, data: bytes, options: Mapping[str, Any] | None = None) -> bool:
    """Write ``uri`` only if nothing is there yet; True when this call created it, False when another
    writer got there first (its object is left untouched, the caller reads it back).

    Two processes that race for the same name (a scheduled run and a dashboard trigger with one run id)
    must not both succeed, or both would release a value: locally the complete file is written under a
    temporary name and hard-linked into place (``link`` fails atomically when the name exists); on S3
    one PUT with ``If-None-Match: *`` (s3fs ``mode="create"``), which the store refuses when the key
    exists. Either way the object is never visible half-written."""
    fs, path = filesystem(uri, options)
    if is_local_fs(fs):
        return with_retries(lambda: _create_local(path, data), what=f"creating {uri}")

    def _put() -> bool:
        try:
            fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except OSError:
            # Some S3-compatible stores answer a failed precondition without naming the condition (s3fs
            # then raises a generic OSError); a lost race is an object that now exists.
            fs.invalidate_cache(path)
            if fs.exists(path):
                return False
            raise

    return with_retries(_put, what=f"creating {uri}")


def _create_local(path: str, data: bytes) -> bool:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_bytes(uri: str, options: Mapping[str, Any] | None = None) -> bytes:
    fs, path = filesystem(uri, options)
    return with_retries(lambda: fs.cat_file(path), what=f"reading {uri}")


def exists(uri: str, options: Mapping[str, Any] | None = None) -> bool:
    fs, path = filesystem(uri, options)
    return with_retries(lambda: fs.exists(path), what=f"checking {uri}")


def listdir(uri: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Full URIs of the entries directly under ``uri`` (empty if it does not exist)."""
    fs, path = filesystem(uri, options)

    def _ls() -> list[str]:
        if not fs.exists(path):
            return []
        return sorted(fs.ls(path, detail=False))

    names = with_retries(_ls, what=f"listing {uri}")
    return [_unstrip(uri, path, n) for n in names]


def remove(uri: str, options: Mapping[str, Any] | None = None, recursive: bool = False) -> None:
    fs, path = filesystem(uri, options)

    def _rm() -> None:
        if fs.exists(path):
            fs.rm(path, recursive=recursive)

    with_retries(_rm, what=f"removing {uri}")


def move(src: str, dst: str, options: Mapping[str, Any] | None = None) -> None:
    """Move one object (a rename on local disk; a server-side copy and a delete on S3), with retries."""
    fs, src_path = filesystem(src, options)
    _, dst_path = filesystem(dst, options)

    def _mv() -> None:
        if is_local_fs(fs):
            os.makedirs(os.path.dirname(dst_path), exist_ok=True)
        fs.mv(src_path, dst_path)

    with_retries(_mv, what=f"moving {src} to {dst}")


def _unstrip(uri: str, path: str, name: str) -> str:
    """fsspec lists paths without the protocol; put it back so callers keep full URIs."""
    if "://" in uri:
        protocol = uri.split("://", 1)[0]
        if protocol == "file":
            return "file://" + name
        return f"{protocol}://{name}"
    return name
