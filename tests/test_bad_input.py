"""Bad input is one line, and no value is a silent no-op (issue #34), by cause, in the scripts each cause applies to.

Whatever goes wrong while a flag's input is loaded or first used is `error: --flag value: ...` (with the library's own
first line), exit status 2, nothing written; a row that cannot be read is named by its number; the error is the log's
last line; --max_grad_norm 0 is no clipping; a completion length that cannot fit the model's context is refused."""

import dataclasses
import gzip
import json
import re
import shutil
import sys
import typing

import pytest
import torch
import transformers
from accelerate.tracking import get_available_trackers
from datasets import Dataset
from safetensors.torch import load_file

import common
import grpo
import ppo
import reinforce
import reward_model
import rloo
import sft
from conftest import (
    EMBEDDED,
    ROOT,
    error_line,
    one_line_error,
    run_main,
    run_script,
    run_to_its_stop,
)

RL = [rloo, grpo, reinforce, ppo]
SCRIPTS = [*RL, sft, reward_model]
DATA = {
    sft: ROOT / "data/arithmetic_sft/test.jsonl",
    reward_model: ROOT / "data/arithmetic_preferences/test.jsonl",
}


def small(module, out) -> list:
    """The flags of a one-step run of `module` on little data, without evaluation, into `out`."""
    if module in RL:
        size = ["--prompts_per_step", "4"]
    else:
        size = ["--train_batch_size", "8", "--dataset_name", DATA[module]]
    return [*size, "--max_steps", "1", "--eval_strategy", "no", "--output_dir", out]


def unloadable(case: str, tmp_path) -> list:
    """The flags of each case: a flag whose input cannot be loaded (a later flag wins over `small`'s)."""
    if case == "a config that is not text":
        (tmp_path / "run.yaml").write_bytes(b"\xff\xfe\x00")
        return ["--config", tmp_path / "run.yaml"]
    if case == "a folder without a model":
        return ["--model_name_or_path", tmp_path]
    if case == "an empty data file":
        (tmp_path / "pairs.json").write_text("")
        return ["--dataset_name", tmp_path / "pairs.json"]
    if case == "a LoRA target no module has":
        return ["--use_peft", "--lora_target_modules", "q_projection"]
    if case == "a tracker that is not installed":
        installed = [str(tracker) for tracker in get_available_trackers()]
        missing = next(t for t in ("wandb", "mlflow", "comet_ml", "aim") if t not in installed)
        return ["--report_to", missing]
    if case == "a misspelt tracker":
        return ["--report_to", "tensorbord"]
    if case == "an output folder inside a file":
        (tmp_path / "notes.txt").write_text("a file")
        return ["--output_dir", tmp_path / "notes.txt" / "out"]
    if case == "vllm not installed":
        return ["--use_vllm"]
    if case == "a reward model whose tokenizer does not parse":
        # its weights load: a classifier of one label
        shutil.copytree(EMBEDDED, tmp_path / "scorer")
        config = json.loads((tmp_path / "scorer/config.json").read_text()) | {
            "id2label": {"0": "LABEL_0"}
        }
        (tmp_path / "scorer/config.json").write_text(json.dumps(config))
        (tmp_path / "scorer/tokenizer_config.json").write_text("{")
        return ["--reward_funcs", "none", "--reward_model_path", tmp_path / "scorer"]


@pytest.mark.parametrize(
    "module, flag, case",
    [
        (rloo, "--config", "a config that is not text"),
        (sft, "--model_name_or_path", "a folder without a model"),
        (reward_model, "--dataset_name", "an empty data file"),
        (grpo, "--lora_target_modules", "a LoRA target no module has"),
        (reinforce, "--report_to", "a tracker that is not installed"),
        (sft, "--report_to", "a misspelt tracker"),
        (ppo, "--output_dir", "an output folder inside a file"),
        (ppo, "--use_vllm", "vllm not installed"),
        (rloo, "--reward_model_path", "a reward model whose tokenizer does not parse"),
    ],
)
def test_an_input_that_cannot_be_loaded_is_one_line_naming_its_flag(
    module, flag, case, tmp_path, capsys, monkeypatch
):
    # `import vllm` fails, whether it is installed or not
    monkeypatch.setitem(sys.modules, "vllm", None)
    flags = unloadable(case, tmp_path)
    line = one_line_error(module, *small(module, tmp_path / "out"), *flags, capsys=capsys)
    value = True if flag == "--use_vllm" else flags[flags.index(flag) + 1]
    named = line.split(": ")[1]  # error: --flag value: the library's first line
    assert named.startswith(f"{flag} "), line
    assert str(value) in named, line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    assert (
        not (tmp_path / "notes.txt").exists() or (tmp_path / "notes.txt").read_text() == "a file"
    )


