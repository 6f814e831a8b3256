"""Benchmark: step time, throughput and peak memory of rloo.py, grpo.py, reinforce.py and ppo.py, and optionally of
TRL's RLOOTrainer on the identical model and batch; with --phases, where a step's time goes and what bounds it.
docs/benchmarks.md says what each figure is, how it is measured, and shows them.

Each (config, algorithm, repeat) is one training run in a child process: the script, unchanged, as `python
<algorithm>.py` runs it, with --logging_steps 1, no checkpoints and no evaluation. Runs go repeat by repeat, so a
background load hits every algorithm alike; the tables show medians over repeats. The child uses no name of the
script's: it hooks the libraries the scripts call (install_hooks). Every script gets 32 completions per step and
β = 0.05; trl_rloo runs TRL in a separate environment (--trl_python), configured like rloo.py (trl_run).

    python benchmarks/bench.py                       # all four on the embedded model
    python benchmarks/bench.py --algorithms rloo,trl_rloo --repeats 3 --trl_python /path/to/trl-venv/bin/python
"""

import collections
import itertools
import json
import math
import os
import platform
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import time
import timeit
from dataclasses import asdict, dataclass, field
from pathlib import Path

import accelerate
import torch
import transformers
from datasets import load_dataset
from torch.nn.modules import module as torch_module  # its global forward hooks
from torch.optim import optimizer as torch_optimizer  # its global step hooks
from transformers import HfArgumentParser

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the scripts, common.py and rewards.py
EMBEDDED = str(ROOT / "models" / "tiny-arith")
PROMPTS = ROOT / "data" / "arithmetic" / "train.jsonl"
ALGORITHMS = ("rloo", "grpo", "reinforce", "ppo", "trl_rloo")  # trl_rloo: TRL's RLOOTrainer
GROUPED = {"rloo", "grpo", "trl_rloo"}  # prompts × num_generations; the others: 1 per prompt
CONFIGS = {"embedded": 24, "llama135m": 64, "qwen0.5b": 64}  # config → max_completion_length
PRECISIONS = ("fp32", "bf16")  # bf16: the scripts' --bf16, TRL's bf16=True
PHASES = ("generation", "policy forward", "reference forward", "backward", "optimizer")  # --phases
# the architecture of a popular ~135M chat model (SmolLM2-135M-Instruct's config), randomly initialized
LLAMA_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, rope_theta=1e5)
LLAMA_135M |= dict(num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)
LLAMA_135M |= dict(tie_word_embeddings=True, max_position_embeddings=2048, rms_norm_eps=1e-5)
# Qwen2.5-0.5B's shape (its 151,936-row embedding; the tokenizer has 49,152 entries, as Qwen's has fewer than its rows)
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, rope_theta=1e6)
QWEN_05B |= dict(num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)
SHAPES = {"llama135m": LLAMA_135M, "qwen0.5b": LLAMA_135M | QWEN_05B | dict(attention_bias=True)}
# rloo.py's defaults, which trl_rloo trains with (tests/test_bench.py checks them)
RLOO_SCHEDULE = dict(learning_rate=2e-4, lr_scheduler_type="cosine", warmup_ratio=0.03)


