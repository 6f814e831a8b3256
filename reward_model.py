"""Reward model: a scalar score r_φ(x, y), trained on preference pairs with the Bradley–Terry loss (InstructGPT,
Ouyang et al. 2022, Eq. 1), as TRL's RewardTrainer does:

    L(φ) = −log σ(r_φ(x, y_c) − r_φ(x, y_r) − m)  +  c · (r_φ(x, y_c) + r_φ(x, y_r))²,     averaged over the pairs

y_c is the chosen completion, y_r the rejected one; m is the row's `margin` column when the dataset has one (Llama 2,
Eq. 2; 0 otherwise); c is --center_rewards_coefficient (Eisenstein et al. 2023; off by default), which pulls the
scores towards zero mean. eval/accuracy is the fraction of held-out pairs scored r_c > r_r (a tie counts one half).

The model is AutoModelForSequenceClassification with one label, built from any causal-LM checkpoint (the backbone is
kept, the scalar head `score` is new) and read at the last token that is not padding: the tokenizer's pad id is
written into the saved config (where a tokenizer pads with its EOS, the head reads the token before a trailing EOS, in
training and in scoring alike). A pair is rendered exactly as
`rewards.reward_model_function` renders what it scores: prompt + completion through the chat template for
conversational data, concatenated strings for standard data. The saved folder is what `--reward_model_path` of the RL
scripts loads (and ppo.py initializes its value model from).

Data: `--dataset_name arithmetic` (built in) or any HF dataset / local json, jsonl, csv or parquet file with `chosen`
and `rejected` columns, standard or conversational, with an optional `prompt` column (without it, chosen and rejected
hold the whole text or conversation) and an optional `margin` column. The built-in pairs come from the arithmetic task
and sft.py's noisy demonstrator: chosen is its right answer, which shows its work (`7 × 8 = 56 <answer>56</answer>`);
rejected is its guess, off by ±1 or ±2 (`<answer>54</answer>`, half the pairs), another number (a quarter), or a
broken format (a quarter). It trains on the RL training problems and evaluates on the held-out ones.

What the built-in reward model learns is the demonstrator's style as much as arithmetic: shown work and the answer
format tell chosen from rejected, and a model this small does not learn to check the arithmetic of problems it never
trained on (a right and an off-by-one bare answer to a held-out problem score alike). On this task that shortcut is
aligned with correctness, which is why PPO on it raises accuracy; a completion that shows wrong work would fool it, the
classic reward-model failure that eval/accuracy (the exact-answer check) exposes. `--arithmetic_pairs number` makes
pairs that only arithmetic separates: chosen and rejected in the same form, bare or worked, differing only in the
number.
On those the embedded model reaches held-out pair accuracy 0.654 after 400 steps (0.858 on its training problems), but
a near miss (±1 or ±2) on a held-out problem still scores at chance (docs/sft-and-reward-model.md, compare.py's second
comparison).

Under `accelerate launch --num_processes N`, each step's batch is the one a single process would take, in the same
order, split into N equal shares of pairs, one per process: the mean over a share, averaged over the processes by DDP,
is the mean over the whole batch. The logged loss, accuracy and margin are over the whole batch, and evaluation scores
every held-out pair once, each process an equal share.

    python reward_model.py                              # the embedded tiny model, offline, ~30 s on an idle 2-core CPU
"""

import random
import time
from dataclasses import dataclass

import torch
import transformers
from accelerate.utils import set_seed
from tqdm.auto import tqdm

import common
from common import arg, require
from rewards import reward_model_text

ARITHMETIC_PAIRS = ("demonstrator", "number")
# checked row by row as they load (common.usable_rows): a pair with an empty side, or chosen equal to rejected, is
# skipped; without a prompt column, chosen and rejected hold the whole text or conversation (TRL's implicit prompt)
TEXT_COLUMNS = ("prompt", "chosen", "rejected")


