"""Reward model: a scalar score r_φ(x, y) trained on preference pairs with the Bradley–Terry loss
(InstructGPT, Ouyang et al. 2022, Eq. 1), as TRL's RewardTrainer trains it:

    L(φ) = mean over the pairs of
           −log σ(r_φ(x, y_c) − r_φ(x, y_r) − m)  +  c · (r_φ(x, y_c) + r_φ(x, y_r))²

y_c is the chosen completion and y_r the rejected one. m is the row's `margin` when the data has
that column (Llama 2, Touvron et al. 2023, Eq. 2), else 0; c is --center_rewards_coefficient
(Eisenstein et al. 2023; off by default), pulling the scores towards a zero mean. Worked example:
scores r_c = 2, r_r = 0 give −log σ(2) = 0.127; with m = 2 the pair costs −log σ(0) = ln 2 = 0.693;
and with c = 0.01 centering adds 0.01 · (2 + 0)² = 0.04. accuracy is the fraction of pairs scored
r_c > r_r (a tie counts one half), margin the mean of r_c − r_r.

The model, a one-label sequence classifier (a causal LM with a new head `score`, or a reward
model), reads a text's last token that is not padding: a pair rendered as the RL scripts'
--reward_model_path reads it (rewards.reward_model_text).

The built-in pairs, data/arithmetic_preferences, are sft.py's demonstrator's right and wrong
answers; data/arithmetic_preferences_number's differ in the number alone (see
docs/sft-and-reward-model.md).

    python reward_model.py          # the embedded tiny model, about 30 s on a CPU
    python reward_model.py --dataset_name data/arithmetic_preferences_number --max_steps 400
    accelerate launch --config_file configs/multi_gpu.yaml reward_model.py \\
        --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name trl-lib/ultrafeedback_binarized \\
        --learning_rate 1e-5 --max_length 1024 --bf16

Data: `chosen` and `rejected` columns, an optional `prompt` and `margin` (docs/sft-and-reward-model.md).

Copy reward_model.py with common.py (text ↔ tokens) and rewards.py (the text a reward model reads).
"""

import contextlib
import json
import math
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import transformers
import yaml
from accelerate import Accelerator, DistributedType
from accelerate.tracking import get_available_trackers
from accelerate.utils import broadcast_object_list, set_seed
from datasets import load_dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser, get_scheduler

import common
from rewards import reward_model_text

HERE = Path(__file__).resolve().parent
SCHEDULES = tuple(
    "linear cosine cosine_with_restarts polynomial constant constant_with_warmup inverse_sqrt".split()
)