def arg(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    algorithms: str = arg("rloo,grpo,reinforce,ppo", "comma-separated, of ALGORITHMS")
    configs: str = arg("embedded", "comma-separated: embedded, llama135m, qwen0.5b (SHAPES)")
    precisions: str = arg("fp32", "comma-separated: fp32, bf16 (--bf16; TRL's bf16=True)")
    steps: int = arg(8, "training steps per run, warm-up included")
    warmup_steps: int = arg(2, "first steps of each run left out of the median")
    repeats: int = arg(1, "runs per config and algorithm, interleaved; the table shows medians")
    completions_per_step: int = arg(32, "completions per step, for every algorithm")
    num_generations: int = arg(4, "completions per prompt for rloo, grpo and trl_rloo")
    beta: float = arg(0.05, "KL coefficient for every algorithm (ppo: --kl_coef)")
    max_completion_length: int = arg(0, "0: the config's (CONFIGS)")
    script_flags: str = arg("", "extra flags for every script: --script_flags='--use_peft --bf16'")
    num_threads: int = arg(1, "OMP_NUM_THREADS in each child (0: PyTorch's one per core)")
    trl_python: str = arg(sys.executable, "python of an environment with trl, for trl_rloo")
    phases: bool = arg(False, "also each phase of a step and its bound")
    work_dir: str = arg("outputs/bench", "where the runs, the random models and the prompts go")
    output_json: str = arg("outputs/bench/bench.json", "settings, every run and the summary")


class BadInput(Exception):
    """A bad flag: one line, exit status 2, nothing written."""


def require(condition: bool, message: str):
    if not condition:
        raise BadInput(message)


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(args_class, argv: list[str] | None = None):
    """`args_class` (bench.py's or compare.py's flags) from the command line; a bad flag is one line."""
    parser = HfArgumentParser(args_class, allow_abbrev=False)
    # argparse's "argument --steps/--steps: invalid int value: 'x'" as "--steps: invalid int value: 'x'"
    flag = lambda message: re.sub(r"^argument (--[^/:]+)(/[^:]*)?: ", r"\1: ", message)
    parser.error = lambda message: fail(flag(message))
    return args_class(**vars(parser.parse_args(argv)))


def split_list(text: str, kind=str) -> list:
    return [kind(item.strip()) for item in text.split(",") if item.strip()]


def read_metrics(run_dir) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# ---- children: one training run each, in a process with the threads and environment the parent set ----
def peak_rss_mb() -> float:
    """This process's own peak resident set size, VmHWM (getrusage counts the parent's too, from the fork)."""
    lines = Path("/proc/self/status").read_text().splitlines()
    kib = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")][0]
    return kib / 1024


def child(spec_json: str):
    """Install the hooks, run the script (or TRL), write bench_child.json next to metrics.jsonl."""
    spec = json.loads(spec_json)
    report_file = Path(spec["output_dir"]) / "bench_child.json"
    report = {}
    try:
        install_hooks(report, spec["phases"])
        if spec["algorithm"] == "trl_rloo":
            trl_run(spec, report)
        else:
            script_run(spec, report)
    finally:
        report["peak_rss_mb"] = peak_rss_mb()
        if torch.cuda.is_available():
            report["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        report_file.write_text(json.dumps(report))
    if spec["phases"]:  # after the peak memory is noted: the bounds' buffers are not the run's
        report["bounds"], report["rates"] = phase_bounds(report, spec["bf16"])
        report_file.write_text(json.dumps(report))


def script_run(spec: dict, report: dict):
    """The script as `python <algorithm>.py argv` runs it."""
    # torch, transformers, accelerate and datasets are in
    report["baseline_rss_mb"] = peak_rss_mb()
    script = str(ROOT / f"{spec['algorithm']}.py")
    sys.argv = [script, *spec["argv"]]
    runpy.run_path(script, run_name="__main__")
    marks = report["cpu_marks"]  # a step's CPU time: from the previous step's end to its own
    report["step_cpu_times"] = [None] + [b - a for a, b in zip(marks, marks[1:])]


def clock() -> float:
    """The clock of --phases: CPU time on a CPU (other jobs inflate it less), else the synced wall clock."""
    if not torch.cuda.is_available():
        return time.process_time()
    torch.cuda.synchronize()
    return time.perf_counter()


def install_hooks(report: dict, phases: bool):
    """accelerate's `log` notes each step's end; with `phases`, hooks in torch and transformers note its phases."""
    steps, cpu_marks, starts, optimizer_starts = [[]], [], [], []
    generating = False
    report.update(steps=steps, cpu_marks=cpu_marks)
    log = accelerate.Accelerator.log

    def timed_log(accelerator, values: dict, *args, **kwargs):
        if "step_time" in values:
            cpu_marks.append(time.process_time())
            steps.append([])
        return log(accelerator, values, *args, **kwargs)

    accelerate.Accelerator.log = timed_log
    if not phases:
        return

    def note(phase: str, start: float, model=None, **shapes):
        seconds = clock() - start
        if model is not None:
            shapes |= model_shapes(model)
        steps[-1].append(dict(phase=phase, seconds=seconds, **shapes))

    generate = transformers.GenerationMixin.generate

    def timed_generate(model, *args, **kwargs):
        nonlocal generating
        start = clock()
        generating = True
        output = generate(model, *args, **kwargs)
        generating = False
        B, P = kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape
        T = getattr(output, "sequences", output).shape[1] - P
        note("generation", start, model, B=B, P=P, T=T)
        return output

    def forward_start(module, args):
        if isinstance(module, transformers.PreTrainedModel):
            starts.append(clock())

    def forward_end(module, args, kwargs, output):
        if not isinstance(module, transformers.PreTrainedModel):
            return
        start = starts.pop()
        if starts or generating:  # a model inside another's forward, or inside generate
            return
        trains = any(p.requires_grad for p in module.parameters())
        B, L = kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape
        kept = output.logits.shape[1] if hasattr(output, "logits") else 0  # positions with logits
        backward = 0  # how many forwards' worth of work its backward does
        if trains and torch.is_grad_enabled():
            # transformers' new name where it has it (is_gradient_checkpointing is deprecated)
            checkpointed = getattr(module, "is_activation_checkpointing", None)
            if checkpointed is None:
                checkpointed = module.is_gradient_checkpointing
            backward = 3 if checkpointed else 2
        phase = "policy forward" if trains else "reference forward"
        note(phase, start, module, B=B, L=L, kept=kept, backward=backward)

    backward = torch.autograd.backward

    def timed_backward(*args, **kwargs):  # loss.backward() and accelerator.backward(loss) call it
        start = clock()
        backward(*args, **kwargs)
        note("backward", start)

    def optimizer_end(optimizer, args, kwargs):
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        trained = sum(p.numel() for p in parameters if p.requires_grad)
        note("optimizer", optimizer_starts.pop(), parameters=trained)

    transformers.GenerationMixin.generate = timed_generate
    torch_module.register_module_forward_pre_hook(forward_start)
    torch_module.register_module_forward_hook(forward_end, with_kwargs=True)
    torch.autograd.backward = timed_backward
    torch_optimizer.register_optimizer_step_pre_hook(lambda *_: optimizer_starts.append(clock()))
    torch_optimizer.register_optimizer_step_post_hook(optimizer_end)


def model_shapes(model) -> dict:
    """What a pass's bound reads of a model: its linears but the head, the head, the attention, the cache."""
    config, head = model.config, model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    counts = collections.Counter((m.in_features, m.out_features) for m in linears)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        head_dim = config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    return {
        "linears": [[i, o, count] for (i, o), count in counts.items()],
        "head": [head.in_features, head.out_features] if head is not None else None,
        # query·key and the sum of values (2 FLOPs each), and the cached keys and values
        "attention": config.num_hidden_layers * heads * head_dim,
        "cache": 2 * config.num_hidden_layers * kv_heads * head_dim,
    }


def phase_bounds(report: dict, bf16: bool) -> tuple[list[dict], dict]:
    """Each step's bound of each phase in seconds (docs/benchmarks.md says how), and the rates behind them."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    calls = 1
    if device == "cuda":  # 10 calls at a time, so that one is not a sync's latency
        calls = 10
    seconds_per_flop = {}

    def best_of_3(work) -> float:  # after a warm-up
        return min(timeit.repeat(work, timer=clock, repeat=4, number=calls)[1:]) / calls

    def matmul_seconds(tokens: int, n_in: int, n_out: int, count: int = 1) -> float:
        """`count` matmuls of (tokens, n_in) by (n_in, n_out), at the rate of that shape."""
        flops = 2 * tokens * n_in * n_out
        if (tokens, n_in, n_out) not in seconds_per_flop:
            x = torch.randn(tokens, n_in, dtype=dtype, device=device)
            w = torch.randn(n_out, n_in, dtype=dtype, device=device)
            seconds_per_flop[tokens, n_in, n_out] = best_of_3(lambda: x @ w.T) / flops
        return count * flops * seconds_per_flop[tokens, n_in, n_out]

    source = torch.empty(2**26, device=device)  # 256 MB of float32
    copy = torch.empty_like(source)
    bandwidth = 2 * source.nbytes / best_of_3(lambda: copy.copy_(source))  # read, written: B/s

    def pass_seconds(shapes: dict, B: int, L: int, past: int, kept: int) -> float:
        """B sequences of L tokens after `past` cached, logits at `kept`: the larger of FLOPs' and bytes' time."""
        linears = sum(matmul_seconds(B * L, i, o, count) for i, o, count in shapes["linears"])
        linear_flops = sum(2 * B * L * i * o * count for i, o, count in shapes["linears"])
        # each token attends to the cache, itself, the ones before
        attended = L * past + L * (L + 1) / 2
        attention_flops = 4 * B * shapes["attention"] * attended
        head = matmul_seconds(B * kept, *shapes["head"]) if shapes["head"] and kept else 0.0
        # attention at the linears' rate
        compute = linears * (1 + attention_flops / linear_flops) + head
        weights = sum(i * o * count for i, o, count in shapes["linears"])
        if shapes["head"]:
            weights += math.prod(shapes["head"])
        cache = B * shapes["cache"] * (past + L)
        return max(compute, (weights + cache) * dtype.itemsize / bandwidth)

    bounds = []
    for events in report["steps"]:
        bound = dict.fromkeys(PHASES, 0.0)
        for event in events:
            phase = event["phase"]
            if phase == "generation":
                # a prefill, then one token at a time: the t-th after P + t - 1
                B, P, T = event["B"], event["P"], event["T"]
                decoding = sum(pass_seconds(event, B, 1, P + t - 1, 1) for t in range(1, T))
                bound["generation"] += pass_seconds(event, B, P, 0, 1) + decoding
            elif phase == "optimizer":  # AdamW: 4 float32 reads and 3 writes per trained parameter
                bound["optimizer"] += 28 * event["parameters"] / bandwidth
            elif phase != "backward":
                forward = pass_seconds(event, event["B"], event["L"], 0, event["kept"])
                bound[phase] += forward
                bound["backward"] += event["backward"] * forward
        bounds.append(bound)
    matmuls = {"x".join(map(str, shape)): 1e-9 / rate for shape, rate in seconds_per_flop.items()}
    return bounds, {
        "copy_GB_per_s": bandwidth / 1e9,
        "matmul_GFLOP_per_s (tokens x in x out)": matmuls,
    }


def trl_run(spec: dict, report: dict):
    """TRL's RLOOTrainer configured like rloo.py: its schedule and optimizer, bf16 as asked, no checkpointing."""
    import trl

    from rewards import accuracy_reward

    report["baseline_rss_mb"] = peak_rss_mb()
    report["trl_version"] = trl.__version__
    step_times, report["step_cpu_times"] = [], []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.start)
            report["step_cpu_times"].append(time.process_time() - self.cpu_start)

    config = dict(output_dir=spec["output_dir"], max_steps=spec["steps"], seed=0, logging_steps=1)
    config |= dict(per_device_train_batch_size=spec["completions_per_step"])
    config |= dict(gradient_accumulation_steps=1, num_generations=spec["num_generations"])
    config |= dict(beta=spec["beta"], max_completion_length=spec["max_completion_length"])
    config |= dict(temperature=1.0, num_iterations=1, optim="adamw_torch", max_grad_norm=1.0)
    config |= {k: spec[k] for k in ("learning_rate", "lr_scheduler_type")}
    config["warmup_steps"] = spec["warmup_ratio"]  # below 1: a fraction of the steps
    config |= dict(save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True)
    config |= dict(bf16=spec["bf16"], gradient_checkpointing=False)
    config["use_cpu"] = not torch.cuda.is_available()  # transformers allows bf16 on a CPU with it
    prompts = load_dataset("json", data_files=str(PROMPTS), split="train")
    trainer = trl.RLOOTrainer(
        model=spec["model"],
        reward_funcs=accuracy_reward,
        args=trl.RLOOConfig(**config),
        train_dataset=prompts,
        callbacks=[StepTimer()],
    )
    trainer.train()
    logs = [log for log in trainer.state.log_history if "completions/mean_length" in log]
    with open(Path(spec["output_dir"]) / "metrics.jsonl", "w") as f:  # the scripts' format
        for step, (step_time, log) in enumerate(zip(step_times, logs), 1):
            record = {"step": step, "step_time": step_time}
            record["completions/mean_length"] = log["completions/mean_length"]
            f.write(json.dumps(record) + "\n")


# ---- the parent: build the inputs, run the children one at a time, summarize ----
def build_random_model(path: Path, shape: dict) -> int:
    """A random Llama of `shape` saved to `path`, with the embedded tokenizer grown to 49,152 entries."""
    from tokenizers import Tokenizer

    import common

    tokenizer = common.load_tokenizer(EMBEDDED)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    # merges of byte pairs: every id decodes to text, the prompts still tokenize, nothing is downloaded
    byte_chars = [c for c in vocab if len(c) == 1][:256]  # the byte-level alphabet
    for a in byte_chars:
        for b in byte_chars:
            if len(vocab) == LLAMA_135M["vocab_size"]:  # 49,152
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append([a, b])
    assert len(vocab) == LLAMA_135M["vocab_size"], f"tokenizer: {len(vocab)} entries"
    special = dict(eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token)
    special["unk_token"] = tokenizer.unk_token
    big = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), padding_side="left", **special
    )
    big.chat_template = tokenizer.chat_template
    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = transformers.LlamaConfig(**shape, **ids, bos_token_id=None)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    big.save_pretrained(path)
    return model.num_parameters()


