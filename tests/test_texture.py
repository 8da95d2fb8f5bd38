"""The texture array on inputs whose answer is known by hand (compat = arr-coc-0-1's maths)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arrcoc.texture import CHANNELS, TextureConstants, sobel, sobel_kernels, texture_array

S, G = 512, 32


def solid(rgb: tuple[int, int, int], batch: int = 1) -> torch.Tensor:
    return torch.tensor(rgb, dtype=torch.uint8).view(1, 3, 1, 1).expand(batch, 3, S, S).contiguous()


@pytest.mark.parametrize("compat", [False, True])
def test_constant_image_has_no_edges_and_known_lab(compat: bool) -> None:
    # sRGB red (255, 0, 0): L* = 53.24, a* = 80.09, b* = 67.20 (D65)
    t = texture_array(solid((255, 0, 0)), compat=compat)[0]
    assert t.shape == (CHANNELS, G, G)
    assert torch.allclose(t[0], torch.ones(G, G)) and torch.all(t[1:3] == 0)
    assert torch.allclose(t[3], torch.full((G, G), 0.53241), atol=2e-4)
    assert torch.allclose(t[4], torch.full((G, G), (80.092 + 128) / 255), atol=2e-4)
    assert torch.all(t[5:8].abs() < 1e-6), "Sobel of a constant image must be 0"
    if not compat:
        assert torch.allclose(t[11], torch.full((G, G), (67.203 + 128) / 255), atol=2e-4)  # b*
        assert torch.all(t[12] < 1e-6), "no local contrast in a flat image"


@pytest.mark.parametrize(
    ("rgb", "lightness", "a_star"),
    [
        ((255, 255, 255), 1.0, 128 / 255),
        ((0, 0, 0), 0.0, 128 / 255),
        ((0, 255, 0), 0.87735, (-86.183 + 128) / 255),
    ],
)
def test_lab_of_pure_colours(rgb, lightness, a_star) -> None:
    t = texture_array(solid(rgb), compat=True)[0]
    assert abs(float(t[3].mean()) - lightness) < 2e-4
    assert abs(float(t[4].mean()) - a_star) < 2e-4


def test_position_channels() -> None:
    t = texture_array(solid((10, 20, 30)))[0]
    line = torch.linspace(0, 1, G)
    assert torch.allclose(t[8], line.view(-1, 1).expand(G, G))  # y down the rows
    assert torch.allclose(t[9], line.view(1, -1).expand(G, G))  # x along the columns
    ecc = t[10]
    assert abs(float(ecc.max()) - 1.0) < 1e-6 and float(ecc[0, 0]) == pytest.approx(1.0)
    assert float(ecc[15, 15]) < 0.05 and torch.allclose(ecc, ecc.flip(0).flip(1), atol=1e-6)


def test_compat_downsampling_is_bilinear_point_sampling() -> None:
    # align_corners=False from 512 to 32: output i samples 16 i + 7.5, the mean of pixels 7 and 8
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (1, 3, S, S), dtype=torch.uint8, generator=g)
    t = texture_array(img, compat=True)[0]
    red = img[0, 0].float() / 255
    idx = torch.arange(G) * 16
    expected = (
        red[idx + 7][:, idx + 7]
        + red[idx + 7][:, idx + 8]
        + red[idx + 8][:, idx + 7]
        + red[idx + 8][:, idx + 8]
    ) / 4
    assert torch.allclose(t[0], expected, atol=1e-6)


def test_compat_extra_channels_copy_edges_and_lightness() -> None:
    img = torch.randint(0, 256, (2, 3, S, S), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    t = texture_array(img, compat=True)
    assert torch.equal(t[:, 11], t[:, 7]) and torch.equal(t[:, 12], t[:, 3])


def test_horizontal_ramp_gives_positive_gx() -> None:
    ramp = torch.linspace(0, 1, 64).view(1, 1, 1, 64).expand(1, 1, 64, 64)
    gx, gy, mag = sobel(ramp.contiguous(), sobel_kernels())
    inner = (slice(None), slice(None), slice(1, -1), slice(1, -1))
    step = 1 / 63
    assert torch.allclose(gx[inner], torch.full_like(gx[inner], step), atol=1e-6)  # kernel/8: gx = slope
    assert torch.all(gy[inner].abs() < 1e-6) and torch.all(mag[inner] > 0)
    # in the texture array: a ramp on the left half, flat on the right -> gx high on the left only
    img = torch.zeros(1, 3, S, S, dtype=torch.uint8)
    img[..., : S // 2] = torch.linspace(0, 255, S // 2).round().to(torch.uint8)
    img[..., S // 2 :] = 255  # the ramp ends at 255: no step at the seam
    t = texture_array(img)[0]
    assert float(t[5][:, 2:14].mean()) > 0.9 and float(t[5][:, 18:30].abs().max()) < 0.1


@pytest.mark.parametrize("compat", [False, True])
def test_all_channels_in_unit_range_and_per_image(compat: bool) -> None:
    g = torch.Generator().manual_seed(2)
    batch = torch.randint(0, 256, (3, 3, S, S), dtype=torch.uint8, generator=g)
    batch[1] = solid((200, 40, 90))[0]
    together = texture_array(batch, compat=compat)
    assert together.min() >= -1e-6 and together.max() <= 1 + 1e-6
    for i in range(3):  # every normalisation is per image: batch-mates change nothing
        alone = texture_array(batch[i : i + 1], compat=compat)[0]
        assert (alone - together[i]).abs().max() <= 1e-6


def test_local_contrast_is_higher_on_texture() -> None:
    img = solid((128, 128, 128)).clone()
    checker = (np.indices((S // 2, S // 2)).sum(0) % 2 * 255).astype(np.uint8)
    img[0, :, : S // 2, : S // 2] = torch.from_numpy(checker)
    t = texture_array(img)[0]
    assert float(t[12][:16, :16].mean()) > 0.9 and float(t[12][16:, 16:].max()) < 0.05


def test_constants_are_buffers() -> None:
    names = {n for n, _ in TextureConstants(G).named_buffers()}
    assert {"sobel", "rgb_to_xyz", "white", "grey_weights", "positions"} <= names


def test_rejects_wrong_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        texture_array(torch.zeros(1, 3, S, S))
