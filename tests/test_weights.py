"""Weights: the bundled file loads; a file for another variant, architecture or a tampered one fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from arrcoc.errors import WeightsError
from arrcoc.registry import create_model, default_weights_path
from arrcoc.weights import file_sha256, read_metadata, save_weights

BUNDLED = default_weights_path("arrcoc-texture")


def test_bundled_weights_load_with_version_and_hash() -> None:
    assert BUNDLED is not None and BUNDLED.is_file(), "trained weights must ship with the package"
    model = create_model("arrcoc-texture")
    meta = read_metadata(BUNDLED)
    assert model.weights_version == meta["version"] and model.weights_version.startswith("20")
    assert meta["variant"] == "arrcoc-texture" and "tensors_sha256" in meta
    sidecar = BUNDLED.with_name(BUNDLED.name + ".sha256")
    assert sidecar.read_text().split()[0] == file_sha256(BUNDLED)
    untrained = create_model("arrcoc-texture", weights=None)
    assert untrained.weights_version == "untrained"
    assert not torch.equal(untrained.participatory.stem.weight, model.participatory.stem.weight)


def test_save_load_roundtrip(tmp_path: Path) -> None:
    model = create_model("arrcoc-texture", weights=None)
    path = tmp_path / "w.safetensors"
    save_weights(model, path, "arrcoc-texture", "test-1")
    loaded = create_model("arrcoc-texture", weights=path)
    assert loaded.weights_version == "test-1"
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_wrong_variant_fails() -> None:
    with pytest.raises(WeightsError, match="not 'arrcoc-texture-compat'"):
        create_model("arrcoc-texture-compat", weights=BUNDLED)


def _rewrite(
    src: Path, dst: Path, meta_update: dict[str, str] | None = None, scale: float | None = None
) -> Path:
    meta = read_metadata(src)
    meta.update(meta_update or {})
    state = load_file(str(src))
    if scale is not None:
        name = next(iter(sorted(state)))
        state[name] = state[name] + scale
    save_file(state, str(dst), metadata=meta)
    return dst


def test_architecture_mismatch_fails(tmp_path: Path) -> None:
    path = _rewrite(BUNDLED, tmp_path / "a.safetensors", {"architecture": "0123456789abcdef"})
    with pytest.raises(WeightsError, match="another version"):
        create_model("arrcoc-texture", weights=path)


def test_tensor_shapes_that_do_not_fit_fail(tmp_path: Path) -> None:
    model = create_model("arrcoc-texture", weights=None)
    path = tmp_path / "s.safetensors"
    save_weights(model, path, "arrcoc-texture", "x")
    state = load_file(str(path))
    state.pop(next(iter(sorted(state))))
    meta = read_metadata(path)
    meta.pop("tensors_sha256")
    save_file(state, str(path), metadata=meta)
    with pytest.raises(WeightsError, match="missing"):
        create_model("arrcoc-texture", weights=path)


def test_tampered_tensors_fail(tmp_path: Path) -> None:
    path = _rewrite(BUNDLED, tmp_path / "t.safetensors", scale=0.01)  # metadata intact, values changed
    with pytest.raises(WeightsError, match="do not match the hash"):
        create_model("arrcoc-texture", weights=path)


def test_sidecar_sha256_is_checked(tmp_path: Path) -> None:
    path = tmp_path / BUNDLED.name
    shutil.copy(BUNDLED, path)
    path.with_name(path.name + ".sha256").write_text("0" * 64 + f"  {path.name}\n")
    with pytest.raises(WeightsError, match="SHA-256"):
        create_model("arrcoc-texture", weights=path)


@pytest.mark.parametrize("content", [b"", b"garbage" * 100])
def test_unreadable_files_fail(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightsError, match="not a readable safetensors"):
        create_model("arrcoc-texture", weights=path)


def test_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="does not exist"):
        create_model("arrcoc-texture", weights=tmp_path / "none.safetensors")


def test_bundled_weights_give_each_way_of_knowing_its_queries(query_encoder, examples_dir: Path) -> None:
    # issue 14: the balancer once gave ~0.02 / 0.02 / 0.96 to every query; now the query decides
    import numpy as np
    from PIL import Image

    from arrcoc.result import SCORER_NAMES

    model = create_model("arrcoc-texture")
    size = model.config.image_size
    image = np.asarray(Image.open(examples_dir / "coffee.jpg").convert("RGB").resize((size, size)))
    wanted = {
        "the most detailed part": "information",
        "what stands out": "perspectival",
        "the coffee cup": "participatory",
    }
    images = torch.from_numpy(image).permute(2, 0, 1)[None].expand(len(wanted), -1, -1, -1).contiguous()
    with torch.no_grad():
        out = model(images, query_encoder.encode(list(wanted)), model.default_controls(len(wanted)))
    for (query, scorer), weights in zip(wanted.items(), out.balance, strict=True):
        assert SCORER_NAMES[int(weights.argmax())] == scorer, (query, weights.tolist())
        assert float(weights.max()) > 0.5, (query, weights.tolist())
