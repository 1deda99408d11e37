"""Sparse profiles on disk (engine/sparse/profile.py): round trip, absence, and refusal when stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.errors import RigllmError
from engine.gguf.loader import load_model
from engine.reference.sparse_attention import DENSE, Pattern
from engine.sparse.profile import (
    HeadChoice,
    SparseProfile,
    StaleProfile,
    load_profile,
    model_identity,
    profile_path,
    require_profile,
    save_profile,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-f32.gguf"


def sample(identity: str) -> SparseProfile:
    heads = [HeadChoice(Pattern("a_shape", sink=1, window=4), 0.08, 0.3),
             HeadChoice(Pattern("vertical_slash", vertical=2, slash=3), 0.09, 0.25),
             HeadChoice(Pattern("block_topk", topk=8), 0.05, 0.4), HeadChoice(DENSE, 0.0, 1.0)]
    return SparseProfile(identity, 64, 4096, 0.1, 2048, {3: heads, 7: heads[::-1]})


@pytest.fixture()
def model_copy(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    shutil.copy(FIXTURE, path)
    return path


def test_round_trip_beside_the_model(model_copy):
    identity = model_identity(load_model(str(model_copy)).file)
    path = profile_path(model_copy)
    assert path == model_copy.parent / "model.gguf.sparse.json"
    assert load_profile(path, identity) is None
    profile = sample(identity)
    save_profile(profile, path)
    assert load_profile(path, identity) == profile
    assert sorted(p.name for p in model_copy.parent.iterdir()) == ["model.gguf", "model.gguf.sparse.json"]  # no temp left
    assert profile.patterns(3)[1] == Pattern("vertical_slash", vertical=2, slash=3)
    assert profile.patterns(0) is None


def test_changed_weights_with_the_same_header_and_size_invalidate(model_copy):
    identity = model_identity(load_model(str(model_copy)).file)
    save_profile(sample(identity), profile_path(model_copy))
    data = bytearray(model_copy.read_bytes())
    data[-3] ^= 0x40  # a byte of the last tensor's data: header and size unchanged
    model_copy.write_bytes(bytes(data))
    changed = model_identity(load_model(str(model_copy)).file)
    assert changed != identity
    with pytest.raises(StaleProfile, match="another model file"):
        load_profile(profile_path(model_copy), changed)


@pytest.mark.parametrize("edit", [
    lambda d: d.update(version=99),
    lambda d: d.update(format="something-else"),
    lambda d: d["layers"]["3"][0]["pattern"].update(kind="diagonal"),
    lambda d: d.pop("block"),
])
def test_other_versions_and_damaged_profiles_are_refused(tmp_path, edit):
    path = tmp_path / "m.gguf.sparse.json"
    data = sample("abc").to_json()
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(StaleProfile, match="calibrate-sparse"):
        load_profile(path, "abc")


def test_unparseable_file_is_refused(tmp_path):
    path = tmp_path / "m.gguf.sparse.json"
    path.write_text("{not json")
    with pytest.raises(StaleProfile):
        load_profile(path, "abc")


def test_require_profile_names_the_command_when_there_is_none(model_copy):
    mf = load_model(str(model_copy)).file
    with pytest.raises(RigllmError, match="calibrate-sparse"):
        require_profile(mf)
    save_profile(sample(model_identity(mf)), profile_path(model_copy))
    assert require_profile(mf).block == 64
