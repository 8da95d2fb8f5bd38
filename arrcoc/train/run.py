"""`arrcoc train` end to end: data, untrained baseline, training, evaluation, weights, report."""

from __future__ import annotations

import datetime as dt
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..query import QueryEncoder
from ..registry import create_model
from ..result import SCORER_NAMES
from ..weights import file_sha256, save_weights, tensors_sha256
from .data import DATA_VERSION, HIT_COVERAGE, Dataset, build_dataset
from .evaluate import CATEGORIES, evaluate
from .scenes import SceneConfig
from .trainer import TrainConfig, seed_everything, train

EVAL_SEED_OFFSET = 1_000_003  # evaluation scenes come from another seed: never seen in training
EVAL_RESERVE_S = 40  # with a time limit: seconds kept for evaluation and writing after training
EVAL_KNOWING = 2  # captions per held-out scene for the other ways of knowing (detail, salience, plain, edges)


def weights_version(model: torch.nn.Module) -> str:
    """'YYYY.MM-<first 8 hex of the tensors' hash>': when, and exactly which weights."""
    state = {k: v for k, v in model.state_dict().items()}
    return f"{dt.datetime.now(dt.UTC):%Y.%m}-{tensors_sha256(state)[:8]}"


def _subset(data: Dataset, n: int) -> Dataset:
    return data.subset(torch.arange(min(n, len(data))))


def heldout_sets(
    model, encoder, cfg: TrainConfig, cache_dir: Path | None, progress: bool
) -> tuple[Dataset, Dataset]:
    """The held-out scenes (another seed) captioned with held-out phrasings, and the same scenes
    captioned with training phrasings: the pair separates new scenes from new words. Both add
    EVAL_KNOWING captions per scene for the other ways of knowing, from their own generator, so the
    scenes and their object captions are those of earlier reports."""
    seed = cfg.seed + EVAL_SEED_OFFSET
    return tuple(
        build_dataset(
            model,
            encoder,
            cfg.eval_scenes,
            seed,
            scenes,
            cache_dir=cache_dir,
            desc="held-out scenes",
            workers=cfg.workers,
            progress=progress,
        )
        for scenes in (
            SceneConfig(heldout_phrasing=True, knowing=EVAL_KNOWING),
            SceneConfig(knowing=EVAL_KNOWING),
        )
    )


def run_training(
    cfg: TrainConfig,
    out: Path,
    cache_dir: Path | None = None,
    encoder_source: str | None = None,
    progress: bool = True,
    init: Path | None = None,
) -> dict:
    """Train cfg.variant, write weights to `out` and the report beside it; return the report.

    init: start from these weights (fine-tuning) instead of a seeded random initialisation.
    """
    t0 = time.perf_counter()
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    model = create_model(cfg.variant, weights=None, device=device)
    baseline = model
    if init is not None:
        model = create_model(cfg.variant, weights=init, device=device)
    init_version = getattr(model, "weights_version", "untrained") if init is not None else None
    encoder = QueryEncoder(encoder_source, cache_size=64, device=str(device))
    train_scenes = SceneConfig(
        extra_phrasings=cfg.extra_phrasings, knowing=cfg.knowing, colour_regions=cfg.colour_regions
    )
    train_data = build_dataset(
        model,
        encoder,
        cfg.scenes,
        cfg.seed,
        train_scenes,
        cache_dir=cache_dir,
        desc="training scenes",
        workers=cfg.workers,
        progress=progress,
    )
    eval_data, eval_seen = heldout_sets(model, encoder, cfg, cache_dir, progress)
    t_data = time.perf_counter() - t0
    untrained = evaluate(baseline, eval_data.to(device))
    budget = cfg.time_limit_s - (time.perf_counter() - t0) - EVAL_RESERVE_S if cfg.time_limit_s > 0 else 0.0
    if cfg.time_limit_s > 0 and budget < 30:
        raise TimeoutError(
            f"--time-limit {cfg.time_limit_s:.0f} s leaves {budget:.0f} s to train after the data"
        )
    log = train(model, train_data, cfg, progress=progress, budget_s=budget)
    model = model.cpu().float()
    trained = evaluate(model, eval_data)
    train_acc = evaluate(model, _subset(train_data, 2000))["overall"]
    seen = evaluate(model, eval_seen)
    seen_phrasing = seen["overall"]
    version = weights_version(model)
    save_weights(
        model, out, cfg.variant, version, extra={"trained_by": "arrcoc train", "seed": str(cfg.seed)}
    )
    sha = file_sha256(out)
    out.with_name(out.name + ".sha256").write_text(f"{sha}  {out.name}\n")
    report = {
        "variant": cfg.variant,
        "weights_version": version,
        "weights_file": out.name,
        "sha256": sha,
        "metric": "pointing game: top-1 cell of the final relevance map inside the named object"
        f" (a cell counts when >= {HIT_COVERAGE:.0%} of it is the object, or it is among the"
        " object's best-covered cells when no cell is covered that much)",
        "eval": "held-out scenes (another seed) with held-out caption frames and synonyms",
        "accuracy": {"trained": trained, "untrained": untrained},
        "train_accuracy": train_acc,
        "heldout_scenes_training_phrasings": seen_phrasing,
        "heldout_scenes_training_phrasings_all_captions": seen["all_captions"]["accuracy"],
        "data": {
            "train_scenes": cfg.scenes,
            "train_captions": len(train_data),
            "train_captions_by_kind": _count_kinds(train_data),
            "eval_scenes": cfg.eval_scenes,
            "eval_captions": len(eval_data),
        },
        "settings": {"train": asdict(cfg), "scenes": asdict(train_scenes)},
        "seed": cfg.seed,
        "trained_on": DATA_VERSION,
        "initialised_from": init_version or "seeded random initialisation",
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0)
            if device.type == "cuda"
            else platform.processor() or "cpu",
            "precision": _precision(cfg, device),
        },
        "time_s": {
            "data": round(t_data, 1),
            "train": log["seconds"],
            "total": round(time.perf_counter() - t0, 1),
        },
        "steps_run": log["steps_run"],
        "steps_skipped": log["steps_skipped"],  # steps whose gradient was not finite (trainer.py)
        "losses": log["losses"],
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    report_paths(out)[0].write_text(json.dumps(report, indent=2) + "\n")
    report_paths(out)[1].write_text(markdown_report(report))
    return report


