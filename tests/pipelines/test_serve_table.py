"""The stream table (`hermes.pipelines.serve.table`) on a folder and on moto's in-process S3: specs saved
under ``_streams/NAME.json`` survive a new table object, a damaged one is reported and kept, a removed one
is gone, and a missing bucket is a one-line problem rather than a traceback."""

from __future__ import annotations

import json

import pytest

from serve_fixtures import set_aws_env

from hermes.pipelines.serve.table import DamagedSpec, StreamTable

SPEC = {"source": "rtsp://user:pw@127.0.0.1:8554/cam", "memory": None, "fps": 2.0, "name": "yard",
        "watches": [{"question": "Is the gate open?", "options": [], "every_s": 5.0}]}


@pytest.fixture(params=["folder", "s3"])
def root(request, tmp_path, monkeypatch):
    """A memory root and a function reading the raw bytes saved under one of its keys."""
    if request.param == "folder":
        yield str(tmp_path / "mem"), lambda key: (tmp_path / "mem" / key).read_bytes()
        return
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    set_aws_env(monkeypatch)
    with moto.mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="mem")
        yield "s3://mem/site", lambda key: client.get_object(Bucket="mem", Key=f"site/{key}")["Body"].read()


def test_specs_are_saved_listed_replaced_and_removed(root):
    memory_root, raw = root
    table = StreamTable(memory_root)
    assert table.names() == [] and table.get("yard") is None and table.problem() is None
    table.put("yard", SPEC)
    table.put("door", {**SPEC, "source": "push", "name": "door", "watches": []})
    assert json.loads(raw("_streams/yard.json")) == SPEC  # where another replica looks for it
    again = StreamTable(memory_root)  # a restarted server's table
    assert again.names() == ["door", "yard"]
    assert again.get("yard") == SPEC
    again.put("yard", {**SPEC, "watches": []})
    assert table.get("yard")["watches"] == []
    again.remove("door")
    again.remove("door")  # nothing saved: no error
    assert table.names() == ["yard"] and table.get("door") is None


@pytest.mark.parametrize("damage", [b"{not json", b'["a list"]', json.dumps({**SPEC, "name": "other"}).encode(),
                                    json.dumps({k: v for k, v in SPEC.items() if k != "watches"}).encode()])
def test_a_damaged_spec_is_reported_and_kept(root, damage):
    memory_root, raw = root
    table = StreamTable(memory_root)
    table.put("yard", SPEC)
    table.objects.put("yard.json", damage)  # as a torn or hand-edited file would be
    with pytest.raises(DamagedSpec, match=r"stream 'yard' \(_streams/yard.json\).*left in place") as err:
        table.get("yard")
    assert "pw" not in str(err.value)
    assert table.names() == ["yard"] and raw("_streams/yard.json") == damage


def test_a_missing_bucket_is_a_problem_not_a_traceback(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    set_aws_env(monkeypatch)
    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="other")
        problem = StreamTable("s3://mem/site").problem()
    assert "the bucket 'mem' does not exist" in problem and "\n" not in problem


def test_the_table_folder_cannot_be_a_stream_name():
    from hermes.pipelines.serve.registry import NAME_RE
    from hermes.pipelines.serve.table import FOLDER

    assert not NAME_RE.match(FOLDER)
