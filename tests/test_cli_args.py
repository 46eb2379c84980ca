"""The configuration surface of the CLI: every config flag is sugar for exactly one key (one table),
applied after --set; the bench's own budget is the lowest layer, beneath presets, files and overrides."""

import pytest

from hermes.cli import build_parser
from hermes.cli_args import CONFIG_FLAGS, config_from_args
from hermes.config import build_config
from hermes.pipelines.bench.cli import MEMORY_SUITE_BUDGET, SWEEP_SUITE_BUDGET, bench_config

# a value for each flag that differs from every default, and the value the config then holds
FLAG_VALUES = {"--device": ("cpu", "cpu"), "--dtype": ("bfloat16", "bfloat16"), "--max-new-tokens": ("7", 7),
               "--fps": ("3", 3.0), "--chunk-frames": ("5", 5), "--budget": ("99", 99)}

# which commands take which config flags
COMMANDS = {
    ("run", "{video}", "--ask", "q"): ("--device", "--fps", "--chunk-frames", "--max-new-tokens"),
    ("bench", "memory"): ("--device", "--budget", "--chunk-frames"),
    ("bench", "sweep"): ("--device", "--budget", "--dtype"),
    ("eval", "ovo-bench"): ("--device",),
    ("demo",): ("--device",),
    ("serve",): ("--device", "--fps", "--max-new-tokens"),
    ("bench", "serve"): ("--max-new-tokens",),
}


def test_the_table_covers_every_config_flag_and_each_names_a_real_key():
    assert set(FLAG_VALUES) == set(CONFIG_FLAGS)
    cfg = build_config(model="tiny-llava-onevision").to_dict()
    for spec in CONFIG_FLAGS.values():
        section, key = spec.key.split(".")
        assert key in cfg[section], spec


@pytest.mark.parametrize("command", list(COMMANDS), ids=[" ".join(c) for c in COMMANDS])
def test_each_flag_sets_its_key_and_wins_over_set(command):
    parser = build_parser()
    for flag in COMMANDS[command]:
        text, value = FLAG_VALUES[flag]
        key = CONFIG_FLAGS[flag].key
        other = "cuda" if flag == "--device" else "float16" if flag == "--dtype" else "11"
        args = parser.parse_args([*command, "--set", f"{key}={other}", flag, text])
        section, name = key.split(".")
        cfg = config_from_args(args, model="tiny-llava-onevision")
        assert getattr(getattr(cfg, section), name) == value, (command, flag)


def test_a_flag_a_command_does_not_take_is_refused():
    from hermes.errors import UsageError

    with pytest.raises(UsageError, match="unrecognized arguments: --budget"):
        build_parser().parse_args(["run", "x.mp4", "--budget", "4"])


@pytest.mark.parametrize("argv, budget", [
    (["bench", "memory"], MEMORY_SUITE_BUDGET),
    (["bench", "sweep"], SWEEP_SUITE_BUDGET),
    (["bench", "memory", "--memory", "hermes-6k"], 6144),  # a preset is above the suite's default
    (["bench", "memory", "--memory", "hermes-6k", "--set", "memory.budget=5000"], 5000),
    (["bench", "memory", "--set", "memory.budget=6144", "--budget", "100"], 100),  # the flag is applied last
    (["bench", "memory", "--config", "{file}"], 777),  # a file is above the suite's default
])
def test_the_bench_reads_its_budget_from_the_config(tmp_path, argv, budget):
    file = tmp_path / "c.yaml"
    file.write_text("memory:\n  budget: 777\n")
    args = build_parser().parse_args([str(file) if a == "{file}" else a for a in argv])
    suite = MEMORY_SUITE_BUDGET if argv[1] == "memory" else SWEEP_SUITE_BUDGET
    assert bench_config(args, suite).memory.budget == budget


def test_a_base_layer_is_beneath_presets_and_overrides():
    assert build_config(memory="full", base={"memory": {"budget": 9}}).memory.budget == 9
    assert build_config(memory="sliding", base={"memory": {"budget": 9}}).memory.budget == 4096
    assert build_config(overrides=["memory.budget=3"], base={"memory": {"budget": 9}}).memory.budget == 3