def arg(default, help: str):
    """A flag's default and --help line; a list default is copied for each Args."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # model and data
    model_name_or_path: str = arg(str(HERE / "models/tiny-arith"), "a causal LM or reward model")
    attn_implementation: str | None = arg(None, "eager, sdpa, ... (default: transformers')")
    dataset_name: str = arg(str(HERE / "data/arithmetic_preferences"), "hub dataset, folder, file")
    dataset_config: str | None = arg(None, "the dataset's configuration, if it has several")
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg("test", "held-out split to evaluate (if absent: none)")
    max_length: int = arg(128, "drop pairs with a longer text, as TRL does")
    # Bradley-Terry
    center_rewards_coefficient: float | None = arg(None, "c of the (r_c + r_r)² term (None: off)")
    # optimization
    train_batch_size: int = arg(32, "pairs per step, over all processes")
    max_steps: int = arg(100, "training steps, one batch each")
    learning_rate: float = arg(5e-4, "AdamW learning rate (~1e-5 for a 0.5B model)")
    lr_scheduler_type: Literal[SCHEDULES] = arg("cosine", "a schedule needing no kwargs or metric")
    warmup_ratio: float = arg(0.05, "fraction of the steps spent warming up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm (0: none)")
    seed: int = arg(0, "random seed (data order, the new head)")
    disable_dropout: bool = arg(True, "dropout off (LoRA's too), as in TRL")
    # logging, evaluation, checkpoints
    output_dir: str = arg("outputs/reward_model", "metrics.jsonl, checkpoints and the final model")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir with another run")
    logging_steps: int = arg(25, "log metrics every this many steps")
    report_to: list[str] = arg(["none"], "trackers besides metrics.jsonl: wandb, all, ...")
    eval_strategy: Literal["steps", "no"] = arg("steps", "steps: at the start, end, eval_steps")
    eval_steps: int = arg(50, "evaluate every this many steps (0: start and end only)")
    per_device_eval_batch_size: int = arg(256, "pairs per evaluation forward pass")
    save_steps: int = arg(50, "checkpoint every this many steps (0: never; a stop saves)")
    save_total_limit: int | None = arg(None, "keep only the newest N checkpoints")
    resume_from_checkpoint: str | None = arg(None, "a checkpoint, or 'latest' in output_dir")
    # efficiency
    bf16: bool = arg(False, "bf16 autocast; master weights stay float32")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass")
    use_peft: bool = arg(False, "train a LoRA adapter and the head, not all weights")
    lora_r: int = arg(16, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.05, "LoRA dropout")
    lora_target_modules: list[str] = arg(["all-linear"], "modules LoRA adapts")
    save_merged_model: bool = arg(False, "with --use_peft, also save output_dir/merged")
    load_in_4bit: bool = arg(False, "QLoRA: the frozen base in 4 bits; needs --use_peft")
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = arg("nf4", "4-bit data type")


def check_args(args: Args):
    """The flags in range."""
    positive = (
        "max_steps train_batch_size learning_rate max_length logging_steps"
        " per_device_eval_batch_size save_total_limit"
    )
    for name in positive.split():
        value = getattr(args, name)
        require(value is None or value > 0, f"--{name}: must be positive, got {value}")
    for name in "eval_steps save_steps weight_decay max_grad_norm".split():
        value = getattr(args, name)
        require(value >= 0, f"--{name}: must be ≥ 0, got {value}")
    c = args.center_rewards_coefficient
    require(c is None or c >= 0, f"--center_rewards_coefficient: must be ≥ 0, got {c}")
    require(0 <= args.warmup_ratio <= 1, f"--warmup_ratio: not in [0, 1]: {args.warmup_ratio}")
    require(0 <= args.seed < 2**32, f"--seed: must be in [0, 2**32), got {args.seed}")  # numpy's
    for name, default in asdict(type(args)()).items():
        if name.startswith(("lora_", "load_in", "save_merged")) and not args.use_peft:
            require(getattr(args, name) == default, f"--{name}: it needs --use_peft")
    if args.dataset_train_split == args.dataset_test_split:
        raise BadInput("--dataset_test_split: the training split")


# ==== Bradley-Terry ====
def bradley_terry_loss(
    chosen_rewards, rejected_rewards, margins, *, center_rewards_coefficient: float | None
):
    """Each pair's −log σ(r_c − r_r − m), plus c · (r_c + r_r)² when centering. (B,) -> (B,)"""
    loss = -torch.nn.functional.logsigmoid(chosen_rewards - rejected_rewards - margins)
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen_rewards + rejected_rewards) ** 2
    return loss


def pair_accuracy(chosen_rewards, rejected_rewards) -> torch.Tensor:
    """1 for each pair scored r_c > r_r, 1/2 for a tie, else 0. (B,) -> (B,)"""
    wins = (chosen_rewards > rejected_rewards).float()
    ties = (chosen_rewards == rejected_rewards).float()
    return wins + 0.5 * ties


def tokenize_pairs(tokenizer, dataset, args, split: str) -> list[dict]:
    """Each pair's chosen_ids, rejected_ids and margin, tokenized as rewards.reward_model_function
    reads them; pairs over --max_length are dropped."""
    columns = dataset.column_names
    for column in ("chosen", "rejected"):
        require(column in columns, f"--dataset_name: the {split} split has no {column!r} column")
    missing = [None] * len(dataset)
    prompts = dataset["prompt"] if "prompt" in columns else missing
    given_margins = dataset["margin"] if "margin" in columns else missing
    pairs = zip(prompts, dataset["chosen"], dataset["rejected"], given_margins)
    chosen, rejected, margins = [], [], []
    for row, (prompt, good, bad, margin) in enumerate(pairs):
        with loading("--dataset_name", f"row {row} of the {split} split", Exception):
            chosen.append(reward_model_text(tokenizer, prompt, good))
            rejected.append(reward_model_text(tokenizer, prompt, bad))
            margins.append(0.0 if margin is None else float(margin))
    chosen_ids = tokenizer(chosen).input_ids
    rejected_ids = tokenizer(rejected).input_ids
    rows = []
    for good, bad, margin in zip(chosen_ids, rejected_ids, margins):
        if max(len(good), len(bad)) <= args.max_length:
            rows.append({"chosen_ids": good, "rejected_ids": bad, "margin": margin})
    dropped = len(chosen_ids) - len(rows)
    if dropped:
        print(f"the {split} split: dropped {dropped} of {len(chosen_ids)} pairs over --max_length")
    return rows


