"""The disk tier of the prefix cache: exact restore, invalidation, budgets, and the tiered cache."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from engine.backends import open_backend
from engine.generation.chat_template import ChatTemplate
from engine.generation.prefix_cache import TieredPrefixCache
from engine.generation.slots import HostSlots, SlotSnapshot
from engine.generation.snapshot_store import (
    SUFFIX,
    SnapshotStore,
    default_host_budget,
    model_identity,
    template_hash,
)
from engine.generation.snapshot_store_format import SnapshotIdentity, read_header
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.gguf.model_file import ModelFile

IDENTITY = SnapshotIdentity("model-a", "f16", "template-a")


@pytest.fixture(scope="module")
def loaded():
    return load_model(ensure_demo_model())


def _conversation(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(5, 1000, n)]


def _slot_state(n_tokens: int, width: int = 64) -> SlotSnapshot:
    """A CUDA-shaped snapshot (position, host planes) with distinct contents per token count."""
    planes = [np.full((2, n_tokens * width), n_tokens % 251, np.uint8), np.arange(12, dtype=np.float32) * n_tokens]
    return SlotSnapshot((n_tokens, planes), sum(p.nbytes for p in planes))


def _store(root, config, identity=IDENTITY, budget=1 << 30) -> SnapshotStore:
    return SnapshotStore(root, identity, config, budget)


@pytest.mark.parametrize("kv", ["f16", "k8v3"])
def test_restored_state_gives_the_logits_of_a_fresh_prefill(loaded, tmp_path, kv):
    """Save the state after one turn, reopen the store as after a restart, restore it into a new
    backend and run the next turn: the logits equal those of prefilling the whole conversation."""
    first, second = _conversation(48), _conversation(9, seed=1)
    slots = HostSlots(open_backend("reference", loaded, kv=kv), 1)
    slots.prefill_slot(0, first)
    store = SnapshotStore(tmp_path, SnapshotIdentity("demo", kv, "t"), loaded.config, 1 << 30)
    assert store.save(first, slots.snapshot_slot(0))

    reopened = SnapshotStore(tmp_path, SnapshotIdentity("demo", kv, "t"), loaded.config, 1 << 30)
    n, snap = reopened.longest_prefix(first + second)
    assert n == len(first)
    restored = HostSlots(open_backend("reference", loaded, kv=kv), 1)
    restored.restore_slot(0, snap)
    restored.prefill_slot(0, second)

    # a fresh prefill split at the turn boundary (as the scheduler runs it, stopping there to snapshot): bit-equal
    fresh = HostSlots(open_backend("reference", loaded, kv=kv), 1)
    fresh.prefill_slot(0, first)
    fresh.prefill_slot(0, second)
    np.testing.assert_array_equal(restored._slots[0].logits, fresh._slots[0].logits)
    # in one piece: equal up to the float rounding of another chunking
    whole = HostSlots(open_backend("reference", loaded, kv=kv), 1)
    whole.prefill_slot(0, first + second)
    np.testing.assert_allclose(restored._slots[0].logits, whole._slots[0].logits, atol=1e-4)
    assert restored._slots[0].logits.argmax() == whole._slots[0].logits.argmax()


def test_cuda_shaped_snapshots_round_trip_exactly(tmp_path, loaded):
    store = _store(tmp_path, loaded.config)
    tokens = _conversation(30)
    original = _slot_state(30)
    pipeline = SlotSnapshot((original, _slot_state(7)), original.nbytes + _slot_state(7).nbytes)  # two stages
    store.save(tokens, pipeline)
    n, back = _store(tmp_path, loaded.config).longest_prefix(tokens + [7])
    assert n == 30 and back.nbytes == pipeline.nbytes
    for got, want in zip(back.state, pipeline.state):
        assert got.state[0] == want.state[0]
        for a, b in zip(got.state[1], want.state[1]):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_the_longest_proper_prefix_wins(tmp_path, loaded):
    store = _store(tmp_path, loaded.config)
    chat = _conversation(100)
    for n in (20, 60, 100):
        store.save(chat[:n], _slot_state(n))
    assert store.longest_prefix(chat)[0] == 60  # 100 covers the whole prompt: nothing left to run
    assert store.longest_prefix(chat + [1])[0] == 100
    assert store.longest_prefix(chat[:59])[0] == 20
    assert store.longest_prefix(_conversation(100, seed=5)) == (0, None)
    assert store.longest_prefix(chat + [1], longer_than=100) == (0, None)


@pytest.mark.parametrize("changed", [
    SnapshotIdentity("model-a", "k8v3", "template-a"),
    SnapshotIdentity("model-a", "f16", "template-b"),
])
def test_a_kv_format_or_template_change_drops_the_files(tmp_path, loaded, changed):
    chat = _conversation(40)
    _store(tmp_path, loaded.config).save(chat, _slot_state(40))
    other = _store(tmp_path, loaded.config, identity=changed)
    assert other.longest_prefix(chat + [1]) == (0, None)
    assert not list((tmp_path / "model-a").glob(f"*{SUFFIX}"))  # cleaned, not only ignored


def test_a_model_change_ignores_the_old_models_files(tmp_path, loaded):
    chat = _conversation(40)
    _store(tmp_path, loaded.config).save(chat, _slot_state(40))
    other = _store(tmp_path, loaded.config, identity=SnapshotIdentity("model-b", "f16", "template-a"))
    assert other.longest_prefix(chat + [1]) == (0, None)
    assert _store(tmp_path, loaded.config).longest_prefix(chat + [1])[0] == 40  # switching back finds it


def test_model_identity_follows_the_header_not_the_weights(tmp_path):
    src = ensure_demo_model()
    base = model_identity(ModelFile(src))
    weights, header = tmp_path / "weights.gguf", tmp_path / "header.gguf"
    shutil.copy(src, weights)
    shutil.copy(src, header)
    first = min(t.offset for t in ModelFile(src).tensors.values())
    with open(weights, "r+b") as f:
        f.seek(first + 16)
        byte = f.read(1)
        f.seek(first + 16)
        f.write(bytes([byte[0] ^ 0xFF]))
    data = bytearray(header.read_bytes()[:first])
    at = data.index(b"qwen35")  # the architecture string: same length, other value
    data[at:at + 6] = b"qwen36"
    with open(header, "r+b") as f:
        f.write(bytes(data))
    assert model_identity(ModelFile(weights)) == base
    assert model_identity(ModelFile(header)) != base
    assert template_hash(ChatTemplate.fallback().source) != template_hash(ChatTemplate.fallback().source + " ")


def test_truncated_and_foreign_files_are_dropped(tmp_path, loaded):
    store = _store(tmp_path, loaded.config)
    chat = _conversation(40)
    store.save(chat, _slot_state(40))
    (path,) = (tmp_path / "model-a").glob(f"*{SUFFIX}")
    path.write_bytes(path.read_bytes()[:-10])
    (tmp_path / "model-a" / f"junk{SUFFIX}").write_bytes(b"not a snapshot")
    assert len(_store(tmp_path, loaded.config)) == 0
    assert not list((tmp_path / "model-a").glob(f"*{SUFFIX}"))


def test_disk_budget_evicts_least_recently_used_across_models(tmp_path, loaded):
    chats = [_conversation(50, seed=s) for s in range(4)]
    store_b = _store(tmp_path, loaded.config, identity=SnapshotIdentity("model-b", "f16", "template-a"))
    store_b.save(chats[3], _slot_state(50))
    size = store_b.disk_bytes
    store = _store(tmp_path, loaded.config, budget=3 * size)
    for chat in chats[:2]:
        time.sleep(0.01)  # distinct mtimes
        store.save(chat, _slot_state(50))
    time.sleep(0.01)
    assert store.longest_prefix(chats[0] + [1])[0] == 50  # touching chat 0 makes chat 1 the oldest of model-a
    time.sleep(0.01)
    store.save(chats[2], _slot_state(50))  # 4 files > budget of 3: the other model's (oldest) goes first
    assert not list((tmp_path / "model-b").glob(f"*{SUFFIX}"))
    time.sleep(0.01)
    store.save(_conversation(50, seed=9), _slot_state(50))
    assert store.longest_prefix(chats[1] + [1]) == (0, None)
    assert store.longest_prefix(chats[0] + [1])[0] == 50
    assert store.disk_bytes <= 3 * size
    assert not store.save(_conversation(5000, seed=8), _slot_state(5000))  # alone over the budget
    assert len(store) == 3


def test_tiered_cache_keeps_ram_within_budget_and_reloads_from_disk(tmp_path, loaded):
    one = _slot_state(40)
    cache = TieredPrefixCache(one.nbytes, _store(tmp_path, loaded.config))
    try:
        a, b = _conversation(40), _conversation(40, seed=1)
        cache.put(a, _slot_state(40))
        cache.put(b, _slot_state(40))  # evicts a from RAM
        assert cache.nbytes <= one.nbytes and len(cache) == 1
        assert a in cache  # still held: queued or on disk, so the scheduler does not snapshot it again
        cache.flush()
        assert len(cache.store) == 2
        n, snap = cache.longest_prefix(a + [3])
        assert n == 40 and snap.state[0] == 40 and len(cache) == 1 and cache.nbytes <= one.nbytes
    finally:
        cache.close()
    restarted = TieredPrefixCache(one.nbytes, _store(tmp_path, loaded.config))
    try:
        assert len(restarted) == 0 and restarted.longest_prefix(b + [3])[0] == 40
    finally:
        restarted.close()


def test_default_host_budget_is_at_most_2_gib_and_a_quarter_of_ram():
    budget = default_host_budget()
    assert 0 < budget <= 2 << 30


def test_header_records_identity_and_tokens(tmp_path, loaded):
    chat = _conversation(33)
    _store(tmp_path, loaded.config).save(chat, _slot_state(33))
    (path,) = (tmp_path / "model-a").glob(f"*{SUFFIX}")
    header = read_header(path)
    assert header.identity == IDENTITY and header.n_tokens == 33 and header.nbytes == _slot_state(33).nbytes


def test_a_speculating_slots_state_with_its_owed_head_rows_round_trips(tmp_path, loaded):
    """HostSlots with a speculator snapshots (StateSnapshot, (hidden rows, tokens) or None)."""
    slots = HostSlots(open_backend("reference", loaded, kv="k8v3"), 1)
    slots.prefill_slot(0, _conversation(20))
    state = slots.snapshot_slot(0).state
    trail = (np.arange(2 * 256, dtype=np.float32).reshape(2, 256), np.array([7], np.int64))
    for extra in (trail, None):
        chat = _conversation(20, seed=3 if extra is None else 4)
        snap = SlotSnapshot((state, extra), 1234)
        store = _store(tmp_path, loaded.config, identity=SnapshotIdentity("m", "k8v3", "t"))
        store.save(chat, snap)
        _, back = _store(tmp_path, loaded.config, identity=SnapshotIdentity("m", "k8v3", "t")).longest_prefix(chat + [1])
        got_state, got_extra = back.state
        assert got_state.cfg == loaded.config and got_state.kv_format.name == "k8v3"
        assert (got_state.n_tokens, got_state.next_position) == (state.n_tokens, state.next_position)
        for got_layer, want_layer in zip(got_state.kv + got_state.gdn, state.kv + state.gdn, strict=True):
            for got, want in zip(got_layer, want_layer, strict=True):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)
        if extra is None:
            assert got_extra is None
        else:
            np.testing.assert_array_equal(got_extra[0], trail[0])
            np.testing.assert_array_equal(got_extra[1], trail[1])