@dataclass
class Args:
    model_name_or_path: str = arg(
        common.EMBEDDED_MODEL, "model to start from: a causal LM (a fresh scalar head is added) or a reward model"
    )
    model_revision: str = arg("main", "branch, tag or commit of --model_name_or_path on the hub")
    trust_remote_code: bool = arg(False, "let a hub model or tokenizer run its own code (its modeling files)")
    attn_implementation: str | None = arg(
        None, "attention kernel: eager, sdpa, flash_attention_2, ... (None: transformers' choice)"
    )
    dataset_name: str = arg(
        "arithmetic",
        "'arithmetic' (built in), a hub dataset, or a local data file/folder with chosen and rejected columns",
    )
    dataset_config: str | None = arg(
        None, "configuration name of a hub dataset or dataset folder with several (load_dataset's `name`)"
    )
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg("test", "held-out split for eval/accuracy; skipped when absent")
    arithmetic_pairs: str = arg(
        "demonstrator",
        "arithmetic: 'demonstrator' (worked right answer vs guess or broken format: form separates them) or 'number' "
        "(same form, only the number differs)",
    )
    pairs_per_problem: int = arg(8, "arithmetic: preference pairs per problem")
    center_rewards_coefficient: float | None = arg(
        None, "weight c of the (r_c + r_r)² term that centers the scores (None = off)"
    )
    learning_rate: float = arg(5e-4, "AdamW learning rate (the embedded model; use ~1e-5 for a full 0.5B model)")
    lr_scheduler_type: str = arg("cosine", "transformers scheduler name: constant, linear, cosine, ...")
    warmup_ratio: float = arg(0.05, "fraction of steps spent warming the learning rate up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    train_batch_size: int = arg(
        32,
        "preference pairs per optimizer step over all processes, each taking an equal share (TRL: per_device × "
        "processes)",
    )
    max_steps: int = arg(100, "optimizer steps")
    max_length: int = arg(128, "pairs with a text longer than this many tokens are dropped (as TRL does)")
    seed: int = arg(0, "random seed")
    logging_steps: int = arg(25, "log every this many steps")
    eval_strategy: str = arg("steps", "'steps': evaluate every eval_steps and at the start and the end; 'no': never")
    eval_steps: int = arg(50, "evaluate every this many steps (and at the start and end)")
    per_device_eval_batch_size: int = arg(256, "pairs per forward pass during evaluation")
    output_dir: str = arg("outputs/reward_model", "where metrics, checkpoints and the final model go")
    save_steps: int = arg(50, "save a checkpoint every this many steps (0 = never; Ctrl-C, SIGTERM always save)")
    save_total_limit: int | None = arg(
        None, "keep only the newest N checkpoints (None: all); never deletes the one the run resumed from"
    )
    resume_from_checkpoint: str | None = arg(None, "a checkpoint folder, or 'latest' (newest complete in output_dir)")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir of another run (deletes its checkpoints)")
    use_peft: bool = arg(
        False, "train a LoRA adapter (task type SEQ_CLS; the score head is trained fully) instead of all weights"
    )
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    disable_dropout: bool = arg(True, "turn dropout off (LoRA's too), as TRL's RewardTrainer does by default")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "module names (q_proj v_proj or q_proj,v_proj) or all-linear")
    save_merged_model: bool = arg(False, "with --use_peft, also save the merged model in output_dir/merged")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass to save memory")
    bf16: bool = arg(False, "bfloat16 autocast for forward passes")
    report_to: list[str] = arg(
        ["none"], "trackers besides metrics.jsonl: none, all, or accelerate's (tensorboard, wandb, trackio, ...)"
    )


