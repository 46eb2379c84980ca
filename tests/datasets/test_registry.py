"""The benchmark registry: names, spellings, protocols, metrics and suggestions."""

from __future__ import annotations

import pytest

from hermes.datasets.benchmarks import ovo_bench
from hermes.datasets.registry import BENCHMARKS, canonical_name, family, get_benchmark
from hermes.errors import UsageError


def test_registry_names_protocols_and_suggestions():
    assert set(BENCHMARKS) == {
        "ovo-bench", "streamingbench", "rvs-ego", "rvs-movie", "mvbench",
        "egoschema", "videomme", "mlvu", "longvideobench", "lvbench",
    }
    assert get_benchmark("OVO-Bench") == (ovo_bench.load, "streaming", "ovo")
    assert get_benchmark("video_mme").protocol == "offline"
    assert canonical_name("Video-MME") == "videomme" and family("rvs_movie") == "rvs"
    with pytest.raises(UsageError, match="did you mean 'streamingbench'"):
        get_benchmark("streamingbnch")
    with pytest.raises(UsageError, match="choose one of"):
        get_benchmark("imagenet")