def test_a_script_copied_without_the_embedded_model_says_so_in_one_line(tmp_path):
    """A copier who took the script, common.py and rewards.py, but not models/, runs the script as it is."""
    for name in ("reward_model.py", "common.py", "rewards.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    result = run_script("reward_model.py", "--output_dir", "out", cwd=tmp_path)
    model = tmp_path.resolve() / "models" / "tiny-arith"
    assert error_line(result).startswith(f"error: --model_name_or_path {model}: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", RL)
def test_a_reward_function_that_cannot_take_trls_keywords_is_one_line_before_any_model(
    module, tmp_path, capsys
):
    (tmp_path / "mine.py").write_text(
        "def exact(prompts, completions, ground_truth):\n    return [1.0] * 8\n"
    )
    flags = ["--reward_funcs", f"{tmp_path / 'mine.py'}:exact"]
    line = one_line_error(module, *small(module, tmp_path / "out"), *flags, capsys=capsys)
    assert line.startswith(
        "error: reward function exact called with ['prompts', 'completions', 'completion_ids'"
    )
    assert line.endswith(
        "(the train split's): got an unexpected keyword argument 'completion_ids'"
    )
    assert not (tmp_path / "out").exists()


def test_a_reward_function_that_returns_no_list_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(
        "def forgot(completions, **kwargs):\n    scores = [1.0] * len(completions)\n"
    )
    flags = ["--reward_funcs", f"{tmp_path / 'mine.py'}:forgot"]
    line = one_line_error(grpo, *small(grpo, tmp_path / "out"), *flags, capsys=capsys)
    assert line == "error: reward function forgot returned None: expected a list, one value each"
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("module", SCRIPTS)
def test_max_grad_norm_0_is_no_clipping_as_in_transformers_trainer(module, tmp_path):
    """Clipping at 0 would make every update zero; in transformers' Trainer, 0 turns clipping off."""
    (tmp_path / "mine.py").write_text(
        "def length(completions, **kwargs):\n    return list(map(len, map(str, completions)))"
    )
    rewards = []
    if module in RL:  # never all equal
        rewards = ["--reward_funcs", f"{tmp_path / 'mine.py'}:length"]
    run_main(module, *small(module, tmp_path / "out"), *rewards, "--max_grad_norm", "0")
    before = load_file(f"{EMBEDDED}/model.safetensors")
    after = load_file(tmp_path / "out" / "model.safetensors")
    # the backbone moved
    assert any(not after[name].equal(before[name]) for name in before if name in after)


@pytest.mark.parametrize("module", RL)
def test_a_completion_length_that_cannot_fit_the_context_after_the_longest_prompt_is_refused(
    module, tmp_path, capsys
):
    tokenizer, texts = common.load_tokenizer(EMBEDDED), []
    for split in ("train", "test"):  # the default data's
        texts += rloo.prompt_texts(
            tokenizer, rloo.load_split(rloo.Args(), split), rloo.Args(), split
        )
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids)
    room = 128 - longest  # the embedded model's 128 positions
    flags = [*small(module, tmp_path / "out"), "--max_completion_length", room + 1]
    line = one_line_error(module, *flags, capsys=capsys)
    fit = f"{room} fit the context after a {longest}-token prompt"
    assert line == f"error: --max_completion_length {room + 1}: {fit}"
    assert not (tmp_path / "out").exists()