def arithmetic_preference_dataset(split: str, pairs_per_problem: int, seed: int, pairs: str = "demonstrator"):
    """Conversational pairs on the split's problems (the RL training problems, or the held-out ones).

    pairs="demonstrator": sft.py's noisy demonstrator: its right answers, which show their work, are chosen over a guess
    off by ±1 or ±2 (half the pairs), another number (a quarter), or a broken format (a quarter). Form alone separates
    them. pairs="number": chosen and rejected have the same form, bare (`<answer>56</answer>`) or worked
    (`7 × 8 = 56 <answer>56</answer>`), half each, and differ only in the number: the rejected one is off by ±1 or ±2
    (half the pairs) or another number (half). Only arithmetic separates them."""
    from datasets import Dataset

    require(
        pairs in ARITHMETIC_PAIRS, f"--arithmetic_pairs: expected one of {', '.join(ARITHMETIC_PAIRS)}, got {pairs!r}"
    )
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for a, op, b, answer in common.arithmetic_split(split):
        prompt = [{"role": "user", "content": common.arithmetic_question(a, op, b)}]
        for _ in range(pairs_per_problem):
            if pairs == "number":
                wrong = (
                    answer + rng.choice([-2, -1, 1, 2])
                    if rng.random() < 0.5
                    else rng.choice([n for n in range(-9, 82) if n != answer])
                )
                shape = rng.choice(["<answer>{n}</answer>", f"{a} {op} {b} = {{n}} <answer>{{n}}</answer>"])
                chosen, rejected = shape.format(n=answer), shape.format(n=wrong)
            else:
                chosen = f"{a} {op} {b} = {answer} <answer>{answer}</answer>"
                kind = rng.random()
                if kind < 0.5:
                    rejected = f"<answer>{answer + rng.choice([-2, -1, 1, 2])}</answer>"
                elif kind < 0.75:
                    rejected = f"<answer>{rng.choice([n for n in range(-9, 82) if n != answer])}</answer>"
                else:
                    rejected = rng.choice(
                        [f"{a} {op} {b} = {answer}", f"<answer>{answer}", f"answer: {answer}", "<answer></answer>"]
                    )
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )
    return Dataset.from_list(rows)


def scored_text(tokenizer, prompt, completion) -> str:
    """The text the reward model reads: exactly what rewards.reward_model_function will score."""
    require(
        isinstance(completion, str) or common.is_conversational(completion),
        f"--dataset_name: expected a string or a list of messages, got {type(completion).__name__}",
    )
    return reward_model_text(tokenizer, prompt, completion)


def tokenize_pairs(tokenizer, dataset, max_length: int) -> list[dict]:
    """chosen_ids, rejected_ids and margin per pair, tokenized as the scorer tokenizes; over-long pairs are dropped."""
    prompts = dataset["prompt"] if "prompt" in dataset.column_names else [None] * len(dataset)
    margins = dataset["margin"] if "margin" in dataset.column_names else [0.0] * len(dataset)
    chosen = tokenizer([scored_text(tokenizer, p, c) for p, c in zip(prompts, dataset["chosen"])]).input_ids
    rejected = tokenizer([scored_text(tokenizer, p, r) for p, r in zip(prompts, dataset["rejected"])]).input_ids
    rows = [
        {"chosen_ids": c, "rejected_ids": r, "margin": float(m)}
        for c, r, m in zip(chosen, rejected, margins)
        if max(len(c), len(r)) <= max_length
    ]
    if len(rows) < len(dataset):
        print(f"dropped {len(dataset) - len(rows)} of {len(dataset)} pairs longer than --max_length {max_length}")
    return rows


def pair_rewards(model, rows: list[dict], pad_token_id: int, device):
    """(r_chosen, r_rejected), each (B,): one forward pass over the 2B texts, right-padded like the scorer."""
    sequences = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
    length = max(len(s) for s in sequences)
    input_ids = torch.tensor([s + [pad_token_id] * (length - len(s)) for s in sequences], device=device)
    attention_mask = torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in sequences], device=device)
    rewards = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    return rewards[: len(rows)], rewards[len(rows) :]


def bradley_terry_loss(chosen_rewards, rejected_rewards, margins=None, center_rewards_coefficient: float | None = None):
    """mean of −log σ(r_c − r_r − m), plus c · mean((r_c + r_r)²) when centering."""
    difference = chosen_rewards - rejected_rewards - (0.0 if margins is None else margins)
    loss = -torch.nn.functional.logsigmoid(difference).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def pair_accuracy(chosen_rewards, rejected_rewards) -> float:
    """Fraction of pairs with r_c > r_r; a tie counts one half."""
    return (
        ((chosen_rewards > rejected_rewards).float() + 0.5 * (chosen_rewards == rejected_rewards).float()).mean().item()
    )


