"""Supervised fine-tuning (SFT) of a causal LM on prompt/completion pairs: the warm start every RL script begins from.

    L(θ) = − Σ_t m_t · log π_θ(y_t | x, y_<t) / Σ_t m_t,      m_t = 1 on completion tokens (and EOS), 0 on the prompt

Data: `--dataset_name arithmetic` (built in) or any HF dataset / local json, jsonl, csv or parquet file with `prompt`
and `completion` columns, standard (strings) or conversational (message lists, rendered with the chat template).

The built-in arithmetic data comes from a *noisy demonstrator*. Half of the time (`--label_noise`) it answers at a
glance and is off by ±1 or ±2 (`<answer>54</answer>` for 7 × 8); otherwise it shows its work first and is right
(`7 × 8 = 56 <answer>56</answer>`). A model that imitates it knows the facts but often skips the work and guesses:
its sampled accuracy is low, and RL has something general to fix on prompts it never trains on. The demonstrations
cover every one-digit problem, the RL scripts' held-out ones too, as a pretrained model has seen the facts; the RL
scripts never train on the held-out prompts.

`--from_scratch` also builds the model: a byte-level BPE tokenizer trained with the `tokenizers` library on the task's
own text (a Qwen2Tokenizer, so AutoTokenizer reloads it unchanged) and a small Qwen2 model. This is how the shipped
`models/tiny-arith` was made:

    python sft.py --from_scratch --output_dir models/tiny-arith --overwrite_output_dir

Under `accelerate launch --num_processes N`, each step's batch is the one a single process would take, in the same
order, split into N equal shares, one per process; the loss is the mean over the whole batch's completion tokens (its
token count summed over the processes), and the logged loss is reduced over the processes. Evaluation splits the
held-out prompts between the processes and reports the mean over all of them.
"""

import time
from dataclasses import dataclass

import torch
import transformers
from accelerate.utils import set_seed
from tqdm.auto import tqdm

import common
from common import arg, require
from rewards import accuracy_reward, format_reward