def pair_rewards(model, rows: list[dict], pad_token_id: int, device):
    """r_φ(x, y_c) and r_φ(x, y_r) (B,) each, float32: one forward pass over the 2B texts,
    right-padded."""
    sequences = [row["chosen_ids"] for row in rows] + [row["rejected_ids"] for row in rows]
    L = max(len(ids) for ids in sequences)
    padded = [ids + [pad_token_id] * (L - len(ids)) for ids in sequences]
    input_ids = torch.tensor(padded, device=device)
    lengths = torch.tensor([len(ids) for ids in sequences], device=device)
    attention_mask = (torch.arange(L, device=device) < lengths[:, None]).long()
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    rewards = outputs.logits[:, 0].float()
    return rewards[: len(rows)], rewards[len(rows) :]


@torch.no_grad()
def evaluate_pairs(accelerator, model, rows: list[dict], pad_token_id: int, args) -> dict:
    """eval/loss, eval/accuracy and eval/margin over the held-out pairs. Each process takes as
    many pairs (the last repeated, not counted): under ZeRO-3 a forward is collective."""
    if not rows:
        return {}
    device = accelerator.device
    share = math.ceil(len(rows) / accelerator.num_processes)
    indices = torch.arange(share) + accelerator.process_index * share
    sums = torch.zeros(4, device=device)  # loss, accuracy, margin, pairs
    for batch in indices.split(args.per_device_eval_batch_size):
        batch_rows = [rows[i] for i in batch.clamp(max=len(rows) - 1)]
        with accelerator.autocast():
            chosen, rejected = pair_rewards(model, batch_rows, pad_token_id, device)
        margins = torch.tensor([row["margin"] for row in batch_rows], device=device)
        losses = bradley_terry_loss(
            chosen, rejected, margins, center_rewards_coefficient=args.center_rewards_coefficient
        )
        wins = pair_accuracy(chosen, rejected)
        per_pair = torch.stack([losses, wins, chosen - rejected, torch.ones_like(losses)])
        counted = (batch < len(rows)).float().to(device)  # a repeated pair: 0
        sums += per_pair @ counted
    loss, accuracy, margin, pairs = accelerator.reduce(sums, "sum").tolist()
    return {
        "eval/loss": loss / pairs,
        "eval/accuracy": accuracy / pairs,
        "eval/margin": margin / pairs,
    }


# ---- plumbing: the command line ----
class BadInput(Exception):
    """Bad input: one line, exit status 2, nothing written."""


def require(condition: bool, message: str):
    if not condition:
        raise BadInput(message)


@contextlib.contextmanager
def loading(flag: str, value, errors=(OSError, ValueError, ImportError, yaml.YAMLError)):
    """One line for bad input: a path, file, value or package that fails to load, a bad data row."""
    try:
        yield
    except errors as error:
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise BadInput(f"{flag} {value}: {reason}") from None


def fail(message: str):
    tqdm.write(f"error: {message}", file=sys.stderr)  # below any progress bar
    sys.exit(2)


def parse_args(args_class):
    """The command line's flags, over a --config YAML file's (a TRL recipe, args.json)."""
    parser = HfArgumentParser(args_class, allow_abbrev=False)
    parser.add_argument("--config", help="a YAML file of flag: value, overridden by the flags")
    parser.error = lambda message: fail(message.replace("argument ", ""))  # no usage
    typed = []  # the config's flags; null and [] leave the default
    if path := parser.parse_args().config:
        with loading("--config", path):
            config = yaml.safe_load(Path(path).read_text()).items()
        for key, value in [(k, v) for k, v in config if v not in (None, [])]:
            values = value if isinstance(value, list) else [value]
            typed += [f"--{key}", *(v if isinstance(v, str) else json.dumps(v) for v in values)]
        parser.error = lambda message: fail(f"--config {path}: {message.replace('argument ', '')}")
    namespace = parser.parse_args(namespace=parser.parse_args(typed))
    del namespace.config
    if isinstance(template_kwargs := getattr(namespace, "chat_template_kwargs", None), str):
        with loading("--chat_template_kwargs", template_kwargs):
            namespace.chat_template_kwargs = json.loads(template_kwargs)
    return args_class(**vars(namespace))


