# TRL 1.16's own GRPOTrainer._compute_loss (GSPO, CISPO, delta, the entropy bonus, the bias-corrected KL), called on
# a stand-in trainer that returns fixed log-probs and entropies (one process, one micro-batch, no vLLM), over two
# updates of one batch: the first on-policy (ρ ≡ 1), the second after an SGD step and a fixed random move of θ, so that
# the ratios differ from 1 on both sides of the clip range, with advantages of either sign. The policy is a table of
# logits θ (B, T, V); its log-probs and entropies are softmax(θ)'s.
#     python tests/data/trl_1_16_grpo_objectives.py > tests/data/trl_1_16_grpo_objectives.json   (with trl==1.16.*)
import json
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

torch.manual_seed(0)
B, T, V, max_completion_length, lr = 8, 5, 6, 6, 4.0
logits = torch.randn(B, T, V)
tokens = torch.randint(V, (B, T))
move = 0.4 * torch.randn(B, T, V)  # θ's fixed move after the first update
ref_logprobs = torch.log_softmax(logits + 0.5 * torch.randn(B, T, V), -1).gather(
    -1, tokens[..., None]
)[..., 0]
mask = torch.tensor(
    [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]] * 2
).float()
advantages = torch.tensor([1.2, -0.4, 0.3, -1.1, 0.9, -0.2, 0.5, -1.2])
CONFIGS = {
    "gspo_grpo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon_high=0.2),
    "gspo_dapo": dict(loss_type="dapo", importance_sampling_level="sequence", epsilon_high=0.28),
    "gspo_beta": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
    "cispo": dict(loss_type="cispo", epsilon_high=1.2),
    "delta": dict(loss_type="dapo", delta=1.2, epsilon_high=0.28),
    "entropy_coef": dict(loss_type="dr_grpo", entropy_coef=0.1),
    "kl_bias_corrected": dict(loss_type="bnpo", beta=0.04),
    "kl_uncorrected": dict(loss_type="bnpo", beta=0.04, use_bias_correction_kl=False),
}


def trainer(
    loss_type,
    importance_sampling_level="token",
    epsilon_high=0.2,
    beta=0.0,
    delta=None,
    entropy_coef=0.0,
    use_bias_correction_kl=True,
):
    args = SimpleNamespace(
        use_bias_correction_kl=use_bias_correction_kl, delta=delta, steps_per_generation=1
    )
    accelerator = SimpleNamespace(
        num_processes=1, sync_gradients=True, gather=lambda x: x, reduce=lambda x, **_: x
    )
    return SimpleNamespace(
        args=args,
        accelerator=accelerator,
        loss_type=loss_type,
        importance_sampling_level=importance_sampling_level,
        epsilon_low=0.2,
        epsilon_high=epsilon_high,
        beta=beta,
        entropy_coef=entropy_coef,
        _entropy_bonus_enabled=entropy_coef != 0.0,
        use_adaptive_entropy=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        aux_loss_enabled=False,
        max_completion_length=max_completion_length,
        _metrics={"train": defaultdict(list)},
    )


def trl_loss(stub, theta, old_logprobs):
    logp = torch.log_softmax(theta, -1)
    logprobs = logp.gather(-1, tokens[..., None])[..., 0]
    entropies = -(logp.exp() * logp).sum(-1)
    stub._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logprobs, entropies, None)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1),
        "completion_ids": tokens,
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": logprobs.detach() if old_logprobs is None else old_logprobs,
        "ref_per_token_logps": ref_logprobs,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(stub, None, inputs), logprobs.detach()


out = {
    "logits": logits.tolist(),
    "tokens": tokens.tolist(),
    "ref": ref_logprobs.tolist(),
    "mask": mask.tolist(),
}
out |= {
    "advantages": advantages.tolist(),
    "move": move.tolist(),
    "lr": lr,
    "max_completion_length": max_completion_length,
}
for name, config in CONFIGS.items():
    stub = trainer(**config)
    theta = logits.clone().requires_grad_()
    record = {"config": config, "losses": [], "grads": []}
    old_logprobs = None
    for _ in range(
        2
    ):  # num_iterations 2: π_old is the policy that sampled, θ moves after each update
        loss, logprobs = trl_loss(stub, theta, old_logprobs)
        old_logprobs = logprobs if old_logprobs is None else old_logprobs
        loss.backward()
        record["losses"].append(loss.item())
        record["grads"].append(theta.grad.tolist())
        with torch.no_grad():
            theta += move - lr * theta.grad
        theta.grad = None
    record["metrics"] = {key: values[-1] for key, values in stub._metrics["train"].items()}
    out[name] = record
print(json.dumps(out))
