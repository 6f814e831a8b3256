"""SFT: supervised fine-tuning of a causal LM on prompt/completion pairs, the warm start the RL
scripts begin from.

The language-modelling objective (Radford et al. 2018, Eq. 1) on the completion alone, as in
InstructGPT's SFT step (Ouyang et al. 2022, §3.5) and TRL's SFTTrainer (completion_only_loss):

    L(θ) = − Σ_t m_t · log π_θ(y_t | x, y_<t)  /  Σ_t m_t

over the tokens of the whole batch: m_t = 1 on the completion's tokens and its end token, 0 on the
prompt's and on padding. The prompt x is rendered as the RL scripts render it (the chat template,
the assistant's turn opened) and the completion y follows it, ended by the tokenizer's EOS: SFT
trains on the sequences the RL scripts sample. Worked example: a completion of three tokens and EOS
that π_θ gives probabilities 1/2, 1/4, 1 and 1/2 has L = (ln 2 + ln 4 + 0 + ln 2) / 4 = ln 2 ≈
0.693, whatever π_θ makes of its prompt. mean_token_accuracy: the share of completion tokens that
π_θ ranks first.

The held-out split gives eval/loss, eval/mean_token_accuracy and, with a `solution` or
`ground_truth` column, the accuracy of completions sampled from its prompts, as the RL scripts'.

The built-in data, data/arithmetic_sft, is a noisy demonstrator's (docs/sft-and-reward-model.md).
models/tiny-arith is this script's default run on an untrained model:

    python tools/make_tiny_model.py outputs/tiny-init   # tiny-arith's tokenizer, random weights
    python sft.py --model_name_or_path outputs/tiny-init --output_dir outputs/tiny-arith  # 5 min
    accelerate launch --config_file configs/multi_gpu.yaml sft.py \\
        --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name my_data --learning_rate 2e-5 \\
        --max_length 1024 --bf16

Data: `prompt` and `completion` columns, strings or conversations (docs/sft-and-reward-model.md).

Copy sft.py with common.py (text ↔ tokens) and rewards.py (the held-out rewards).
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
import yaml
from accelerate import Accelerator, DistributedType
from accelerate.tracking import get_available_trackers
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from datasets import load_dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser, get_scheduler

import common
from rewards import accuracy_reward, compute_rewards, format_reward, text_of

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
    model_name_or_path: str = arg(str(HERE / "models/tiny-arith"), "the model: hub id or folder")
    attn_implementation: str | None = arg(None, "eager, sdpa, ... (default: transformers')")
    dataset_name: str = arg(str(HERE / "data/arithmetic_sft"), "hub dataset, folder or file")
    dataset_config: str | None = arg(None, "the dataset's configuration, if it has several")
    dataset_train_split: str = arg("train", "split to train on")
    dataset_test_split: str = arg("test", "held-out split to evaluate (if absent: none)")
    max_length: int = arg(128, "tokens of prompt and completion kept, the first ones")
    chat_template_kwargs: dict | str | None = arg(None, "the chat template's arguments, as JSON")
    # optimization
    train_batch_size: int = arg(64, "sequences per step, over all processes")
    max_steps: int = arg(1500, "training steps, one batch each")
    learning_rate: float = arg(3e-3, "AdamW learning rate (~2e-5 for a 0.5B model)")
    lr_scheduler_type: Literal[SCHEDULES] = arg("cosine", "a schedule needing no kwargs or metric")
    warmup_ratio: float = arg(0.05, "fraction of the steps spent warming up")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm (0: none)")
    seed: int = arg(0, "random seed (data order, evaluation samples, LoRA's start)")
    disable_dropout: bool = arg(True, "dropout off (LoRA's too)")
    # evaluation: sampling from the held-out prompts
    eval_strategy: Literal["steps", "no"] = arg("steps", "steps: at the start, end, eval_steps")
    eval_steps: int = arg(500, "evaluate every this many steps (0: start and end only)")
    num_generations_eval: int = arg(4, "samples per held-out prompt (and one greedy)")
    per_device_eval_batch_size: int = arg(512, "sequences per forward, or per generate call")
    max_completion_length: int = arg(24, "tokens generated per completion at most")
    temperature: float = arg(1.0, "sampling temperature")
    top_p: float = arg(1.0, "nucleus sampling (1.0: off)")
    top_k: int = arg(0, "top-k sampling (0: off)")
    # logging, checkpoints
    output_dir: str = arg("outputs/sft", "metrics.jsonl, checkpoints and the final model")
    overwrite_output_dir: bool = arg(False, "start over in an output_dir with another run")
    logging_steps: int = arg(25, "log metrics every this many steps")
    report_to: list[str] = arg(["none"], "trackers besides metrics.jsonl: wandb, all, ...")
    save_steps: int = arg(500, "checkpoint every this many steps (0: never; a stop saves)")
    save_total_limit: int | None = arg(None, "keep only the newest N checkpoints")
    resume_from_checkpoint: str | None = arg(None, "a checkpoint, or 'latest' in output_dir")
    # efficiency
    bf16: bool = arg(False, "bf16 autocast; master weights stay float32")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass")
    use_peft: bool = arg(False, "train a LoRA adapter instead of all weights")
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
        "max_steps train_batch_size learning_rate max_length logging_steps num_generations_eval"
        " per_device_eval_batch_size max_completion_length temperature save_total_limit"
    )
    for name in positive.split():
        value = getattr(args, name)
        require(value is None or value > 0, f"--{name}: must be positive, got {value}")
    for name in "top_k eval_steps save_steps weight_decay max_grad_norm".split():
        value = getattr(args, name)
        require(value >= 0, f"--{name}: must be ≥ 0, got {value}")
    require(0 < args.top_p <= 1, f"--top_p: must be in (0, 1], got {args.top_p}")
    require(0 <= args.warmup_ratio <= 1, f"--warmup_ratio: not in [0, 1]: {args.warmup_ratio}")
    require(0 <= args.seed < 2**32, f"--seed: must be in [0, 2**32), got {args.seed}")  # numpy's
    for name, default in asdict(type(args)()).items():
        if name.startswith(("lora_", "load_in", "save_merged")) and not args.use_peft:
            require(getattr(args, name) == default, f"--{name}: it needs --use_peft")
    if args.dataset_train_split == args.dataset_test_split:
        raise BadInput("--dataset_test_split: the training split")


# ==== SFT ====
def tokenize(tokenizer, dataset, args, split: str) -> list[dict]:
    """Each pair's `input_ids` (prompt, completion, EOS) and `labels` (−100, no loss, on the
    prompt), the first --max_length; prompt and completion tokenized apart, as sampled."""
    if "completion" not in dataset.column_names:
        raise BadInput(f"--dataset_name: the {split} split has no 'completion' column")
    completions = []
    for row, completion in enumerate(dataset["completion"]):
        with loading("--dataset_name", f"row {row} of the {split} split", Exception):
            completions.append(text_of(completion))
    prompt_ids = token_ids(tokenizer, prompt_texts(tokenizer, dataset, args, split))
    completion_ids = token_ids(tokenizer, completions)
    rows = []
    for prompt, completion in zip(prompt_ids, completion_ids):
        if len(prompt) >= args.max_length:
            raise BadInput(
                f"--max_length {args.max_length}: a {len(prompt)}-token prompt leaves no completion token"
            )
        completion = completion + [tokenizer.eos_token_id]
        input_ids = (prompt + completion)[: args.max_length]
        labels = ([-100] * len(prompt) + completion)[: args.max_length]
        rows.append({"input_ids": input_ids, "labels": labels})
    return rows


def token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids, without special tokens (the chat template wrote them), each distinct text
    once: the built-in data repeats 390 prompts in 78,000 rows."""
    distinct = list(dict.fromkeys(texts))
    ids = dict(zip(distinct, tokenizer(distinct, add_special_tokens=False).input_ids))
    return [ids[text] for text in texts]