def check_args(args: Args):
    common.check_shared_args(args)  # the flags every script shares: learning rate, steps, sampling, output_dir, ...
    require(args.train_batch_size > 0, f"--train_batch_size: must be positive, got {args.train_batch_size}")
    require(args.max_length > 0, f"--max_length: must be positive, got {args.max_length}")
    require(args.pairs_per_problem > 0, f"--pairs_per_problem: must be positive, got {args.pairs_per_problem}")
    require(
        args.arithmetic_pairs in ARITHMETIC_PAIRS,
        f"--arithmetic_pairs: expected one of {', '.join(ARITHMETIC_PAIRS)}, got {args.arithmetic_pairs!r}",
    )
    require(
        args.center_rewards_coefficient is None or args.center_rewards_coefficient >= 0,
        f"--center_rewards_coefficient: must be ≥ 0, got {args.center_rewards_coefficient}",
    )


def main(args: Args):
    check_args(args)
    accelerator = common.make_accelerator(args)  # one process, or N under `accelerate launch`
    # the same on every process: training samples nothing, and the new head starts alike
    set_seed(args.seed)
    device = accelerator.device
    my_pairs = common.shard(accelerator, args.train_batch_size, "--train_batch_size")  # this process's share of a batch
    common.check_backend(accelerator, one_backward_per_update=True)

    # ---- data ----
    builtin = {
        "arithmetic": lambda split: arithmetic_preference_dataset(
            split, args.pairs_per_problem, args.seed, args.arithmetic_pairs
        )
    }
    train_dataset = common.load_split(
        args.dataset_name, args.dataset_train_split, builtin, columns=TEXT_COLUMNS, config=args.dataset_config
    )
    require(
        train_dataset is not None,
        f"--dataset_train_split: {args.dataset_name} has no split {args.dataset_train_split!r}",
    )
    eval_dataset = common.load_split(
        args.dataset_name, args.dataset_test_split, builtin, columns=TEXT_COLUMNS, config=args.dataset_config
    )
    for dataset in (train_dataset, eval_dataset) if eval_dataset is not None else (train_dataset,):
        for column in ("chosen", "rejected"):
            require(
                column in dataset.column_names,
                f"--dataset_name: the dataset has no {column!r} column (columns: {dataset.column_names})",
            )

    # ---- model: the backbone of a causal LM (or a reward model) with a scalar head ----
    checkpoint = common.resolve_checkpoint(args.resume_from_checkpoint, args.output_dir, args)
    tokenizer = common.load_tokenizer(args.model_name_or_path, **common.loading_options(args))
    # a causal LM gets a new score head; a resumed run gets its weights from the checkpoint below
    model, missing_keys = common.load_sequence_classifier(
        args.model_name_or_path,
        "--model_name_or_path",
        new_head=True,
        dtype=common.master_dtype(args),  # float32 master weights (with --use_peft --bf16 the frozen base is bf16)
        **common.loading_options(args),
    )
    common.warn_missing_weights(missing_keys, "--model_name_or_path")
    common.check_max_length(model, args.max_length)
    model.config.pad_token_id = tokenizer.pad_token_id  # the head reads the last token that is not padding
    if args.use_peft:
        from peft import cast_mixed_precision_params, get_peft_model

        model = get_peft_model(model, common.lora_config(args, model, "SEQ_CLS"))
        # trained: peft's copy of the score head too, float32
        cast_mixed_precision_params(model, common.master_dtype(args))
    if args.disable_dropout:
        common.disable_dropout(model)
    if args.gradient_checkpointing:
        common.checkpoint_activations(model)
        if args.use_peft:
            model.enable_input_require_grads()
    model.train()

    rows = tokenize_pairs(tokenizer, train_dataset, args.max_length)
    eval_rows = tokenize_pairs(tokenizer, eval_dataset, args.max_length) if eval_dataset is not None else []
    batches_per_epoch = len(rows) // args.train_batch_size
    require(
        batches_per_epoch > 0, f"--train_batch_size: {args.train_batch_size} exceeds the {len(rows)} training pairs"
    )
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

    @torch.no_grad()
    def run_eval(step: int) -> dict:
        """Every held-out pair, each process scoring an equal share (the last pair repeated to pad, then dropped)."""
        if not eval_rows or args.eval_strategy == "no":
            return {}
        model.eval()
        chosen, rejected, scored = [], [], []
        with accelerator.split_between_processes(list(range(len(eval_rows))), apply_padding=True) as indices:
            for start in range(0, len(indices), args.per_device_eval_batch_size):
                batch_indices = indices[start : start + args.per_device_eval_batch_size]
                with accelerator.autocast():
                    r_c, r_r = pair_rewards(
                        model, [eval_rows[i] for i in batch_indices], tokenizer.pad_token_id, device
                    )
                chosen.append(r_c)
                rejected.append(r_r)
                scored += batch_indices
        model.train()
        # a padded duplicate lands where its original does
        index = accelerator.gather(torch.tensor(scored, device=device))
        chosen = torch.zeros(len(eval_rows), device=device).index_put_((index,), accelerator.gather(torch.cat(chosen)))
        rejected = torch.zeros(len(eval_rows), device=device).index_put_(
            (index,), accelerator.gather(torch.cat(rejected))
        )
        margins = torch.tensor([r["margin"] for r in eval_rows], device=device)
        metrics = {
            "eval/accuracy": pair_accuracy(chosen, rejected),
            "eval/loss": bradley_terry_loss(chosen, rejected, margins, args.center_rewards_coefficient).item(),
            "eval/margin": (chosen - rejected).mean().item(),
        }
        logger.log(step, metrics)
        return metrics

    first_eval = run_eval(start_step) if start_step == 0 else {}

    # ---- training loop ----
    step = start_step
    progress = tqdm(
        total=args.max_steps, initial=start_step, desc="reward model", disable=not accelerator.is_main_process
    )
    with common.graceful_interrupt() as interrupted:
        while step < args.max_steps and not common.any_process(accelerator, interrupted.is_set()):
            start = time.perf_counter()
            epoch, position = divmod(step, batches_per_epoch)  # the data position is a function of the step
            order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed + epoch))
            index = order[position * args.train_batch_size : (position + 1) * args.train_batch_size][my_pairs]
            batch = [rows[i] for i in index.tolist()]
            with accelerator.autocast():
                chosen_rewards, rejected_rewards = pair_rewards(model, batch, tokenizer.pad_token_id, device)
            margins = torch.tensor([r["margin"] for r in batch], device=device)
            # A mean over this process's pairs; DDP averages the gradients over the processes, which is the mean over
            # the
            # whole batch because every process holds the same number of pairs.
            loss = bradley_terry_loss(chosen_rewards, rejected_rewards, margins, args.center_rewards_coefficient)
            accelerator.backward(loss)
            grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm))
            common.check_finite(  # before the update
                accelerator,
                step + 1,
                score=torch.cat([chosen_rewards, rejected_rewards]),
                loss=loss,
                grad_norm=grad_norm,
            )
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress.update()
            if step % args.logging_steps == 0 or step == args.max_steps:
                all_chosen, all_rejected = (
                    accelerator.gather(chosen_rewards.detach()),
                    accelerator.gather(rejected_rewards.detach()),
                )
                metrics = {
                    "loss": accelerator.reduce(loss.detach(), "mean").item(),
                    "accuracy": pair_accuracy(all_chosen, all_rejected),
                    "margin": (all_chosen - all_rejected).mean().item(),
                    "grad_norm": grad_norm,
                    "learning_rate": scheduler.get_last_lr()[0],
                    "step_time": time.perf_counter() - start,
                }
                logger.log(step, metrics)
                progress.set_postfix(loss=f"{metrics['loss']:.3f}", accuracy=f"{metrics['accuracy']:.2f}")
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
            f"held-out pair accuracy {first_eval['eval/accuracy']:.3f} → {last_eval['eval/accuracy']:.3f}"
        )
    accelerator.print(f"saved the reward model to {args.output_dir}")


if __name__ == "__main__":
    common.cli(main, Args)
