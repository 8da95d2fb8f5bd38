"""Selection modes (Controls.selection = "top" | "diverse") and `arrcoc eval selection`."""

from __future__ import annotations

import pytest
import torch

from arrcoc.attending import DIVERSE_CANDIDATES, TokenAllocator, cell_features, diverse_order
from arrcoc.errors import InvalidInputError
from arrcoc.model import CONTROL_FIELDS
from arrcoc.registry import create_model
from arrcoc.request import SELECTION_MODES, Controls

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def trained():
    return create_model("arrcoc-texture").eval()


@pytest.mark.parametrize(
    ("selection", "message"),
    [("best", "selection must be one of top, diverse"), (1, "selection must be one of"), ("", "selection")],
)
def test_unknown_selection_fails_clearly(selection, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Controls(selection=selection).validated(1024, 200, 25600)


def test_selection_travels_as_a_control_column() -> None:
    assert Controls().validated(1024, 200, 25600).selection == "top"
    row = Controls(selection="diverse").validated(1024, 200, 25600).as_row()
    assert len(row) == len(CONTROL_FIELDS) and row[
        CONTROL_FIELDS.index("selection")
    ] == SELECTION_MODES.index("diverse")
    assert Controls.from_wire(Controls(selection="diverse").to_wire()).selection == "diverse"
    assert Controls.from_wire({"k": 10}).selection is None, "a request from before the option keeps working"


def _two_blobs() -> tuple[torch.Tensor, torch.Tensor]:
    """A strong object (a 6x6 block, relevance ~1) and a weaker one far away (~0.6), in other colours."""
    g = 32
    rel = torch.full((1, g, g), 0.1)
    rel[0, 4:10, 4:10] = 0.9 + 0.1 * torch.rand(6, 6, generator=torch.Generator().manual_seed(0))
    rel[0, 22:26, 20:24] = 0.6
    rel[0, 23, 21] = 0.62
    texture = torch.zeros(1, 13, g, g)
    texture[:, 8] = torch.linspace(0, 1, g).view(g, 1)
    texture[:, 9] = torch.linspace(0, 1, g).view(1, g)
    texture[:, 3] = 0.5
    texture[:, 4, 22:26, 20:24] = 0.8  # redder
    return rel, texture


def test_diverse_brings_the_other_object_forward() -> None:
    rel, texture = _two_blobs()
    scores, order = torch.topk(rel.flatten(1), 1024, dim=1)
    div = diverse_order(scores, order, cell_features(texture))
    weak = 23 * 32 + 21
    assert weak not in order[0, :36].tolist(), "by relevance alone the strong object fills the first 36"
    assert div[0, 0] == order[0, 0], "the best cell stays first"
    assert weak in div[0, :3].tolist(), "the weaker object's peak comes second or third"
    assert torch.equal(div[0].sort().values, torch.arange(1024)), "a permutation of the cells"
    assert torch.equal(div[0, DIVERSE_CANDIDATES:], order[0, DIVERSE_CANDIDATES:]), (
        "past the candidates: by relevance"
    )


def test_model_serves_both_modes_in_one_batch(trained) -> None:
    g = torch.Generator().manual_seed(3)
    image = (
        torch.randint(0, 256, (1, 3, 512, 512), dtype=torch.uint8, generator=g)
        .expand(2, -1, -1, -1)
        .contiguous()
    )
    query = torch.nn.functional.normalize(torch.randn(1, 384, generator=g), dim=-1).expand(2, -1).contiguous()
    controls = trained.default_controls(2)
    controls[:, 3], controls[:, 4] = 50, 6400
    controls[1, 5] = 1.0
    with torch.no_grad():
        out = trained(image, query, controls)
        top_alone = trained(image[:1], query[:1], controls[:1])
    assert torch.equal(out.order[0], top_alone.order[0]) and torch.equal(out.budgets[0], top_alone.budgets[0])
    assert not torch.equal(out.order[1, :50], out.order[0, :50]), "diverse chooses other cells"
    chosen = out.budgets[1, :50]
    assert (
        chosen.min() >= 64
        and chosen.max() <= 400
        and chosen.sum() <= 6400
        and (out.budgets[1, 50:] == 0).all()
    )
    assert torch.equal(
        out.budget_map[1].flatten().gt(0).nonzero().flatten().sort().values, out.order[1, :50].sort().values
    )
    rel = out.relevance[1].flatten()
    assert torch.allclose(
        out.budgets[1, :50],
        TokenAllocator()(
            rel.view(1, 32, 32)[:, :, :],
            torch.tensor([50.0]),
            torch.tensor([6400.0]),
            torch.ones(1),
            cell_features(out.texture[1:2]),
        ).budgets[0, :50],
    ), "budgets follow each cell's relevance"


def _allocator_inputs(batch: int = 3):
    g = torch.Generator().manual_seed(5)
    rel = torch.rand(batch, 32, 32, generator=g)
    texture = torch.rand(batch, 13, 32, 32, generator=g)
    k = torch.tensor([200.0, 20.0, 1024.0])[:batch]
    total = torch.tensor([25600.0, 5000.0, 1024 * 64.0])[:batch]
    mode = torch.tensor([1.0, 0.0, 1.0])[:batch]
    return rel, k, total, mode, cell_features(texture)


def test_diverse_compiles_fullgraph_and_matches_eager() -> None:
    alloc = TokenAllocator().eval()
    args = _allocator_inputs()
    with torch.no_grad():
        ref = alloc(*args)
        got = torch.compile(alloc, fullgraph=True)(*args)  # Inductor, as the compiled backend uses
    assert torch.equal(ref.order, got.order) and torch.equal(ref.budgets, got.budgets)


def test_diverse_exports_to_onnx_and_runs_in_onnxruntime(tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    alloc = TokenAllocator().eval()
    args = _allocator_inputs()
    path = tmp_path / "alloc.onnx"
    with torch.no_grad():
        ref = alloc(*args)
        torch.onnx.export(
            alloc, args, path, dynamo=True, input_names=["rel", "k", "total", "mode", "features"]
        )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args, strict=True)}
    order, budgets, _ = sess.run(None, feeds)
    assert (order == ref.order.numpy()).all() and (budgets == ref.budgets.numpy()).all()


@pytest.mark.slow
def test_engine_onnx_backend_serves_diverse_like_eager(trained, tmp_path) -> None:
    """The engine's own ONNX path (dynamo export of the whole forward, ONNX Runtime CPU) gives the
    "diverse" rows the cells eager gives them, beside a "top" row in the same batch."""
    from arrcoc.engine import create_backend
    from arrcoc.engine.base import example_inputs

    cpu = torch.device("cpu")
    eager = create_backend("eager", trained, cpu, (2,))
    onnx = create_backend("onnx", trained, cpu, (2,), cache_dir=tmp_path)
    eager.warmup()
    onnx.warmup()
    images, query, controls = example_inputs(trained, 2, cpu, seed=4)
    controls[:, 3] = 40
    controls[0, 5] = 1.0  # row 0 diverse, row 1 top
    ref, got = eager.run(images, query, controls), onnx.run(images, query, controls)
    for i in range(2):
        assert set(ref.order[i, :40].tolist()) == set(got.order[i, :40].tolist()), i
    assert not torch.equal(
        ref.order[0, :40].sort().values,
        trained(images[:1], query[:1], controls[1:2].clone()).order[0, :40].sort().values,
    ), "row 0 really was diverse"
    onnx.close()