def script_argv(args: Args, algorithm, model, data_file, length, run_dir, precision) -> list[str]:
    """A script's flags: the same batch, KL coefficient and steps for all, every step logged."""
    G = args.num_generations if algorithm in GROUPED else 1
    flags = {"--model_name_or_path": model, "--dataset_name": data_file}
    flags |= {"--max_completion_length": length, "--max_steps": args.steps, "--logging_steps": 1}
    flags |= {"--eval_steps": 0, "--save_steps": 0, "--output_dir": run_dir}
    flags["--prompts_per_step"] = args.completions_per_step // G
    if algorithm == "ppo":
        flags["--kl_coef"] = args.beta
    else:
        flags |= {"--num_generations": G, "--beta": args.beta}
    argv = [str(item) for flag in flags.items() for item in flag] + ["--overwrite_output_dir"]
    if precision == "bf16":
        argv.append("--bf16")
    return argv + args.script_flags.split()


def run_child(args: Args, spec: dict, run_dir: Path) -> dict:
    """One training run in a child process; returns its figures."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)])
    if args.num_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.num_threads)
    python = args.trl_python if spec["algorithm"] == "trl_rloo" else sys.executable
    command = [python, "-c", "import sys, bench; bench.child(sys.argv[1])", json.dumps(spec)]
    start = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        process = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if process.returncode != 0:
        lines = (run_dir / "log.txt").read_text().strip().splitlines()
        last = f"{lines[-1] if lines else '(no output)'} (log: {run_dir / 'log.txt'})"
        raise RuntimeError(f"{spec['algorithm']} exited with status {process.returncode}: {last}")
    records = [r for r in read_metrics(run_dir) if "step_time" in r]
    measured = records[args.warmup_steps :]
    step_times = [r["step_time"] for r in measured]
    lengths = [r["completions/mean_length"] for r in measured]
    tokens = [length * args.completions_per_step for length in lengths]  # real ones, up to EOS
    child_report = json.loads((run_dir / "bench_child.json").read_text())
    cpu_times = child_report["step_cpu_times"][args.warmup_steps :]
    figures = {
        "median_step_time_s": median(step_times),
        "median_step_cpu_time_s": median(cpu_times),
        "completions_per_s": args.completions_per_step / median(step_times),
        "generated_tokens_per_s": median([n / t for n, t in zip(tokens, step_times)]),
        "mean_completion_length": statistics.mean(lengths),
        "peak_rss_mb": child_report["peak_rss_mb"],
        "baseline_rss_mb": child_report["baseline_rss_mb"],
        "rss_above_baseline_mb": child_report["peak_rss_mb"] - child_report["baseline_rss_mb"],
        "cuda_max_allocated_mb": child_report.get("cuda_max_allocated_mb"),
        "step_times_s": [r["step_time"] for r in records],
        "wall_s": time.perf_counter() - start,
    }
    if "trl_version" in child_report:
        figures["trl_version"] = child_report["trl_version"]
    if args.phases:
        figures["phases"] = phase_medians(records, child_report, args.warmup_steps)
    # --phases: what the bounds were measured at
    figures["phase_rates"] = child_report.get("rates")
    return figures


def phase_medians(records: list[dict], child_report: dict, warmup_steps: int) -> dict:
    """Each phase's median seconds and bound over the measured steps, in `clock`'s time."""
    cuda = "cuda_max_allocated_mb" in child_report
    step_seconds = [r["step_time"] for r in records] if cuda else child_report["step_cpu_times"]
    steps = zip(step_seconds, child_report["steps"], child_report["bounds"])
    seconds, bounds = [], []
    for step, events, bound in list(steps)[warmup_steps:]:
        phases = {name: sum(e["seconds"] for e in events if e["phase"] == name) for name in PHASES}
        seconds.append(phases | {"rest": step - sum(phases.values()), "step": step})
        bounds.append(bound | {"rest": None, "step": sum(bound.values())})
    medians = {}  # the rest: the step less its phases; the step's bound: the sum of the phases'
    for name in seconds[0]:
        medians[name] = {"seconds": median([s[name] for s in seconds])}
        medians[name]["bound"] = median([b[name] for b in bounds])
    return medians


FIGURES = {  # each run's figures (the summary: medians over repeats), their column and format
    "median_step_time_s": ("step time (s)", "{:.3f}"),
    "median_step_cpu_time_s": ("CPU s/step", "{:.3f}"),
    "completions_per_s": ("completions/s", "{:.1f}"),
    "generated_tokens_per_s": ("gen tokens/s", "{:.0f}"),
    "mean_completion_length": ("mean length", "{:.1f}"),
    "peak_rss_mb": ("peak RSS (MB)", "{:.0f}"),
    "baseline_rss_mb": (None, None),  # in the JSON only
    "rss_above_baseline_mb": ("RSS above imports (MB)", "{:.0f}"),
    "cuda_max_allocated_mb": ("CUDA max allocated (MB)", "{:.0f}"),  # on CUDA only
}


def summarize(runs: list[dict]) -> list[dict]:
    """The median of each figure over the repeats of a (config, algorithm, precision)."""
    summary = []
    for key in dict.fromkeys((r["config"], r["algorithm"], r["precision"]) for r in runs):
        group = [r for r in runs if (r["config"], r["algorithm"], r["precision"]) == key]
        row = dict(zip(("config", "algorithm", "precision"), key))
        row |= dict(repeats=len(group), parameters=group[0]["parameters"])
        for name in FIGURES:
            row[name] = median([r[name] for r in group])
        for name in group[0].get("phases", {}):  # each phase's medians over the repeats
            figures = [r["phases"][name] for r in group]
            medians = {k: median([f[k] for f in figures]) for k in ("seconds", "bound")}
            row.setdefault("phases", {})[name] = medians
        summary.append(row)
    return summary


def median(values: list):
    """The median of those that are not None; None if none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_table(summary: list[dict], cuda: bool):
    shown = [name for name, (column, _) in FIGURES.items() if column]
    if not cuda:
        shown.remove("cuda_max_allocated_mb")
    header = ["config", "algorithm", "precision", "runs", *(FIGURES[n][0] for n in shown)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * (4 + len(shown)))
    for r in summary:
        cells = [r["config"], r["algorithm"], r["precision"], str(r["repeats"])]
        cells += ["-" if r[name] is None else FIGURES[name][1].format(r[name]) for name in shown]
        print("| " + " | ".join(cells) + " |")


