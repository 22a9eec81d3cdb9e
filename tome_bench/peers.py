"""The alternatives a user could pick instead of ours, for the whole-generation benchmark (`--steps N --peers`).

Each peer comes from its own PyPI package (`make peers` installs requirements-peers.txt into .venv with
`--no-deps`) and is imported here at run time only; nothing of theirs is copied into this project, and the
extension itself never imports them. Every peer runs at its documented default and at one faster setting:

- tomesd 0.1.3: `tomesd.apply_patch(unet, ratio=r, max_downsample=md)` / `tomesd.remove_patch(unet)`; default
  at each --ratios ratio with --tomesd-max-downsample (tomesd's own default 1), `tomesd:fast` with
  max_downsample doubled (its README recommends 1 or 2).
- CA-ToMe (ca-tome 0.1.3): `ca_tome.apply_CA_ToMe(pipe, cache_conf, r)`, then generations through its
  `pipe.call`; default as in its README (`CacheConf.CONFIG_3`, similarity threshold r=0.8), `ca-tome:fast` r=0.5
  (lower thresholds merge more; its README's table stops gaining speed there). Removed with
  `ca_tome.patch.remove_patch(pipe)`.
- DeepCache 0.1.1: `DeepCacheSDHelper(pipe=pipe)`, `set_params(cache_interval, cache_branch_id)`, `enable()` /
  `disable()`; default as in its README (interval 3, branch 0), `deepcache:fast` interval 5.
- HiDiffusion 0.1.10: `apply_hidiffusion(pipe, apply_raunet=..., apply_window_attn=...)` /
  `remove_hidiffusion(pipe)`; default both on (RAU-Net and MSW-MSA), `hidiffusion:msw-msa` the windowed
  attention alone (RAU-Net changes the feature-map sizes, meant for resolutions above the native one).
- `deepcache+ours`: DeepCache at its default stacked on ours at each --ratios ratio.

What a peer's own removal leaves behind (attributes, a changed `num_upsamplers`) is put back by the benchmark
before the next variant runs, and reported (see `generate.Snapshot`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tome_bench.archs import Arch

#: Peer names on the command line, in the order they run; `all` selects every one.
PEER_NAMES = ("tomesd", "ca-tome", "deepcache", "hidiffusion", "deepcache+ours")


@dataclass(frozen=True)
class Package:
    """A peer's PyPI distribution, its import name and the version requirements-peers.txt pins."""

    dist: str
    module: str
    pin: str

    @property
    def install(self) -> str:
        return f"make peers (pip install --no-deps {self.dist}=={self.pin})"


PACKAGES: dict[str, Package] = {
    "tomesd": Package("tomesd", "tomesd", "0.1.3"),
    "ca-tome": Package("ca-tome", "ca_tome", "0.1.3"),
    "deepcache": Package("DeepCache", "DeepCache", "0.1.1"),
    "hidiffusion": Package("hidiffusion", "hidiffusion", "0.1.10"),
}
#: The packages each peer name needs.
NEEDS: dict[str, tuple[str, ...]] = {
    "tomesd": ("tomesd",),
    "ca-tome": ("ca-tome",),
    "deepcache": ("deepcache",),
    "hidiffusion": ("hidiffusion",),
    "deepcache+ours": ("deepcache",),
}


def load(package: str) -> tuple[Any | None, str]:
    """(module, installed version) of one of `PACKAGES`, or (None, why it cannot be used)."""
    pkg = PACKAGES[package]
    try:
        module = importlib.import_module(pkg.module)
    except ImportError as exc:
        return None, f"{pkg.dist} is not installed ({type(exc).__name__}: {exc}); {pkg.install}"
    try:
        version = importlib.metadata.version(pkg.dist)
    except importlib.metadata.PackageNotFoundError:
        version = str(getattr(module, "__version__", "unknown"))
    return module, version


def versions(names: Sequence[str]) -> dict[str, str]:
    """Installed version (or 'not installed') of every package the named peers need."""
    out: dict[str, str] = {}
    for name in names:
        for package in NEEDS[name]:
            module, text = load(package)
            out[PACKAGES[package].dist] = text if module is not None else "not installed"
    return out


@dataclass
class PeerSetting:
    """One way to run a peer: a row of the table.

    `apply(pipe)` / `remove(pipe)` patch and unpatch the pipeline; `call(pipe)` is what a generation calls
    (the pipeline itself unless the peer brings its own call); `error` says why it cannot run at all.
    """

    peer: str
    variant: str
    setting: str
    apply: Callable[[Any], None]
    remove: Callable[[Any], None]
    call: Callable[[Any], Callable[..., Any]] | None = None
    ratio: float | None = None
    error: str | None = None


def _nothing(pipe: Any) -> None:
    return None


def unavailable(peer: str, why: str) -> PeerSetting:
    """The one row of a peer that cannot run: `why` says exactly why."""
    return PeerSetting(peer, peer, "-", _nothing, _nothing, error=why)


