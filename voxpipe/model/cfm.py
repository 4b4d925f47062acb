"""Conditional flow matching around the local DiT: the training loss and the Euler sampler.

The loss draws its random numbers in exactly upstream's order and shapes (condition-dropout
mask, noisy-condition mask, condition noise, two time draws, the r!=t mask, the noise z), so
under the same `torch.manual_seed` it equals upstream's. A `torch.Generator` can replace the
global RNG (a fixed-seed evaluation then sees the same t, z and dropout every time), and
condition dropout can be switched off; the dropout mask is still drawn so that switching it
off leaves every other draw unchanged. All loss math and sampler state are fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

from voxpipe.model.config import CfmConfig
from voxpipe.model.locdit import LocalDiT


def active_rows(weight: torch.Tensor) -> torch.Tensor:
    """Flat indices of the rows with weight > 0, at least one (row 0): every rank then still runs
    each FSDP-sharded tower, whose collectives need all ranks. On an accelerator this reads the
    count back to the host (a sync): the trainer computes the rows from its host batch instead."""
    rows = torch.nonzero(weight.reshape(-1) > 0).squeeze(1)
    return rows if rows.numel() else rows.new_zeros(1)


# upstream's log-normal time distribution: t = sigmoid(N(-0.4, 1))
T_MEAN = -0.4
T_STD = 1.0


class ConditionalFlowMatching(nn.Module):
    """`forward` is the training loss (so FSDP hooks see it); `sample` generates one patch per row."""

    def __init__(self, in_channels: int, cfm: CfmConfig, estimator: LocalDiT, mean_mode: bool = False):
        super().__init__()
        if cfm.t_scheduler not in ("log-norm", "uniform"):
            raise ValueError(f"unsupported t_scheduler {cfm.t_scheduler!r} (log-norm or uniform)")
        self.in_channels = in_channels
        self.cfm = cfm
        self.mean_mode = mean_mode
        self.estimator = estimator

    # -- training -------------------------------------------------------------------------------
    def _sample_r_t(
        self, n: int, ratio_r_neq_t: float, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def draw(fn):
            return fn(n, generator=generator, device=device, dtype=torch.float32)

        if self.cfm.t_scheduler == "log-norm":
            r = torch.sigmoid(draw(torch.randn) * T_STD + T_MEAN)
            t = torch.sigmoid(draw(torch.randn) * T_STD + T_MEAN)
        else:
            r, t = draw(torch.rand), draw(torch.rand)
        differ = draw(torch.rand) < ratio_r_neq_t
        return torch.where(differ, torch.minimum(r, t), t), torch.where(differ, torch.maximum(r, t), t)

    def forward(
        self,
        x1: torch.Tensor,
        mu: torch.Tensor,
        cond: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        progress: float = 0.0,
        *,
        generator: torch.Generator | None = None,
        cond_dropout: bool = True,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flow-matching loss (fp32 scalar).

        x1 [N, C, P] target patches, mu [N, k*hidden] LM conditions, cond [N, C, P'] previous
        patches, tgt_mask [N, 1, P] 1 where the loss counts, progress in [0, 1] of training.
        rows: indices of the rows with loss weight (`active_rows`), and then mu holds only theirs
        ([len(rows), k*hidden]); None = found from tgt_mask.
        """
        cfm = self.cfm
        n = x1.size(0)
        device = x1.device
        x1 = x1.float()

        keep = None
        if cfm.training_cfg_rate > 0:
            keep = torch.rand(n, generator=generator, device=device) > cfm.training_cfg_rate
        if cond is None:
            cond = torch.zeros_like(x1)

        low, high = cfm.noise_cond_prob_range
        noisy = torch.rand(n, generator=generator, device=device) > 1.0 - (low + progress * (high - low))
        cond_noise = torch.randn(cond.shape, generator=generator, device=device, dtype=torch.float32)
        if cfm.noise_cond_scale != 0:
            cond = cond.float() + noisy.view(-1, 1, 1) * cond_noise * cfm.noise_cond_scale

        ratio = 0.0
        if self.mean_mode:
            ratio = cfm.ratio_r_neq_t_range[0] + progress * (
                cfm.ratio_r_neq_t_range[1] - cfm.ratio_r_neq_t_range[0]
            )
        r, t = self._sample_r_t(n, ratio, device, generator)
        z = torch.randn(x1.shape, generator=generator, device=device, dtype=torch.float32)

        # Every draw above covers all N rows (RNG parity); the DiT then runs only on rows that
        # carry loss weight: text, reference and padding rows would add exact zeros. One row is
        # kept when none count, so every rank still runs the FSDP-sharded DiT.
        weights = None if tgt_mask is None else tgt_mask.squeeze(1).float()
        if rows is None and weights is not None:
            rows = active_rows(weights.amax(dim=1))
            mu = mu.index_select(0, rows)
        if rows is not None:
            x1, cond, z, r, t = (x.index_select(0, rows) for x in (x1, cond, z, r, t))
            weights = None if weights is None else weights.index_select(0, rows)
            keep = None if keep is None else keep.index_select(0, rows)
        if keep is not None and cond_dropout:
            mu = mu * keep.view(-1, 1)
        t3 = t.view(-1, 1, 1)
        y = (1 - t3) * x1 + t3 * z
        v = z - x1

        if self.mean_mode:

            def velocity(y_, r_, t_):
                return self.estimator(y_, mu, t_, cond, t_ - r_).float()

            # forward-mode AD through attention needs the math SDPA backend
            with sdpa_kernel(SDPBackend.MATH):
                u_pred, dudt = jvp(velocity, (y, r, t), (v, torch.zeros_like(r), torch.ones_like(t)))
            u_tgt = v - (t - r).view(-1, 1, 1) * dudt
        else:
            u_pred = self.estimator(y, mu, t, cond, t - r).float()
            u_tgt = v

        losses = F.mse_loss(u_pred, u_tgt.detach(), reduction="none").mean(dim=1)  # [rows, P]
        if weights is None:
            return losses.mean()
        # upstream's adaptive weighting with p=0 reduces to the mask itself
        return (weights * losses).sum() / torch.clamp(weights.sum(), min=1.0)

    # -- generation -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        mu: torch.Tensor,
        n_timesteps: int | list[int],
        patch_size: int,
        cond: torch.Tensor,
        temperature: float = 1.0,
        cfg_value: float | torch.Tensor = 1.0,
        sway_sampling_coef: float = 1.0,
        use_cfg_zero_star: bool = True,
        generator: torch.Generator | list[torch.Generator | None] | None = None,
    ) -> torch.Tensor:
        """Euler integration from noise (t=1) to data (t=0) with sway-sampled steps and CFG-Zero*.

        mu [B, k*hidden], cond [B, C, P'] -> patch [B, C, patch_size] (fp32). Each of `n_timesteps`,
        `cfg_value` ([B] tensor) and `generator` is one for the batch or one per row: a row's patch then
        does not depend on its batch-mates (a row with fewer steps than another sits out the others' last
        ones unchanged).
        """
        b = mu.size(0)
        device = mu.device
        shape = (self.in_channels, patch_size)
        if isinstance(generator, list):
            x = torch.stack([torch.randn((1, *shape), generator=g, device=device)[0] for g in generator])
        else:
            x = torch.randn((b, *shape), generator=generator, device=device)
        x = x * temperature
        if isinstance(cfg_value, torch.Tensor):
            cfg_value = cfg_value.to(device=device, dtype=torch.float32).view(-1, 1, 1)
        steps = n_timesteps if isinstance(n_timesteps, list) else [n_timesteps] * b
        plans = {n: self._euler_plan(n, sway_sampling_coef, use_cfg_zero_star, device) for n in set(steps)}
        mu_pair = torch.cat((mu, torch.zeros_like(mu)))
        cond_pair = torch.cat((cond, cond))
        for step in range(max(steps)):
            now = [plans[n][step] if step < n else None for n in steps]
            runs = [p is not None and p[2] for p in now]
            if not any(runs):
                continue
            idle = torch.zeros((), device=device)
            t = torch.stack([p[0] if p is not None else idle for p in now])
            dt = torch.stack([p[1] if p is not None else idle for p in now])
            t_pair = torch.cat((t, t))
            dt_pair = torch.cat((dt, dt)) if self.mean_mode else torch.zeros_like(t_pair)
            out = self.estimator(torch.cat((x, x)), mu_pair, t_pair, cond_pair, dt_pair).float()
            cond_v, uncond_v = out[:b], out[b:]
            scale = self._cfg_zero_scale(cond_v, uncond_v) if use_cfg_zero_star else 1.0
            moved = x - dt.view(-1, 1, 1) * (uncond_v * scale + cfg_value * (cond_v - uncond_v * scale))
            x = moved if all(runs) else torch.where(torch.tensor(runs, device=device).view(-1, 1, 1),
                                                    moved, x)
        return x

    @staticmethod
    def _euler_plan(n: int, sway: float, cfg_zero_star: bool, device: torch.device
                    ) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        """(t, dt, whether the step moves x) of each of n Euler steps, sway-sampled; t accumulates as
        upstream's loop does. CFG-Zero*: the first few steps (at least one) keep x unchanged instead of
        trusting the velocity estimate at pure noise."""
        t_span = torch.linspace(1, 0, n + 1, device=device)
        t_span = t_span + sway * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)
        zero_init_steps = max(1, int(len(t_span) * 0.04))
        plan = []
        t, dt = t_span[0], t_span[0] - t_span[1]
        for step in range(1, n + 1):
            plan.append((t, dt, not (cfg_zero_star and step <= zero_init_steps)))
            t = t - dt
            if step < n:
                dt = t - t_span[step + 1]
        return plan

    @staticmethod
    def _cfg_zero_scale(cond_v: torch.Tensor, uncond_v: torch.Tensor) -> torch.Tensor:
        """Per-row projection coefficient of the conditional onto the unconditional velocity."""
        pos, neg = cond_v.reshape(cond_v.size(0), -1), uncond_v.reshape(uncond_v.size(0), -1)
        st = (pos * neg).sum(dim=1, keepdim=True) / ((neg**2).sum(dim=1, keepdim=True) + 1e-8)
        return st.view(-1, *([1] * (cond_v.dim() - 1)))
