"""The rotary test on wrong frequencies must fail: LTX-Video's pairs as if each head rotated alike (a per-head split
22/22/20 at theta 10000), HunyuanVideo's at theta 10000 in place of 256."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))

from test_refit_standin import test_the_refit_kernel_turns_at_the_model_s_rotary_frequencies as rotary

from tome_bench import refit


def test_ltx_bands_wrong(monkeypatch) -> None:
    monkeypatch.setitem(refit.ROPES, "ltx", refit.Rope((22, 22, 20), 10000.0, (0, 1, 2)))
    rotary("ltx")


def test_hunyuanvideo_theta_wrong(monkeypatch) -> None:
    monkeypatch.setitem(refit.ROPES, "hunyuanvideo", refit.Rope((16, 56, 56), 10000.0, (0, 1, 2)))
    rotary("hunyuanvideo")
