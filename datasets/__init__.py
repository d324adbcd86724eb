"""Bouquet's data: sources, partitioners, per-client loading. Hugging Face's `datasets` has the same import
name; where it is installed too, this one package serves both (datasets/hf_coexistence.py)."""

from datasets.hf_coexistence import share as _share

_share(globals())
