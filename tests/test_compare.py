"""benchmarks/compare.py: the same budget for every algorithm, its KL and frontier arithmetic, a bad flag's one line,
and both reports end to end in --quick mode on rloo.py."""

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import HfArgumentParser

from conftest import EMBEDDED, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import compare  # noqa: E402


def script_config(name: str, flags: list[str]):
    """The run's Args as its script's own parser reads `flags`."""
    module = importlib.import_module(compare.ALGORITHMS[name][1].removesuffix(".py"))
    (config,) = HfArgumentParser(module.Args).parse_args_into_dataclasses(flags)
    return config


@pytest.mark.parametrize("name", compare.ALGORITHMS)
def test_every_algorithm_samples_the_same_completions_per_step_and_evaluates_alike(tmp_path, name):
    args = compare.Args(completions_per_step=32, output_dir=str(tmp_path))
    config = script_config(name, compare.run_flags(args, name, seed=0))
    assert config.prompts_per_step * getattr(config, "num_generations", 1) == 32
    assert (config.max_steps, config.eval_steps, config.num_generations_eval) == (50, 10, 4)
    assert (config.save_steps, config.output_dir) == (0, str(tmp_path / "runs" / name / "seed0"))


def test_vanilla_pg_is_ppo_with_lambda_1_one_epoch_no_whitening_and_ppo_keeps_its_defaults(
    tmp_path,
):
    args = compare.Args(output_dir=str(tmp_path))
    vanilla_pg = script_config("vanilla_pg", compare.run_flags(args, "vanilla_pg", seed=0))
    ppo = script_config("ppo", compare.run_flags(args, "ppo", seed=0))
    assert (vanilla_pg.lam, vanilla_pg.num_ppo_epochs, vanilla_pg.num_mini_batches) == (1.0, 1, 1)
    assert not vanilla_pg.whiten_advantages
    assert compare.updates_per_batch(vanilla_pg) == 1
    assert (ppo.lam, ppo.whiten_advantages) == (0.95, True)
    assert compare.updates_per_batch(ppo) == ppo.num_ppo_epochs * ppo.num_mini_batches > 1


def test_ppo_logs_kl_per_completion_and_the_others_per_token():
    assert compare.sequence_kl({"objective/kl": 0.6, "completions/mean_length": 12.0}) == 0.6
    assert compare.sequence_kl({"kl": 0.05, "completions/mean_length": 12.0}) == pytest.approx(0.6)


@pytest.mark.parametrize("name", compare.ALGORITHMS)
def test_the_reward_model_experiment_optimizes_the_proxy_alone_with_one_kl_coefficient(
    tmp_path, name
):
    args = compare.resolve_experiment(
        compare.Args(experiment="reward_model", output_dir=str(tmp_path))
    )
    assert args.reward_model_path == str(tmp_path / "runs" / "rm" / "reward_model")
    config = script_config(name, compare.run_flags(args, name, seed=0))
    assert (config.reward_funcs, config.reward_model_path) == (["none"], args.reward_model_path)
    # GRPO too: its own default β = 0 has no KL to trade
    assert compare.kl_coefficient(config) == 0.05
    # a checkpoint at every evaluation, for the KL and the proxy
    assert config.save_steps == config.eval_steps
    assert config.output_dir == str(tmp_path / "runs" / "rm" / name / "seed0")


def test_the_first_experiment_keeps_each_scripts_own_kl_coefficient(tmp_path):
    args = compare.Args(output_dir=str(tmp_path))
    assert compare.resolve_experiment(args) == args
    grpo = script_config("grpo", compare.run_flags(args, "grpo", seed=0))
    assert (grpo.beta, grpo.reward_funcs) == (0.0, ["accuracy"])


def test_script_args_cannot_change_the_budget_or_the_algorithm(tmp_path):
    args = compare.Args(
        output_dir=str(tmp_path), script_args="--max_steps 3 --num_generations 2 --bf16"
    )
    config = script_config("grpo", compare.run_flags(args, "grpo", seed=0))
    assert (config.max_steps, config.num_generations, config.prompts_per_step) == (50, 8, 4)
    assert config.bf16  # any other flag reaches the script


