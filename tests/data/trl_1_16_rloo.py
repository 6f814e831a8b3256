# TRL 1.16 RLOOTrainer lines (_generate_and_score_completions, _compute_loss), verbatim, on fixed inputs:
#     python tests/data/trl_1_16_rloo.py > tests/data/trl_1_16_rloo.json   (in an environment with trl==1.16.*)
import json
import math

import torch
from trl.trainer.utils import nanstd

torch.manual_seed(0)
G, B, T = 4, 8, 5
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
completion_mask = torch.tensor(
    [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]] * 2
).float()
per_token_logps = old_per_token_logps + torch.randn(B, T) * 0.1
out = {
    "old": old_per_token_logps.tolist(),
    "ref": ref_per_token_logps.tolist(),
    "new": per_token_logps.tolist(),
    "mask": completion_mask.tolist(),
}
for beta, normalize in ((0.0, False), (0.1, False), (0.1, True)):
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    if beta != 0.0:
        per_token_kl = old_per_token_logps - ref_per_token_logps
        kl = (per_token_kl * completion_mask).sum(-1)
        rewards = rewards - beta * kl
    grouped_rewards = rewards.view(-1, G)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
    baselines = baselines.view(-1)
    advantages = rewards - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # _compute_loss (epsilon 0.2, epsilon_high 0.28)
    logps = (per_token_logps * completion_mask).sum(1)
    old_logps = (old_per_token_logps * completion_mask).sum(1)
    coef_1 = torch.exp(logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    loss = (-torch.min(coef_1 * advantages, coef_2 * advantages)).mean()
    out[f"beta={beta},normalize={normalize}"] = {
        "advantages": advantages.tolist(),
        "loss": loss.item(),
    }
print(json.dumps(out))
