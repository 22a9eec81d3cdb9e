"""Tiny diffusion transformers with the class names and modules of Forge Neo's (`backend/nn/*.py`)."""
