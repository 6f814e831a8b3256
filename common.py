"""The helpers between text and tokens that every script shares, and nothing else.

- `load_tokenizer`: the tokenizer, padding on the left, with a pad token;
- `prompt_text`: a prompt as the model reads it, a conversation through the chat template;
- `encode`: texts as left-padded token ids;
- `sampling_config`: softmax(logits / T) and the checkpoint's end ids, nothing else;
- `generate`: prompt and completion ids, and the sampler's log-probs when asked;
- `inverse_cdf_sampling`: the same sampling, faster on a CPU;
- `end_of_completion`: where each completion ends, as a mask;
- `decode`: completions as text and as token lists.

It imports no accelerate and no datasets, and reads no file but the tokenizer's.
"""

import torch
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def load_tokenizer(path: str, **options):
    """The tokenizer at `path`, padding on the left: generation appends on the right.
    Its EOS ends a completion, so it must exist; it pads when the tokenizer has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left", **options)
    if tokenizer.eos_token is None:
        raise ValueError(f"the tokenizer of {path} has no eos token, so no completion could end")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def is_conversational(prompt) -> bool:
    """A list of {"role", "content"} messages: TRL's conversational format."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def prompt_text(tokenizer, prompt, chat_template_kwargs: dict | None = None) -> str:
    """A string as it is; a conversation through the chat template, as TRL renders it: the
    template opens the assistant's turn, or continues it when the conversation ends with it.
    `chat_template_kwargs` (e.g. enable_thinking) go to the template."""
    if isinstance(prompt, str):
        return prompt
    if not is_conversational(prompt) or not prompt:
        raise ValueError(f"expected a string or a list of messages, got {str(prompt)[:80]!r}")
    continued = prompt[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        prompt,
        tokenize=False,
        add_generation_prompt=not continued,
        continue_final_message=continued,
        **(chat_template_kwargs or {}),
    )


def encode(tokenizer, texts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask (B, P), left-padded. No special tokens are added: the chat
    template wrote them."""
    enc = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    )
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def end_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion, as in TRL: the tokenizer's EOS and the eos_token_id
    (an int or a list) of the checkpoint's generation_config, e.g. Llama-3's <|eot_id|>."""
    shipped = model.generation_config.eos_token_id
    shipped = [shipped] if isinstance(shipped, int) else list(shipped or [])
    return sorted({tokenizer.eos_token_id, *shipped} - {None})


def sampling_config(model, tokenizer, args, greedy: bool = False) -> GenerationConfig:
    """softmax(logits / args.temperature), or greedy decoding, for at most
    args.max_completion_length tokens, ended at every `end_ids`, and nothing else: a checkpoint's
    repetition penalty or top_k would make the sampler differ from the log-probs of the loss.
    --top_k > 0 and --top_p < 1 truncate the sampled distribution: off-policy, as in TRL."""
    sampling = {}
    if not greedy:
        sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    return GenerationConfig(
        do_sample=not greedy,
        max_new_tokens=args.max_completion_length,
        eos_token_id=end_ids(model, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        **sampling,  # top_k 0: off
    )


@torch.no_grad()
def generate(
    model, tokenizer, texts: list[str], config: GenerationConfig, sampler_logprobs: bool = False
) -> dict:
    """One completion per text: prompt_ids and prompt_mask (B, P), left-padded, and
    completion_ids (B, T) as sampled (`end_of_completion` says where each ends). With
    `sampler_logprobs`, also the sampler's log softmax(logits / temperature) of each token (B, T).

    transformers fills what `config` leaves unset from the model's generation_config, so that is
    swapped out while sampling: only `config` decides."""
    prompt_ids, prompt_mask = encode(tokenizer, texts, next(model.parameters()).device)
    logprobs, last = [], []

    def record(input_ids, scores):
        # Runs before each draw, on the raw logits; the previous step's log-probs are read at the
        # token that step drew.
        if last:
            logprobs.append(last.pop().gather(-1, input_ids[:, -1:]))
        last.append((scores.float() / config.temperature).log_softmax(-1))
        return scores

    processors = [record] if sampler_logprobs else []
    decoding = config
    if config.do_sample:
        decoding, sampling = inverse_cdf_sampling(config)
        processors += sampling
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft
    shipped = base.generation_config
    base.generation_config = decoding
    try:
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            generation_config=decoding,
            logits_processor=processors,
        )
    finally:
        base.generation_config = shipped
    out = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": sequences[:, prompt_ids.shape[1] :],
    }
    if sampler_logprobs:
        logprobs.append(last.pop().gather(-1, sequences[:, -1:]))
        out["sampler_logprobs"] = torch.cat(logprobs, 1)
    return out


def inverse_cdf_sampling(config: GenerationConfig) -> tuple[GenerationConfig, list]:
    """`config`'s sampling as greedy decoding after transformers' temperature, top-k and top-p
    processors and `draw_by_inverse_cdf` (docs/benchmarks.md, "The speed helpers")."""
    processors = [TemperatureLogitsWarper(config.temperature)]
    if config.top_k:
        processors.append(TopKLogitsWarper(config.top_k))
    if config.top_p < 1:
        processors.append(TopPLogitsWarper(config.top_p))
    processors.append(draw_by_inverse_cdf)
    greedy = GenerationConfig.from_dict(config.to_dict())
    greedy.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return greedy, processors


def draw_by_inverse_cdf(input_ids, scores):
    """A logits processor that draws a token from softmax(scores), the i where cdf_{i-1} ≤ u < cdf_i,
    and leaves it alone for greedy decoding to take: the same distribution as `do_sample=True`,
    faster on a CPU (tests/test_common.py::test_generate_draws_exactly_from_the_softmax_at_the_temperature)."""
    cdf = scores.softmax(-1).cumsum(-1)  # (B, V)
    u = torch.rand(len(cdf), 1, device=cdf.device) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1)
    return torch.full_like(scores, -torch.inf).scatter(1, drawn, 0.0)


def end_of_completion(
    completion_ids: torch.Tensor, end_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A completion ends at its first end token, which it keeps. Returns its mask (B, T), 1 up to
    that token, and is_truncated (B,): True where no end token came in the T tokens."""
    is_end = torch.isin(completion_ids, torch.tensor(end_ids, device=completion_ids.device))
    first_end = torch.where(is_end.any(1), is_end.int().argmax(1), completion_ids.shape[1])
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    mask = (positions[None] <= first_end[:, None]).long()
    return mask, ~is_end.any(1)


def decode(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> tuple[list[str], list[list[int]]]:
    """Each completion up to its end (the mask), as text without special tokens and as ids."""
    ids = [row[mask.bool()].tolist() for row, mask in zip(completion_ids, completion_mask)]
    return tokenizer.batch_decode(ids, skip_special_tokens=True), ids
