"""The local cache of an S3 stream stands for nothing the store does not hold.

Two fresh stores one after the other under the same bucket and prefix (here: two moto stores, as a
test server restarted empty) must not share a cache folder: the second is a new stream, never one
that "already holds a stream" from the first store's checkpoint copy. The folder is keyed by the
endpoint and a marker the store holds (`hermes.tiers.remote_level.STREAM_ID`), and every cache
lives under one root (`hermes.tiers.files.cache_root`).
"""

from __future__ import annotations

import pytest
import torch

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from hermes.pipelines.bench.tiers import synthetic_record  # noqa: E402
from hermes.tiers.directory import MemoryDirectory  # noqa: E402
from hermes.tiers.files import cache_root  # noqa: E402
from hermes.tiers.fingerprint import _cache_file  # noqa: E402
from hermes.tiers.remote_level import RemoteOptions, default_cache_dir  # noqa: E402
from hermes.tiers.s3 import S3Location  # noqa: E402

FP = {"model": "s3-cache-test", "family": "synthetic", "num_layers": 3}
URL = "s3://mem/cams/door"


def _fresh_store():
    """A new, empty S3 store (moto) with the bucket made; a context manager."""
    mock = moto.mock_aws()
    mock.start()
    boto3.client("s3").create_bucket(Bucket="mem")
    return mock


def _open(remote: RemoteOptions):
    return MemoryDirectory(URL, FP, 40_000, 1 << 30, remote=remote)


def _write_stream(remote: RemoteOptions) -> None:
    md = _open(remote)
    for rid in range(6):
        md.add(synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12))
    md.save_checkpoint("session", {"x": torch.arange(3.0)}, {"frames": 12})
    md.close()


@pytest.mark.parametrize("explicit_cache", [True, False])
def test_a_second_fresh_store_under_the_same_bucket_sees_nothing_of_the_first(aws_env, tmp_path, monkeypatch,
                                                                             explicit_cache):
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path / "root"))
    remote = RemoteOptions(cache_dir=str(tmp_path / "cache") if explicit_cache else None)
    first = _fresh_store()
    try:
        _write_stream(remote)
        md = _open(remote)
        assert [c["name"] for c in md.checkpoints()] == ["session"] and len(md.disk.ids()) + len(md.dram) == 6
        first_id = md.inspect()["stream_id"]
        md.close()
    finally:
        first.stop()
    second = _fresh_store()  # the same bucket and prefix, empty: a server restarted without its data
    try:
        md = _open(remote)
        try:
            assert md.checkpoints() == []  # a fresh write is not refused as "already holds a stream"
            assert md.inspect()["stream_id"] not in (None, first_id)
            assert md.disk.ids() == [] and len(md.dram) == 0 and len(md.index) == 0
            with pytest.raises(KeyError):
                md.load_checkpoint("session")
        finally:
            md.close()
    finally:
        second.stop()


def test_a_local_checkpoint_copy_the_store_does_not_hold_is_never_resumed(aws_env, tmp_path):
    remote = RemoteOptions(cache_dir=str(tmp_path / "cache"))
    store = _fresh_store()
    try:
        _write_stream(remote)
        boto3.client("s3").delete_object(Bucket="mem", Key="cams/door/checkpoints/session.json")
        md = _open(remote)
        try:
            assert md.checkpoints() == []  # the copy in the cache went with the store's object
        finally:
            md.close()
    finally:
        store.stop()


def test_the_same_bucket_on_two_endpoints_has_two_cache_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path))
    location = S3Location("mem", "cams/door")
    a = default_cache_dir(location, "http://127.0.0.1:9000")
    b = default_cache_dir(location, "http://127.0.0.1:9001")
    assert a != b and a.parts[-3:] == b.parts[-3:] == ("mem", "cams", "door")
    assert a.is_relative_to(tmp_path / "s3") and b.is_relative_to(tmp_path / "s3")


def test_every_cache_follows_one_root(monkeypatch, tmp_path):
    monkeypatch.delenv("HERMES_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    location = S3Location("mem", "x")
    assert cache_root() == tmp_path / "xdg" / "hermes-video"
    assert _cache_file().is_relative_to(cache_root())  # the weights digests
    assert default_cache_dir(location, "aws").is_relative_to(cache_root())  # the S3 caches
    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache_file().is_relative_to(tmp_path / "mine")
    assert default_cache_dir(location, "aws").is_relative_to(tmp_path / "mine")
