"""Shared plumbing: the shipped model and tokenizer, the arithmetic task, data loading, generation, log-probs."""

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import common
import grpo
import ppo
import reinforce
import rloo
from common import ConfigError


def test_shipped_model_loads_like_a_hub_model_and_is_small():
    files = {p.name for p in Path(common.EMBEDDED_MODEL).iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= files
    assert sum(p.stat().st_size for p in Path(common.EMBEDDED_MODEL).iterdir()) <= 10 * 2**20
    model = AutoModelForCausalLM.from_pretrained(common.EMBEDDED_MODEL)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 2e6
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_tokenizer_round_trip_survives_save_and_reload(tmp_path):
    """The transformers-5 pitfall: AutoTokenizer picks the class from model_type and may rebuild the pre-tokenizer.
    Ours is a Qwen2Tokenizer by construction, so the reloaded one splits text exactly as the trained tokenizers.json."""
    from tokenizers import Tokenizer

    tokenizer = AutoTokenizer.from_pretrained(common.EMBEDDED_MODEL)
    messages = [{"role": "user", "content": "Compute  7 × 8.\n\nAnswer in the form <answer>N</answer>.\t(two  spaces)"}]
    text = (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        + "<answer>56</answer><|im_end|>\n"
    )
    assert "\n" in text and "  " in text
    raw = Tokenizer.from_file(str(Path(common.EMBEDDED_MODEL) / "tokenizer.json"))
    for reloaded in (tokenizer, _save_and_reload(tokenizer, tmp_path)):
        ids = reloaded(text, add_special_tokens=False).input_ids
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert reloaded.decode(ids) == text
        assert reloaded.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace(
            "<|im_end|>", ""
        )
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"


def _save_and_reload(tokenizer, path):
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(common.EMBEDDED_MODEL).config.save_pretrained(path)  # model_type next to it
    return AutoTokenizer.from_pretrained(path)


def test_arithmetic_split_is_disjoint_and_correct():
    train, test = common.arithmetic_split("train"), common.arithmetic_split("test")
    assert len(train) + len(test) == len(common.arithmetic_problems()) == 390
    assert not {p[:3] for p in train} & {p[:3] for p in test}
    assert {p[1] for p in test} == {"+", "-", "×", "÷"}
    for a, op, b, answer in train + test:
        assert answer == {"+": a + b, "-": a - b, "×": a * b, "÷": a / b if b else None}[op]
    dataset = common.arithmetic_dataset("test")
    assert dataset.column_names == ["prompt", "ground_truth"] and common.is_conversational(dataset[0]["prompt"])


def test_load_split_standard_and_conversational_files(tmp_path):
    standard = tmp_path / "standard.jsonl"
    standard.write_text("\n".join(json.dumps({"prompt": f"2 + {i} =", "ground_truth": str(2 + i)}) for i in range(3)))
    dataset = common.load_split(str(standard), "train")
    assert dataset["prompt"][0] == "2 + 0 =" and common.load_split(str(standard), "test") is None
    folder = tmp_path / "conv"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text(
            json.dumps({"prompt": [{"role": "user", "content": split}], "ground_truth": "1"}) + "\n"
        )
    assert common.load_split(str(folder), "test")["prompt"] == [[{"role": "user", "content": "test"}]]
    csv = tmp_path / "data.csv"
    csv.write_text("prompt,answer\nhello,1\n")
    assert common.load_split(str(csv), "train")["answer"] == [1]


def test_load_split_errors_name_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--dataset_name: no such file"):
        common.load_split(str(tmp_path / "missing.jsonl"), "train")
    with pytest.raises(ConfigError, match="--dataset_name: no such file or folder"):
        common.load_split("./no/such/folder", "train")
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text('{"question": "x"}\n')
    with pytest.raises(ConfigError, match="no 'prompt' column"):
        common.check_prompt_column(common.load_split(str(no_prompt), "train"))


def test_prompt_text_formats(tiny_tokenizer):
    assert common.prompt_text(tiny_tokenizer, "plain text") == "plain text"
    text = common.prompt_text(tiny_tokenizer, [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("script", [rloo, grpo, reinforce, ppo], ids=lambda m: m.__name__)
def test_end_of_completion_masks_everything_after_the_first_end_token(tiny_model, tiny_tokenizer, script):
    class Args:
        temperature, top_p, top_k, max_completion_length = 1.0, 1.0, 0, 12

    texts = [
        common.prompt_text(tiny_tokenizer, [{"role": "user", "content": common.arithmetic_question(a, "+", 1)}])
        for a in range(6)
    ]
    out = common.generate(tiny_model, tiny_tokenizer, texts, common.sampling_config(tiny_model, tiny_tokenizer, Args))
    eos = tiny_tokenizer.eos_token_id
    completion_mask, is_truncated = script.end_of_completion(out["completion_ids"], eos)
    for ids, mask, truncated in zip(out["completion_ids"], completion_mask, is_truncated):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        assert (ids[n - 1] == eos) != bool(truncated)
        assert (ids[: n - 1] != eos).all()


def test_the_scripts_share_the_log_prob_and_end_of_completion_text():
    """The blocks the four scripts share are the same text, so `diff rloo.py grpo.py` shows only the algorithm."""
    for name in ("completion_logprobs", "end_of_completion"):
        sources = {inspect.getsource(getattr(script, name)) for script in (rloo, grpo, reinforce, ppo)}
        assert len(sources) == 1, name


def test_completion_logprobs_match_a_full_log_softmax_and_ignore_left_padding(tiny_model, tiny_tokenizer):
    texts = [
        "<|im_start|>user\nCompute 1 + 1.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n",
    ]
    completion = tiny_tokenizer("<answer>2</answer><|im_end|>", add_special_tokens=False, return_tensors="pt").input_ids
    enc = tiny_tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    input_ids = torch.cat([enc.input_ids, completion.repeat(2, 1)], 1)
    attention_mask = torch.cat([enc.attention_mask, torch.ones_like(completion).repeat(2, 1)], 1)
    T = completion.shape[1]
    batched, entropy = rloo.completion_logprobs(tiny_model, input_ids, attention_mask, T, 0.7, entropy=True)
    # reference: the unpadded second sequence alone, full log-softmax
    alone = input_ids[1:, attention_mask[1].bool()]
    logits = tiny_model(alone).logits[:, -T - 1 : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, alone[:, -T:, None]).squeeze(-1)
    assert torch.allclose(batched[1:], expected, atol=1e-5)
    probs = torch.softmax(logits, -1)
    assert torch.allclose(entropy[1:], -(probs * probs.log()).sum(-1), atol=1e-5)
    assert (entropy >= 0).all()


def test_evaluate_is_reproducible_and_leaves_training_rng_alone(tiny_model, tiny_tokenizer):
    from rewards import accuracy_reward

    class Args:
        temperature, top_p, top_k, max_completion_length = 1.0, 1.0, 0, 12
        num_generations_eval, per_device_eval_batch_size = 2, 50
        chat_template_kwargs = None

    dataset = common.arithmetic_dataset("test").select(range(20))
    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = common.evaluate(tiny_model, tiny_tokenizer, dataset, Args, {"accuracy": accuracy_reward}, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert common.evaluate(tiny_model, tiny_tokenizer, dataset, Args, {"accuracy": accuracy_reward}, seed=5) == first
    assert set(first) == {"eval/reward", "eval/reward_greedy", "eval/accuracy", "eval/accuracy_greedy"}
    assert (first["eval/reward"], first["eval/reward_greedy"]) == (
        first["eval/accuracy"],
        first["eval/accuracy_greedy"],
    )


def test_metrics_logger_truncates_records_past_the_resumed_step(tmp_path):
    run = SimpleNamespace(output_dir=str(tmp_path), report_to="none", bf16=False)
    logger = common.MetricsLogger(common.make_accelerator(run), run)
    for step in (1, 2, 3):
        logger.log(step, {"reward": step / 10, "kl": float("nan")})
    assert common.read_metrics(str(tmp_path))[0] == {"step": 1, "reward": 0.1, "kl": None}
    common.MetricsLogger(common.make_accelerator(run), run, resume_step=2).log(3, {"reward": 0.5})
    assert [(r["step"], r["reward"]) for r in common.read_metrics(str(tmp_path))] == [(1, 0.1), (2, 0.2), (3, 0.5)]


def test_resolve_checkpoint(tmp_path):
    assert common.resolve_checkpoint(None, str(tmp_path)) is None
    with pytest.raises(ConfigError, match="--resume_from_checkpoint latest: no checkpoint"):
        common.resolve_checkpoint("latest", str(tmp_path))
    with pytest.raises(ConfigError, match="--resume_from_checkpoint: .* is not a checkpoint"):
        common.resolve_checkpoint(str(tmp_path / "checkpoint-9"), str(tmp_path))
    for step in (2, 10, 11):  # complete ones, as save_checkpoint writes them (an empty accelerate state here)
        (tmp_path / f"checkpoint-{step}" / "accelerator_state").mkdir(parents=True)
        torch.save({"step": step, "files": {}}, tmp_path / f"checkpoint-{step}" / "training_state.pt")
    (tmp_path / "checkpoint-11" / "training_state.pt").write_bytes(b"")  # ... but this one was cut short
    (tmp_path / "checkpoint-best").mkdir()
    assert common.resolve_checkpoint("latest", str(tmp_path)).name == "checkpoint-10"


def test_sampling_config_samples_from_the_distribution_the_logprobs_assume(tiny_model, tiny_tokenizer):
    """No top-k, top-p or other warper unless asked: transformers 5 turns top_k=None into its default of 50, which would
    sample from a truncated distribution while the log-probs assume the full softmax. NaN logits read as 0 (a diverged
    policy samples on, and `check_finite` stops the step)."""

    class Args:
        temperature, top_p, top_k, max_completion_length = 0.7, 1.0, 0, 8

    def processors(config):
        config, _ = tiny_model._prepare_generation_config(config)
        return [
            type(p).__name__
            for p in tiny_model._get_logits_processor(
                generation_config=config,
                input_ids_seq_length=4,
                encoder_input_ids=torch.zeros(1, 4, dtype=torch.long),
                prefix_allowed_tokens_fn=None,
                logits_processor=None,
                device="cpu",
            )
        ]

    sampled = processors(common.sampling_config(tiny_model, tiny_tokenizer, Args))
    assert sampled == ["InfNanRemoveLogitsProcessor", "TemperatureLogitsWarper"]  # the first changes no finite logit
    Args.top_k = 5
    assert "TopKLogitsWarper" in processors(common.sampling_config(tiny_model, tiny_tokenizer, Args))