def collate(rows: list[dict], pad_token_id: int, device):
    """input_ids, attention_mask and labels (B, L), padded on the right: positions count from 0."""
    L = max(len(row["input_ids"]) for row in rows)

    def padded(key: str, value: int) -> torch.Tensor:
        ids = [row[key] + [value] * (L - len(row[key])) for row in rows]
        return torch.tensor(ids, device=device)

    lengths = torch.tensor([len(row["input_ids"]) for row in rows], device=device)
    attention_mask = (torch.arange(L, device=device) < lengths[:, None]).long()
    return padded("input_ids", pad_token_id), attention_mask, padded("labels", -100)


def token_losses(logits, labels):
    """−m_t log π_θ(y_t | x, y_<t) (B, L−1) in float32, the logits at t predicting token t + 1;
    m (B, L−1): 1 where the label is not −100; and whether π_θ ranks the token first (B, L−1)."""
    logits = logits[:, :-1].float()
    labels = labels[:, 1:]
    mask = labels != -100
    targets = labels.clamp(min=0)  # −100: no class, masked
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    correct = (logits.argmax(-1) == labels) & mask
    return nll * mask, mask, correct


@torch.no_grad()
def evaluate_loss(accelerator, model, rows: list[dict], pad_token_id: int, args) -> dict:
    """eval/loss and eval/mean_token_accuracy over the held-out completion tokens. Each process
    takes as many rows (the last repeated, not counted): under ZeRO-3 a forward is collective."""
    if not rows:
        return {}
    device = accelerator.device
    share = math.ceil(len(rows) / accelerator.num_processes)
    indices = torch.arange(share) + accelerator.process_index * share
    sums = torch.zeros(3, device=device)  # −log-probs, tokens ranked first, tokens
    for batch in indices.split(args.per_device_eval_batch_size):
        batch_rows = [rows[i] for i in batch.clamp(max=len(rows) - 1)]
        input_ids, attention_mask, labels = collate(batch_rows, pad_token_id, device)
        labels[batch >= len(rows)] = -100  # a repeated row counts no token
        with accelerator.autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        nll, mask, correct = token_losses(logits, labels)
        sums += torch.stack([nll.sum(), correct.sum(), mask.sum()])
    nll, correct, tokens = accelerator.reduce(sums, "sum").tolist()
    tokens = max(tokens, 1)  # --max_length may leave no completion token
    return {"eval/loss": nll / tokens, "eval/mean_token_accuracy": correct / tokens}


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


