"""When ToMe is applied and removed during a generation.

The order (see the WebUI contract, section 2.3), for one `process_images(p)`:

* `before_process`: remove stale patches (a generation that raised never ran `postprocess`); resolve the args
  (plus XYZ values from `p.tome_xyz`) into a `TomeJob` on `p.tome_run`; switch the built-in token merging off
  for this job through `p.override_settings`; write our infotext keys. With ToMe off nothing else happens.
* each sampling pass, with `p.sd_model` resolved afresh: v1.10+ `process_before_every_sampling` (first pass,
  hires pass by `p.is_hr_pass`, img2img); v1.6-1.9 `process_batch` (first pass of every batch) and `before_hr`
  (hires pass). The pass's config is applied to the current model (or removed from it when that pass must not
  merge); applying the config already on the model changes nothing.
* `on_cfg_denoiser`, each step: make sure the current model (a refiner may have been swapped in) carries the
  pass's config, and tell the core the sampler step for the step window. v1.6/1.7 pass no `p` there, so they
  only get the step.
* `postprocess`: remove every patch this script instance applied.
* Also removed: on `on_model_loaded` (the model object may be reused for another checkpoint; the next pass hook
  re-applies) and `on_script_unloaded` (Reload UI).

Errors: callbacks swallow exceptions, so nothing here raises for bad input. Invalid args or a model that cannot be
patched leave ToMe off and write `ToMe error` into the infotext (and the API's `info`); the API middleware
(`tome_webui.api`) refuses invalid requests before that.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tome_core
from tome_webui import compat, infotext
from tome_webui.params import TomeArgsError, TomeJob, resolve

log = logging.getLogger("tome")


@dataclass(eq=False)
class Run:
    """The ToMe state of one generation, kept on its processing object as `p.tome_run`."""

    job: TomeJob
    runtime: Runtime
    owner: weakref.ReferenceType[Any]  # the `p` this run belongs to (a copy of `p` must not inherit it)
    noted: set[str] = field(default_factory=set)  # problems already logged
    unpatchable: set[int] = field(default_factory=set)  # ids of models that cannot be patched (not retried per step)


class Runtime:
    """The hook logic of one Script instance (one per tab); remembers weakly which models it patched."""

    def __init__(self) -> None:
        self.patched: weakref.WeakSet[Any] = weakref.WeakSet()

    # ------------------------------------------------------------------------------------------ hooks

    def before_process(self, p: Any, args: Sequence[Any], *, is_img2img: bool) -> None:
        remove_patches((*self.patched, *compat.loaded_models()))
        p.tome_run = None
        extra = getattr(p, "extra_generation_params", None) or {}
        ours: dict[str, str] = {}
        try:
            job = resolve(args, getattr(p, "tome_xyz", None), is_img2img=is_img2img)
        except TomeArgsError as exc:
            log.warning("ToMe: not applied, invalid arguments: %s", exc)
            job, ours = None, {infotext.ERROR_KEY: str(exc)}
        if job is not None:
            ours = infotext.entries(job, with_hires=not is_img2img and bool(getattr(p, "enable_hr", False)))
            if switch_off_builtin(p, is_img2img=is_img2img):
                ours[infotext.BUILTIN_KEY] = "disabled"
            p.tome_run = Run(job=job, runtime=self, owner=weakref.ref(p))
        if ours or any(key in infotext.ALL_KEYS for key in extra):
            # XYZ plot cells share one dict: never edit it, and never keep another cell's keys.
            p.extra_generation_params = {**infotext.without_ours(extra), **ours}

    def process_batch(self, p: Any) -> None:
        """v1.6-1.9: the first pass of each batch (v1.10+ uses `process_before_every_sampling`)."""
        if not compat.has_every_sampling_hook(p):
            self._pass(p, is_hr_pass=False)

    def before_hr(self, p: Any) -> None:
        """v1.6-1.9: the hires pass."""
        if not compat.has_every_sampling_hook(p):
            self._pass(p, is_hr_pass=True)

    def before_every_sampling(self, p: Any) -> None:
        """v1.10+: right before each sampler call."""
        self._pass(p, is_hr_pass=bool(getattr(p, "is_hr_pass", False)))

    def postprocess(self, p: Any) -> None:
        run = run_of(p)
        if run is None:
            return
        remove_patches((*self.patched, p.sd_model))
        restore = getattr(p, "tome_builtin_restore", None)
        if restore:
            options = compat.opts()
            for key, value in restore.items():
                setattr(options, key, value)
        p.tome_run = None

    def _pass(self, p: Any, *, is_hr_pass: bool) -> None:
        run = run_of(p)
        if run is not None:
            ensure(p, run, is_hr_pass=is_hr_pass, new_pass=True)


def run_of(p: Any) -> Run | None:
    """The ToMe run of a processing object, or None when ToMe is off for it."""
    run = getattr(p, "tome_run", None)
    return run if isinstance(run, Run) and run.owner() is p else None


def ensure(p: Any, run: Run, *, is_hr_pass: bool, new_pass: bool = False) -> None:
    """Make the current model carry the config of the pass that runs (or no patch when that pass does not merge)."""
    config = run.job.config_for(is_hr_pass)
    model = p.sd_model
    if id(model) in run.unpatchable:
        return
    try:
        if config is not None and compat.builtin_ratio_applied(model) > 0:
            note_error(p, run, "the WebUI's built-in token merging is applied to the model; ToMe stayed off")
            config = None
        current = tome_core.get_config(model)
        if config is None:
            if current is not None:
                tome_core.remove_patch(model)
            return
        if current != config:
            tome_core.apply_patch(model, config)
        elif new_pass:
            tome_core.set_step(model, None, None)
        run.runtime.patched.add(model)
    except (TypeError, ValueError) as exc:  # no UNet (Forge 2, SD3) or no transformer blocks
        run.unpatchable.add(id(model))
        note_error(p, run, f"cannot patch {type(model).__name__}: {exc}")


def note_error(p: Any, run: Run, message: str) -> None:
    """Log a problem once per run and put it into the image's infotext."""
    if message not in run.noted:
        run.noted.add(message)
        log.warning("ToMe: %s", message)
    p.extra_generation_params[infotext.ERROR_KEY] = message