# ---- plumbing: data ----
def load_split(args, split: str):
    """A split of --dataset_name (hub dataset, folder, or file: its train split), or None."""
    is_train = split == args.dataset_train_split
    if not is_train and args.eval_strategy == "no":
        return None
    path = Path(args.dataset_name)
    if path.is_file() and path.stat().st_size == 0:
        raise BadInput(f"--dataset_name {path}: the file is empty")
    with loading("--dataset_name", args.dataset_name):
        if path.is_file():  # datasets reads the format from the extension
            splits = load_dataset(str(path.resolve().parent), data_files={"train": path.name})
        else:
            splits = load_dataset(args.dataset_name, args.dataset_config)
    flag = "--dataset_train_split" if is_train else "--dataset_test_split"
    optional = split == "test" and not is_train  # the default held-out split
    require(split in splits or optional, f"{flag}: no {split!r} in {sorted(splits)}")
    return splits.get(split)


# ---- plumbing: models ----
def load_for_training(args, path: str, model_class=AutoModelForCausalLM, **options):
    """A model to train: float32, dropout off (a frozen LoRA base: bf16 or 4-bit)."""
    from peft import LoraConfig, get_peft_model

    task_type = options.pop("task_type", "CAUSAL_LM")
    flag = options.pop("flag", "--model_name_or_path")
    four_bit = None
    if args.load_in_4bit:
        four_bit = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=args.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=torch.bfloat16 if args.bf16 else torch.float32,
        )
    dtype = torch.bfloat16 if args.use_peft and args.bf16 else torch.float32
    options.setdefault("attn_implementation", args.attn_implementation)
    with loading(flag, path):
        model = model_class.from_pretrained(
            path, dtype=dtype, quantization_config=four_bit, **options
        )
    if args.use_peft:
        modules = args.lora_target_modules
        targets = "all-linear" if modules == ["all-linear"] else modules  # peft's shorthand
        lora = LoraConfig(
            task_type=task_type,
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=targets,
        )
        with loading("--lora_target_modules", targets):
            model = get_peft_model(model, lora)
        for param in model.parameters():
            if param.requires_grad:  # what trains is float32 (a score head too)
                param.data = param.data.float()
    if args.disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):  # TRL's disable_dropout_in_model
                module.p = 0.0
            for name in ("dropout", "attention_dropout", "activation_dropout"):  # float rates
                if isinstance(getattr(module, name, None), float):  # OPT's, Llama's
                    setattr(module, name, 0.0)
    # bitsandbytes' CPU repacking at no-grad passes would break the training passes: turned off
    for layer in model.modules():
        if getattr(layer, "support_avx512bf16_for_cpu", False):
            layer.support_avx512bf16_for_cpu = False
    if args.gradient_checkpointing:
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    return model.train()


