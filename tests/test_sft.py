"""sft.py: prompt masking, a short fine-tune on a standard-format file, and building a tiny model from scratch."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import common
import sft
from common import ConfigError


def test_prompt_tokens_are_masked_and_completion_ends_with_eos(tiny_tokenizer):
    dataset = sft.arithmetic_sft_dataset("test", label_noise=0.0, samples_per_problem=1, seed=0).select(range(2))
    rows = sft.tokenize(tiny_tokenizer, dataset, max_length=128)
    prompt = common.prompt_text(tiny_tokenizer, dataset[0]["prompt"])
    n_prompt = len(tiny_tokenizer(prompt, add_special_tokens=False).input_ids)
    labels = rows[0]["labels"]
    assert labels[:n_prompt] == [-100] * n_prompt
    assert labels[n_prompt:] == rows[0]["input_ids"][n_prompt:]
    assert labels[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(labels[n_prompt:-1]) == dataset[0]["completion"][0]["content"]


def test_noisy_demonstrator_guesses_half_the_time_and_is_right_when_it_works():
    from rewards import extract_answer, format_reward

    dataset = sft.arithmetic_sft_dataset("train", label_noise=0.5, samples_per_problem=20, seed=0)
    assert len(dataset) == 20 * len(common.arithmetic_problems())
    texts = [row["completion"][0]["content"] for row in dataset]
    guessed = [
        int(extract_answer(t)) - int(row["ground_truth"]) for t, row in zip(texts, dataset) if t.startswith("<answer>")
    ]
    worked = [(t, row["ground_truth"]) for t, row in zip(texts, dataset) if not t.startswith("<answer>")]
    assert set(guessed) == {-2, -1, 1, 2}
    assert 0.45 < len(guessed) / len(dataset) < 0.55
    assert all(extract_answer(t) == truth and t.split(" = ")[1].startswith(truth + " ") for t, truth in worked)
    assert format_reward(texts) == [1.0] * len(texts)


def test_short_sft_on_a_standard_format_file(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "\n".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": f"<answer>{a + 1}</answer>"}) for a in range(16))
    )
    out = tmp_path / "out"
    sft.main(
        sft.Args(
            dataset_name=str(data),
            output_dir=str(out),
            max_steps=3,
            train_batch_size=8,
            logging_steps=1,
            learning_rate=1e-3,
        )
    )
    assert [r["step"] for r in common.read_metrics(out)] == [1, 2, 3]
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_from_scratch_builds_a_reloadable_model(tmp_path):
    out = tmp_path / "tiny"
    sft.main(
        sft.Args(
            from_scratch=True,
            output_dir=str(out),
            hidden_size=32,
            num_hidden_layers=1,
            vocab_size=300,
            samples_per_problem=2,
            max_steps=2,
            train_batch_size=8,
            eval_steps=0,
            num_generations_eval=1,
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Compute 12 ÷ 4.\n  spaced"}], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == len(tokenizer)


def test_sft_bad_inputs(tmp_path):
    data = tmp_path / "no_completion.jsonl"
    data.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match="--dataset_name: the dataset has no 'completion' column"):
        sft.main(sft.Args(dataset_name=str(data), output_dir=str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="--learning_rate: must be positive"):
        sft.main(sft.Args(learning_rate=-1.0, output_dir=str(tmp_path / "o")))