def print_phases(row: dict):
    """One run's phases: median seconds, bound and ratio; the step's bound is the sum of its phases'."""
    unit = "seconds" if row["cuda_max_allocated_mb"] else "CPU seconds"
    wall = f"(the wall clock's step: {row['median_step_time_s']:.3g} s)"
    which = f"{row['config']}, {row['algorithm']}, {row['precision']}"
    print(f"\n{which}: medians over the measured steps {wall}")
    print(f"| phase | {unit} | bound | ratio |\n|---|---|---|---|")
    for name, figure in row["phases"].items():
        seconds, bound = figure["seconds"], figure["bound"]
        if bound is None:
            print(f"| {name} | {seconds:.3g} | – | – |")
        else:
            print(f"| {name} | {seconds:.3g} | {bound:.3g} | {seconds / bound:.2f}× |")


def cpu_name() -> str:
    """The CPU's model name and whether it has AMX, whose bf16 matmuls are several times AVX-512's."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = re.search(r"model name\s*: (.*)", info)
    amx = "with AMX" if "amx_bf16" in info else "no AMX"
    return f"{name[1] if name else platform.processor()}, {amx}, {os.cpu_count()} cores"


def check_args(args: Args):
    """Every flag, before anything is built or written."""
    for kind, known in (("algorithm", ALGORITHMS), ("config", CONFIGS), ("precision", PRECISIONS)):
        names = split_list(getattr(args, f"{kind}s"))
        require(bool(names), f"--{kind}s: nothing to run")
        for name in names:
            unknown = f"unknown {kind} {name!r} (choose from {', '.join(known)})"
            require(name in known, f"--{kind}s: {unknown}")
    unmeasured = f"{args.steps} leaves no measured step after --warmup_steps {args.warmup_steps}"
    require(args.steps > args.warmup_steps >= 0, f"--steps: {unmeasured}")
    require(args.repeats >= 1, f"--repeats: must be ≥ 1, got {args.repeats}")
    trl = "trl_rloo" in split_list(args.algorithms)
    require(not (args.phases and trl), "--phases: for the scripts, not for trl_rloo")
    first = "--phases: needs --warmup_steps ≥ 1 (step 1 has no CPU time)"
    require(args.warmup_steps >= 1 or not args.phases, first)
    G = args.num_generations
    require(G >= 2, f"--num_generations: RLOO and GRPO need at least 2, got {G}")
    multiple = f"{args.completions_per_step} is not a multiple of --num_generations {G}"
    require(args.completions_per_step % G == 0, f"--completions_per_step: {multiple}")
    length = args.max_completion_length
    require(length >= 0, f"--max_completion_length: must be ≥ 0, got {length}")
    if trl:
        command = [args.trl_python, "-c", "import trl"]
        found = False
        if Path(args.trl_python).exists():
            found = subprocess.run(command, capture_output=True).returncode == 0
        pip = "pip install 'trl==1.16.*'"
        install = f"install it in a separate environment ({pip}) and pass its python"
        require(found, f"--trl_python: {args.trl_python} cannot import trl; {install}")


def main(args: Args):
    check_args(args)
    algorithms, configs = split_list(args.algorithms), split_list(args.configs)
    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    data_file = work_dir / "arithmetic_train.jsonl"  # the train split alone: no evaluation
    shutil.copyfile(PROMPTS, data_file)
    embedded = transformers.AutoModelForCausalLM.from_pretrained(EMBEDDED).num_parameters()
    models = {"embedded": (EMBEDDED, embedded)}
    for config in set(configs) & set(SHAPES):
        path = work_dir / config
        models[config] = (str(path), build_random_model(path, SHAPES[config]))
    runs = []
    plan = itertools.product(range(args.repeats), configs, algorithms, split_list(args.precisions))
    for repeat, config, algorithm, precision in plan:  # one run of each, then the next
        model, parameters = models[config]
        length = CONFIGS[config]
        if args.max_completion_length:
            length = args.max_completion_length
        run_dir = work_dir / f"{config}-{algorithm}-{precision}-{repeat}"
        G = args.num_generations if algorithm in GROUPED else 1
        spec = asdict(args) | RLOO_SCHEDULE  # the child reads its steps, batch, β and --phases
        spec |= dict(algorithm=algorithm, output_dir=str(run_dir), model=model, num_generations=G)
        spec |= dict(max_completion_length=length, bf16=precision == "bf16")
        spec["argv"] = script_argv(args, algorithm, model, data_file, length, run_dir, precision)
        result = run_child(args, spec, run_dir)
        run = dict(config=config, precision=precision, repeat=repeat, parameters=parameters)
        runs.append(run | {"algorithm": algorithm, "max_completion_length": length} | result)
        step = f"{result['median_step_time_s']:.3f} s/step"
        peak = f"peak RSS {result['peak_rss_mb']:.0f} MB"
        which = f"{config:>9} {algorithm:>9} {precision}"
        print(f"[{repeat + 1}/{args.repeats}] {which}: {step}, {peak}", flush=True)
    summary = summarize(runs)
    cuda = torch.cuda.is_available()
    print_table(summary, cuda)
    for row in [r for r in summary if "phases" in r]:
        print_phases(row)
    machine = {
        "device": torch.cuda.get_device_name() if cuda else cpu_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average_at_end": os.getloadavg(),
    }
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    report = {"settings": asdict(args), "machine": machine, "summary": summary, "runs": runs}
    Path(args.output_json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output_json}")


def cli(argv: list[str] | None = None):
    """`python benchmarks/bench.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    try:
        main(parse_args(Args, argv))
    except BadInput as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
