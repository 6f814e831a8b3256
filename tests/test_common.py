"""common.py, the helpers between text and tokens: the shipped model and tokenizer, prompt rendering, sampling exactly
from the distribution the log-probs describe, every end token, decoding."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import common
import rloo
from conftest import ARITHMETIC, EMBEDDED

ARGS = SimpleNamespace(temperature=0.7, top_p=1.0, top_k=0, max_completion_length=12)


def prompts(n: int) -> list:
    rows = [
        json.loads(line)
        for line in (Path(ARITHMETIC) / "train.jsonl").read_text().splitlines()[:n]
    ]
    return [row["prompt"] for row in rows]


def test_the_shipped_model_loads_like_a_hub_model_and_is_small():
    files = {p.name for p in Path(EMBEDDED).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert sum(p.stat().st_size for p in Path(EMBEDDED).iterdir()) <= 10 * 2**20
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED)
    assert 0.5e6 < model.num_parameters() < 2e6
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_the_tokenizer_pads_on_the_left_and_has_a_pad_token(tmp_path):
    tokenizer = common.load_tokenizer(EMBEDDED)
    assert tokenizer.padding_side == "left"
    assert tokenizer.eos_token == "<|im_end|>"
    no_pad = AutoTokenizer.from_pretrained(EMBEDDED)
    no_pad.pad_token = None
    no_pad.save_pretrained(tmp_path)
    assert common.load_tokenizer(str(tmp_path)).pad_token == "<|im_end|>"  # its EOS, as TRL does


def test_prompt_text_renders_strings_conversations_and_continues_an_assistant_turn(tiny_tokenizer):
    assert common.prompt_text(tiny_tokenizer, "plain text") == "plain text"
    text = common.prompt_text(tiny_tokenizer, [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    prefilled = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>"}]
    continued = common.prompt_text(tiny_tokenizer, prefilled)
    assert continued.endswith("<|im_start|>assistant\n<answer>")  # not closed


def test_encode_pads_on_the_left(tiny_tokenizer):
    ids, mask = common.encode(tiny_tokenizer, ["a", "a b c"], "cpu")
    assert mask[0].tolist()[0] == 0
    assert mask[0].tolist()[-1] == 1
    assert mask[1].all()
    assert ids[0, 0] == tiny_tokenizer.pad_token_id


def test_sampling_takes_nothing_from_a_checkpoints_generation_config(
    tiny_model, tiny_tokenizer, monkeypatch
):
    """A hub checkpoint ships temperature, top-k, repetition penalties, min_new_tokens...: none of it may change what
    is sampled, else the sampler is not the softmax(logits / T) the log-probs describe."""
    texts = [common.prompt_text(tiny_tokenizer, p) for p in prompts(8)]
    config = common.sampling_config(tiny_model, tiny_tokenizer, ARGS)
    torch.manual_seed(3)
    plain = common.generate(tiny_model, tiny_tokenizer, texts, config)["completion_ids"]
    shipped = tiny_model.generation_config
    sampling = dict(do_sample=True, temperature=0.1, top_k=2, top_p=0.5, repetition_penalty=2.0)
    ends = dict(eos_token_id=shipped.eos_token_id, pad_token_id=shipped.pad_token_id)
    hub_config = GenerationConfig(**sampling, min_new_tokens=10, **ends)
    monkeypatch.setattr(tiny_model, "generation_config", hub_config)
    torch.manual_seed(3)
    out = common.generate(tiny_model, tiny_tokenizer, texts, config)
    assert torch.equal(out["completion_ids"], plain)
    assert tiny_model.generation_config.top_k == 2  # swapped back


def test_a_policy_whose_logits_are_nan_still_samples(tiny_tokenizer):
    """Diverged weights give NaN logits: sampling goes on (torch.multinomial would raise), so that the loss's
    finite-check stops the run with its one line and keeps the newest checkpoint."""
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED).eval()
    torch.nn.init.constant_(model.get_output_embeddings().weight, float("nan"))
    config = common.sampling_config(model, tiny_tokenizer, ARGS)
    texts = [common.prompt_text(tiny_tokenizer, p) for p in prompts(2)]
    completion_ids = common.generate(model, tiny_tokenizer, texts, config)["completion_ids"]
    assert completion_ids.shape[0] == 2
    assert completion_ids.max() < len(tiny_tokenizer)


@pytest.mark.parametrize("bf16, tolerance", [(False, 1e-5), (True, 0.1)])
def test_the_samplers_log_probs_equal_completion_logprobs(
    tiny_model, tiny_tokenizer, bf16, tolerance
):
    """On-policy: the log softmax(logits / T) the sampler drew each token from is what completion_logprobs computes,
    in float32 and under --bf16's autocast, where the sampler's (B, V) step and the loss's (B, T, V) pass round
    alike."""
    config = common.sampling_config(tiny_model, tiny_tokenizer, ARGS)
    texts = [common.prompt_text(tiny_tokenizer, p) for p in prompts(6)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = common.generate(
            tiny_model.eval(), tiny_tokenizer, texts, config, sampler_logprobs=True
        )
        mask, _ = common.end_of_completion(out["completion_ids"], config.eos_token_id)
        input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        attention_mask = torch.cat([out["prompt_mask"], mask], 1)
        T = out["completion_ids"].shape[1]
        with torch.no_grad():
            logprobs = rloo.completion_logprobs(tiny_model, input_ids, attention_mask, T, 0.7)[0]
    sampler = out["sampler_logprobs"]
    assert sampler.shape == (6, T)
    assert sampler.dtype == torch.float32
    assert ((logprobs - sampler).abs() * mask).max() < tolerance
    # only when asked
    assert "sampler_logprobs" not in common.generate(tiny_model, tiny_tokenizer, texts, config)


def test_every_end_id_of_the_checkpoint_ends_a_completion(tiny_model, tiny_tokenizer, monkeypatch):
    """Llama-3-Instruct ends a turn with <|eot_id|>, which is not its tokenizer's EOS: both end a completion."""
    other = tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    shipped = GenerationConfig(eos_token_id=[tiny_tokenizer.eos_token_id, other])
    monkeypatch.setattr(tiny_model, "generation_config", shipped)
    end_ids = common.sampling_config(tiny_model, tiny_tokenizer, ARGS).eos_token_id
    assert end_ids == sorted({tiny_tokenizer.eos_token_id, other})
    ids = torch.tensor([[5, other, 7, 8], [5, 6, tiny_tokenizer.eos_token_id, 9], [5, 6, 7, 8]])
    mask, is_truncated = common.end_of_completion(ids, end_ids)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert is_truncated.tolist() == [False, False, True]