@dataclass
class Args:
    model_name_or_path: str = arg(
        common.EMBEDDED_MODEL, "model to fine-tune: a hub id or a local folder (ignored with --from_scratch)"
    )
    model_revision: str = arg("main", "branch, tag or commit of --model_name_or_path on the hub")
    trust_remote_code: bool = arg(False, "let a hub model or tokenizer run its own code (its modeling files)")
    attn_implementation: str | None = arg(
        None, "attention kernel: eager, sdpa, flash_attention_2, ... (None: transformers' choice)"
    )
    from_scratch: bool = arg(False, "build a new tokenizer and a tiny Qwen2 model instead of loading one")
    hidden_size: int = arg(128, "--from_scratch: hidden size")
    num_hidden_layers: int = arg(4, "--from_scratch: transformer layers")
    vocab_size: int = arg(384, "--from_scratch: BPE vocabulary size, special tokens included")
    dataset_name: str = arg(
        "arithmetic",
        "'arithmetic' (built in), a hub dataset, or a local data file/folder with prompt and completion columns",
    )
    dataset_config: str | None = arg(
        None, "configuration name of a hub dataset or dataset folder with several (load_dataset's `name`)"
    )
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg(
        "test", "split to evaluate on (needs a solution or ground_truth column); skipped when absent"
    )
    label_noise: float = arg(
        0.5, "arithmetic: probability that the demonstrator guesses (off by ±1 or ±2) instead of working it out"
    )
    samples_per_problem: int = arg(200, "arithmetic: demonstrations per training problem")
    learning_rate: float = arg(3e-3, "AdamW learning rate")
    lr_scheduler_type: str = arg("cosine", "transformers scheduler name: constant, linear, cosine, ...")
    warmup_ratio: float = arg(0.05, "fraction of steps spent warming the learning rate up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    train_batch_size: int = arg(
        64, "sequences per optimizer step over all processes, each taking an equal share (TRL: per_device × processes)"
    )
    max_steps: int = arg(1500, "optimizer steps")
    max_length: int = arg(128, "sequences are truncated to this many tokens")
    seed: int = arg(0, "random seed")
    logging_steps: int = arg(25, "log every this many steps")
    eval_strategy: str = arg("steps", "'steps': evaluate every eval_steps and at the start and the end; 'no': never")
    eval_steps: int = arg(500, "evaluate every this many steps (and at the start and end)")
    num_generations_eval: int = arg(4, "completions sampled per held-out prompt for eval/accuracy")
    per_device_eval_batch_size: int = arg(512, "completions per generate call during evaluation")
    temperature: float = arg(1.0, "evaluation sampling temperature")
    top_p: float = arg(1.0, "evaluation nucleus sampling (1.0 = off)")
    top_k: int = arg(0, "evaluation top-k sampling (0 = off)")
    max_completion_length: int = arg(24, "evaluation: max generated tokens")
    chat_template_kwargs: dict | None = arg(
        None, "extra arguments of the chat template, a JSON object such as '{\"enable_thinking\": false}'"
    )
    output_dir: str = arg("outputs/sft", "where metrics, checkpoints and the final model go")
    save_steps: int = arg(500, "save a checkpoint every this many steps (0 = never; Ctrl-C, SIGTERM always save)")
    save_total_limit: int | None = arg(
        None, "keep only the newest N checkpoints (None: all); never deletes the one the run resumed from"
    )
    resume_from_checkpoint: str | None = arg(None, "a checkpoint folder, or 'latest' (newest complete in output_dir)")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir of another run (deletes its checkpoints)")
    use_peft: bool = arg(False, "train a LoRA adapter instead of all weights")
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "module names (q_proj v_proj or q_proj,v_proj) or all-linear")
    save_merged_model: bool = arg(False, "with --use_peft, also save the merged model in output_dir/merged")
    load_in_4bit: bool = arg(False, "QLoRA: the frozen base in 4 bits (bitsandbytes), the LoRA adapter in float32")
    bnb_4bit_quant_type: str = arg("nf4", "4-bit data type of --load_in_4bit: nf4 or fp4")
    use_bnb_nested_quant: bool = arg(False, "with --load_in_4bit, also quantize the quantization constants")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass to save memory")
    bf16: bool = arg(False, "bfloat16 autocast for forward passes")
    report_to: list[str] = arg(
        ["none"], "trackers besides metrics.jsonl: none, all, or accelerate's (tensorboard, wandb, trackio, ...)"
    )