def settings(
    peer: str, *, spec: Arch, ratios: Sequence[float], ours: Callable[[float], tuple[Any, Any]], tomesd_md: int
) -> list[PeerSetting]:
    """The settings a peer runs at (default first, then the faster one), or one unavailable row saying why.

    `ours(r)` gives (apply, remove) of ours at ratio r, for the stacked variant.
    """
    modules: dict[str, Any] = {}
    for package in NEEDS[peer]:
        module, why = load(package)
        if module is None:
            return [unavailable(peer, why)]
        modules[package] = module
    if peer == "tomesd":
        return _tomesd(modules["tomesd"], ratios, tomesd_md)
    if peer == "ca-tome":
        return _ca_tome(modules["ca-tome"], spec)
    if peer == "deepcache":
        return [
            _deepcache(modules["deepcache"], "deepcache", 3, "cache_interval=3, cache_branch_id=0 (its README)"),
            _deepcache(modules["deepcache"], "deepcache:fast", 5, "cache_interval=5, cache_branch_id=0"),
        ]
    if peer == "hidiffusion":
        return _hidiffusion(modules["hidiffusion"])
    if peer == "deepcache+ours":
        return [_stacked(modules["deepcache"], r, ours(r)) for r in ratios]
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEER_NAMES)}")


def _tomesd(tomesd: Any, ratios: Sequence[float], md: int) -> list[PeerSetting]:
    out = []
    for variant, max_downsample in (("tomesd", md), ("tomesd:fast", min(8, 2 * md))):
        for r in ratios:

            def apply(pipe: Any, r: float = r, md: int = max_downsample) -> None:
                tomesd.apply_patch(pipe.unet, ratio=r, max_downsample=md)

            def remove(pipe: Any) -> None:
                tomesd.remove_patch(pipe.unet)

            setting = f"ratio={r:g}, max_downsample={max_downsample}"
            out.append(PeerSetting("tomesd", variant, setting, apply, remove, ratio=r))
    return out


def _ca_tome(ca_tome: Any, spec: Arch) -> list[PeerSetting]:
    if spec.text_time:
        return [
            unavailable(
                "ca-tome",
                "ca-tome 0.1.3 patches StableDiffusionPipeline only: apply_CA_ToMe replaces the pipeline's call with"
                " its copy of SD1.5's __call__ (no pooled text embeddings or time ids) and the UNet's forward with"
                " one that takes the step as a third argument; SDXL pipelines are not supported",
            )
        ]
    patch = importlib.import_module("ca_tome.patch")
    conf = ca_tome.CacheConf.CONFIG_3
    out = []
    for variant, r, note in (("ca-tome", 0.8, " (its README)"), ("ca-tome:fast", 0.5, "")):

        def apply(pipe: Any, r: float = r) -> None:
            ca_tome.apply_CA_ToMe(pipe, conf, r)

        def remove(pipe: Any) -> None:
            # Restores the blocks' classes and removes its hook; the UNet's replaced forward and the
            # pipeline's `call` stay behind and are put back by the benchmark's snapshot.
            patch.remove_patch(pipe)

        out.append(
            PeerSetting(
                "ca-tome",
                variant,
                f"CacheConf.CONFIG_3, r={r:g}{note}",
                apply,
                remove,
                call=lambda pipe: pipe.call,  # CA-ToMe runs through its own copy of the pipeline's __call__
            )
        )
    return out


def _deepcache(deepcache: Any, variant: str, interval: int, setting: str) -> PeerSetting:
    helpers: list[Any] = []

    def apply(pipe: Any) -> None:
        helper = deepcache.DeepCacheSDHelper(pipe=pipe)
        helper.set_params(cache_interval=interval, cache_branch_id=0)
        helper.enable()
        helpers.append(helper)

    def remove(pipe: Any) -> None:
        if helpers:
            helpers.pop().disable()

    return PeerSetting("deepcache", variant, setting, apply, remove)


def _hidiffusion(hidiffusion: Any) -> list[PeerSetting]:
    out = []
    for variant, raunet, setting in (
        ("hidiffusion", True, "apply_raunet=True, apply_window_attn=True (its defaults)"),
        ("hidiffusion:msw-msa", False, "apply_raunet=False, apply_window_attn=True"),
    ):

        def apply(pipe: Any, raunet: bool = raunet) -> None:
            hidiffusion.apply_hidiffusion(pipe, apply_raunet=raunet, apply_window_attn=True)

        def remove(pipe: Any) -> None:
            hidiffusion.remove_hidiffusion(pipe)

        out.append(PeerSetting("hidiffusion", variant, setting, apply, remove))
    return out


def _stacked(deepcache: Any, r: float, ours: tuple[Any, Any]) -> PeerSetting:
    """DeepCache at its default on top of ours: ours is applied first and removed last."""
    apply_ours, remove_ours = ours
    cache = _deepcache(deepcache, "deepcache+ours", 3, "")

    def apply(pipe: Any) -> None:
        apply_ours(pipe)
        cache.apply(pipe)

    def remove(pipe: Any) -> None:
        try:
            cache.remove(pipe)
        finally:
            remove_ours(pipe)

    setting = f"DeepCache cache_interval=3, cache_branch_id=0 on ours at ratio {r:g}"
    return PeerSetting("deepcache+ours", "deepcache+ours", setting, apply, remove, ratio=r)
