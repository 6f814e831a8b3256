"""benchmarks/compare_real.py's own pieces, on the embedded model: the pairs it samples and labels with the gold,
a chosen run written as a --config file that its script reads back as the same flags, and the one line that stops it
when the SFT model gives no pairs."""

import json
import sys

import pytest

import rloo
from conftest import ARITHMETIC, EMBEDDED, ROOT
from rewards import accuracy_reward

sys.path.insert(0, str(ROOT / "benchmarks"))
import compare_real  # noqa: E402


def test_each_pair_sets_a_right_sample_against_a_wrong_one_of_a_prompt_of_its_split():
    args = compare_real.Args(samples_per_prompt=4, pairs_per_prompt=2)
    pairs = compare_real.sample_pairs(EMBEDDED, "test", args)
    rows = [json.loads(line) for line in open(f"{ARITHMETIC}/test.jsonl")]
    truth = {row["prompt"][0]["content"]: row["ground_truth"] for row in rows}
    assert pairs  # the embedded model is right about half of the time
    for pair in pairs:
        answer = [truth[pair["prompt"][0]["content"]]]
        assert accuracy_reward([pair["chosen"]], ground_truth=answer) == [1.0]
        assert accuracy_reward([pair["rejected"]], ground_truth=answer) == [0.0]
        assert pair["chosen"] != pair["rejected"]
    per_prompt = [sum(p["prompt"] == row["prompt"] for p in pairs) for row in rows]
    assert max(per_prompt) == 2


def test_a_chosen_run_as_a_config_file_reads_back_as_the_flags_it_ran_with(tmp_path, monkeypatch):
    flags = "--num_generations 4 --learning_rate 3e-5 --bf16 --reward_funcs none".split()
    flags += "--reward_model_path outputs/real/reward_model --output_dir somewhere".split()
    monkeypatch.setattr(sys, "argv", ["rloo.py", *flags])
    ran = rloo.parse_args(rloo.Args)
    run = {"algorithm": "rloo_k4", "config": {k: v for k, v in vars(ran).items()}}
    compare_real.write_config(tmp_path / "rloo_k4.yaml", run)
    monkeypatch.setattr(sys, "argv", ["rloo.py", "--config", str(tmp_path / "rloo_k4.yaml")])
    read = rloo.parse_args(rloo.Args)
    assert read.output_dir == "outputs/real/rloo_k4"
    assert vars(read) == vars(ran) | {"output_dir": "outputs/real/rloo_k4"}


@pytest.mark.parametrize("flag", ["--algorithms no_such", "--completions_per_step 6"])
def test_a_bad_flag_prints_one_line_and_exits_2(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as stop:
        compare_real.cli([*flag.split(), "--output_dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_sft_model_that_gives_no_pairs_stops_the_pipeline_with_one_line(
    tmp_path, monkeypatch, capsys
):
    """A model that is never right (or never wrong) gives no pairs: the pipeline names --sft_args before the reward
    model's stage fails on empty files."""
    (tmp_path / "out" / "sft").mkdir(parents=True)
    (tmp_path / "out" / "sft" / "args.json").write_text('{"num_generations_eval": 1}')
    (tmp_path / "out" / "sft" / "metrics.jsonl").write_text("")
    monkeypatch.setattr(compare_real, "run_script", lambda *args: {"wall_s": 0.0})
    monkeypatch.setattr(compare_real, "sample_pairs", lambda *args: [])
    with pytest.raises(SystemExit) as stop:
        compare_real.cli(["--model_name_or_path", EMBEDDED, "--output_dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    error = "error: --sft_args: a split has no pairs: the SFT model got none of its prompts both right and wrong\n"
    assert capsys.readouterr().err == error
    assert not (tmp_path / "out" / "reward_model").exists()