def reevaluate(
    weights: Path,
    cfg: TrainConfig,
    cache_dir: Path | None = None,
    encoder_source: str | None = None,
    progress: bool = True,
) -> dict:
    """Score existing weights on today's held-out set; update the report beside them (or start one)."""
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    untrained_model = create_model(cfg.variant, weights=None)
    model = create_model(cfg.variant, weights=weights)
    encoder = QueryEncoder(encoder_source, cache_size=64)
    eval_data, eval_seen = heldout_sets(model, encoder, cfg, cache_dir, progress)
    js, md = report_paths(weights)
    report = json.loads(js.read_text()) if js.is_file() else {"variant": cfg.variant, "settings": {}}
    seen = evaluate(model, eval_seen)
    report.update(
        {
            "weights_version": model.weights_version,
            "weights_file": weights.name,
            "sha256": file_sha256(weights),
            "accuracy": {
                "trained": evaluate(model, eval_data),
                "untrained": evaluate(untrained_model, eval_data),
            },
            "heldout_scenes_training_phrasings": seen["overall"],
            "heldout_scenes_training_phrasings_all_captions": seen["all_captions"]["accuracy"],
            "evaluated": {
                "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "scenes": DATA_VERSION,
                "device": "cpu",
                "eval_seed": cfg.seed + EVAL_SEED_OFFSET,
            },
        }
    )
    report.setdefault("data", {}).update({"eval_scenes": cfg.eval_scenes, "eval_captions": len(eval_data)})
    js.write_text(json.dumps(report, indent=2) + "\n")
    md.write_text(markdown_report(report))
    return report


def _count_kinds(data: Dataset) -> dict[str, int]:
    kinds = data.meta["kind"]
    return {k: kinds.count(k) for k in dict.fromkeys(sorted(kinds))}


def _precision(cfg: TrainConfig, device: torch.device) -> str:
    if device.type != "cuda":
        return "fp32, eager"
    return f"{'bf16 autocast' if cfg.bf16 else 'fp32'}, {'torch.compile' if cfg.compile else 'eager'}"


def report_paths(weights: Path) -> tuple[Path, Path]:
    stem = weights.name.removesuffix(".safetensors")
    return weights.with_name(stem + ".report.json"), weights.with_name(stem + ".report.md")


