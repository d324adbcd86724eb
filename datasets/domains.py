"""Input domains of the `domains` partition: image transforms that make one data set several domains.

Two families: `rotations` (the angle in degrees is the domain's name, e.g.
"90") and `styles` — `plain` (as is), `inverted` (1 − x), `noisy` (Gaussian noise, σ = 0.3, clipped
to [0, 1]), `thick` (strokes dilated by a 3×3 max filter), `blurred` (3×3 box blur, twice) and
`low-contrast` (0.3·x + 0.35). Images are float32 [n, C, H, W] in [0, 1]; every transform keeps that
range and is deterministic (the noise comes from a generator the caller seeds).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

DOMAIN_FAMILIES: tuple[str, ...] = ("rotations", "styles")
NOISE_SD = 0.3


def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate [n, C, H, W] images counter-clockwise; exact (torch.rot90) for multiples of 90 degrees."""
    quarter_turns, remainder = divmod(float(degrees), 90.0)
    if len(images) == 0:  # e.g. the empty train split of a held-out test client
        return images
    if remainder == 0.0:
        turns = int(quarter_turns) % 4
        return torch.rot90(images, k=turns, dims=(-2, -1)).contiguous() if turns else images
    from torchvision.transforms.functional import InterpolationMode
    from torchvision.transforms.functional import rotate as tv_rotate

    return tv_rotate(images, float(degrees), interpolation=InterpolationMode.BILINEAR, fill=0.0)


def _box_blur(x: torch.Tensor) -> torch.Tensor:
    kernel = torch.full((x.shape[1], 1, 3, 3), 1.0 / 9.0, dtype=x.dtype)
    for _ in range(2):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=x.shape[1])
    return x


def _noisy(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return (x + NOISE_SD * noise).clamp(0.0, 1.0)


STYLES: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "plain": lambda x, g: x,
    "inverted": lambda x, g: 1.0 - x,
    "noisy": _noisy,
    "thick": lambda x, g: F.max_pool2d(x, kernel_size=3, stride=1, padding=1),
    "blurred": lambda x, g: _box_blur(x),
    "low-contrast": lambda x, g: 0.3 * x + 0.35,
}


def check_domain_names(family: str, names: tuple[str, ...]) -> None:
    """Raise ValueError naming the first domain that `family` does not know."""
    if family not in DOMAIN_FAMILIES:
        raise ValueError(f"unknown domain family {family!r}; allowed: {', '.join(DOMAIN_FAMILIES)}")
    for name in names:
        if family == "styles" and name not in STYLES:
            raise ValueError(f"unknown style {name!r}; allowed styles: {', '.join(STYLES)}")
        if family == "rotations":
            try:
                float(name)
            except ValueError:
                raise ValueError(f"rotation {name!r} is not an angle in degrees") from None


def apply_domain(images: torch.Tensor, family: str, name: str, generator: torch.Generator) -> torch.Tensor:
    """The images as seen in domain `name` of `family`."""
    if family == "rotations":
        return rotate(images, float(name))
    if len(images) == 0:
        return images
    return STYLES[name](images, generator).contiguous()


def apply_domains(images: torch.Tensor, domains: torch.Tensor, family: str, names: tuple[str, ...],
                  seed: int) -> torch.Tensor:
    """Each image in its own domain: image i in domain `names[domains[i]]`. The noise of image i's
    group comes from `seed` (so a client's images are the same in every process)."""
    out = images.clone() if len(torch.unique(domains)) > 1 else images
    generator = torch.Generator().manual_seed(seed)
    for domain in torch.unique(domains).tolist():
        where = torch.nonzero(domains == domain).flatten()
        out[where] = apply_domain(images[where], family, names[domain], generator)
    return out
