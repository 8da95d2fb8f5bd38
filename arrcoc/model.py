"""The ARR-COC model: uint8 images + query embeddings + controls -> relevance and allocation.

One forward with static shapes, no host syncs and no graph breaks, so the same function runs
eagerly, under torch.compile(fullgraph=True), inside a CUDA graph and as an ONNX export.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .attending import TokenAllocator, cell_features
from .balancing import TensionBalancer
from .configs import TextureModelConfig  # noqa: F401 -- its home is configs.py
from .knowing import ParticipatoryScorer, cell_index_map, channel_softmax_entropy, luminance_entropy, salience
from .request import DEFAULT_SELECTION, SELECTION_MODES
from .texture import CHANNELS, TextureConstants, texture_from_float

# controls (B, 6): scorer scales (information, perspectival, participatory), K, total tokens,
# selection (the index of the mode in arrcoc.request.SELECTION_MODES: 0 top, 1 diverse)
CONTROL_FIELDS = (
    "scale_information",
    "scale_perspectival",
    "scale_participatory",
    "k",
    "token_budget",
    "selection",
)


class ModelOutput(NamedTuple):
    relevance: Tensor  # (B, G, G) in [0, 1]
    information: Tensor  # (B, G, G)
    perspectival: Tensor  # (B, G, G)
    participatory: Tensor  # (B, G, G)
    balance: Tensor  # (B, 3) effective scorer weights, sum to 1
    tensions: Tensor  # (B, 3) in (0, 1)
    order: Tensor  # (B, N) int64 cells in selection order (by relevance for "top"), first selected first
    budgets: Tensor  # (B, N) tokens per rank, 0 past K (ranks follow `order`, by relevance only for "top")
    budget_map: Tensor  # (B, G, G)
    texture: Tensor  # (B, 13, G, G)
    # (B,) absolute query-image match, before any per-image normalisation: the variant's
    # `match_score` (arrcoc.result.WEAK_MATCH says when it is weak). Last, so positional
    # unpacking of the fields above is unchanged.
    match: Tensor


class ArrcocTexture(nn.Module):
    def __init__(self, config: TextureModelConfig = TextureModelConfig()):
        super().__init__()
        assert config.image_size % config.cell == 0 and config.cell == 16
        self.config = config
        self.constants = TextureConstants(config.grid)
        self.register_buffer("cell_of_pixel", cell_index_map(config.image_size), persistent=False)
        self.participatory = ParticipatoryScorer(CHANNELS, config.hidden, config.query_dim, config.embed_dim)
        self.balancer = TensionBalancer(config.query_dim)
        self.allocator = TokenAllocator()

    def default_controls(self, batch: int, device: torch.device | None = None) -> Tensor:
        c = self.config
        row = torch.tensor(
            [
                1.0,
                1.0,
                1.0,
                float(c.k),
                float(c.token_budget),
                float(SELECTION_MODES.index(DEFAULT_SELECTION)),
            ],
            device=device,
        )
        return row.expand(batch, -1).contiguous()

    def fixed_maps(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """The query-independent, parameter-free part: (texture (B, 13, G, G), maps (B, 2, G, G)).

        maps = information, perspectival. Training computes this once per dataset.
        """
        c = self.config
        rgb = images.to(torch.float32) / 255.0
        texture, _ = texture_from_float(rgb, self.constants, c.grid, c.compat)
        if c.information == "softmax":
            information = channel_softmax_entropy(texture)
        else:
            information = luminance_entropy(images, self.cell_of_pixel, c.grid)
        return texture, torch.stack((information, salience(texture)), dim=1)

    def scorer_maps(self, images: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
        """(maps (B, 3, G, G), texture (B, 13, G, G)): the part training needs."""
        texture, fixed = self.fixed_maps(images)
        maps = torch.cat((fixed, self.participatory(texture, query).unsqueeze(1)), dim=1)
        return maps, texture

    def match_score(self, maps: Tensor) -> Tensor:
        """maps (B, 3, G, G) -> (B,): the best cell's cosine with the query, clamped to [0, 1].

        The participatory map, (cos + 1) / 2, is not min-max normalised (the balancer's sum is),
        so its peak is an absolute measure: a query that matches nothing has no cell whose
        embedding points its way, whatever the image's contrast. The cosine rather than
        (cos + 1) / 2 so that WEAK_MATCH (0.5) sits where it separates: on held-out synthetic
        scenes 90% of captions of present objects score >= 0.5, and 72% of captions from another
        scene score below it (docs/model.md, "Match score").
        """
        return (2.0 * maps[:, 2].flatten(1).amax(dim=-1) - 1.0).clamp(0.0, 1.0)

    def forward(self, images: Tensor, query: Tensor, controls: Tensor) -> ModelOutput:
        """images uint8 (B, 3, S, S); query (B, 384); controls (B, 6) see CONTROL_FIELDS."""
        maps, texture = self.scorer_maps(images, query)
        return self.outputs(maps, texture, query, controls)

    def outputs(self, maps: Tensor, texture: Tensor, query: Tensor, controls: Tensor) -> ModelOutput:
        """The scorer maps (B, 3, G, G) balanced, allocated and packed into the ModelOutput."""
        balanced = self.balancer(maps, query, controls[:, 0:3])
        alloc = self.allocator(
            balanced.relevance, controls[:, 3], controls[:, 4], controls[:, 5], cell_features(texture)
        )
        return ModelOutput(
            balanced.relevance,
            maps[:, 0],
            maps[:, 1],
            maps[:, 2],
            balanced.weights,
            balanced.tensions,
            alloc.order,
            alloc.budgets,
            alloc.budget_map,
            texture,
            self.match_score(maps),
        )