# ---- plumbing: the output folder, checkpoints and logging ----
def claim_output_dir(args) -> Path | None:
    """The checkpoint to resume from, its later metrics dropped; None for a fresh folder."""
    out = Path(args.output_dir)
    metrics = out / "metrics.jsonl"
    require(args.output_dir, "--output_dir '': the working folder; name one")
    for flag, value in asdict(args).items():
        own = flag in ("output_dir", "resume_from_checkpoint")
        read = not own and Path(str(value)).exists()
        inside = read and value and Path(value).resolve().is_relative_to(out.resolve())
        require(not inside, f"--output_dir {out}: it holds --{flag} {value}")
    checkpoint = Path(args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    if args.resume_from_checkpoint == "latest":
        found = checkpoints(out)
        require(found, f"--resume_from_checkpoint: none in {out}")
        checkpoint = found[-1]
    if checkpoint is not None:
        with loading("--resume_from_checkpoint", checkpoint):
            saved = json.loads((checkpoint / "args.json").read_text())
        if not (checkpoint / "state").is_dir():
            raise BadInput(f"--resume_from_checkpoint {checkpoint}: a run's final model")
        if not set(saved) <= set(asdict(args)):
            raise BadInput(f"--resume_from_checkpoint {checkpoint}: another script's checkpoint")
        skip = {"resume_from_checkpoint", "overwrite_output_dir"}
        changed = [k for k, v in asdict(args).items() if k not in skip and saved.get(k, v) != v]
        for key in ("learning_rate", "weight_decay", "lr_scheduler_type", "warmup_ratio"):
            require(key not in changed, f"--{key} {getattr(args, key)}: resumes keep {saved[key]}")
        changes = [f"--{k} {getattr(args, k)} (was {saved[k]})" for k in changed]
        print("; ".join([f"resuming from {checkpoint}", *changes]))
    with loading("--output_dir", out):
        out.mkdir(parents=True, exist_ok=True)
    if checkpoint is not None:
        step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
        if metrics.is_file():  # the log up to the checkpoint's step
            records = metrics.read_text().splitlines(keepends=True)
            metrics.write_text("".join(r for r in records if json.loads(r)["step"] <= step))
        return checkpoint
    used = [*checkpoints(out), *out.glob("metrics.jsonl")]
    if used and not args.overwrite_output_dir:
        raise BadInput(
            f"--output_dir: {out} holds a run: resume it (--resume_from_checkpoint latest) or --overwrite_output_dir"
        )
    for folder in checkpoints(out):  # --overwrite_output_dir
        shutil.rmtree(folder)
    metrics.unlink(missing_ok=True)
    return None


def checkpoints(output_dir) -> list[Path]:
    found = Path(output_dir).glob("checkpoint-*")
    return sorted(found, key=lambda path: int(path.name.split("-")[1]))


def save_model(accelerator, args, model, tokenizer, folder: Path, state: dict):
    """The model (or adapter), the tokenizer, trainer_state.json and args.json."""
    weights = accelerator.get_state_dict(model)  # every process: gathers sharded weights
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(folder, state_dict=weights)
        tokenizer.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps(state))
        flags = asdict(args) | {"resume_from_checkpoint": None}
        (folder / "args.json").write_text(json.dumps(flags, indent=2))


def save_checkpoint(accelerator, args, model, tokenizer, state: dict) -> Path:
    """checkpoint-{step}: `save_model` and accelerate's state/, renamed when complete."""
    folder = Path(args.output_dir) / f"checkpoint-{state['step']}"
    tmp = folder.with_name(f".{folder.name}.tmp")
    save_model(accelerator, args, model, tokenizer, tmp, state)
    # accelerate's hook: save_state writes no weights (saved above)
    hook = accelerator.register_save_state_pre_hook(lambda models, weights, _: weights.clear())
    accelerator.save_state(tmp / "state")
    hook.remove()
    accelerator.wait_for_everyone()  # every process has written its part of state/
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)  # a resume from before this step
        tmp.rename(folder)
        if args.save_total_limit:
            for old in checkpoints(args.output_dir)[: -args.save_total_limit]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return folder


