"""What hub checkpoints do that the embedded model does not: weights stored in bfloat16 (every trained model still gets
float32 master weights), end ids beyond the tokenizer's EOS (a completion ends at each, everywhere its end is
decided), and no file next to a script changes its flags."""

import types

import pytest
import torch
from test_vllm import FakeLLM, fake_vllm  # noqa: F401 (a fixture)
from test_vllm import args as vllm_args

import common
import grpo
import ppo
import reinforce
import reward_model
import rloo
import sft
from rewards import accuracy_reward, format_reward

RL_SCRIPTS = {
    rloo: dict(prompts_per_step=2, num_generations=2),
    grpo: dict(prompts_per_step=2, num_generations=2),
    reinforce: dict(prompts_per_step=4),
    ppo: dict(prompts_per_step=4, num_ppo_epochs=1),
}
# sft.py and reward_model.py tokenize their whole built-in data set first: two demonstrations, one pair per problem
TRAINING_SCRIPTS = {
    **RL_SCRIPTS,
    sft: dict(samples_per_problem=2, train_batch_size=8),
    reward_model: dict(pairs_per_problem=1, train_batch_size=8),
}
QUIET = dict(eval_strategy="no", logging_steps=1, save_steps=0)
SAMPLING = types.SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=24)


@pytest.fixture(scope="session")
def bf16_model(tmp_path_factory) -> str:
    from hub_like import make_bf16_checkpoint

    return str(make_bf16_checkpoint(tmp_path_factory.mktemp("bf16")))


@pytest.fixture(scope="session")
def turn_end_model(tmp_path_factory) -> str:
    from hub_like import make_turn_end_checkpoint

    return str(make_turn_end_checkpoint(tmp_path_factory.mktemp("turn-end")))


def run(script, tmp_path, **overrides):
    script.main(script.Args(output_dir=str(tmp_path / "out"), **{**QUIET, **TRAINING_SCRIPTS[script], **overrides}))
    return [r for r in common.read_metrics(tmp_path / "out") if "learning_rate" in r]


# ---- 1. float32 master weights whatever the checkpoint's dtype
# -------------------------------------------------------
@pytest.fixture
def optimized(monkeypatch) -> list:
    """The parameter groups of every AdamW a script makes, each as [(parameter, its value when the AdamW was made)]."""
    groups = []

    class RecordingAdamW(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            groups.extend([(p, p.detach().clone()) for p in group["params"]] for group in self.param_groups)

    monkeypatch.setattr(torch.optim, "AdamW", RecordingAdamW)
    return groups


@pytest.mark.parametrize("flags", [{}, {"use_peft": True, "bf16": True}], ids=["full", "peft-bf16"])
@pytest.mark.parametrize("script", list(TRAINING_SCRIPTS), ids=lambda m: m.__name__)
def test_every_trained_weight_is_float32_from_a_bf16_checkpoint(tmp_path, bf16_model, optimized, script, flags):
    """From a checkpoint stored in bf16, three steps at a small learning rate: every parameter an optimizer updates
    (ppo.py's policy and value model, LoRA's adapters and peft's copy of the score head) is float32, and the steps move
    most of its elements. Updated in bf16 instead, a step of 3e-6 is below half a bf16 ulp of most weights and is
    rounded away (the issue measured 0.4% of the elements moved, 94.9% in float32)."""
    run(script, tmp_path, model_name_or_path=bf16_model, max_steps=3, learning_rate=3e-6, **flags)
    assert len(optimized) == (2 if script is ppo else 1)  # ppo.py: the policy's group and the value model's
    for group in optimized:
        assert {p.dtype for p, _ in group} == {torch.float32}
        moved = sum((p.detach() != start).sum().item() for p, start in group)
        assert moved / sum(p.numel() for p, _ in group) > 0.5


# ---- 2. a completion ends at every end id of the checkpoint
# ----------------------------------------------------------
# turn_end_model is the embedded model with Llama-3-Instruct's layout: the tokenizer's EOS is never emitted, and the
# token that ends each turn, which ends nearly every completion, is a second end id in generation_config.json. Ended
# only at the tokenizer's EOS, every completion would run to max_completion_length.
def test_sampling_ends_at_the_tokenizers_eos_and_every_listed_end_id(turn_end_model, hub_model):
    for path, listed in ((turn_end_model, ["<|endoftext|>", "<|im_end|>"]), (hub_model, ["</s>", "<|user|>"])):
        tokenizer, model = common.load_tokenizer(path), common.load_causal_lm(path)
        config = common.sampling_config(model, tokenizer, SAMPLING)
        assert config.eos_token_id == sorted(tokenizer.convert_tokens_to_ids(listed))
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)  # generation_config.json: eos_token_id 2, an int
    config = common.sampling_config(common.load_causal_lm(common.EMBEDDED_MODEL), tokenizer, SAMPLING)
    assert config.eos_token_id == [tokenizer.eos_token_id]


