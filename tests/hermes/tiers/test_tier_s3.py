"""Level 3 on an S3 object store, against moto's in-process S3 (create-only puts and If-Match as AWS).

What must hold: records committed by one writer are recalled by a reader with its own cache, and
followed as the writer goes on; a second writer is refused by the store; a writer whose lease was
taken over cannot commit, and what it slips in is ignored; a flipped byte in a segment object is
detected and never served; a writer killed between a group's segment and its manifest leaves no
visible record; checkpoints live in the store (resume from another machine's empty cache).
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from hermes.errors import StorageError, UsageError  # noqa: E402
from hermes.rope import RotarySpec  # noqa: E402
from hermes.pipelines.bench.tiers import synthetic_record  # noqa: E402
from hermes.tiers.directory import MemoryDirectory  # noqa: E402
from hermes.tiers.errors import MemoryDirError  # noqa: E402
from hermes.tiers.lease import Lease, LeaseLost  # noqa: E402
from hermes.tiers.objects import LocalObjects, PreconditionFailed  # noqa: E402
from hermes.tiers.remote import manifest_key  # noqa: E402
from hermes.tiers.remote_level import RemoteOptions  # noqa: E402
from hermes.tiers.s3 import S3Location, S3Objects, S3Settings, parse_location  # noqa: E402
from hermes.tiers.summarise import summarise  # noqa: E402

FP = {"model": "s3-test", "family": "synthetic", "num_layers": 3}
URL = "s3://mem/cams/door"


def _rec(rid):
    rec = synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12)
    rec.value = float(rid % 5)
    return rec


@pytest.fixture
def s3(aws_env):
    with moto.mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="mem")
        yield client


def _open(tmp_path, cache, dram_bytes=40_000, readonly=False, lease_s=30.0):
    return MemoryDirectory(URL, None if readonly else FP, dram_bytes, 1 << 30, readonly=readonly,
                           summarise_fn=functools.partial(summarise, anchors_per_layer=2, spec=RotarySpec(head_dim=16)),
                           remote=RemoteOptions(cache_dir=str(tmp_path / cache), lease_s=lease_s))


def test_parse_location_reads_s3_urls_once_and_refuses_other_schemes():
    assert parse_location("s3://bucket/a/b/") == S3Location("bucket", "a/b")
    assert str(parse_location("s3://bucket")) == "s3://bucket"
    assert str(parse_location("s3:/bucket/x")) == "s3:/bucket/x"  # one slash: a local path, as the OS reads it
    for bad in ("s3://B/x", "s3://ab/x", "s3:///x", "gs://bucket/x"):
        with pytest.raises(UsageError):
            parse_location(bad)


def test_reader_with_its_own_cache_recalls_and_follows_the_writer(s3, tmp_path):
    writer = _open(tmp_path, "a")
    for rid in range(30):
        writer.add(_rec(rid))
    writer.flush()
    on_disk = [e.record_id for e in writer.disk.entries()]
    assert on_disk and len(writer.dram) > 0  # both levels in use
    reader = _open(tmp_path, "b", readonly=True)
    # level 3 and the writer's level 2 (its log in the store) are both recalled
    for rid in (on_disk[0], writer.dram.ids()[0]):
        assert reader.search(_rec(rid).embedding, 1)[0][0] == rid
        assert torch.equal(reader.fetch([rid])[0].frame_start * torch.ones(1), torch.tensor([_rec(rid).frame_start]))
    assert not reader.skipped
    for rid in range(30, 45):  # the writer goes on; the reader follows by listing after its last key
        writer.add(_rec(rid))
    writer.flush()
    assert reader.search(_rec(44).embedding, 1)[0][0] == 44
    with pytest.raises(MemoryDirError):
        reader.add(_rec(99))
    writer.close()
    reader.refresh()
    assert {r for r in reader.index.ids().tolist()} == set(range(45))  # all of them, now on level 3
    ok, messages = reader.verify()
    assert ok, messages
    reader.close(spill_dram=False)


def test_second_writer_is_refused_while_the_first_holds_the_lease(s3, tmp_path):
    first = _open(tmp_path, "a")
    with pytest.raises(MemoryDirError, match="in use by writer"):
        _open(tmp_path, "b")
    first.close()
    second = _open(tmp_path, "b")  # a clean close gives the lease up at once
    second.close()


def test_two_writers_racing_for_one_lease_exactly_one_wins(s3):
    objects = S3Objects(S3Location("mem", "race"))
    a, b = Lease(objects, 30), Lease(objects, 30)
    a.acquire()
    with pytest.raises(MemoryDirError):
        b.acquire()
    # the same race on the store itself: two create-only puts of one manifest sequence number
    objects.put(manifest_key(5), b"x", create_only=True)
    with pytest.raises(PreconditionFailed):
        objects.put(manifest_key(5), b"y", create_only=True)
    assert objects.get(manifest_key(5))[0] == b"x"


def test_an_idle_writer_keeps_its_lease_while_it_lives_and_an_unrenewed_one_expires(s3):
    """A stream with nothing to commit must not lose its lease to another server (its writer renews it on
    a thread); a writer that stopped renewing lets it expire, so a successor can take over."""
    import time

    objects = S3Objects(S3Location("mem", "idle"))
    silent = Lease(objects, 2.0)
    silent.acquire()  # never renewed: like a writer that was SIGKILLed
    time.sleep(3.0)
    successor = Lease(objects, 3.0)
    successor.acquire()
    successor.keep_renewed()
    time.sleep(4.5)  # more than its whole lease, with no commit
    with pytest.raises(MemoryDirError, match="in use by writer"):
        Lease(objects, 3.0).acquire()
    assert successor.lost is None
    successor.release()
    Lease(objects, 3.0).acquire()  # released: free at once


def test_stale_lease_holder_cannot_commit_and_what_it_slipped_in_is_ignored(s3, tmp_path):
    old = _open(tmp_path, "a", dram_bytes=0, lease_s=0.6)
    for rid in range(3):
        old.add(_rec(rid))
    old.flush()
    lease = old.remote.lease
    # the old writer stalls past its lease; a new one takes over (a fresh epoch and its fence)
    lease.expires_unix = 0
    body = json.loads(s3.get_object(Bucket="mem", Key="cams/door/lease.json")["Body"].read())
    body["expires_unix"] = 0
    s3.put_object(Bucket="mem", Key="cams/door/lease.json", Body=json.dumps(body).encode())
    new = _open(tmp_path, "b", dram_bytes=0)
    assert new.remote.lease.epoch == lease.epoch + 1
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(MemoryDirError):  # refused at add (its writer already found the lease gone) or at flush
        old.disk.add(_rec(50))
        old.disk.flush()
    # even a manifest object written behind the lease check, under the old epoch, is never served
    stale = json.loads(s3.get_object(Bucket="mem", Key="cams/door/" + manifest_key(1))["Body"].read())
    from hermes.tiers.remote import seal
    stale.pop("sha256")
    stale.update(seq=999, epoch=lease.epoch, entries=[{**stale["entries"][0], "id": 777}])
    s3.put_object(Bucket="mem", Key="cams/door/" + manifest_key(999), Body=seal(stale))
    reader = _open(tmp_path, "c", readonly=True)
    assert 777 not in reader.disk and 50 not in reader.disk and set(range(3)) <= set(reader.disk.ids())
    assert any("fenced" in n for n in reader.disk.open_notes)
    new.close()
    reader.close(spill_dram=False)


def test_flipped_byte_in_a_segment_object_is_detected_and_never_served(s3, tmp_path):
    writer = _open(tmp_path, "a", dram_bytes=0)
    for rid in range(4):
        writer.add(_rec(rid))
    writer.close()
    entry = next(e for e in _open(tmp_path, "x", readonly=True).disk.entries() if e.record_id == 2)
    key = f"cams/door/{entry.segment}"
    data = bytearray(s3.get_object(Bucket="mem", Key=key)["Body"].read())
    data[entry.offset + entry.length // 2] ^= 0x01
    s3.put_object(Bucket="mem", Key=key, Body=bytes(data))
    reader = _open(tmp_path, "b", readonly=True)
    with pytest.warns(UserWarning, match="sha256"):
        got = reader.fetch([2])
    assert got == [] and reader.skipped
    ok, messages = reader.verify()
    assert not ok and any("record 2" in m and "sha256" in m for m in messages)
    # a damaged local cache copy is fetched again from the store, not served and not fatal
    good = [e for e in reader.disk.entries() if e.segment != entry.segment]
    if good:
        reader.fetch([good[0].record_id])
        # the cache sits under the store's marker (one folder per store identity)
        [path] = (tmp_path / "b").glob(f"*/cache/level3/{good[0].segment}.{good[0].offset}")
        raw = bytearray(path.read_bytes())
        raw[10] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert len(reader.fetch([good[0].record_id])) == 1
    reader.close(spill_dram=False)


def test_writer_killed_between_segment_and_manifest_leaves_no_visible_record(s3, tmp_path):
    writer = _open(tmp_path, "a", dram_bytes=0)
    writer.add(_rec(0))
    writer.flush()
    # what a kill after the segment put and before the manifest put leaves: an unnamed segment object
    s3.put_object(Bucket="mem", Key="cams/door/segments/000000009999.1.deadbeef.seg", Body=b"partial group")
    writer.close()
    reader = _open(tmp_path, "b", readonly=True)
    assert reader.disk.ids() == [0]
    ok, messages = reader.verify()
    assert ok and any("no committed record uses it" in m for m in messages)
    reader.close(spill_dram=False)


def test_checkpoints_live_in_the_store_and_resume_from_an_empty_cache(s3, tmp_path):
    writer = _open(tmp_path, "a")
    for rid in range(20):
        writer.add(_rec(rid))
    writer.save_checkpoint("session", {"level1": torch.arange(6.0)}, {"frames": 7})
    writer.save_checkpoint("session", {"level1": torch.arange(8.0)}, {"frames": 9})
    writer.close()
    other = _open(tmp_path, "fresh-machine")
    tensors, meta = other.load_checkpoint("session")
    assert meta == {"frames": 9} and torch.equal(tensors["level1"], torch.arange(8.0))
    assert set(other.disk.ids()) | set(other.dram.ids()) == set(range(20))
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="mem", Prefix="cams/door/checkpoints/")["Contents"]]
    assert len(keys) == 2  # the metadata and the one tensor file it names; the older one is gone
    other.close()


def test_a_reader_opening_while_the_writer_replaces_its_checkpoint_gets_a_whole_one(s3, tmp_path, monkeypatch):
    # the race CI once lost: the reader read one checkpoint's metadata or tensors, the writer replaced
    # the checkpoint (new tensor file, new metadata, old tensor file deleted), the reader read the rest
    writer = _open(tmp_path, "a")
    writer.save_checkpoint("session", {"level1": torch.arange(6.0)}, {"frames": 7})
    real_get, replaced = S3Objects.get, []

    def get_then_replace(self, key):
        got = real_get(self, key)
        if key.startswith("checkpoints/") and not replaced:
            replaced.append(key)
            writer.save_checkpoint("session", {"level1": torch.arange(8.0)}, {"frames": 9})
        return got

    monkeypatch.setattr(S3Objects, "get", get_then_replace)
    reader = _open(tmp_path, "b", readonly=True)
    assert replaced  # the replacement happened inside the reader's open
    tensors, meta = reader.load_checkpoint("session")
    assert meta == {"frames": 9} and torch.equal(tensors["level1"], torch.arange(8.0))
    reader.close()
    writer.close()


def test_fingerprint_of_another_model_is_refused(s3, tmp_path):
    _open(tmp_path, "a").close()
    with pytest.raises(MemoryDirError, match="made by"):
        MemoryDirectory(URL, {**FP, "model": "other"}, 0, 1 << 30, remote=RemoteOptions(cache_dir=str(tmp_path / "b")))


def test_endpoint_down_is_one_storage_error_after_bounded_retries(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECRETKEYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    settings = S3Settings(endpoint="http://127.0.0.1:9", timeout_s=0.5, retries=2)
    attempts = []
    objects = S3Objects(S3Location("mem", "x"), settings)
    objects.client.meta.events.register("before-send.s3.*", lambda **kw: attempts.append(1))
    with pytest.raises(StorageError) as err:
        objects.get("fingerprint.json")
    message = str(err.value)
    assert "\n" not in message and "127.0.0.1:9" in message and "committed before this are kept" in message
    assert "very-secret-value" not in message and "AKIASECRETKEYID" not in message
    assert len(attempts) == 2  # bounded: exactly the configured attempts


def test_local_objects_create_only_and_compare_and_swap(tmp_path):
    store = LocalObjects(tmp_path / "o")
    etag = store.put("a/b", b"1", create_only=True)
    with pytest.raises(PreconditionFailed):
        store.put("a/b", b"2", create_only=True)
    store.put("a/b", b"3", if_match=etag)
    with pytest.raises(PreconditionFailed):
        store.put("a/b", b"4", if_match=etag)
    assert store.get("a/b")[0] == b"3" and store.keys("a/") == ["a/b"]
    cache = LocalObjects(tmp_path / "c", capacity_bytes=10)
    for i in range(5):
        cache.put(f"k{i}", b"x" * 4)
    assert sum(p.stat().st_size for p in (tmp_path / "c").iterdir() if p.is_file()) <= 10
    assert cache.get("k4") is not None and cache.get("k0") is None


def test_a_stale_writer_that_skips_its_lease_check_is_refused_by_the_store_itself(s3, tmp_path):
    old = _open(tmp_path, "a", dram_bytes=0)
    old.add(_rec(0))
    old.flush()
    old.remote.lease.check = lambda: None  # as if its check ran just before the takeover
    body = json.loads(s3.get_object(Bucket="mem", Key="cams/door/lease.json")["Body"].read())
    s3.put_object(Bucket="mem", Key="cams/door/lease.json", Body=json.dumps({**body, "expires_unix": 0}).encode())
    new = _open(tmp_path, "b", dram_bytes=0)  # its epoch marker takes the sequence number old would use next
    with pytest.raises(MemoryDirError, match="another writer committed manifest"):
        old.disk.add(_rec(1))
        old.disk.flush()
    new.add(_rec(2))
    new.flush()
    assert set(new.disk.ids()) == {0, 2}  # exactly one of the two writers committed
    new.close()


@pytest.mark.parametrize("group_bytes, segments", [(4 << 20, 1), (1, 40)])
def test_a_commit_group_spans_the_batches_queued_while_the_writer_encodes(tmp_path, monkeypatch, group_bytes,
                                                                          segments):
    # two PUTs per group: records queued while the writer encodes join the open group however small
    # the queue (here 4: one group per batch would make at least 10), until it reaches OBJECT_GROUP_BYTES
    import time

    from hermes.tiers import ledger
    from hermes.tiers.remote import RemoteStore

    monkeypatch.setattr(ledger, "OBJECT_GROUP_BYTES", group_bytes)
    encode, added = RemoteStore._encode, []

    def encode_slower_than_the_caller(self, group, record):  # as real records are: more arrive meanwhile
        deadline = time.monotonic() + 10
        while self._queue.empty() and len(added) < 40 and time.monotonic() < deadline:
            time.sleep(0.001)
        encode(self, group, record)

    monkeypatch.setattr(RemoteStore, "_encode", encode_slower_than_the_caller)
    objects = LocalObjects(tmp_path / "objects")
    lease = Lease(objects, 30)
    lease.acquire()
    store = RemoteStore(objects, LocalObjects(tmp_path / "cache"), 1 << 30, FP, lease=lease, queue_size=4)
    try:
        for rid in range(40):
            store.add(_rec(rid))
            added.append(rid)
        store.flush()
        assert len(objects.keys("segments/")) == segments
        assert sorted(store.ids()) == list(range(40)) and store.verify().ok
    finally:
        store.close()
        lease.release()


def test_each_store_signs_with_the_key_the_environment_holds_when_it_opens(monkeypatch):
    """boto3's default session keeps the first key it read for the whole process: a store opened later
    (another stream, another test of one worker) must still sign with the environment's key of now."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    first = S3Objects(S3Location("mem", "a"), S3Settings(endpoint="http://127.0.0.1:9"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second-secret")
    second = S3Objects(S3Location("mem", "b"), S3Settings(endpoint="http://127.0.0.1:9"))
    signing = [o.client._request_signer._credentials.get_frozen_credentials() for o in (first, second)]
    assert [(c.access_key, c.secret_key) for c in signing] == [("first-key", "first-secret"),
                                                              ("second-key", "second-secret")]
