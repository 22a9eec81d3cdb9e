"""Forge Neo's `backend/args.py`, as far as the stand-in needs it: `dynamic_args`, the dict Neo's loader fills for
the checkpoint it loads (`backend/loader.py`: `dynamic_args["wan"] = "Wan" in repo_name`) and `process_images_inner`
reads (with `sd_model.is_wan`, a Wan video: its frame count is the batch size). Neo's other keys are left out."""

from __future__ import annotations

from typing import Any

dynamic_args: dict[str, Any] = {"wan": False}
