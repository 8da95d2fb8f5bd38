"""Train the participatory scorer and the balancer on cached scene tensors.

The query encoder and everything before the participatory scorer are frozen (and precomputed,
see data.py), so a CPU step costs a few 32x32 convs per caption. On a GPU the same step runs
under torch.compile and bf16 autocast.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from .data import Dataset
from .evaluate import relevance_from_fixed


@dataclass(frozen=True)
class TrainConfig:
    variant: str = "arrcoc-texture"
    scenes: int = 3000  # training scenes (~3 captions each)
    eval_scenes: int = 500  # held-out scenes, captioned with held-out phrasings
    steps: int = 2500
    batch: int = 32
    lr: float = 3e-3  # AdamW, cosine decay after a short warmup
    warmup: int = 100
    weight_decay: float = 0.05
    query_noise: float = 0.02  # Gaussian noise on the (unit) query embeddings: paraphrase robustness
    extra_phrasings: int = 2  # extra training captions per object from the extended vocabulary (scenes.py)
    knowing: int = 4  # captions per scene for the other ways of knowing (detail, salience, plain, edges)
    # share of training scenes with a large area of one colour, captioned by it: off by default, as
    # fine-tuning the bundled weights with it diverged under bf16 (docs/model.md, Training)
    colour_regions: float = 0.0
    logit_scale: float = 20.0  # maps are in [0, 1]: scale them to softmax logits in the loss
    seed: int = 0
    threads: int = 2  # CPU threads: the machine is shared
    workers: int = 1  # processes drawing scenes (the data does not depend on it)
    device: str = "cpu"
    compile: bool = True  # CUDA only: torch.compile the loss step
    bf16: bool = True  # CUDA only: bf16 autocast
    # > 0: fit the whole `arrcoc train` run (data, training, evaluation) into this many seconds:
    # the step rate measured over steps 100-300 sets how many steps fit into what is left, and the
    # cosine schedule ends there (the run is then not reproducible step for step)
    time_limit_s: float = 0.0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pointing_loss(scores: Tensor, hit: Tensor, scale: float) -> Tensor:
    """-log of the softmax mass on the target cells (multiple-instance: any of them will do),
    averaged over the rows that have a target (a row of all-False cells asks nothing)."""
    logp = F.log_softmax(scores.flatten(1).float() * scale, dim=1)
    target = hit.flatten(1)
    inside = torch.where(target, logp, torch.full_like(logp, -1e4))
    has = target.any(dim=1)
    per_row = torch.where(has, -torch.logsumexp(inside, dim=1), torch.zeros_like(logp[:, 0]))
    return per_row.sum() / has.sum().clamp_min(1)


def learnable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return list(model.participatory.parameters()) + list(model.balancer.parameters())


def make_step(model: nn.Module, cfg: TrainConfig, device: torch.device):
    """One loss function; compiled with bf16 autocast on CUDA, plain fp32 on CPU."""
    use_cuda = device.type == "cuda"

    def loss_fn(texture: Tensor, fixed: Tensor, query: Tensor, hit: Tensor, part_hit: Tensor) -> Tensor:
        asks_part = part_hit.flatten(1).any(dim=1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_cuda and cfg.bf16):
            # a caption for another way of knowing ("the most detailed part") does not train the
            # participatory scorer, not even through the balanced map: the balancer has to find
            # the scorer that answers it, instead of the participatory scorer learning to imitate it
            relevance, part = relevance_from_fixed(model, texture, fixed, query, detach_part=~asks_part)
        # the participatory map is trained directly on its own targets (it must find the object on
        # its own, it is reported as a "way of knowing"), and every caption trains the balanced map:
        # the balancer learns which scorer, or which mixture, answers which query
        return pointing_loss(part, part_hit, cfg.logit_scale) + pointing_loss(relevance, hit, cfg.logit_scale)

    return torch.compile(loss_fn, fullgraph=True) if use_cuda and cfg.compile else loss_fn


def train(
    model: nn.Module, data: Dataset, cfg: TrainConfig, progress: bool = True, budget_s: float = 0.0
) -> dict:
    """Train in place; return a log {"losses": [...], "seconds": s, "steps_run": n}. Seeded and
    reproducible; budget_s > 0: at most about this many seconds (fewer steps, shorter schedule)."""
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    model.to(device).train()
    for p in model.parameters():
        p.requires_grad_(False)
    params = learnable_parameters(model)
    for p in params:
        p.requires_grad_(True)
    data = data.to(device)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = [cfg.steps]  # the time limit may shorten it, and the schedule with it
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + np.cos(np.pi * min(s, total[0]) / total[0])),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    step_fn = make_step(model, cfg, device)
    losses: list[float] = []
    skipped = torch.zeros((), dtype=torch.int64, device=device)  # steps whose gradient was not finite
    t0 = time.perf_counter()
    t_rate = t0
    bar = tqdm(range(cfg.steps), desc="train", unit="step", disable=not progress)
    for step in bar:
        if step >= total[0]:
            break
        if budget_s > 0 and step in (100, 300):  # after compilation: time steps 100-300
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            if step == 300:
                rate = (now - t_rate) / 200
                total[0] = max(301, min(cfg.steps, int((budget_s - (now - t0)) / rate) + 300))
            t_rate = now
        rows = torch.randint(len(data), (cfg.batch,), generator=gen).to(device)
        scene = data.scene[rows]
        query = data.query[rows]
        if cfg.query_noise > 0:  # seeded like everything else; a new phrasing moves the embedding a bit
            noise = torch.randn(query.shape, generator=gen).to(device)
            query = F.normalize(query + cfg.query_noise * noise, dim=-1)
        loss = step_fn(data.texture[scene], data.fixed[scene], query, data.hit[rows], data.part_hit[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        skipped += _drop_nonfinite_step(params, torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()
        sched.step()
        if step % 25 == 0 or step == total[0] - 1:
            losses.append(round(float(loss.detach()), 4))  # a host sync, but only every 25 steps
            bar.set_postfix(loss=f"{losses[-1]:.3f}", skipped=int(skipped))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:  # never save weights that diverged
        raise FloatingPointError(
            f"training diverged ({len(bad)} non-finite parameters, {bad[:3]} ...);"
            " try a lower --lr or --no-bf16"
        )
    return {
        "losses": losses,
        "seconds": round(time.perf_counter() - t0, 1),
        "config": asdict(cfg),
        "steps_run": total[0],
        "steps_skipped": int(skipped),
    }


def _drop_nonfinite_step(params: list[nn.Parameter], grad_norm: Tensor) -> Tensor:
    """Zero every gradient when their norm is not finite; 1 when it did (a tensor: no host sync).

    One non-finite gradient element makes the clipping norm NaN or inf, and the clipping then
    multiplies every gradient by NaN (or an inf one by 0): one bad batch would turn every
    parameter non-finite at once, whichever module it came from. A zeroed step still moves the
    weights by AdamW's momentum and decay, which are finite. Finite steps are left bit for bit."""
    bad = ~torch.isfinite(grad_norm)
    grads = [p.grad for p in params if p.grad is not None]
    torch._foreach_mul_(grads, torch.where(bad, 0.0, 1.0).to(grads[0].dtype))
    for g in grads:
        g.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return bad.to(torch.int64)
