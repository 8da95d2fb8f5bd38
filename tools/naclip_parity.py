"""Our NACLIP dense path against the authors' own code, on the same random-weight CLIP ViT-B/16.

    python tools/naclip_parity.py /path/to/NACLIP [--sizes 224 448] [--batch 2] [--seed 0]

The argument is a checkout of github.com/sinahmr/NACLIP (not part of this repository). Their
`clip/model.py` is imported from that checkout as it is (it needs only torch and numpy); its
VisionTransformer is built at our shapes, given our random weights (OpenAI CLIP's layout: fused
in_proj, conv1, ln_pre/ln_post, proj), set to the authors' method (arch "reduced", attention
"naclip", Gaussian std 5) and run with return_all=True, which is their last-block change; their
naclip.py keeps the patch tokens ([:, 1:]) and normalises them. Ours: ArrcocClip.dense_embeddings
(the same, normalised). At 448 px their model is built at 448 with our already-interpolated
position embeddings, so both run the same 28 x 28 grid with no interpolation of their own.

The random weights are N(0, 0.02), which leave the key-key logits near 0 (the Gaussian prior then
decides the attention alone); the last block's key weights are also scaled up (--key-scales) so
that the key-key similarity decides too. Prints the largest absolute difference per case and
exits 1 if any exceeds --tol.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from arrcoc.clip import ClipModelConfig, build_clip


def load_their_model_module(checkout: Path):
    """The authors' clip/model.py, imported from their checkout by path (nothing of theirs copied)."""
    path = checkout / "clip" / "model.py"
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass the path of a NACLIP checkout (github.com/sinahmr/NACLIP)")
    spec = importlib.util.spec_from_file_location("naclip_authors_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def their_state_dict(ours) -> dict[str, torch.Tensor]:
    """Our tower's weights under OpenAI CLIP's VisionTransformer names (what their code loads)."""
    v = ours.vision_model
    sd = {
        "conv1.weight": v.embeddings.patch_embedding.weight,
        "class_embedding": v.embeddings.class_embedding,
        "positional_embedding": v.embeddings.position_embedding.weight,
        "ln_pre.weight": v.pre_layrnorm.weight,
        "ln_pre.bias": v.pre_layrnorm.bias,
        "ln_post.weight": v.post_layernorm.weight,
        "ln_post.bias": v.post_layernorm.bias,
        "proj": ours.visual_projection.weight.t(),
    }
    for i, layer in enumerate(v.encoder.layers):
        a, p = layer.self_attn, f"transformer.resblocks.{i}."
        sd |= {
            p + "attn.in_proj_weight": torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)),
            p + "attn.in_proj_bias": torch.cat((a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)),
            p + "attn.out_proj.weight": a.out_proj.weight,
            p + "attn.out_proj.bias": a.out_proj.bias,
            p + "ln_1.weight": layer.layer_norm1.weight,
            p + "ln_1.bias": layer.layer_norm1.bias,
            p + "ln_2.weight": layer.layer_norm2.weight,
            p + "ln_2.bias": layer.layer_norm2.bias,
            p + "mlp.c_fc.weight": layer.mlp.fc1.weight,
            p + "mlp.c_fc.bias": layer.mlp.fc1.bias,
            p + "mlp.c_proj.weight": layer.mlp.fc2.weight,
            p + "mlp.c_proj.bias": layer.mlp.fc2.bias,
        }
    return {k: t.detach().clone().float() for k, t in sd.items()}


def compare(module, size: int, batch: int, seed: int, key_scale: float = 1.0) -> float:
    config = ClipModelConfig(image_size=size, dense="naclip")
    ours = build_clip(config, None).eval()  # random weights of the real shapes (seeded)
    with torch.no_grad():  # sharper key-key logits, so that they, not only the prior, decide the attention
        ours.vision_model.encoder.layers[-1].self_attn.k_proj.weight.mul_(key_scale)
    theirs = module.VisionTransformer(
        input_resolution=size,
        patch_size=config.cell,
        width=config.hidden,
        layers=config.layers,
        heads=config.heads,
        output_dim=config.query_dim,
    )
    theirs.load_state_dict(their_state_dict(ours))
    theirs.set_params("reduced", "naclip", config.neighbourhood_std)  # the authors' method and setting
    theirs.eval()
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g)
    with torch.inference_mode():
        got = ours.dense_embeddings(images)  # (B, G*G, E), unit
        expected = F.normalize(theirs(ours.pixels(images), return_all=True)[:, 1:], dim=-1)
        maskclip = F.normalize(ours.visual_projection(_maskclip(ours, images)), dim=-1)
    diff = float((got - expected).abs().max())
    apart = float((maskclip - expected).abs().max())
    print(
        f"{size} px ({config.grid}x{config.grid} patches), batch {batch}, last block's keys x{key_scale:g}:"
        f" max |ours - theirs| = {diff:.3g}"
        f" over {tuple(got.shape)} unit features (MaskCLIP's, for scale: {apart:.3g} from theirs)"
    )
    return diff


def _maskclip(ours, images):
    """The same tower's MaskCLIP features: how far apart two different methods are."""
    tower = ours.vision_model
    last = tower.encoder.layers[-1]
    h = tower.hidden_states(ours.pixels(images), upto=len(tower.encoder.layers) - 1)
    return tower.post_layernorm(last.self_attn.value_path(last.layer_norm1(h[:, 1:])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkout", type=Path, help="a checkout of github.com/sinahmr/NACLIP")
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 448])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--key-scales",
        type=float,
        nargs="+",
        default=[1.0, 3.0],
        help="the last block's key weights scaled so: N(0, 0.02) keys give key-key logits near 0",
    )
    p.add_argument("--tol", type=float, default=1e-4, help="float32 over 12 layers in two op orders")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    module = load_their_model_module(args.checkout)
    worst = max(compare(module, s, args.batch, args.seed, k) for s in args.sizes for k in args.key_scales)
    ok = worst <= args.tol
    print(f"{'PASS' if ok else 'FAIL'}: largest difference {worst:.3g} (tolerance {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
