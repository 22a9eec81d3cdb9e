"""Forge Neo's Chroma (`backend/nn/chroma.py: IntegratedChromaTransformer2DModel`): Flux.1's blocks in a class of its
own (not a subclass of Neo's Flux class); here the tiny Flux's layers."""

from __future__ import annotations

from backend.nn.flux import FluxBody


class IntegratedChromaTransformer2DModel(FluxBody):
    pass
