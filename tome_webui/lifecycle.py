"""When ToMe is applied and removed during a generation.

The order (see the WebUI contract, section 2.3), for one `process_images(p)`:

* `before_process`: remove stale patches (a generation that raised never ran `postprocess`); resolve the args
  (plus XYZ values from `p.tome_xyz`) into a `TomeJob` on `p.tome_run`; switch the built-in token merging off
  for this job through `p.override_settings`; write our infotext keys (a preset's values are not known yet) and,
  with them, `ToMe version`. With ToMe off nothing else happens.
* each sampling pass, with `p.sd_model` resolved afresh: v1.10+ `process_before_every_sampling` (first pass,
  hires pass by `p.is_hr_pass`, img2img); v1.6-1.9 `process_batch` (first pass of every batch) and `before_hr`
  (hires pass). The pass's config, resolved for the model family of the UNet that runs (`tome_core.model_family`:
  a preset differs between SD1/SD2 and SDXL; Forge loads the model only after `before_process`, and a hires
  checkpoint or a refiner may be another family), is applied to the current model (or removed from it when that
  pass must not merge); applying the config already on the model changes nothing. `process_batch` also writes
  the values a preset resolves to for the loaded model on every version, since `params.txt` is written right
  after it.
* `on_cfg_denoiser`, each step: make sure the current model (a refiner may have been swapped in) carries the
  pass's config, and tell the core the sampler step for the step window. v1.6/1.7 pass no `p` there, so they
  only get the step.
* `postprocess_batch`, after the passes of each batch and before its images' infotexts are written: write the
  values each pass ran with (`tome_webui.infotext.entries` for the families seen), compare what each pass really
  merged with what its config selects (`tome_webui.report`) and write `ToMe note` when they differ (another
  extension replaced the attention, a compiled graph that does not check its modules, a model without a UNet, ...).
* `postprocess`: remove every patch this script instance applied.
* Also removed: on SD.Next's `on_after_process` (it skips `postprocess` after an interrupt), on `on_model_loaded`
  (the model object may be reused for another checkpoint; the next pass hook re-applies) and `on_script_unloaded`
  (Reload UI).

Hosts: the model object is handed to its host adapter (`tome_webui.hosts`: A1111, Forge 2 / Forge Neo / reForge /
Forge Classic, SD.Next) for the module ToMe patches (its UNet, or a diffusion transformer `tome_core` reduces: Forge
Neo's Flux, Wan, ..., SD.Next's diffusers transformers; "unet" below means either), its model family and the built-in
token merging; patches are applied to that module itself. A model with no such module gets the core's words naming
its class (`not applied: NextDiT is not a model ToMe patches`), never a silent no-op. Where the host keeps a `torch.compile` wrapper in the UNet's place (Forge Neo's Torch Compile Integrated,
reForge's `--torch-compile`, SD.Next's compile: docs/hosts.md), the adapter hands over the wrapper and `tome_core`
patches the module it wraps; the wrapper's graph traces again once with the patch in it and merges, and after the
patch is removed its earlier graph runs again. Nothing here differs for a compiled UNet. A host that fires no per-step callback (SD.Next: no `on_cfg_denoiser`, no `before_hr` and no
`process_before_every_sampling`) gets its first pass from `process_batch`, and the adapter's `watch` runs
`on_unet_call` before every call of each loaded model's UNet: it starts the next pass when `p.is_hr_pass` changes
(hires) or another UNet runs (a refiner), and otherwise does what `on_cfg_denoiser` does.

Errors: callbacks swallow exceptions, so nothing here raises for bad input. Invalid args leave ToMe off and write
`ToMe error` into the infotext (and the API's `info`); the API middleware (`tome_webui.api`) refuses invalid
requests before that. A model that cannot be patched gets `ToMe note` instead. Both are also logged as warnings
that start with `ToMe <version>:`, the line a user copies into a bug report.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

import tome_core
from tome_webui import compat, hosts, infotext, report
from tome_webui.hosts import Removable, host_of, unet_of
from tome_webui.params import TomeArgsError, TomeJob, resolve

log = logging.getLogger("tome")
#: How the warnings of a generation start: with the version, which a bug report quoting the line then carries.
LOG_HEAD = f"ToMe {tome_core.__version__}"


@dataclass(eq=False)
class Run:
    """The ToMe state of one generation, kept on its processing object as `p.tome_run`."""

    job: TomeJob
    runtime: Runtime
    owner: weakref.ReferenceType[Any]  # the `p` this run belongs to (a copy of `p` must not inherit it)
    is_img2img: bool = False
    with_hires: bool = False  # txt2img with Hires fix: the infotext has the hires keys
    families: dict[bool, str] = field(default_factory=dict)  # is_hr_pass -> the model family the pass resolved for
    unet_families: dict[int, str] = field(default_factory=dict)  # id(unet) -> its family (not walked every step)
    logged: set[str] = field(default_factory=set)  # notes already logged (once per generation)
    unpatchable: set[int] = field(default_factory=set)  # ids of UNets that cannot be patched (not retried per step)
    refused: set[tuple[int, tome_core.TomeConfig]] = field(default_factory=set)  # (id(module), a config it refused)
    problems: dict[str, None] = field(default_factory=dict)  # this batch's reasons ToMe could not apply, in order
    reports: dict[str, report.PassReport] = field(default_factory=dict)  # this batch's finished passes
    pass_name: str | None = None  # the pass now sampling
    pass_unet: nn.Module | None = None
    pass_steps: int = 0
    pass_progress: tuple[int, int] | None = None  # (sampler step, of steps) last reported in the pass, where known
    watched: set[int] = field(default_factory=set)  # ids of the UNets whose calls the host adapter watches


class Runtime:
    """The hook logic of one Script instance (one per tab); remembers weakly which UNets it patched."""

    def __init__(self) -> None:
        self.patched: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.watches: list[Removable] = []  # the host adapter's per-call hooks (SD.Next)

    def unwatch(self) -> None:
        for handle in self.watches:
            handle.remove()
        self.watches.clear()

    # ------------------------------------------------------------------------------------------ hooks

    def before_process(self, p: Any, args: Sequence[Any], *, is_img2img: bool) -> None:
        remove_patches((*self.patched, *loaded_unets()))
        self.unwatch()  # an interrupted generation skips `postprocess` in SD.Next
        p.tome_run = None
        extra = getattr(p, "extra_generation_params", None) or {}
        ours: dict[str, str] = {}
        try:
            job = resolve(args, getattr(p, "tome_xyz", None), is_img2img=is_img2img)
        except TomeArgsError as exc:
            log.warning("%s: not applied, invalid arguments: %s", LOG_HEAD, exc)
            job, ours = None, {infotext.ERROR_KEY: str(exc)}
        if job is not None:
            with_hires = not is_img2img and bool(getattr(p, "enable_hr", False))
            ours = infotext.entries(job, with_hires=with_hires)
            if host_of(compat.current_model()).switch_off_builtin(p, is_img2img=is_img2img):
                ours[infotext.BUILTIN_KEY] = "disabled"
            p.tome_run = Run(job=job, runtime=self, owner=weakref.ref(p), is_img2img=is_img2img, with_hires=with_hires)
        if ours:
            ours[infotext.VERSION_KEY] = tome_core.__version__
        if ours or any(key in infotext.ALL_KEYS for key in extra):
            # XYZ plot cells share one dict: never edit it, and never keep another cell's keys.
            p.extra_generation_params = {**infotext.without_ours(extra), **ours}

    def process_batch(self, p: Any) -> None:
        """v1.6-1.9: the first pass of each batch (v1.10+ uses `process_before_every_sampling`).

        On every version, the infotext entries are brought up to date here: `params.txt` (which the WebUI's "read
        last generation parameters" button pastes) is written right after this hook, before any sampling.
        """
        run = run_of(p)
        if run is None:
            return
        if not compat.has_every_sampling_hook(p):
            self._pass(p, is_hr_pass=False)
        else:
            unet = unet_of(p.sd_model)
            if unet is not None and id(unet) not in run.unpatchable:
                try:
                    family_of(run, unet, is_hr_pass=False, model=p.sd_model)
                except TypeError as exc:  # the pass hook reports it in the note
                    log.debug("ToMe: no model family for the infotext yet: %s", exc)
        record_values(p, run)

    def before_hr(self, p: Any) -> None:
        """v1.6-1.9: the hires pass."""
        if not compat.has_every_sampling_hook(p):
            self._pass(p, is_hr_pass=True)

    def before_every_sampling(self, p: Any) -> None:
        """v1.10+ and Forge: right before each sampler call (Forge calls it twice before the hires pass)."""
        self._pass(p, is_hr_pass=bool(getattr(p, "is_hr_pass", False)))

    def postprocess_batch(self, p: Any) -> None:
        """After the passes of one batch, before its infotexts: say what fell short of the config."""
        run = run_of(p)
        if run is None:
            return
        finish_pass(run)
        record_values(p, run)
        text = report.note(run.reports)
        lines = [*run.problems, *([text] if text else [])]
        run.problems.clear()
        run.reports.clear()
        for line in lines:
            if line not in run.logged:
                run.logged.add(line)
                log.warning("%s: %s", LOG_HEAD, line)
        if lines:
            p.extra_generation_params[infotext.NOTE_KEY] = "; ".join(lines)
        else:
            p.extra_generation_params.pop(infotext.NOTE_KEY, None)

    def postprocess(self, p: Any) -> None:
        run = run_of(p)
        if run is None:
            return
        remove_patches((*self.patched, unet_of(p.sd_model)))
        self.unwatch()
        restore = getattr(p, "tome_builtin_restore", None)
        if restore:
            options = compat.opts()
            for key, value in restore.items():
                setattr(options, key, value)
        p.tome_run = None

    def _pass(self, p: Any, *, is_hr_pass: bool) -> None:
        run = run_of(p)
        if run is None:
            return
        finish_pass(run)
        unet = ensure(p, run, is_hr_pass=is_hr_pass, new_pass=True)
        start_pass(run, pass_name(run, is_hr_pass=is_hr_pass), unet)
        self._watch(p, run)

    def _watch(self, p: Any, run: Run) -> None:
        """Where the host asks for it, watch the calls of every loaded model's UNet (once per generation)."""
        owner = weakref.ref(p)
        for model in compat.loaded_models():
            unet = unet_of(model)
            if unet is None or id(unet) in run.watched:
                continue
            run.watched.add(id(unet))
            handle = host_of(model).watch(unet, lambda model=model: on_unet_call(owner, model))
            if handle is not None:
                self.watches.append(handle)


def record_values(p: Any, run: Run) -> None:
    """Write the infotext entries of the values the passes resolved to (for the model families seen so far)."""
    infotext.update(
        p.extra_generation_params, infotext.entries(run.job, with_hires=run.with_hires, families=run.families)
    )


def run_of(p: Any) -> Run | None:
    """The ToMe run of a processing object, or None when ToMe is off for it."""
    run = getattr(p, "tome_run", None)
    return run if isinstance(run, Run) and run.owner() is p else None


def pass_name(run: Run, *, is_hr_pass: bool) -> str:
    return "hires" if is_hr_pass else "img2img" if run.is_img2img else "first"


def start_pass(run: Run, name: str, unet: nn.Module | None) -> None:
    run.pass_name, run.pass_unet, run.pass_steps, run.pass_progress = name, unet, 0, None
    if unet is not None:
        tome_core.reset_stats(unet)


def finish_pass(run: Run) -> None:
    """Keep the counts of the pass that just sampled; a pass that did not sample (Forge's discarded hook call
    before the hires pass) leaves no report."""
    name, unet = run.pass_name, run.pass_unet
    run.pass_name, run.pass_unet = None, None
    if name is None or unet is None:
        return
    stats = tome_core.stats(unet)
    if stats is None or not (stats.unet_calls or run.pass_steps):
        return
    transformer = tome_core.find_layout(tome_core.find_model(unet)) is not None
    progress = run.pass_progress
    stopped = progress if progress is not None and progress[0] + 1 < progress[1] else None
    new = report.PassReport(stats=stats, steps=run.pass_steps, transformer=transformer, stopped=stopped)
    old = run.reports.get(name)  # a refiner took over mid-pass: keep whichever model fell short
    if old is None or report.explain(old) is None or report.explain(new) is not None:
        run.reports[name] = new


def ensure(p: Any, run: Run, *, is_hr_pass: bool, new_pass: bool = False, model: Any = None) -> nn.Module | None:
    """Make the current model (or `model`) carry the config of the pass that runs (or no patch when that pass does
    not merge).

    Returns the module (UNet or diffusion transformer) that carries the pass's config, or None when this pass does
    not merge.
    """
    model = p.sd_model if model is None else model
    host = host_of(model)
    if host.is_placeholder(model):
        return None
    unet = host.unet(model)
    if unet is None:
        if run.job.may_merge(is_hr_pass):
            not_patched(run, host, model)
        return None
    if id(unet) in run.unpatchable:
        return None
    try:
        family = family_of(run, unet, is_hr_pass=is_hr_pass, model=model)
        config = run.job.config_for(is_hr_pass, family)
        if config is not None and (id(unet), config) in run.refused:
            return None
        if config is not None and host.builtin_applied(model):
            if host.remove_builtin(model):
                p.extra_generation_params[infotext.BUILTIN_KEY] = "disabled"
            else:
                run.problems["not applied: the WebUI's built-in token merging is applied to the model"] = None
                config = None
        current = tome_core.get_config(unet)
        if config is None:
            if current is not None:
                tome_core.remove_patch(unet)
            return None
        if current != config:
            try:
                tome_core.apply_patch(unet, config)
            except ValueError as exc:  # settings this model cannot run (a DiT runs keys/values subsampling only)
                run.refused.add((id(unet), config))
                run.problems[f"not applied: {exc}"] = None
                if current is not None:
                    tome_core.remove_patch(unet)
                return None
        elif new_pass:
            tome_core.set_step(unet, None, None)
        run.runtime.patched.add(unet)
        return unet
    except TypeError as exc:  # no transformer blocks (a compiled wrapper is patched through)
        run.unpatchable.add(id(unet))
        run.problems[f"not applied: cannot patch {type(model).__name__}: {exc}"] = None
        return None


def not_patched(run: Run, host: Any, model: Any) -> None:
    """Record why `model` has no module ToMe patches: its class in the core's words for the note, and once per
    generation the core's whole message (what ToMe does patch) for the log."""
    full = host.not_patched(model)
    reason = hosts.short_reason(full)
    run.problems[f"not applied: {reason}"] = None
    if full != reason and full not in run.logged:
        run.logged.add(full)
        log.warning("%s: not applied: %s", LOG_HEAD, full)


def family_of(run: Run, unet: nn.Module, *, is_hr_pass: bool, model: Any = None) -> str | None:
    """The model family a pass resolves its preset for (None when it uses no preset), recorded for the infotext
    either way (a diffusion transformer's infotext holds the fields it runs only). `model` is the host's object holding
    `unet` (its adapter may know the family better than the module does: Forge Neo's Flux.2).

    Raises TypeError for a UNet without transformer blocks (`tome_core.model_family`).
    """
    family = run.unet_families.get(id(unet))
    if family is None:
        family = run.unet_families[id(unet)] = (
            tome_core.model_family(unet) if model is None else host_of(model).family(model, unet)
        )
    run.families[is_hr_pass] = family  # also for custom settings: the infotext writes a transformer's fields only
    return family if run.job.needs_family(is_hr_pass) else None


def loaded_unets() -> list[nn.Module]:
    """The UNet modules of every model the WebUI holds."""
    return [unet for unet in map(unet_of, compat.loaded_models()) if unet is not None]


def remove_patches(unets: Iterable[nn.Module | None]) -> None:
    """Remove our patch from each UNet that has one."""
    for unet in unets:
        if unet is not None and tome_core.is_patched(unet):
            tome_core.remove_patch(unet)


# ---------------------------------------------------------------------------------------------- callbacks


def on_cfg_denoiser(params: Any) -> None:
    """Each sampler step: re-check the current model's patch (refiner swap) and set the step for the step window."""
    p = compat.denoiser_p(params)
    if p is None:  # v1.6/1.7: no way to reach p
        unet = unet_of(compat.current_model())
    else:
        run = run_of(p)
        if run is None:
            return
        is_hr_pass = bool(getattr(p, "is_hr_pass", False))
        unet = ensure(p, run, is_hr_pass=is_hr_pass)
        if unet is not run.pass_unet and unet is not None:  # a refiner took over: count its blocks from here on
            finish_pass(run)
            start_pass(run, pass_name(run, is_hr_pass=is_hr_pass), unet)
        run.pass_steps += 1
        run.pass_progress = _progress(params)
    if unet is not None and tome_core.is_patched(unet):
        tome_core.set_step(unet, params.sampling_step, params.total_sampling_steps)


def _progress(params: Any) -> tuple[int, int] | None:
    """(the sampler step now running, of how many), from the denoiser callback's parameters; None where they do not
    say."""
    step, total = getattr(params, "sampling_step", None), getattr(params, "total_sampling_steps", None)
    return (step, total) if isinstance(step, int) and isinstance(total, int) and total > 0 else None


def on_unet_call(owner: weakref.ReferenceType[Any], model: Any) -> None:
    """Before each call of a watched UNet (`model`'s): a new pass starts when `p.is_hr_pass` changed or another UNet
    runs than the pass's (a refiner); otherwise make sure the model still carries the pass's config."""
    p = owner()
    run = run_of(p) if p is not None else None
    if run is None:
        return
    is_hr_pass = bool(getattr(p, "is_hr_pass", False))
    name = pass_name(run, is_hr_pass=is_hr_pass)
    unet = unet_of(model)
    if name != run.pass_name or (unet is not run.pass_unet and run.job.may_merge(is_hr_pass)):
        finish_pass(run)
        start_pass(run, name, ensure(p, run, is_hr_pass=is_hr_pass, new_pass=True, model=model))
    else:
        ensure(p, run, is_hr_pass=is_hr_pass, model=model)
    run.pass_steps += 1


def on_after_process(p: Any) -> None:
    """SD.Next's `on_after_process`, which fires even when the generation was interrupted or failed (it then skips
    `postprocess`): leave no patch and no watch behind."""
    run = run_of(p)
    if run is None:
        return
    remove_patches((*run.runtime.patched, *loaded_unets()))
    run.runtime.unwatch()


def on_model_loaded(sd_model: Any) -> None:
    """A (re)loaded model may be the same object with new weights: it starts unpatched; the next hook re-applies."""
    remove_patches((unet_of(sd_model),))


def on_script_unloaded() -> None:
    """Reload UI: leave no patch behind."""
    remove_patches(loaded_unets())