def test_sft_refuses_a_completion_length_its_evaluation_cannot_fit(tmp_path, capsys):
    """sft.py samples completions of the held-out prompts when it evaluates: the same check, on those prompts."""
    flags = ["--train_batch_size", "8", "--max_steps", "1", "--output_dir", tmp_path / "out"]
    line = one_line_error(sft, *flags, "--max_completion_length", 500, capsys=capsys)
    assert re.fullmatch(
        r"error: --max_completion_length 500: \d+ fit the context after a \d+-token prompt", line
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", SCRIPTS)
def test_a_data_file_is_read_by_its_last_extension(module, tmp_path):
    """`arith.v2.csv` is a csv file (its first suffix, .v2, is no format); a compressed file is read as well."""
    rows = "prompt,ground_truth\n" + "".join(f"Compute {a} + 1.,{a + 1}\n" for a in range(4))
    (tmp_path / "arith.v2.csv").write_text(rows)
    (tmp_path / "arith.csv.gz").write_bytes(gzip.compress(rows.encode()))
    for name in ("arith.v2.csv", "arith.csv.gz"):
        split = module.load_split(module.Args(dataset_name=str(tmp_path / name)), "train")
        assert split.column_names == ["prompt", "ground_truth"]
        assert split[3]["ground_truth"] == 4


def test_a_row_that_cannot_be_read_is_named_by_its_number_in_every_script(tiny_tokenizer):
    said = [{"role": "user", "content": "1 + 1"}]
    prompts = Dataset.from_list(
        [{"prompt": said, "completion": "2"}] * 3 + [{"prompt": [], "completion": "2"}]
    )
    for module in [*RL, sft]:
        with pytest.raises(
            module.BadInput,
            match="^--dataset_name row 3 of the test split: expected a string or a",
        ):
            module.prompt_texts(tiny_tokenizer, prompts, module.Args(), "test")
    completions = Dataset.from_list(
        [{"prompt": "1 + 1", "completion": c} for c in ("2", "2", None, "2")]
    )
    with pytest.raises(sft.BadInput, match="^--dataset_name row 2 of the train split: "):
        sft.tokenize(tiny_tokenizer, completions, sft.Args(), "train")
    pairs = Dataset.from_list(
        [{"chosen": "2", "rejected": "3", "margin": m} for m in ("1", "high", "1")]
    )
    with pytest.raises(
        reward_model.BadInput, match="^--dataset_name row 1 of the train split: could not convert"
    ):
        reward_model.tokenize_pairs(tiny_tokenizer, pairs, reward_model.Args(), "train")


def last_line_of_a_stop(module, flags, capsys) -> str:
    """The last line a script writes to stderr when it stops inside its loop."""
    return run_to_its_stop(module, *flags, capsys=capsys)[1][-1]


def test_the_error_is_the_last_line_below_the_progress_bar(tmp_path, capsys):
    """tqdm redraws its bar below a line written above it: the bar is closed first, whatever stops the loop (here a
    loss that overflows float32 at the first step, and a reward function that breaks its contract there)."""
    flags = [*small(reward_model, tmp_path / "rm"), "--center_rewards_coefficient", "1e300"]
    assert last_line_of_a_stop(reward_model, flags, capsys).startswith(
        "error: step 1: the loss or the gradient norm"
    )
    (tmp_path / "mine.py").write_text("def short(completions, **kwargs):\n    return [1.0]\n")
    flags = [*small(rloo, tmp_path / "rl"), "--reward_funcs", f"{tmp_path / 'mine.py'}:short"]
    line = last_line_of_a_stop(rloo, flags, capsys)
    assert line == "error: reward function short returned 1 values for 8 completions"


@pytest.mark.parametrize(
    "module, resume", [(sft, "latest"), (reward_model, "a folder that holds none")]
)
def test_resuming_where_there_is_no_checkpoint_names_the_folder_and_writes_nothing(
    module, resume, tmp_path, capsys
):
    (tmp_path / "notes").mkdir()
    folder = tmp_path / "out" if resume == "latest" else tmp_path / "notes"
    checkpoint = "latest" if resume == "latest" else folder
    flags = [*small(module, tmp_path / "out"), "--resume_from_checkpoint", checkpoint]
    line = one_line_error(module, *flags, capsys=capsys)
    if resume == "latest":
        assert line == f"error: --resume_from_checkpoint: none in {folder}"
    else:  # the file a checkpoint of this project holds, and this folder does not
        assert line.startswith(f"error: --resume_from_checkpoint {folder}: ")
        assert "args.json" in line
    assert not (tmp_path / "out").exists()


def parsed(module, *flags):
    """`module`'s Args from the command line `flags`, as `python script.py flags` reads them."""
    old, sys.argv = sys.argv, [f"{module.__name__}.py", *map(str, flags)]
    try:
        return module.parse_args(module.Args)
    finally:
        sys.argv = old


@pytest.mark.parametrize("module", SCRIPTS)
def test_a_configs_values_are_read_as_the_same_flags_typed_on_the_command_line(
    module, tmp_path, capsys
):
    """A TRL recipe's YAML lists, numbers and booleans mean what they would typed as flags (issue #45)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "report_to: none\nlearning_rate: 2e-4\nbf16: true\nlora_target_modules: q_proj\n"
    )
    args = parsed(module, "--config", recipe, "--lora_target_modules", "v_proj", "k_proj")
    assert (args.report_to, args.learning_rate, args.bf16) == (["none"], 2e-4, True)
    assert args.lora_target_modules == ["v_proj", "k_proj"]  # the command line wins
    if module in RL:
        recipe.write_text("reward_funcs: accuracy\nreward_weights: [1.0, 0.5]\n")
        args = parsed(module, "--config", recipe)
        assert (args.reward_funcs, args.reward_weights) == (["accuracy"], ["1.0", "0.5"])
    recipe.write_text("max_steps: 2.0\n")  # as --max_steps 2.0 on the command line
    with pytest.raises(SystemExit) as stopped:
        parsed(module, "--config", recipe, "--output_dir", tmp_path / "out")
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: --config {recipe}: --max_steps")  # the file, the key
    assert line.endswith(": invalid int value: '2.0'")
    assert not (tmp_path / "out").exists()


def test_a_recipes_scale_rewards_true_is_group_as_in_trl(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    for value, meant in (("true", "group"), ("false", "none"), ("batch", "batch")):
        recipe.write_text(f"scale_rewards: {value}\n")
        args = parsed(grpo, "--config", recipe)
        grpo.check_args(args)
        assert args.scale_rewards == meant


def a_run_folder(module, folder, *, checkpoint: bool, **flags):
    """What `module` saves into `folder`, as far as a resume reads it before loading anything: args.json,
    trainer_state.json and, in a checkpoint, state/."""
    folder.mkdir(parents=True)
    saved = dataclasses.asdict(module.Args(**flags))
    (folder / "args.json").write_text(json.dumps(saved, default=str))
    (folder / "trainer_state.json").write_text(json.dumps({"step": 1, "num_tokens": 0}))
    if checkpoint:
        (folder / "state").mkdir()
    return folder


@pytest.mark.parametrize("module", SCRIPTS)
def test_a_folder_that_is_not_this_scripts_checkpoint_is_named_and_nothing_is_written(
    module, tmp_path, capsys
):
    """A finished run's output folder, or another script's checkpoint, to resume from (issue #45)."""
    final = a_run_folder(module, tmp_path / "done", checkpoint=False)
    flags = [*small(module, tmp_path / "out"), "--resume_from_checkpoint", final]
    line = one_line_error(module, *flags, capsys=capsys)
    assert line == f"error: --resume_from_checkpoint {final}: a run's final model"
    other = sft if module is not sft else rloo
    foreign = a_run_folder(other, tmp_path / "other" / "checkpoint-500", checkpoint=True)
    flags[-1] = foreign
    line = one_line_error(module, *flags, capsys=capsys)
    assert line == f"error: --resume_from_checkpoint {foreign}: another script's checkpoint"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flag, value",
    [("learning_rate", "0.002"), ("weight_decay", "0.1"), ("lr_scheduler_type", "constant")],
)
def test_a_resume_refuses_what_its_optimizer_and_scheduler_would_restore(
    flag, value, tmp_path, capsys
):
    """The restored optimizer and scheduler would put the checkpoint's value back: refused, nothing written."""
    out = tmp_path / "out"
    run_main(rloo, *small(rloo, out), "--save_steps", "1")
    before = (out / "metrics.jsonl").read_text()
    old = json.loads((out / "checkpoint-1" / "args.json").read_text())[flag]
    resume = "--max_steps 2 --save_steps 1 --resume_from_checkpoint latest".split()
    flags = [*small(rloo, out), *resume, f"--{flag}", value]
    assert (
        one_line_error(rloo, *flags, capsys=capsys)
        == f"error: --{flag} {value}: resumes keep {old}"
    )
    assert (out / "metrics.jsonl").read_text() == before
    assert not (out / "checkpoint-2").exists()


@pytest.mark.parametrize("module", SCRIPTS)
def test_an_output_folder_that_is_or_holds_an_input_of_the_run_is_refused(
    module, tmp_path, capsys
):
    """The model's folder (its weights would be overwritten), the data's, or '' (the working folder) (issue #45)."""
    shutil.copytree(EMBEDDED, tmp_path / "model")
    before = sorted(path.name for path in (tmp_path / "model").iterdir())
    model = ["--model_name_or_path", tmp_path / "model"]
    for out, input_flag in (
        (tmp_path / "model", "model_name_or_path"),
        (tmp_path, "model_name_or_path"),
    ):
        line = one_line_error(module, *small(module, out), *model, capsys=capsys)
        assert line == f"error: --output_dir {out}: it holds --{input_flag} {tmp_path / 'model'}"
    data = shutil.copytree(ROOT / "data/arithmetic", tmp_path / "data")
    if module in DATA:
        data = shutil.copy(DATA[module], tmp_path / "data" / "pairs.jsonl")
    data_before = sorted(path.name for path in (tmp_path / "data").iterdir())
    line = one_line_error(
        module, *small(module, tmp_path / "data"), "--dataset_name", data, capsys=capsys
    )
    assert line == f"error: --output_dir {tmp_path / 'data'}: it holds --dataset_name {data}"
    line = one_line_error(module, *small(module, ""), capsys=capsys)
    assert line == "error: --output_dir '': the working folder; name one"
    assert sorted(path.name for path in (tmp_path / "model").iterdir()) == before
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == data_before


@pytest.mark.parametrize("module", SCRIPTS)
def test_a_typed_held_out_split_that_does_not_exist_is_refused_the_default_may_be_absent(
    module, tmp_path, capsys
):
    """As in TRL, a --dataset_test_split that was asked for must exist; only the default 'test' may be absent."""
    data = DATA.get(module, ROOT / "data/arithmetic/train.jsonl")  # a file: its one split, train
    assert module.load_split(module.Args(dataset_name=str(data)), "test") is None
    flags = [*small(module, tmp_path / "out"), "--dataset_name", data, "--eval_strategy", "steps"]
    line = one_line_error(module, *flags, "--dataset_test_split", "validation", capsys=capsys)
    assert line == "error: --dataset_test_split: no 'validation' in ['train']"
    assert not (tmp_path / "out").exists()


def test_a_batch_that_no_reward_function_scores_is_said_once(tmp_path, caplog):
    """Every completion None: the step has no learning signal, as TRL warns (issue #45). The line goes to the
    logger `rewards`, which Python prints as it is on stderr (pytest captures it here)."""
    from transformers.utils import logging

    logging.get_logger().warning_once.cache_clear()
    (tmp_path / "mine.py").write_text(
        "def abstain(completions, **kwargs):\n    return [None] * len(completions)\n"
    )
    flags = ["--reward_funcs", f"{tmp_path / 'mine.py'}:abstain", "--max_steps", "2"]
    run_main(rloo, *small(rloo, tmp_path / "out"), *flags)
    said = [r.getMessage() for r in caplog.records if r.name == "rewards"]
    assert said == ["warning: no reward function scored the batch"]


def test_sft_refuses_a_max_length_that_leaves_a_prompt_no_completion_token(tmp_path, capsys):
    """Such a row trains on nothing: loss 0, gradient 0 (issue #45)."""
    flags = [*small(sft, tmp_path / "out"), "--max_length", "5"]
    line = one_line_error(sft, *flags, capsys=capsys)
    assert re.fullmatch(
        r"error: --max_length 5: a \d+-token prompt leaves no completion token", line
    )
    assert not (tmp_path / "out").exists()


def test_reward_functions_as_trl_takes_them(tmp_path):
    """Two files' functions of one name both score; an async def function is awaited; a ground_truth that lists
    the accepted answers matches any of them (issue #45)."""
    import rewards

    for name, body in (
        ("a", "return [1.0] * len(completions)"),
        ("b", "return [2.0] * len(completions)"),
    ):
        (tmp_path / f"{name}.py").write_text(
            f"async def score(completions, **kwargs):\n    {body}\n"
        )
    specs = [f"{tmp_path / 'a.py'}:score", f"{tmp_path / 'b.py'}:score"]
    functions = rewards.load_reward_funcs(rloo.Args(reward_funcs=specs))
    assert len(functions) == 2
    total, per_func = rewards.compute_rewards(
        functions, rewards.reward_weights([], functions), ["1 + 1"], ["2"], [[5]], {}
    )
    assert per_func.tolist() == [[1.0, 2.0]]
    assert total.tolist() == [3.0]
    completions = ["<answer>4</answer>", "<answer>5</answer>", "<answer>7</answer>"]
    truths = [["4", "four"], [3, 6.0], 7]
    assert rewards.accuracy_reward(completions, ground_truth=truths) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("module", SCRIPTS)
def test_a_lora_flag_without_use_peft_is_refused(module, tmp_path, capsys):
    """Without --use_peft the run would be a full fine-tune, whatever --lora_r says (issue #45)."""
    flags = [*small(module, tmp_path / "out"), "--lora_r", "8"]
    assert one_line_error(module, *flags, capsys=capsys) == "error: --lora_r: it needs --use_peft"
    if module in (sft, reward_model):  # the merged model of an adapter
        flags = [*small(module, tmp_path / "out"), "--save_merged_model"]
        line = one_line_error(module, *flags, capsys=capsys)
        assert line == "error: --save_merged_model: it needs --use_peft"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", [*RL, sft])
def test_the_context_check_takes_a_config_without_max_position_embeddings(module, tiny_tokenizer):
    """BLOOM's config names no context length (ALiBi has none): nothing to check (issue #45)."""
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(hidden_size=8))
    module.check_context(model, tiny_tokenizer, ["Compute 7 × 8."], 10**6)