def test_value_at_kl_follows_each_run_from_kl_0_and_interpolates():
    kls, gold = [0.0, 0.4, 1.2, 0.9, 2.0], [0.5, 0.7, 0.9, 0.8, 0.6]
    assert compare.value_at_kl(kls, gold, 0.2) == pytest.approx(0.6)
    # the first crossing (0.4 → 1.2), not 1.2 → 0.9
    assert compare.value_at_kl(kls, gold, 0.8) == pytest.approx(0.8)
    assert compare.value_at_kl(kls, gold, 2.0) == pytest.approx(0.6)
    assert compare.value_at_kl(kls, gold, 2.5) is None  # never reached


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            "--completions_per_step 12",
            "--completions_per_step: 12 is not a multiple of 8, the completions per prompt of grpo",
        ),
        (
            "--algorithms rloo_k3",
            "--algorithms: unknown algorithm 'rloo_k3' (choose from rloo_k4, rloo_k2, reinforce_ma, vanilla_pg, ppo, "
            "grpo)",
        ),
        ("--seeds 0,one", "--seeds: expected comma-separated numbers, got '0,one'"),
        ("--max_steps x", "--max_steps: invalid int value: 'x'"),
        (
            "--experiment judge",
            "--experiment: expected one of accuracy, reward_model, got 'judge'",
        ),
        ("--frontier_kls 0,1", "--frontier_kls: must be positive, got '0,1'"),
    ],
)
def test_bad_flag_prints_one_line_and_exits_2_before_anything_is_written(
    tmp_path, capsys, flags, message
):
    with pytest.raises(SystemExit) as stopped:
        compare.cli([*flags.split(), "--output_dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "out").exists()


def test_a_bad_script_flag_stops_the_comparison_with_the_scripts_exit_status_2(tmp_path, capfd):
    flags = ["--quick", "--algorithms", "rloo_k4", "--script_args=--no_such_flag 1"]
    with pytest.raises(SystemExit) as stopped:
        compare.cli([*flags, "--output_dir", str(tmp_path)])
    assert stopped.value.code == 2
    assert "--no_such_flag" in capfd.readouterr().err  # in the script's own line, on stderr
    assert not (tmp_path / "compare.md").exists()


@pytest.mark.parametrize("layout", ["a file", "a folder with a train split only"])
def test_a_dataset_without_a_held_out_split_stops_with_one_line_and_exit_status_2(
    tmp_path, capsys, monkeypatch, layout
):
    dataset = ROOT / "data" / "arithmetic" / "train.jsonl"
    if layout != "a file":
        dataset = tmp_path / "data"
        dataset.mkdir()
        shutil.copy(ROOT / "data" / "arithmetic" / "train.jsonl", dataset)

    def finished_run(script, flags, tag):  # as if the script had trained: its args.json
        folder = Path(flags[flags.index("--output_dir") + 1])
        folder.mkdir(parents=True)
        config = dict(dataset_name=str(dataset), dataset_config=None, dataset_test_split="test")
        (folder / "args.json").write_text(json.dumps(config))
        return {"returncode": 0, "wall_s": 1.0, "peak_mib": 1.0}

    monkeypatch.setattr(compare, "run_script", finished_run)
    with pytest.raises(SystemExit) as stopped:
        compare.cli(["--quick", "--algorithms", "rloo_k4", "--output_dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    error = f"error: --dataset_name {dataset}: no held-out split 'test' with a ground_truth column"
    assert capsys.readouterr().err.strip().splitlines()[-1] == error  # after datasets' progress


@pytest.mark.slow
def test_quick_comparison_writes_the_table_the_figure_and_the_raw_results(tmp_path, capsys):
    flags = ["--quick", "--algorithms", "rloo_k4", "--output_dir", str(tmp_path)]
    compare.cli(flags)
    assert "1 of 1 runs done" in capsys.readouterr().out
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "compare.md").read_text()
    command = "python benchmarks/compare.py --quick --algorithms rloo_k4 --output_dir "
    assert f"Command: `{command}" in table
    row = next(line for line in table.splitlines() if line.startswith("| RLOO k=4 |"))
    accuracy, per_seed, greedy, heldout_kl, train_kl, variance = row.split(" | ")[1:7]
    assert re.fullmatch(r"\d\.\d{3} ± \d\.\d{3}", accuracy), row
    assert re.fullmatch(r"\d\.\d{3}", per_seed), row
    assert re.fullmatch(r"-?\d+\.\d{2} ± \d+\.\d{2}", heldout_kl), row
    assert re.fullmatch(r"\d\.\d{3}", variance), row
    (run,) = json.loads((tmp_path / "compare.json").read_text())["runs"]
    assert run["completions"] == 16
    assert run["peak_mib"] > 0
    assert run["wall_s"] > 0
    assert run["eval_steps"] == [0, 2]  # evaluated at step 0 and at the end


@pytest.mark.slow
def test_quick_reward_model_comparison_scores_the_proxy_and_measures_the_frontier(
    tmp_path, capsys
):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    # a reward model with a random head: the experiment's arithmetic, not its findings
    proxy = tmp_path / "proxy"
    torch.manual_seed(0)
    scorer = AutoModelForSequenceClassification.from_pretrained(EMBEDDED, num_labels=1)
    scorer.save_pretrained(proxy)
    AutoTokenizer.from_pretrained(EMBEDDED).save_pretrained(proxy)
    flags = "--experiment reward_model --quick --algorithms rloo_k4".split()
    compare.cli([*flags, "--reward_model_path", str(proxy), "--output_dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "1 of 1 runs done" in out
    assert "[reward model] held-out pair accuracy" in out
    assert (tmp_path / "out" / "compare_rm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "out" / "compare_rm.md").read_text()
    assert re.search(
        r"\| number pairs, all \| \d\.\d{3} \(78 pairs\) \| \d\.\d{3} \(312 pairs\) \|", table
    )
    assert re.search(r"\| RLOO k=4 \| \d\.\d{3} ± \d\.\d{3} \| \d\.\d{3} \|", table)
    (run,) = json.loads((tmp_path / "out" / "compare_rm.json").read_text())["runs"]
    frontier = run["frontier"]
    # step 0: the reference
    assert frontier["steps"] == run["eval_steps"] == [0, 2]
    assert frontier["kl"][0] == 0.0
    assert all(isinstance(v, float) for v in frontier["proxy"] + frontier["gold"])
    assert frontier["prompts"] == 78
    assert run["accuracy"] == frontier["gold"]  # gold: the proxy run logs no accuracy of its own
    assert "--reward_funcs none" in run["command"]
    assert "--beta 0.05" in run["command"]
    assert not list((tmp_path / "out" / "runs" / "rm" / "rloo_k4" / "seed0").glob("checkpoint-*"))
