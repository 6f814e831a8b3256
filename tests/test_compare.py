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
    for name, (label, script, _, _) in compare.ALGORITHMS.items():
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


def test_reward_model_experiment_optimizes_the_reward_model_alone_with_the_same_kl_coefficient_everywhere(tmp_path):
    args = compare.resolve_experiment(compare.Args(experiment="reward_model", output_dir=str(tmp_path)))
    assert args.reward_model_path == str(tmp_path / "runs" / "rm" / "reward_model")
    for name, (label, script, _, _) in compare.ALGORITHMS.items():
        flags = compare.run_flags(args, name, seed=0)
        config = compare.script_config(script, flags)
        assert (config.reward_funcs, config.reward_model_path) == (["none"], args.reward_model_path), label
        assert compare.kl_coefficient(config) == 0.05, label  # GRPO too: its own default β = 0 has no KL to trade
        assert config.save_steps == config.eval_steps, (
            label
        )  # a checkpoint at every evaluation, for the KL and the proxy
        assert config.output_dir == str(tmp_path / "runs" / "rm" / name / "seed0"), label
    # the first comparison keeps each script's own β (GRPO: 0), no checkpoints and its run folders
    first = compare.Args(output_dir=str(tmp_path))
    assert compare.resolve_experiment(first) == first
    grpo = compare.script_config("grpo.py", compare.run_flags(first, "grpo", seed=0))
    assert (grpo.beta, grpo.save_steps, grpo.reward_funcs, grpo.output_dir) == (
        0.0,
        0,
        ["accuracy"],
        str(tmp_path / "runs" / "grpo" / "seed0"),
    )


def test_value_at_kl_follows_each_run_from_kl_0_and_interpolates():
    kls, gold = [0.0, 0.4, 1.2, 0.9, 2.0], [0.5, 0.7, 0.9, 0.8, 0.6]
    assert compare.value_at_kl(kls, gold, 0.2) == pytest.approx(0.6)
    assert compare.value_at_kl(kls, gold, 0.8) == pytest.approx(
        0.8
    )  # the first crossing (0.4 → 1.2), not the later 1.2 → 0.9
    assert compare.value_at_kl(kls, gold, 2.0) == pytest.approx(0.6)
    assert compare.value_at_kl(kls, gold, 2.5) is None  # never reached


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--completions_per_step", "12"],
            "error: --completions_per_step: 12 is not a multiple of 8, the completions per prompt of grpo",
        ),
        (
            ["--algorithms", "rloo_k3"],
            "error: --algorithms: unknown algorithm 'rloo_k3' (choose from rloo_k4, rloo_k2, reinforce_ma, "
            "vanilla_pg, ppo, grpo)",
        ),
        (["--seeds", "0,one"], "error: --seeds: expected comma-separated integers, got '0,one'"),
        (
            ["--script_args=--no_such_flag 1"],
            "error: --script_args: rloo.py: --no_such_flag: unknown flag (--help lists the flags)",
        ),
        (["--max_completion_length", "0"], "error: --max_completion_length: must be positive, got 0"),
        (["--experiment", "judge"], "error: --experiment: expected one of accuracy, reward_model, got 'judge'"),
        (["--frontier_kls", "0,1"], "error: --frontier_kls: expected positive comma-separated numbers, got '0,1'"),
        (
            ["--experiment", "reward_model", "--reward_model_args=--no_such_flag 1"],
            "error: --reward_model_args: reward_model.py: --no_such_flag: unknown flag (--help lists the flags)",
        ),
        (
            ["--experiment", "reward_model", "--beta", "0"],
            "error: --beta: must be > 0 under --experiment reward_model (the frontier needs a reference model)",
        ),
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


@pytest.mark.slow
def test_quick_reward_model_comparison_trains_the_proxy_and_measures_the_frontier(tmp_path, capsys):
    # one algorithm, PPO (--kl_coef, its value model from the reward model); run_flags are checked for all of them above
    flags = ["--experiment", "reward_model", "--quick", "--algorithms", "ppo", "--output_dir", str(tmp_path)]
    compare.common.cli(compare.main, compare.Args, flags)  # in this process: the import is paid once
    out = capsys.readouterr().out
    assert "1 of 1 runs done" in out and "[reward model] held-out pair accuracy" in out
    assert (tmp_path / "compare_rm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (
        tmp_path / "compare.md"
    ).exists()
    table = (tmp_path / "compare_rm.md").read_text()
    assert re.search(r"\| number pairs, all \| \d\.\d{3} \(78 pairs\) \| \d\.\d{3} \(312 pairs\) \|", table)
    assert re.search(r"\| PPO \| \d\.\d{3} ± \d\.\d{3} \| \d\.\d{3} \|", table)
    report = json.loads((tmp_path / "compare_rm.json").read_text())
    for run in report["runs"]:
        frontier = run["frontier"]
        assert (
            frontier["steps"] == run["eval_steps"] == [0, 2] and frontier["kl"][0] == 0.0
        )  # step 0 is the reference itself
        assert all(isinstance(v, float) for v in frontier["proxy"] + frontier["gold"])
        assert "--reward_funcs none" in run["command"] and not list(
            (tmp_path / "runs" / "rm" / run["algorithm"] / "seed0").glob("checkpoint-*")
        )
    (tmp_path / "compare_rm.md").unlink()
    compare.common.cli(
        compare.main, compare.Args, [*flags, "--report_only"]
    )  # rebuilt from the run folders, training nothing
    assert "[1/1]" not in capsys.readouterr().out and (tmp_path / "compare_rm.md").read_text() == table
