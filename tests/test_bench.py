"""benchmarks/bench.py: every script gets the same batch, a tiny benchmark end to end (rloo.py, three steps, the
embedded model), its phases and their bounds (two steps), and bad input's one line."""

import importlib
import json
import sys

import pytest
from transformers import HfArgumentParser

from conftest import EMBEDDED, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "reinforce", "ppo"])
def test_every_script_gets_a_batch_of_32_completions_and_a_kl_coefficient_of_0_05(
    tmp_path, algorithm
):
    argv = bench.script_argv(
        bench.Args(), algorithm, EMBEDDED, tmp_path / "train.jsonl", 24, tmp_path / "run", "bf16"
    )
    module = importlib.import_module(algorithm)
    # the script's own flags, no others
    (args,) = HfArgumentParser(module.Args).parse_args_into_dataclasses(argv)
    assert args.prompts_per_step * getattr(args, "num_generations", 1) == 32
    assert (args.beta if hasattr(args, "beta") else args.kl_coef) == 0.05
    assert (args.max_steps, args.logging_steps, args.save_steps, args.bf16) == (8, 1, 0, True)


def tiny_bench(tmp_path, capsys, flags: str) -> tuple[dict, list[str]]:
    """bench.py on rloo.py and the embedded model, 8 completions a step: its report and printout."""
    output_json = tmp_path / "bench.json"
    flags += " --algorithms rloo --configs embedded --completions_per_step 8"
    bench.cli([*flags.split(), "--work_dir", str(tmp_path), "--output_json", str(output_json)])
    return json.loads(output_json.read_text()), capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_tiny_bench_prints_a_table_and_writes_positive_figures(tmp_path, capsys):
    report, printed = tiny_bench(tmp_path, capsys, "--steps 3 --warmup_steps 1")
    table = [line for line in printed if line.startswith("| embedded |")]
    assert [line.split(" | ")[1] for line in table] == ["rloo"]
    (row,) = report["summary"]
    which = (row["config"], row["algorithm"], row["precision"], row["repeats"])
    assert which == ("embedded", "rloo", "fp32", 1)
    for name in [
        "median_step_time_s",
        "median_step_cpu_time_s",
        "completions_per_s",
        "generated_tokens_per_s",
        "mean_completion_length",
        "baseline_rss_mb",
        "rss_above_baseline_mb",
    ]:
        assert row[name] > 0, name
    assert row["peak_rss_mb"] > row["baseline_rss_mb"]
    assert row["parameters"] > 0
    (run,) = report["runs"]
    assert len(run["step_times_s"]) == 3  # every step logged; the median is over the last two
    assert run["completions_per_s"] == pytest.approx(8 / run["median_step_time_s"])
    assert report["settings"]["num_threads"] == 1
    assert "AMX" in report["machine"]["device"]  # which CPU: the bounds depend on it


def test_phases_are_timed_inside_the_step_and_each_has_a_positive_bound(tmp_path, capsys):
    """--phases on rloo.py: each phase is found by the library hooks, has a positive bound measured in the run, and
    together they take no longer than the step (one measured step: its medians are its own figures)."""
    report, printed = tiny_bench(tmp_path, capsys, "--steps 2 --warmup_steps 1 --phases")
    (row,) = report["summary"]
    phases = row["phases"]
    assert list(phases) == [*bench.PHASES, "rest", "step"]
    for name in bench.PHASES:
        assert phases[name]["seconds"] > 0, name
        assert phases[name]["bound"] > 0, name
        shown = [line for line in printed if line.startswith(f"| {name} | ")]
        assert any(line.endswith("× |") for line in shown), name
    assert sum(phases[name]["seconds"] for name in bench.PHASES) <= phases["step"]["seconds"]
    assert phases["rest"]["seconds"] == pytest.approx(
        phases["step"]["seconds"] - sum(phases[name]["seconds"] for name in bench.PHASES)
    )
    assert phases["step"]["bound"] == pytest.approx(
        sum(phases[name]["bound"] for name in bench.PHASES)
    )
    assert phases["rest"]["bound"] is None
    assert "| rest | " in "\n".join(printed)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            "--algorithms sft",
            "--algorithms: unknown algorithm 'sft' (choose from rloo, grpo, reinforce, ppo, trl_rloo)",
        ),
        (
            "--configs huge",
            "--configs: unknown config 'huge' (choose from embedded, llama135m, qwen0.5b)",
        ),
        ("--algorithms trl_rloo --phases", "--phases: for the scripts, not for trl_rloo"),
        (
            "--phases --warmup_steps 0",
            "--phases: needs --warmup_steps ≥ 1 (step 1 has no CPU time)",
        ),
        (
            "--steps 2 --warmup_steps 2",
            "--steps: 2 leaves no measured step after --warmup_steps 2",
        ),
        (
            "--completions_per_step 30",
            "--completions_per_step: 30 is not a multiple of --num_generations 4",
        ),
        ("--steps x", "--steps: invalid int value: 'x'"),
        ("--no_such_flag", "unrecognized arguments: --no_such_flag"),
        (
            "--algorithms trl_rloo --trl_python /nonexistent/python",
            "--trl_python: /nonexistent/python cannot import trl; install it in a separate environment (pip install "
            "'trl==1.16.*') and pass its python",
        ),
    ],
)
def test_bad_input_prints_one_line_and_exits_2_before_anything_is_written(
    tmp_path, capsys, flags, message
):
    where = ["--work_dir", str(tmp_path / "work"), "--output_json", str(tmp_path / "bench.json")]
    with pytest.raises(SystemExit) as stopped:
        bench.cli([*flags.split(), *where])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "work").exists()


def test_trl_trains_with_rloos_default_learning_rate_schedule_and_warm_up():
    import rloo

    defaults = rloo.Args()
    scheduler = defaults.lr_scheduler_type
    schedule = dict(lr_scheduler_type=getattr(scheduler, "value", scheduler))
    schedule |= dict(learning_rate=defaults.learning_rate, warmup_ratio=defaults.warmup_ratio)
    assert bench.RLOO_SCHEDULE == schedule
