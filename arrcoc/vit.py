"""A ViT image tower in Hugging Face CLIPVisionTransformer's layout, written for static shapes.

Module names follow transformers' CLIPVisionModel (`embeddings.*`, `pre_layrnorm`, `encoder.layers.N.*`,
`post_layernorm`), so a CLIP checkpoint's vision tensors load by name (arrcoc/clip.py). Why our own
module rather than transformers' one inside the forward: every op here is a plain conv, linear,
layer norm or SDPA, so torch.compile(fullgraph=True) and torch.onnx.export(dynamo=True) see one
graph with no output dataclasses, attention-backend dispatch or interpolation branches; the
position embeddings are sized for the tower's own grid (interpolated once, at load).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .configs import DENSE_METHODS, TowerConfig  # noqa: F401 -- their home is configs.py


def quick_gelu(x: Tensor) -> Tensor:
    """CLIP's activation (hidden_act="quick_gelu")."""
    return x * torch.sigmoid(1.702 * x)


class CLIPEmbeddings(nn.Module):
    def __init__(self, c: TowerConfig):
        super().__init__()
        self.class_embedding = nn.Parameter(torch.randn(c.hidden) * 0.02)
        self.patch_embedding = nn.Conv2d(3, c.hidden, c.patch, stride=c.patch, bias=False)
        self.position_embedding = nn.Embedding(c.grid * c.grid + 1, c.hidden)  # class + G*G patches

    def forward(self, x: Tensor) -> Tensor:
        """x (B, 3, S, S) normalised -> tokens (B, 1 + G*G, D)."""
        patches = self.patch_embedding(x).flatten(2).transpose(1, 2)  # (B, G*G, D)
        cls = self.class_embedding.view(1, 1, -1).expand(x.shape[0], 1, -1)
        return torch.cat((cls, patches), dim=1) + self.position_embedding.weight.unsqueeze(0)


class CLIPAttention(nn.Module):
    def __init__(self, c: TowerConfig):
        super().__init__()
        self.heads = c.heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(c.hidden, c.hidden) for _ in range(4)
        )

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D/H)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))

    def value_path(self, x: Tensor) -> Tensor:
        """out_proj(v_proj(x)): the attention output with every token attending to itself only
        (MaskCLIP's dense features; see arrcoc/clip.py)."""
        return self.out_proj(self.v_proj(x))

    def neighbourhood(self, x: Tensor, prior: Tensor) -> Tensor:
        """NACLIP's attention (Hajimiri, Ben Ayed, Dolz, WACV 2025): the logits are the keys'
        similarity with each other (k k^T / sqrt(d), no queries) plus `prior` (T, T), a Gaussian
        of the distance between patches, so each patch attends to its similar neighbours."""
        b, t, d = x.shape
        k, v = (
            p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(k, k, v, attn_mask=prior.to(k.dtype))  # (B, H, T, D/H)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class CLIPMLP(nn.Module):
    def __init__(self, c: TowerConfig):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c.hidden, c.mlp), nn.Linear(c.mlp, c.hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(quick_gelu(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, c: TowerConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.layer_norm2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.self_attn, self.mlp = CLIPAttention(c), CLIPMLP(c)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, c: TowerConfig):
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(c) for _ in range(c.layers))


class CLIPVisionTower(nn.Module):
    """transformers' CLIPVisionTransformer ("pre_layrnorm" is their spelling)."""

    def __init__(self, c: TowerConfig):
        super().__init__()
        self.config = c
        self.embeddings = CLIPEmbeddings(c)
        self.pre_layrnorm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.encoder = CLIPEncoder(c)
        self.post_layernorm = nn.LayerNorm(c.hidden, eps=c.eps)
        # a constant of the grid: a buffer (no host copy inside forward), not part of the weights
        self.register_buffer("prior", neighbourhood_prior(c.grid, c.neighbourhood_std), persistent=False)

    def hidden_states(self, x: Tensor, upto: int | None = None) -> Tensor:
        """(B, 1 + G*G, D) after the first `upto` layers (all: transformers' `last_hidden_state`)."""
        h = self.pre_layrnorm(self.embeddings(x))
        for layer in self.encoder.layers[:upto]:
            h = layer(h)
        return h

    def pooled(self, x: Tensor) -> Tensor:
        """(B, D): the class token, post-layernorm (transformers' `pooler_output`)."""
        return self.post_layernorm(self.hidden_states(x)[:, 0])

    def dense(self, x: Tensor) -> Tensor:
        """(B, G*G, D): per-patch features from a changed last block, post-layernorm, class token
        dropped. Both methods skip the last block's residual and MLP (the "reduced" block of
        NACLIP; MaskCLIP skips them too); they differ in its attention:

        - maskclip: the value path only (every patch attends to itself);
        - naclip: neighbourhood attention over key-key similarity, every token taking part.
        """
        last = self.encoder.layers[-1]
        h = self.hidden_states(x, upto=len(self.encoder.layers) - 1)  # (B, 1 + G*G, D)
        if self.config.dense == "maskclip":
            return self.post_layernorm(last.self_attn.value_path(last.layer_norm1(h[:, 1:])))
        return self.post_layernorm(last.self_attn.neighbourhood(last.layer_norm1(h), self.prior)[:, 1:])


def neighbourhood_prior(grid: int, std: float) -> Tensor:
    """(1 + G*G, 1 + G*G) NACLIP's additive attention prior: exp(-d^2 / (2 std^2)) between two
    patches d cells apart on the G x G grid (1 on the diagonal, unnormalised, as the authors'
    window); 0 in the class token's row and column."""
    yx = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"), dim=-1)
    yx = yx.reshape(-1, 2).to(torch.float64)  # (G*G, 2) row, column of each patch
    d2 = (yx.unsqueeze(1) - yx.unsqueeze(0)).pow(2).sum(-1)  # (G*G, G*G)
    return F.pad(torch.exp(-d2 / (2.0 * std * std)), (1, 0, 1, 0)).to(torch.float32)


def interpolate_positions(weight: Tensor, grid: int) -> Tensor:
    """(1 + g*g, D) position embeddings -> (1 + grid*grid, D), as transformers'
    `interpolate_pos_encoding` does per call (bicubic, align_corners=False); done once at load."""
    n, d = weight.shape
    g = round((n - 1) ** 0.5)
    assert g * g == n - 1, f"{n - 1} patch positions are not a square grid"
    if g == grid:
        return weight
    patches = weight[1:].reshape(1, g, g, d).permute(0, 3, 1, 2).float()  # (1, D, g, g)
    patches = F.interpolate(patches, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat((weight[:1].float(), patches.permute(0, 2, 3, 1).reshape(grid * grid, d)), dim=0)
