"""`serve --engine ray`'s flags and `serve run` config args: refused in one line (exit 2) before Ray or the
model loads; no Ray cluster is started here."""

from __future__ import annotations

import sys

import pytest

from hermes.cli import main
from hermes.errors import UsageError

TINY = ["serve", "--model", "tiny-llava-onevision"]


@pytest.mark.parametrize("argv, message", [
    ([*TINY, "--replicas", "2"], "--replicas goes with --engine ray"),
    ([*TINY, "--ray-address", "auto"], "--ray-address goes with --engine ray"),
    ([*TINY, "--engine", "ray"], "--engine ray needs --memory-root"),
    ([*TINY, "--engine", "ray", "--memory-root", "m", "--replicas", "0"], "expected a positive whole number"),
    ([*TINY, "--engine", "spark"], "invalid choice: 'spark'"),
])
def test_bad_engine_flags_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_engine_ray_without_ray_installed_is_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails, as where it is not installed
    assert main([*TINY, "--engine", "ray", "--memory-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--engine ray needs Ray Serve: pip install 'hermes-video[ray]'" in err and err.count("\n") == 1, err


def test_serve_run_config_args_are_serves_flags():
    from hermes.pipelines.serve.cli import argv_from_mapping

    argv = argv_from_mapping({"memory_root": "/m", "allow-source": ["a", "b"], "replicas": 2, "debug": True,
                              "api_key": None, "quiet": False})
    assert argv == ["--memory-root", "/m", "--allow-source", "a", "--allow-source", "b", "--replicas", "2", "--debug"]


@pytest.mark.parametrize("config, message", [
    ({"model": "tiny-llava-onevision"}, "--engine ray needs --memory-root"),
    ({"model": "tiny-llava-onevision", "memory_root": "m", "replicas": "two"}, "argument --replicas"),
    ({"model": "tiny-llava-onevision", "memory_root": "m", "gpus": 1}, "unrecognized arguments: --gpus"),
    ({"model": "tiny-llava-onevision", "memory_root": "m", "host": "0.0.0.0"}, "listens beyond this machine"),
])
def test_a_bad_serve_run_config_is_refused_in_one_line(config, message):
    pytest.importorskip("ray")
    from hermes.pipelines.serve.cli import ray_app

    with pytest.raises(UsageError, match=message.replace("-", "\\-")):
        ray_app(config)