def markdown_report(r: dict) -> str:
    tr, un = r["accuracy"]["trained"], r["accuracy"]["untrained"]
    s = r["settings"]["train"]
    lines = [
        f"# Training report: {r['variant']} {r['weights_version']}",
        "",
        f"{r['metric']}.",
        f"Evaluated on {r['data']['eval_captions']} captions of {r['data']['eval_scenes']} {r['eval']}.",
        "",
        "| | trained | untrained |",
        "| --- | ---: | ---: |",
        f"| **overall** | **{tr['overall']:.3f}** | {un['overall']:.3f} |",
        f"| participatory map alone | {tr['participatory_only']:.3f} | {un['participatory_only']:.3f} |",
        f"| held-out scenes, training phrasings | {r['heldout_scenes_training_phrasings']:.3f} | |",
        *(
            [f"| training captions (first 2000) | {r['train_accuracy']:.3f} | |"]
            if "train_accuracy" in r
            else []
        ),
        *(
            [
                f"| every caption, other ways of knowing included ({tr['all_captions']['n']}) |"
                f" {tr['all_captions']['accuracy']:.3f} | {un['all_captions']['accuracy']:.3f} |"
            ]
            if "all_captions" in tr
            else []
        ),
        "",
        "Rows above are over the object captions (the kinds of the first table below, as in earlier reports);"
        " the other ways of knowing are scored in the kind table: detail = a top-1 cell among the information"
        " map's top 2%, salience = among the perspectival map's top 2%, plain = among the 5% of cells lowest in"
        " both, edges = on the named object's outline.",
    ]
    if "balance" in tr:
        lines += [
            "",
            "## Balancer weights (held-out captions)",
            "",
            "Effective weights information / perspectival / participatory at the default scales: mean ± std"
            " (10th–90th percentile), and the share of captions where each scorer has the largest weight.",
            "",
            "| kind | n | information | perspectival | participatory | largest: inf / persp / part |",
            "| --- | ---: | --- | --- | --- | --- |",
        ]
        for g, b in tr["balance"].items():
            cells = [
                f"{b[n]['mean']:.2f} ± {b[n]['std']:.2f} ({b[n]['p10']:.2f}–{b[n]['p90']:.2f})"
                for n in SCORER_NAMES
            ]
            largest = " / ".join(f"{b['largest'][n]:.2f}" for n in SCORER_NAMES)
            lines.append(f"| {g} | {b['n']} | {' | '.join(cells)} | {largest} |")
        if "balance" in un:
            a = un["balance"]["all captions"]
            lines += [
                "",
                "Untrained (seeded init), all captions: "
                + ", ".join(f"{n} {a[n]['mean']:.2f} ± {a[n]['std']:.2f}" for n in SCORER_NAMES)
                + ".",
            ]
    for cat in CATEGORIES:
        lines += ["", f"## By {cat}", "", "| | n | trained | untrained |", "| --- | ---: | ---: | ---: |"]
        for value, d in tr["by"][cat].items():
            lines.append(
                f"| {value} | {d['n']} | {d['accuracy']:.3f} | {un['by'][cat][value]['accuracy']:.3f} |"
            )
    lines += [
        "",
        "## Settings",
        "",
        f"- seed {r['seed']}; {s['scenes']} training scenes ({r['data']['train_captions']} captions),"
        f" {s['steps']} steps of batch {s['batch']}, AdamW lr {s['lr']}, logit scale {s['logit_scale']},"
        f" query noise {s.get('query_noise', '?')}, extra phrasings per object {s.get('extra_phrasings', 0)},"
        f" captions for the other ways of knowing per scene {s.get('knowing', 0)},"
        f" share of scenes with a colour region {s.get('colour_regions', 0)}"
        + (
            f"; {r['steps_run']} steps run (time limit)"
            if r.get("steps_run", s["steps"]) != s["steps"]
            else ""
        ),
        f"- initialised from {r.get('initialised_from', 'a seeded random initialisation')};"
        f" trained on scene generator {r.get('trained_on', '?')}",
        *(
            [
                f"- base weights {r['base']['version']}: `{r['base']['trained_by']}` on {r['base']['device']}"
                f" (generator {r['base']['trained_on']}); held-out {r['base']['heldout_accuracy_same_eval_set']:.3f}"
                " on this evaluation set before fine-tuning"
            ]
            if "base" in r
            else []
        ),
        f"- device {r['environment']['device']} ({r['environment']['precision']}), torch {r['environment']['torch']}",
        f"- time: data {r['time_s']['data']} s, training {r['time_s']['train']} s, total {r['time_s']['total']} s",
        f"- weights `{r['weights_file']}`, sha256 `{r['sha256']}`",
        f"- created {r['created']}",
        *(
            [
                f"- re-evaluated {r['evaluated']['at']} on scene generator {r['evaluated']['scenes']}"
                f" (trained on {r.get('trained_on', 'an earlier generator')})"
            ]
            if "evaluated" in r
            else []
        ),
        "",
    ]
    return "\n".join(lines)