@pytest.mark.parametrize("module", SCRIPTS)
def test_only_the_schedules_that_run_are_offered(module, tmp_path, capsys):
    """A schedule that needs --lr_scheduler_kwargs (open-r1's cosine_with_min_lr) or a metric (reduce_lr_on_plateau)
    is refused by the parser, where it was a traceback; each one offered steps as the loop steps it (issue #45)."""
    for schedule in ("cosine_with_min_lr", "reduce_lr_on_plateau"):
        flags = [*small(module, tmp_path / "out"), "--lr_scheduler_type", schedule]
        line = one_line_error(module, *flags, capsys=capsys)
        assert line.startswith("error: --lr_scheduler_type")
        assert f"invalid choice: '{schedule}'" in line
    assert not (tmp_path / "out").exists()
    field = next(f for f in dataclasses.fields(module.Args) if f.name == "lr_scheduler_type")
    for schedule in typing.get_args(field.type):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        scheduler = transformers.get_scheduler(schedule, optimizer, 1, 3)
        for _ in range(3):
            optimizer.step()
            scheduler.step()


@pytest.mark.parametrize("module", SCRIPTS)
@pytest.mark.parametrize("where", ["while the model loads", "inside the model's forward"])
def test_an_error_that_is_not_bad_input_keeps_its_traceback(module, where, tmp_path, monkeypatch):
    """One line is for bad input alone. Running out of memory while a model loads, or a bug inside a model's forward,
    reaches the user as the error it is, with its traceback."""

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CPU out of memory while loading")

    def bug(*args, **kwargs):
        raise RuntimeError("a bug inside the forward")

    if where == "while the model loads":
        monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", out_of_memory)
        expected = torch.OutOfMemoryError
    else:
        monkeypatch.setattr(torch.nn.Embedding, "forward", bug)
        expected = RuntimeError
    with pytest.raises(expected, match="while loading|inside the forward"):
        run_main(module, *small(module, tmp_path / "out"))


@pytest.mark.parametrize("module", [rloo, grpo, reinforce])
def test_a_4_bit_base_is_refused_with_vllm_before_anything_loads(module, tmp_path, capsys):
    """vLLM is sent the policy's full weights, which a 4-bit base does not have."""
    flags = "--use_peft --load_in_4bit --use_vllm".split()
    line = one_line_error(module, *small(module, tmp_path / "out"), *flags, capsys=capsys)
    assert line == "error: --load_in_4bit: not with --use_vllm"
    assert not (tmp_path / "out").exists()