def remove_patches(models: Iterable[Any]) -> None:
    """Remove our patch from each model that has one."""
    for model in models:
        try:
            if tome_core.is_patched(model):
                tome_core.remove_patch(model)
        except TypeError as exc:  # a model without a UNet cannot carry our patch
            log.debug("ToMe: nothing to remove from %s: %s", type(model).__name__, exc)


def switch_off_builtin(p: Any, *, is_img2img: bool) -> bool:
    """Override the built-in token merging ratios to 0 for this job; True if it would have merged.

    Only done when the built-in would run, and on a copy of `p.override_settings` (XYZ cells share the dict).
    With `override_settings_restore_afterwards` off, the WebUI keeps overrides, so the settings are put back in
    `postprocess` (for options present in `opts.data`; an absent one stays at its default 0).
    """
    overrides = dict(getattr(p, "override_settings", None) or {})

    def setting(key: str) -> float:
        raw = overrides[key] if key in overrides else compat.option(key, 0)
        try:
            return float(raw or 0)
        except (TypeError, ValueError):
            log.debug("ToMe: unreadable setting %s=%r", key, raw)
            return 0.0

    ratio, ratio_hr, ratio_img2img = (setting(key) for key in compat.BUILTIN_RATIO_KEYS)
    if is_img2img:
        active = ratio_img2img > 0 or ratio > 0
    else:
        active = ratio > 0 or (bool(getattr(p, "enable_hr", False)) and ratio_hr > 0)
    if not active:
        return False
    if not getattr(p, "override_settings_restore_afterwards", True):
        data = compat.opts().data
        p.tome_builtin_restore = {key: data[key] for key in compat.BUILTIN_RATIO_KEYS if key in data}
    p.override_settings = {**overrides, **dict.fromkeys(compat.BUILTIN_RATIO_KEYS, 0)}
    return True


# ---------------------------------------------------------------------------------------------- callbacks


def on_cfg_denoiser(params: Any) -> None:
    """Each sampler step: re-check the current model's patch (refiner swap) and set the step for the step window."""
    p = compat.denoiser_p(params)
    if p is None:  # v1.6/1.7: no way to reach p
        model = compat.current_model()
    else:
        run = run_of(p)
        if run is None:
            return
        ensure(p, run, is_hr_pass=bool(getattr(p, "is_hr_pass", False)))
        model = p.sd_model
    if model is None:
        return
    try:
        if tome_core.is_patched(model):
            tome_core.set_step(model, params.sampling_step, params.total_sampling_steps)
    except TypeError as exc:
        log.debug("ToMe: no step for %s: %s", type(model).__name__, exc)


def on_model_loaded(sd_model: Any) -> None:
    """A (re)loaded model may be the same object with new weights: it starts unpatched; the next hook re-applies."""
    remove_patches((sd_model,))


def on_script_unloaded() -> None:
    """Reload UI: leave no patch behind."""
    remove_patches(compat.loaded_models())
