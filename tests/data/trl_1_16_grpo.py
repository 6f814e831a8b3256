# TRL 1.16 GRPOTrainer lines (_generate_and_score_completions with sum_then_normalize, _compute_loss with token-level
# importance sampling, one process, one micro-batch), verbatim, on fixed inputs:
#     python tests/data/trl_1_16_grpo.py > tests/data/trl_1_16_grpo.json   (in an environment with trl==1.16.*)
import json
import math

import torch
from trl.trainer.utils import nanstd

torch.manual_seed(0)
G, B, T, max_completion_length = 4, 8, 5, 6
rewards_per_func = torch.tensor(
    [
        [1.0, 0.2],
        [0.0, 0.2],
        [1.0, 0.0],
        [0.0, 0.0],
        [1.0, 0.2],
        [math.nan, math.nan],
        [0.0, 0.2],
        [1.0, 0.2],
    ]
)
reward_weights = torch.tensor([1.0, 0.5])
old_per_token_logps = -torch.rand(B, T) * 2
ref_per_token_logps = old_per_token_logps + torch.randn(B, T) * 0.3
per_token_logps = old_per_token_logps + torch.randn(B, T) * 0.1
mask = torch.tensor(
    [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]] * 2
).float()
out = {
    "old": old_per_token_logps.tolist(),
    "ref": ref_per_token_logps.tolist(),
    "new": per_token_logps.tolist(),
}
out["mask"] = mask.tolist()
for scale_rewards in ("group", "batch", "none"):
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, G), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(G, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, G), dim=1)
        std_rewards = std_rewards.repeat_interleave(G, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    out[f"advantages/{scale_rewards}"] = advantages.tolist()
advantages = torch.tensor(out["advantages/group"]).unsqueeze(1)
for beta in (0.0, 0.04):
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        log_ratio = per_token_logps - old_per_token_logps
        coef_1 = torch.exp(log_ratio)
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps)
            - 1
        )
        coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * per_token_kl
        if loss_type == "grpo":
            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        elif loss_type == "bnpo":
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        elif loss_type == "dr_grpo":
            loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
        else:  # dapo: num_items_in_batch is the batch's completion tokens
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        out[f"loss/{loss_type}/beta={beta}"] = loss.item()
print(json.dumps(out))
