"""FLT's convolutional autoencoder (spec §4, [C] `ConvAutoencoder`): the encoder G whose codes clients
cluster into centroids for Form Client Relatedness, and the decoder used only to train it.

encoder: Conv3×3 C→16 (pad 1), ReLU, MaxPool2; Conv3×3 16→4 (pad 1), ReLU, MaxPool2; flatten;
Linear(4·7·7 = 196 → e). decoder: Linear(e → 196), reshape [4, 7, 7], ConvTranspose2×2 s2 4→16 +
ReLU, ConvTranspose2×2 s2 16→C + sigmoid (inputs are images in [0, 1]). C is the data's channel
count; the spatial size must be 28×28 (the linear layers are sized for it).
"""

from __future__ import annotations

import torch
from torch import nn

from models.backbones import InputShape

AE_SIDE = 28  # the spec's autoencoder is defined for 28×28 images
_CODE_SHAPE = (4, 7, 7)  # 4 channels after two 2×2 pools of 28×28
_CODE_SIZE = 4 * 7 * 7  # 196


def check_autoencoder_input(input_shape: InputShape) -> None:
    """Raise a ValueError naming the shape if the autoencoder cannot take `input_shape`."""
    dims = tuple(int(d) for d in input_shape)
    if len(dims) != 3 or dims[1:] != (AE_SIDE, AE_SIDE) or dims[0] < 1:
        raise ValueError(
            f"FLT's convolutional autoencoder needs (channels, 28, 28) images, got input_shape "
            f"{tuple(input_shape)}; use a 28×28 data set (mnist, emnist, femnist, digits, synthetic)"
        )


class ConvAutoencoder(nn.Module):
    """`encoder` (images → R^e codes) and `decoder` (codes → images); `forward` reconstructs."""

    def __init__(self, input_shape: InputShape = (1, AE_SIDE, AE_SIDE), latent_dim: int = 128) -> None:
        super().__init__()
        check_autoencoder_input(input_shape)
        if latent_dim < 1:
            raise ValueError(f"latent_dim must be a positive int, got {latent_dim!r}")
        channels = int(input_shape[0])
        self.input_shape = tuple(int(d) for d in input_shape)
        self.latent_dim = int(latent_dim)
        self.encoder = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 4, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(_CODE_SIZE, latent_dim),
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, _CODE_SIZE),
            nn.Unflatten(1, _CODE_SHAPE),
            nn.ConvTranspose2d(4, 16, kernel_size=2, stride=2),
            nn.ReLU(),
            nn.ConvTranspose2d(16, channels, kernel_size=2, stride=2),
            nn.Sigmoid(),
        )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes G(x) ∈ R^e for images `x` [B, C, 28, 28] (spec §2, E_m)."""
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction Dec(G(x)) with the input's shape."""
        return self.decoder(self.encoder(x))


def load_autoencoder_checkpoint(path: str, input_shape: InputShape, latent_dim: int) -> dict[str, torch.Tensor]:
    """The state_dict in `path` (torch.save of a `ConvAutoencoder`'s `state_dict()`, or of a dict holding
    it under `state_dict`), checked against the autoencoder this run builds: every `encoder.*` key with
    its shape; `decoder.*` keys optional (absent: the decoder keeps its initialisation). ValueError
    naming the file, the key and the shapes otherwise."""
    from pathlib import Path

    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{str(file)!r} is not a file on the server; allowed: a torch.save'd state_dict "
                         "of FLT's autoencoder (keys encoder.*, decoder.*)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same problem
        raise ValueError(f"{str(file)!r} could not be read by torch.load ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{str(file)!r} holds no state_dict (a mapping of names to tensors)")
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = ConvAutoencoder(input_shape, latent_dim)
    shapes = {key: tuple(value.shape) for key, value in expected.state_dict().items()}
    unknown = sorted(set(state) - set(shapes))
    if unknown:
        raise ValueError(f"{str(file)!r}: keys {unknown[:4]} are not FLT autoencoder keys; allowed: "
                         f"{', '.join(shapes)}")
    missing = sorted(key for key in shapes if key.startswith("encoder.") and key not in state)
    if missing:
        raise ValueError(f"{str(file)!r}: encoder keys {missing} are missing; the checkpoint must hold "
                         "the whole encoder (encoder.*), and may hold the decoder (decoder.*)")
    for key, value in state.items():
        if tuple(value.shape) != shapes[key]:
            raise ValueError(
                f"{str(file)!r}: {key} has shape {list(value.shape)} but this run's autoencoder needs "
                f"{list(shapes[key])} (input shape {list(input_shape)}, flt.latent-dim={latent_dim}); "
                "give a checkpoint of an autoencoder of the same channels and latent size")
    return {key: value.float() for key, value in state.items()}


def build_autoencoder(input_shape: InputShape, latent_dim: int) -> ConvAutoencoder:
    """The spec's autoencoder for images of `input_shape` with an e = `latent_dim` code.
    Callers seed `torch.manual_seed` first (initialisation is the only random step)."""
    return ConvAutoencoder(input_shape, latent_dim)


@torch.no_grad()
def encode_batched(encoder: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Codes of `x` in eval mode, a batch at a time (spec §3 Phase 2: E_m = {G(x) : x ∈ D_m})."""
    encoder.eval()
    parts = [encoder(x[start : start + batch_size]) for start in range(0, len(x), batch_size)]
    if not parts:
        raise ValueError("cannot encode an empty data set")
    return torch.cat(parts)


def reconstruction_epochs(
    model: ConvAutoencoder,
    x: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> float:
    """Train Dec∘G on mean-squared reconstruction error with Adam (spec §2, AE (pre-)training);
    return the mean loss of the last epoch."""
    if len(x) == 0:
        raise ValueError("cannot train the autoencoder on an empty data set")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    mean = float("nan")
    for _ in range(epochs):
        total, count = 0.0, 0
        order = torch.randperm(len(x), generator=generator).to(x.device)
        for start in range(0, len(x), batch_size):
            batch = x[order[start : start + batch_size]]
            loss = nn.functional.mse_loss(model(batch), batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        mean = total / count
    return mean