def test_decode_stops_at_the_end_and_drops_special_tokens(tiny_tokenizer):
    ids = tiny_tokenizer(
        "<answer>7</answer><|im_end|>", add_special_tokens=False, return_tensors="pt"
    ).input_ids
    ids = torch.cat([ids, torch.tensor([[tiny_tokenizer.pad_token_id] * 2])], 1)
    mask, _ = common.end_of_completion(ids, [tiny_tokenizer.eos_token_id])
    texts, id_lists = common.decode(tiny_tokenizer, ids, mask)
    assert texts == ["<answer>7</answer>"]
    assert id_lists[0][-1] == tiny_tokenizer.eos_token_id


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.6)])
def test_generate_draws_exactly_from_the_softmax_at_the_temperature(
    tiny_model, tiny_tokenizer, top_k, top_p
):
    """Each token is an exact draw from softmax(logits / T), truncated as --top_k and --top_p say: the counts of
    5,000 first tokens pass a chi-squared test of that distribution (at 5 standard deviations)."""
    args = SimpleNamespace(temperature=1.5, top_p=top_p, top_k=top_k, max_completion_length=1)
    config = common.sampling_config(tiny_model, tiny_tokenizer, args)
    text = "What is"  # a prompt whose next token has many likely values
    with torch.no_grad():
        logits = tiny_model(**tiny_tokenizer(text, return_tensors="pt")).logits[0, -1] / 1.5
    if top_k:
        logits[logits < logits.topk(top_k).values[-1]] = -torch.inf
    probs = logits.softmax(-1)
    if top_p < 1:  # the smallest set of the most likely tokens whose mass reaches top_p
        ordered, order = probs.sort(descending=True)
        probs[order[ordered.cumsum(0) - ordered >= top_p]] = 0
        probs /= probs.sum()
    torch.manual_seed(0)
    out = common.generate(tiny_model.eval(), tiny_tokenizer, [text] * 5_000, config)
    drawn = out["completion_ids"][:, 0]
    counts = torch.bincount(drawn, minlength=len(probs)).double()
    assert (probs > 0.01).sum() >= 3  # a distribution worth testing
    assert counts[probs == 0].sum() == 0
    expected = len(drawn) * probs[probs > 0].double()
    chi_squared = ((counts[probs > 0] - expected) ** 2 / expected).sum().item()
    degrees = len(expected) - 1
    assert chi_squared < degrees + 5 * (2 * degrees) ** 0.5