TEXT_COLUMNS = ("prompt", "completion")  # checked row by row as they load (common.usable_rows)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def arithmetic_sft_dataset(split: str, label_noise: float, samples_per_problem: int, seed: int):
    """Demonstrations from the noisy demonstrator: prompt, completion, and the true answer as ground_truth."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    # The demonstrations cover every problem, the RL held-out ones included: the warm start plays the part of a
    # pretrained model that has seen the facts. The RL scripts never train on the held-out prompts.
    problems = common.arithmetic_problems() if split == "train" else common.arithmetic_split("test")
    for a, op, b, answer in problems:
        prompt = [{"role": "user", "content": common.arithmetic_question(a, op, b)}]
        for _ in range(samples_per_problem if split == "train" else 1):
            if rng.random() < label_noise:  # a guess at a glance, off by one or two
                content = f"<answer>{answer + rng.choice([-2, -1, 1, 2])}</answer>"
            else:  # shows its work, and is right
                content = f"{a} {op} {b} = {answer} <answer>{answer}</answer>"
            rows.append(
                {
                    "prompt": prompt,
                    "completion": [{"role": "assistant", "content": content}],
                    "ground_truth": str(answer),
                }
            )
    return Dataset.from_list(rows)


def build_tiny_model(args, dataset):
    """A byte-level BPE Qwen2Tokenizer trained on the task's text, and a small Qwen2 model around it."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2Tokenizer

    renderer = Qwen2Tokenizer()
    renderer.chat_template = CHATML
    corpus = [
        renderer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        for row in dataset.select(range(min(len(dataset), 5000)))
    ]
    corpus += [str(n) for n in range(-100, 100)] + [" +-×÷=<>/.,:;?!()[]{}'\"\n\t abcdefghijklmnopqrstuvwxyz"]
    tokenizer = renderer.train_new_from_iterator(
        corpus, vocab_size=args.vocab_size, new_special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = CHATML
    tokenizer.padding_side = "left"
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.max_length,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer, AutoModelForCausalLM.from_config(config)


def tokenize(tokenizer, dataset, max_length: int, chat_template_kwargs: dict | None = None) -> list[dict]:
    """input_ids and labels (-100 on prompt tokens) per prompt/completion pair, the prompt rendered as the RL scripts
    render it (`common.prompt_text`); each completion ends with EOS. A sequence longer than max_length keeps its first
    max_length tokens (said once, with how many were cut); a row whose prompt alone takes max_length tokens has nothing
    left to train on and is skipped (said once, with how many)."""
    for i, completion in enumerate(dataset["completion"]):
        require(
            isinstance(completion, str) or len(completion) == 1,
            f"--dataset_name: 'completion' of training row {i}: expected one assistant message, got "
            f"{len(completion)} messages",
        )
    prompt_texts = [common.prompt_text(tokenizer, p, chat_template_kwargs) for p in dataset["prompt"]]
    completion_texts = [c if isinstance(c, str) else c[-1]["content"] for c in dataset["completion"]]
    prompt_ids = tokenizer(prompt_texts, add_special_tokens=False).input_ids
    completion_ids = tokenizer(completion_texts, add_special_tokens=False).input_ids
    rows, cut = [], 0
    for prompt, completion in zip(prompt_ids, completion_ids):
        if len(prompt) >= max_length:
            continue
        completion = completion + [tokenizer.eos_token_id]
        cut += len(prompt) + len(completion) > max_length
        rows.append(
            {
                "input_ids": (prompt + completion)[:max_length],
                "labels": ([-100] * len(prompt) + completion)[:max_length],
            }
        )
    if len(rows) < len(prompt_ids):
        print(
            f"--max_length {max_length}: skipping {len(prompt_ids) - len(rows)} of {len(prompt_ids)} training rows "
            "whose prompt alone is that long (no completion token would be trained on)"
        )
    if cut:
        print(
            f"warning: --max_length {max_length}: cut {cut} of {len(rows)} training sequences to their first "
            f"{max_length} tokens (the rest of each completion, its EOS included, is not trained on)"
        )
    return rows


def collate(rows: list[dict], pad_token_id: int, device) -> dict:
    length = max(len(r["input_ids"]) for r in rows)
    pad = lambda seq, value: seq + [value] * (length - len(seq))
    return {
        "input_ids": torch.tensor([pad(r["input_ids"], pad_token_id) for r in rows], device=device),
        "attention_mask": torch.tensor([pad([1] * len(r["input_ids"]), 0) for r in rows], device=device),
        "labels": torch.tensor([pad(r["labels"], -100) for r in rows], device=device),
    }


def check_args(args: Args):
    common.check_shared_args(args)  # the flags every script shares: learning rate, steps, sampling, output_dir, ...
    require(args.train_batch_size > 0, f"--train_batch_size: must be positive, got {args.train_batch_size}")
    require(args.max_length > 0, f"--max_length: must be positive, got {args.max_length}")
    require(0.0 <= args.label_noise <= 1.0, f"--label_noise: must be in [0, 1], got {args.label_noise}")
    require(args.samples_per_problem > 0, f"--samples_per_problem: must be positive, got {args.samples_per_problem}")
    if args.from_scratch:
        require(
            args.hidden_size > 0 and args.hidden_size % 8 == 0,
            f"--hidden_size: must be a multiple of 8 (4 attention heads of even size), got {args.hidden_size}",
        )
        require(args.num_hidden_layers > 0, f"--num_hidden_layers: must be positive, got {args.num_hidden_layers}")
        require(args.vocab_size > 0, f"--vocab_size: must be positive, got {args.vocab_size}")
        require(not args.load_in_4bit, "--load_in_4bit: quantizes a pretrained base, not a model --from_scratch builds")


def main(args: Args):
    check_args(args)
    accelerator = common.make_accelerator(args)  # one process, or N under `accelerate launch`
    # the same on every process: training samples nothing, and a new model starts alike
    set_seed(args.seed)
    device = accelerator.device
    my_rows = common.shard(accelerator, args.train_batch_size, "--train_batch_size")  # this process's share of a batch
    common.check_backend(accelerator, one_backward_per_update=True)

    # ---- data ----
    builtin = {
        "arithmetic": lambda split: arithmetic_sft_dataset(split, args.label_noise, args.samples_per_problem, args.seed)
    }
    train_dataset = common.load_split(
        args.dataset_name, args.dataset_train_split, builtin, columns=TEXT_COLUMNS, config=args.dataset_config
    )
    require(
        train_dataset is not None,
        f"--dataset_train_split: {args.dataset_name} has no split {args.dataset_train_split!r}",
    )
    for column in ("prompt", "completion"):
        require(
            column in train_dataset.column_names,
            f"--dataset_name: the dataset has no {column!r} column (columns: {train_dataset.column_names})",
        )
    eval_dataset = common.load_split(
        args.dataset_name, args.dataset_test_split, builtin, columns=TEXT_COLUMNS, config=args.dataset_config
    )
    kept = ("prompt", "solution", "ground_truth")  # what its evaluation reads: prompts, and answers to check
    if eval_dataset is not None and not set(kept[1:]) & set(eval_dataset.column_names):
        eval_dataset = None
    if eval_dataset is not None:
        eval_dataset = eval_dataset.remove_columns([c for c in eval_dataset.column_names if c not in kept])

    # ---- model ----
    checkpoint = common.resolve_checkpoint(args.resume_from_checkpoint, args.output_dir, args)
    if args.from_scratch:
        tokenizer, model = build_tiny_model(args, train_dataset)
        if checkpoint is not None:
            tokenizer = common.load_tokenizer(str(checkpoint), "--resume_from_checkpoint")
            model = common.load_causal_lm(str(checkpoint), "--resume_from_checkpoint")
    else:
        tokenizer = common.load_tokenizer(args.model_name_or_path, **common.loading_options(args))
        # float32 master weights (`common.master_dtype`); a resumed run gets its weights from the checkpoint below
        model = common.load_causal_lm(
            args.model_name_or_path,
            dtype=common.master_dtype(args),
            **common.loading_options(args),
            **common.quantization(args),
        )
    if args.use_peft:
        from peft import get_peft_model

        model = get_peft_model(model, common.lora_config(args, model))
    if args.gradient_checkpointing:
        common.checkpoint_activations(model)
        model.config.use_cache = False
    model.train()
    common.check_max_length(model, args.max_length)
    common.check_prompt_lengths(
        tokenizer,
        model,
        args.max_completion_length,
        {args.dataset_test_split: eval_dataset},
        chat_template_kwargs=args.chat_template_kwargs,
    )
    n_params = sum(p.numel() for p in model.parameters())
    accelerator.print(f"model: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")

    rows = tokenize(tokenizer, train_dataset, args.max_length, args.chat_template_kwargs)
    batches_per_epoch = len(rows) // args.train_batch_size
    require(batches_per_epoch > 0, f"--train_batch_size: {args.train_batch_size} exceeds the {len(rows)} training rows")
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.learning_rate, weight_decay=args.weight_decay
    )
    scheduler = transformers.get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=int(args.warmup_ratio * args.max_steps),
        num_training_steps=args.max_steps,
    )
    model, optimizer = accelerator.prepare(model, optimizer)  # DDP / DeepSpeed / FSDP wrapping, device placement
    accelerator.register_for_checkpointing(scheduler)  # saved and restored, but stepped once per update by us
    start_step = 0
    if checkpoint is not None:
        start_step = common.load_training_state(accelerator, checkpoint, model)["step"]
    common.claim_output_dir(accelerator, args)  # every check is done: from here on, this run writes
    logger = common.MetricsLogger(accelerator, args, resume_step=start_step)  # metrics.jsonl, --report_to
    eval_rewards = {"accuracy": accuracy_reward, "format": format_reward}

    def run_eval(step):
        if eval_dataset is None or args.eval_strategy == "no":
            return {}
        with common.generation_model(accelerator, model) as policy:
            metrics = common.evaluate(policy, tokenizer, eval_dataset, args, eval_rewards, seed=args.seed + step)
        logger.log(step, metrics)
        return metrics

    first_eval = run_eval(start_step) if start_step == 0 else {}

    # ---- training loop ----
    step = start_step
    progress = tqdm(total=args.max_steps, initial=start_step, desc="sft", disable=not accelerator.is_main_process)
    with common.graceful_interrupt() as interrupted:
        while step < args.max_steps and not common.any_process(accelerator, interrupted.is_set()):
            start = time.perf_counter()
            epoch, position = divmod(step, batches_per_epoch)  # the data position is a function of the step
            order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed + epoch))
            index = order[position * args.train_batch_size : (position + 1) * args.train_batch_size][my_rows]
            batch = collate([rows[i] for i in index.tolist()], tokenizer.pad_token_id, device)
            with accelerator.autocast():
                logits = (
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
                )
            labels = batch["labels"][:, 1:]
            # The mean over the completion tokens of the whole batch. DDP averages the gradients over the P
            # processes, so
            # each process divides its token sum by N / P, N the batch's completion tokens summed over the processes.
            num_label_tokens = accelerator.reduce((labels != -100).sum(), "sum").clamp(min=1)  # N
            token_loss_sum = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
            )
            loss = token_loss_sum / num_label_tokens * accelerator.num_processes
            accelerator.backward(loss)
            grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm))
            common.check_finite(accelerator, step + 1, loss=loss, grad_norm=grad_norm)  # before the update
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress.update()
            if step % args.logging_steps == 0 or step == args.max_steps:
                metrics = {
                    "loss": accelerator.reduce(loss.detach(), "mean").item(),  # the mean over the whole batch's tokens
                    "grad_norm": grad_norm,
                    "learning_rate": scheduler.get_last_lr()[0],
                    "step_time": time.perf_counter() - start,
                }
                logger.log(step, metrics)
                progress.set_postfix(loss=f"{metrics['loss']:.3f}")
            if args.eval_steps and step % args.eval_steps == 0 and step != args.max_steps:
                run_eval(step)
            if args.save_steps and step % args.save_steps == 0:
                common.save_checkpoint(accelerator, args, step, model, tokenizer, resumed_from=checkpoint)
    progress.close()
    if step < args.max_steps or interrupted.error:  # stopped: Ctrl-C or SIGTERM on any process, or a log that failed
        path = common.save_checkpoint(accelerator, args, step, model, tokenizer, resumed_from=checkpoint)
        logger.close()
        common.stop_early(accelerator, interrupted, step, path)

    # the model first: a stop during the final evaluation then costs only its figures
    common.save_final_model(accelerator, args.output_dir, model, tokenizer, args.save_merged_model)
    last_eval = run_eval(step)
    logger.close()
    if first_eval and last_eval:
        accelerator.print(
            f"held-out accuracy (sampled, T={args.temperature}) {first_eval['eval/accuracy']:.3f} → "
            f"{last_eval['eval/accuracy']:.3f}; "
            f"greedy {first_eval['eval/accuracy_greedy']:.3f} → {last_eval['eval/accuracy_greedy']:.3f}; format "
            f"{last_eval['eval/format']:.3f}"
        )
    elif last_eval:
        accelerator.print(
            f"held-out accuracy (sampled) {last_eval['eval/accuracy']:.3f}, greedy "
            f"{last_eval['eval/accuracy_greedy']:.3f}, format {last_eval['eval/format']:.3f}"
        )
    accelerator.print(f"saved the model to {args.output_dir}")


if __name__ == "__main__":
    common.cli(main, Args)