# ---- plumbing: prompts ----
def prompt_texts(tokenizer, dataset, args, split: str) -> list[str]:
    """Every prompt of a split as the model reads it; an unrenderable row is named."""
    columns = dataset.column_names
    require("prompt" in columns, f"--dataset_name: the {split} split has no 'prompt' column")
    texts = []
    for row, prompt in enumerate(dataset["prompt"]):
        with loading("--dataset_name", f"row {row} of the {split} split", Exception):
            texts.append(common.prompt_text(tokenizer, prompt, args.chat_template_kwargs))
    return texts


def check_context(model, tokenizer, texts: list[str], length: int):
    """The longest prompt and --max_completion_length tokens fit the model's context."""
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids)
    room = getattr(model.config, "max_position_embeddings", math.inf) - longest
    if length > room:
        raise BadInput(
            f"--max_completion_length {length}: {room} fit the context after a {longest}-token prompt"
        )


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


# ---- plumbing: sampling ----
@contextlib.contextmanager
def unwrapped_for_generation(accelerator, model):
    """The plain policy in eval mode, to sample from; its parameters gathered under ZeRO-3."""
    plugin = accelerator.state.deepspeed_plugin
    policy = accelerator.unwrap_model(model)
    gathered = contextlib.nullcontext()
    if plugin is not None and plugin.zero_stage == 3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
    with gathered, accelerator.autocast():
        yield policy.eval()  # in train mode, checkpointing turns generate's cache off
    policy.train()


