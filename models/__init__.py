"""Bouquet model zoo: ``Backbone`` models split into ``features`` and ``head``, built by name."""

from models.kernels import use_portable_kernels

use_portable_kernels()  # before any tensor is computed: the same CPU kernels on every machine (kernels.py)

from models.autoencoder import ConvAutoencoder, build_autoencoder
from models.backbones import (
    MODEL_BUILDERS,
    MODEL_NAMES,
    SEQUENCE_MODELS,
    Backbone,
    InputShape,
    ModelBuilder,
    build_model,
)

__all__ = [
    "ConvAutoencoder",
    "build_autoencoder",
    "MODEL_BUILDERS",
    "MODEL_NAMES",
    "SEQUENCE_MODELS",
    "Backbone",
    "InputShape",
    "ModelBuilder",
    "build_model",
]