@pytest.mark.parametrize("script", list(RL_SCRIPTS), ids=lambda m: m.__name__)
def test_a_second_end_id_ends_completions_as_the_tokenizers_eos_does(tmp_path, turn_end_model, script):
    """turn_end_model has the embedded model's weights, with <|im_end|> a second end id instead of the tokenizer's EOS:
    a run on it is the embedded model's run, every metric equal (rewards, the KL, the loss, the gradient norm, the
    completion lengths, the truncated fraction, evaluation at the start and the end), with the flags that read where a
    completion ends: --mask_truncated_completions, and ppo.py's --missing_eos_penalty."""
    ends = dict(missing_eos_penalty=1.0) if script is ppo else dict(mask_truncated_completions=True)
    flags = dict(eval_strategy="steps", eval_steps=0, num_generations_eval=1, max_completion_length=24, **ends)
    runs = []
    for name, path in (("eos", common.EMBEDDED_MODEL), ("turn_end", turn_end_model)):
        run(script, tmp_path / name, model_name_or_path=path, max_steps=2, **flags)
        runs.append(
            [{k: v for k, v in r.items() if k != "step_time"} for r in common.read_metrics(tmp_path / name / "out")]
        )
    assert runs[0] == runs[1]
    assert [r["completions/clipped_ratio"] < 0.5 for r in runs[1] if "completions/clipped_ratio" in r] == [True] * 2


def test_evaluation_ends_completions_at_the_checkpoints_turn_end(turn_end_model):
    """The same weights, with <|im_end|> as the tokenizer's EOS (the embedded model) or as a second end id: the same
    held-out scores. Cut at the tokenizer's EOS only, every completion ran on past its answer and failed the format."""
    dataset = common.arithmetic_dataset("test").select(range(16))
    args = types.SimpleNamespace(
        **vars(SAMPLING), num_generations_eval=2, per_device_eval_batch_size=64, chat_template_kwargs=None
    )
    rewards = {"accuracy": accuracy_reward, "format": format_reward}
    scores = [
        common.evaluate(common.load_causal_lm(path), common.load_tokenizer(path), dataset, args, rewards, seed=3)
        for path in (common.EMBEDDED_MODEL, turn_end_model)
    ]
    assert scores[0] == scores[1] and scores[0]["eval/format"] > 0.5


@pytest.mark.parametrize("script", list(RL_SCRIPTS), ids=lambda m: m.__name__)
def test_vllm_stops_at_every_end_id_of_the_checkpoint(
    tmp_path,
    fake_vllm,  # noqa: F811
    turn_end_model,
    monkeypatch,
    script,
):
    asked = []
    monkeypatch.setattr(
        fake_vllm, "SamplingParams", lambda **kwargs: asked.append(kwargs) or types.SimpleNamespace(**kwargs)
    )
    script.main(vllm_args(tmp_path, script, model_name_or_path=turn_end_model, max_steps=1))
    tokenizer = FakeLLM.instances[0].tokenizer
    assert asked[0]["stop_token_ids"] == sorted(tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]))


# ---- 9. the command line is the only source of flags
# -----------------------------------------------------------------
def test_no_args_file_next_to_the_script_is_read(tmp_path, monkeypatch):
    """HfArgumentParser's default reads `<script>.args` next to the script being run and prepends its flags."""
    (tmp_path / "rloo.args").write_text("--max_steps 7")
    monkeypatch.setattr("sys.argv", [str(tmp_path / "rloo.py")])
    assert common.parse_args(rloo.Args, []).max_steps == rloo.Args().max_steps