# ---- plumbing: evaluation ----
@torch.no_grad()
def evaluate(accelerator, model, tokenizer, eval_dataset, eval_texts, reward_funcs, weights, args):
    """eval/reward, eval/<function>: means of num_generations_eval samples and a greedy one."""
    if eval_dataset is None:
        return {}
    my_rows = range(accelerator.process_index, len(eval_dataset), accelerator.num_processes)
    names = ["reward", *(name.removesuffix("_reward") for name in reward_funcs)]
    metrics = {}
    with torch.random.fork_rng(), unwrapped_for_generation(accelerator, model) as policy:
        torch.manual_seed(args.seed)
        for suffix, n, greedy in (("", args.num_generations_eval, False), ("_greedy", 1, True)):
            config = common.sampling_config(policy, tokenizer, args, greedy=greedy)
            rows_per_call = max(1, args.per_device_eval_batch_size // n)
            scores = []
            for start in range(0, len(my_rows), rows_per_call):
                indices = [i for i in my_rows[start : start + rows_per_call] for _ in range(n)]
                columns = eval_dataset.select(indices).to_dict()  # each row n times
                texts = [eval_texts[i] for i in indices]
                out = common.generate(policy, tokenizer, texts, config)
                mask, _ = common.end_of_completion(out["completion_ids"], config.eos_token_id)
                completions, ids = common.decode(tokenizer, out["completion_ids"], mask)
                prompts = columns.pop("prompt")
                rewards, per_func = compute_rewards(
                    reward_funcs, weights, prompts, completions, ids, columns
                )
                scores += torch.cat([rewards[:, None], per_func], 1).tolist()
            means = torch.tensor(gather_object(scores)).nanmean(0)  # over every process
            metrics |= {f"eval/{name}{suffix}": m for name, m in zip(names, means.tolist())}
    return metrics


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

    # ---- sft: the splits, tokenized; the model; the evaluation ----
    with loading("--model_name_or_path", args.model_name_or_path):
        tokenizer = common.load_tokenizer(args.model_name_or_path)
    train_dataset = load_split(args, args.dataset_train_split)
    eval_dataset = load_split(args, args.dataset_test_split)
    rows = tokenize(tokenizer, train_dataset, args, args.dataset_train_split)
    if len(rows) < args.train_batch_size:
        raise BadInput(f"--train_batch_size: more than the {len(rows)} rows")
    eval_rows = []
    answered = None  # held-out rows with an answer: their sampled completions are scored
    eval_texts = []
    if eval_dataset is not None:
        eval_rows = tokenize(tokenizer, eval_dataset, args, args.dataset_test_split)
        if {"solution", "ground_truth"} & set(eval_dataset.column_names):
            answered = eval_dataset
            eval_texts = prompt_texts(tokenizer, eval_dataset, args, args.dataset_test_split)
    reward_funcs = {"accuracy_reward": accuracy_reward, "format_reward": format_reward}
    weights = torch.tensor([1.0, 0.0])  # eval/reward is eval/accuracy
    model = load_for_training(args, args.model_name_or_path)
    if eval_texts:  # the evaluation samples completions after the held-out prompts
        check_context(model, tokenizer, eval_texts, args.max_completion_length)

    def evaluation():
        loss = evaluate_loss(accelerator, model, eval_rows, tokenizer.pad_token_id, args)
        scores = evaluate(
            accelerator, model, tokenizer, answered, eval_texts, reward_funcs, weights, args
        )
        return loss | scores

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

        # ==== 1. batch: this process's share of the step's rows ====
        # the step alone picks its rows (a fresh permutation each epoch): a resume sees the same
        epoch, position = divmod(step - 1, len(rows) // args.train_batch_size)
        seeded = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(rows), generator=seeded)
        start = position * args.train_batch_size
        indices = order[start : start + args.train_batch_size][my_rows].tolist()
        batch = [rows[i] for i in indices]
        input_ids, attention_mask, labels = collate(batch, tokenizer.pad_token_id, device)

        # ==== 2. loss: the mean of −log π_θ(y_t | x, y_<t) over the batch's completion tokens ====
        with accelerator.autocast():  # logits (B, L, V)
            logits = model(input_ids, attention_mask=attention_mask, use_cache=False).logits
        nll, mask, correct = token_losses(logits, labels)  # (B, L − 1) each
        # every process's tokens; × processes as DDP averages the processes' gradients
        num_completion_tokens = accelerator.reduce(mask.sum(), "sum").clamp(min=1)
        loss = nll.sum() / num_completion_tokens * processes

        # ==== 3. update ====
        accelerator.backward(loss)
        max_norm = args.max_grad_norm or math.inf  # 0: no clipping, as in transformers
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_norm))
        if not (math.isfinite(loss.item()) and math.isfinite(grad_norm)):
            progress.close()  # first: the error is then the log's last line
            fail(f"step {step}: the loss or the gradient norm is not finite; no update saved")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # ==== 4. log: over the whole batch, from every process (TRL's names) ====
        state["num_tokens"] += accelerator.reduce(attention_mask.sum(), "sum").item()
        if logging_step:
            with torch.no_grad():  # H = logsumexp(z) − Σ softmax(z) z at the completion tokens
                z = logits[:, :-1][mask].float()
                entropy = z.logsumexp(-1) - (z.softmax(-1) * z).sum(-1)
            sums = torch.stack([nll.sum().detach(), correct.sum(), entropy.sum()])
            means = accelerator.reduce(sums, "sum") / num_completion_tokens
            metrics = {
                "loss": means[0].item(),
                "mean_token_accuracy": means[1].item(),
                "entropy": means[2].item(),
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
