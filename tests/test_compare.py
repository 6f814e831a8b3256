"""compare.py: the same budget for every algorithm, the report end to end in --quick mode, and a bad flag's one line."""

import json
import os
import re
import subprocess
import sys

import pytest

import compare
from common import ROOT


def compare_command(*flags):
    return [sys.executable, str(ROOT / "compare.py"), *flags]


def test_every_algorithm_samples_the_same_completions_per_step(tmp_path):
    args = compare.Args(completions_per_step=32, output_dir=str(tmp_path))
    for name, (label, script, G, _) in compare.ALGORITHMS.items():
        config = compare.script_config(script, compare.run_flags(args, name, seed=0))
        assert config.prompts_per_step * getattr(config, "num_generations", 1) == 32, label
        assert config.max_steps == args.max_steps and config.eval_steps == args.eval_steps, label


def test_vanilla_pg_is_ppo_with_lambda_1_one_epoch_no_whitening_and_ppo_keeps_its_defaults(tmp_path):
    args = compare.Args(output_dir=str(tmp_path))
    vanilla_pg = compare.script_config("ppo.py", compare.run_flags(args, "vanilla_pg", seed=0))
    ppo = compare.script_config("ppo.py", compare.run_flags(args, "ppo", seed=0))
    assert (vanilla_pg.lam, vanilla_pg.num_ppo_epochs, vanilla_pg.num_mini_batches, vanilla_pg.whiten_advantages) == (
        1.0,
        1,
        1,
        False,
    )
    assert (ppo.lam, ppo.num_ppo_epochs, ppo.whiten_advantages) == (0.95, 4, True)
    assert compare.updates_per_batch(ppo) == 4 and compare.updates_per_batch(vanilla_pg) == 1


def test_ppo_logs_kl_per_completion_and_the_others_per_token():
    assert compare.sequence_kl({"objective/kl": 0.6, "completions/mean_length": 12.0}) == 0.6
    assert compare.sequence_kl({"kl": 0.05, "completions/mean_length": 12.0}) == pytest.approx(0.6)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--completions_per_step", "12"],
            "error: --completions_per_step: 12 is not a multiple of 8, the completions per prompt of grpo",
        ),
        (
            ["--algorithms", "rloo_k3"],
            "error: --algorithms: unknown algorithm 'rloo_k3' (choose from rloo_k4, rloo_k2, reinforce_ma, vanilla_pg, ppo, grpo)",
        ),
        (["--seeds", "0,one"], "error: --seeds: expected comma-separated integers, got '0,one'"),
        (
            ["--script_args=--no_such_flag 1"],
            "error: --script_args: rloo.py: --no_such_flag: unknown flag (--help lists the flags)",
        ),
        (["--max_completion_length", "0"], "error: --max_completion_length: must be positive, got 0"),
    ],
)
def test_bad_flag_prints_one_line_and_exits_2_before_anything_is_written(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        compare.common.cli(compare.main, compare.Args, [*flags, "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "out").exists()


def test_cli_bad_flag_exits_2_with_one_line(tmp_path):
    result = subprocess.run(
        compare_command("--completions_per_step", "30", "--output_dir", str(tmp_path)),
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --completions_per_step: 30 is not a multiple of 4, the completions per prompt of rloo_k4"
    ]


@pytest.mark.slow
def test_quick_comparison_writes_the_table_the_figure_and_the_raw_results(tmp_path):
    result = subprocess.run(
        compare_command("--quick", "--output_dir", str(tmp_path)),
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "6 of 6 runs done" in result.stdout
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "compare.md").read_text()
    for label, *_ in compare.ALGORITHMS.values():
        row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        accuracy, per_seed, greedy, heldout_kl = row.split(" | ")[1:5]
        assert re.fullmatch(r"\d\.\d{3} ± \d\.\d{3}", accuracy) and re.fullmatch(r"\d\.\d{3}", per_seed), row
        assert re.fullmatch(r"-?\d+\.\d{2} ± \d+\.\d{2}", heldout_kl), (
            row
        )  # measured for every algorithm, GRPO included
    report = json.loads((tmp_path / "compare.json").read_text())
    assert len(report["runs"]) == 6 and all(run["completions"] == 16 and run["peak_mib"] > 0 for run in report["runs"])
    assert all(
        len(run["accuracy"]) == 2 for run in report["runs"]
    )  # evaluated at step 0 and at the end, every run alike
    # the report rebuilds from the run folders without training
    (tmp_path / "compare.md").unlink()
    rebuilt = subprocess.run(
        compare_command("--quick", "--report_only", "--output_dir", str(tmp_path)),
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert rebuilt.returncode == 0 and "[1/6]" not in rebuilt.stdout and (tmp_path / "compare.md").read_text() == table