def load_checkpoint(accelerator, args, model, checkpoint: Path) -> dict:
    """Restore what `save_checkpoint` saved."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file, load_model

    unwrapped = accelerator.unwrap_model(model)
    # DeepSpeed and FSDP keep the weights in state/
    if accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        if hasattr(unwrapped, "peft_config"):
            adapter = checkpoint / "adapter_model.safetensors"
            set_peft_model_state_dict(unwrapped, load_file(adapter))
        else:
            load_model(unwrapped, checkpoint / "model.safetensors")
    # accelerate's hook: load_state reads no weights (loaded above)
    hook = accelerator.register_load_state_pre_hook(lambda models, _: models.clear())
    accelerator.load_state(checkpoint / "state")
    hook.remove()
    return json.loads((checkpoint / "trainer_state.json").read_text())


def log(accelerator, args, step: int, metrics: dict):
    if metrics and accelerator.is_main_process:
        with open(Path(args.output_dir) / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
    accelerator.log(metrics, step=step)


def main(args: Args):
    # ---- plumbing: setup, a batch of rows a step ----
    check_args(args)
    known = {"none", "all", *map(str, get_available_trackers())}  # the trackers installed here
    require(set(args.report_to) <= known, f"--report_to {args.report_to}: not in {sorted(known)}")
    accelerator = Accelerator(
        mixed_precision="bf16" if args.bf16 else "no",
        log_with=None if args.report_to == ["none"] else args.report_to,
        project_dir=args.output_dir,
        step_scheduler_with_optimizer=False,  # one step an update, not one a process and update
    )
    if accelerator.state.deepspeed_plugin is not None:  # no DataLoader gives it the batch sizes
        accelerator.state.deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=1,
            gradient_accumulation_steps=1,
            train_batch_size=accelerator.num_processes,
            gradient_clipping=args.max_grad_norm,
        )
    set_seed(args.seed)  # the same on every process: a new adapter or head starts alike
    device = accelerator.device
    processes = accelerator.num_processes
    if args.train_batch_size % processes != 0:
        raise BadInput(f"--train_batch_size: not a multiple of the {processes} processes")
    local_batch_size = args.train_batch_size // processes
    first_row = accelerator.process_index * local_batch_size
    my_rows = slice(first_row, first_row + local_batch_size)

    # ---- reward model: the splits, tokenized; the model; the evaluation ----
    with loading("--model_name_or_path", args.model_name_or_path):
        tokenizer = common.load_tokenizer(args.model_name_or_path)
    train_dataset = load_split(args, args.dataset_train_split)
    eval_dataset = load_split(args, args.dataset_test_split)
    rows = tokenize_pairs(tokenizer, train_dataset, args, args.dataset_train_split)
    if len(rows) < args.train_batch_size:
        raise BadInput(f"--train_batch_size: more than the {len(rows)} pairs")
    eval_rows = []
    if eval_dataset is not None:
        eval_rows = tokenize_pairs(tokenizer, eval_dataset, args, args.dataset_test_split)
    # a sequence classifier with one label, whatever the checkpoint says (a causal LM's: 2)
    path = args.model_name_or_path
    classifier = transformers.AutoModelForSequenceClassification
    model = load_for_training(args, path, classifier, task_type="SEQ_CLS", num_labels=1)
    # the head reads each text's last token that is not padding
    model.config.pad_token_id = tokenizer.pad_token_id
    pad_token_id = tokenizer.pad_token_id
    evaluation = lambda: evaluate_pairs(accelerator, model, eval_rows, pad_token_id, args)

    # ---- plumbing: optimizer, scheduler, processes: one update a step ----
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trained, args.learning_rate, weight_decay=args.weight_decay, fused=True
    )
    warmup = int(args.warmup_ratio * args.max_steps)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, warmup, args.max_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # --bf16: the logits stay bf16

    # ---- plumbing: resume, the first evaluation, the loop's stop: one update a step ----
    # the main process alone claims the folder; every process resumes
    claimed = [claim_output_dir(args) if accelerator.is_main_process else None]
    checkpoint = broadcast_object_list(claimed)[0]
    state = {"step": 0, "num_tokens": 0}
    if checkpoint is not None:
        state = load_checkpoint(accelerator, args, model, checkpoint)
    accelerator.init_trackers("huggingface", {k: str(v) for k, v in asdict(args).items()})
    first_eval = evaluation() if state["step"] == 0 else {}
    log(accelerator, args, 0, first_eval)
    # Ctrl-C, or SIGTERM from a scheduler: the loop ends after its step, with a checkpoint
    received_signals = []
    on_signal = lambda signum, frame: received_signals.append(signum)
    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    steps = range(state["step"] + 1, args.max_steps + 1)
    hidden = not accelerator.is_main_process
    progress = tqdm(steps, initial=state["step"], total=args.max_steps, disable=hidden)

    for step in progress:
        step_start = time.perf_counter()
        logging_step = step % args.logging_steps == 0 or step == args.max_steps

        # ==== 1. batch: this process's share of the step's pairs ====
        # the step alone picks its pairs (a fresh permutation each epoch): a resume sees the same
        epoch, position = divmod(step - 1, len(rows) // args.train_batch_size)
        seeded = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(rows), generator=seeded)
        start = position * args.train_batch_size
        indices = order[start : start + args.train_batch_size][my_rows].tolist()
        pairs = [rows[i] for i in indices]

        # ==== 2. scores: r_φ(x, y_c) and r_φ(x, y_r), (B,) each ====
        with accelerator.autocast():
            chosen_rewards, rejected_rewards = pair_rewards(model, pairs, pad_token_id, device)

        # ==== 3. loss: Bradley–Terry, the mean over the pairs ====
        # each process's loss is its pairs' mean; DDP's mean over processes is the batch's
        margins = torch.tensor([pair["margin"] for pair in pairs], device=device)
        pair_losses = bradley_terry_loss(
            chosen_rewards,
            rejected_rewards,
            margins,
            center_rewards_coefficient=args.center_rewards_coefficient,
        )
        loss = pair_losses.mean()

        # ==== 4. update ====
        accelerator.backward(loss)
        max_norm = args.max_grad_norm or math.inf  # 0: no clipping, as in transformers
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_norm))
        if not (math.isfinite(loss.item()) and math.isfinite(grad_norm)):
            progress.close()  # first: the error is then the log's last line
            fail(f"step {step}: the loss or the gradient norm is not finite; no update saved")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # ==== 5. log: over the whole batch, from every process (TRL's names) ====
        lengths = [len(pair["chosen_ids"]) + len(pair["rejected_ids"]) for pair in pairs]
        tokens = torch.tensor(sum(lengths), device=device)
        state["num_tokens"] += accelerator.reduce(tokens, "sum").item()
        if logging_step:
            all_chosen = accelerator.gather(chosen_rewards.detach())
            all_rejected = accelerator.gather(rejected_rewards.detach())
            all_rewards = torch.cat([all_chosen, all_rejected])
            metrics = {
                "loss": accelerator.reduce(loss.detach(), "mean").item(),
                "accuracy": pair_accuracy(all_chosen, all_rejected).mean().item(),
                "margin": (all_chosen - all_rejected).mean().item(),
                "min_reward": all_rewards.min().item(),
                "mean_reward": all_rewards.mean().item(),
                "max_reward": all_rewards.max().item(),
                "grad_norm": grad_norm,
            }

        # ---- plumbing: log, evaluate, save, stop: one update a step ----
        state["step"] = step
        if logging_step:
            metrics["learning_rate"] = scheduler.get_last_lr()[0]
            metrics["num_tokens"] = state["num_tokens"]
            metrics["step_time"] = time.perf_counter() - step_start
            log(accelerator, args, step, metrics)
            progress.set_postfix(loss=f"{metrics['loss']:.3f}")
        if args.eval_steps and step % args.eval_steps == 0 and step < args.max_steps:
            log(accelerator, args, step, evaluation())
        signalled = torch.tensor(float(len(received_signals)), device=device)
        stopping = accelerator.reduce(signalled, "sum").item() > 0  # any process's signal
        if (args.save_steps and step % args.save_steps == 0) or stopping:
            folder = save_checkpoint(accelerator, args, model, tokenizer, state)
        if stopping:
            accelerator.print(
                f"interrupted at step {step}: saved {folder}; continue with --resume_from_checkpoint latest"
            )
            accelerator.end_training()
            signum = received_signals[0] if received_signals else signal.SIGTERM
            sys.exit(128 + signum)

    # ---- plumbing: the final model and evaluation: one update a step ----
    for signum, handler in handlers.items():  # from here on, a signal stops at once
        signal.signal(signum, handler)
    save_model(accelerator, args, model, tokenizer, Path(args.output_dir), state)
    last_eval = evaluation()
    log(accelerator, args, args.max_steps, last_eval)
    changes = []
    for key, value in last_eval.items():
        if key in first_eval:
            changes.append(f"{key.removeprefix('eval/')} {first_eval[key]:.3f} → {value:.3f}")
    if changes:
        accelerator.print("held-out " + ", ".join(changes))
    if args.use_peft and args.save_merged_model and accelerator.is_main_process:
        merged = Path(args.output_dir) / "merged"  # a model that loads without peft
        accelerator.unwrap_model(model).merge_and_unload().save_pretrained(merged)
        tokenizer.save_pretrained(merged)
    # The DDP wrapper holds the process group: freed after end_training, it hangs gloo's workers
    if torch.distributed.is_initialized():  # a single process has no process group
        model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)
    accelerator.end_training()
    accelerator.print(f"saved the model to {args.output_dir}")


if __name__ == "__main__":
    try:
        main(parse_args(Args))
    except BadInput as error:
        fail(str(error))
