"""Bouquet model zoo: ``Backbone`` models split into ``features`` and ``head``, built by name."""

from models.kernels import use_portable_kernels

use_portable_kernels()  # before any tensor is computed: the same CPU kernels on every machine (kernels.py)

from models.autoencoder import ConvAutoencoder, build_autoencoder
from models.backbones import (
    IMAGE_MODELS,
    MODEL_BUILDERS,
    MODEL_NAMES,
    SEQUENCE_MODELS,
    Backbone,
    InputShape,
    ModelBuilder,
    build_model,
)
from models.paper_models import TEXT_MODELS

__all__ = [
    "ConvAutoencoder",
    "build_autoencoder",
    "IMAGE_MODELS",
    "MODEL_BUILDERS",
    "MODEL_NAMES",
    "SEQUENCE_MODELS",
    "TEXT_MODELS",
    "Backbone",
    "InputShape",
    "ModelBuilder",
    "build_model",
]
