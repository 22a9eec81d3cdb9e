"""Whole generations (`python -m tome_bench --steps N`): every variant runs N sampler steps of a diffusers
pipeline, side by side with the alternatives a user could pick instead (`--peers`, see `peers`).

With `--strength S` below 1 a generation is an img2img pass, as the WebUI's hires fix runs one: the start latent
is noised to the timestep where a fraction S of the N-step schedule remains and only those last int(N * S) steps
run (`noise_to_strength`, with the scheduler's own `set_timesteps`, `timesteps[t_start:]` and `add_noise`).

The pipeline (StableDiffusionPipeline or StableDiffusionXLPipeline) wraps the random-weight UNet of `archs`
with no VAE, text encoders or tokenizers: prompt embeddings are seeded random tensors passed through the
pipeline's own arguments (SDXL: pooled embeddings too; its time ids come from height and width), the output is
the final latent (`output_type="latent"`), guidance 7 (classifier-free: batch 2 per UNet call), Euler or DPM++ 2M
from SD's noise schedule, and every variant starts from the same latent and generator. Variants run
round-robin within each repetition; each is applied right before its generation and removed right after, and
the pipeline is compared with a snapshot taken before the first variant: what a peer's own removal leaves
behind is put back and reported, anything ours leaves behind fails a check, and the baseline's final latent
must stay bitwise identical across repetitions.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench import archs, compiled, peers, report, run, timing
from tome_bench.options import Options, Row, steps_at_strength
from tome_bench.timing import timed_call
from tome_core import TomeConfig

#: SD's noise schedule (scaled-linear betas, as in the SD1.5 and SDXL-base scheduler configs), shared by both
#: samplers; "leading" spacing with steps_offset 1 as in SDXL-base's EulerDiscreteScheduler config.
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "steps_offset": 1,
    "timestep_spacing": "leading",
}
#: Output files of this mode in --out (the per-call mode writes bench.*).
OUTPUT_STEM = "gen"


# ---------------------------------------------------------------------------------------------- pipeline


def make_scheduler(name: str) -> Any:
    """Euler (EulerDiscreteScheduler) or DPM++ 2M (DPMSolverMultistepScheduler, dpmsolver++, order 2)."""
    from diffusers import DPMSolverMultistepScheduler, EulerDiscreteScheduler

    if name == "euler":
        return EulerDiscreteScheduler(**SCHEDULER_CONFIG)
    if name == "dpm++2m":
        return DPMSolverMultistepScheduler(**SCHEDULER_CONFIG, algorithm_type="dpmsolver++", solver_order=2)
    raise ValueError(f"unknown scheduler {name!r}; known: euler, dpm++2m")


def _pipeline_classes() -> tuple[Any, Any]:
    """diffusers' SD and SDXL pipelines; they import transformers (for the text encoders we never build)."""
    try:
        logging = importlib.import_module("transformers.utils.logging")
    except ImportError as exc:
        raise RuntimeError(
            f"--steps needs transformers, which diffusers' pipelines import ({exc}); it is in requirements-nodeps.txt"
            " (make venv)"
        ) from exc
    # transformers announces, once per process, that image processors fall back to PIL without torchvision:
    # nothing here processes images, so the notice is noise in the benchmark's output.
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        # diffusers imports a pipeline's module (and transformers) on first access, i.e. here
        from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

        return StableDiffusionPipeline, StableDiffusionXLPipeline
    finally:
        logging.set_verbosity(verbosity)


def build_pipeline(
    spec: archs.Arch, unet: nn.Module, scheduler: str, name: str | None = None, parts: dict[str, Any] | None = None
) -> Any:
    """A diffusers pipeline around `unet` without safety checker, and without VAE, text encoders and tokenizers
    unless `parts` gives them (`vae`, `text_encoder`, `tokenizer`, SDXL's `text_encoder_2`, `tokenizer_2`)."""
    sd_pipeline, sdxl_pipeline = _pipeline_classes()
    sched = make_scheduler(scheduler)
    given = parts or {}
    components = {key: given.get(key) for key in ("vae", "text_encoder", "tokenizer")}
    if spec.text_time:
        components.update(text_encoder_2=given.get("text_encoder_2"), tokenizer_2=given.get("tokenizer_2"))
        pipe = sdxl_pipeline(**components, unet=unet, scheduler=sched, add_watermarker=False)
    else:
        pipe = sd_pipeline(
            **components,
            unet=unet,
            scheduler=sched,
            safety_checker=None,
            feature_extractor=None,
            image_encoder=None,
            requires_safety_checker=False,
        )
    pipe.set_progress_bar_config(disable=True)
    # A pipeline built in code has no name (None); HiDiffusion reads it as a string ('inpainting' in it) and then
    # recognises the architecture by its module names.
    pipe.register_to_config(_name_or_path=name or f"random-weights/{spec.name}")
    return pipe


@dataclass
class GenInputs:
    """Everything one generation gets: the same for every variant; `kwargs()` hands out fresh copies."""

    fixed: dict[str, Any]
    latents: torch.Tensor
    seed: int
    device: torch.device
    #: Below strength 1: the timesteps that run, the last ones of the schedule (the pipeline's `timesteps=`).
    timesteps: list[float] | None = None

    def kwargs(self, steps: int | None = None) -> dict[str, Any]:
        """Fresh arguments of one generation; `steps` runs only the first `steps` sampler steps (the priming)."""
        out = dict(self.fixed)
        if steps is not None and self.timesteps is None:
            out["num_inference_steps"] = steps
        elif steps is not None:
            out["timesteps"] = self.timesteps[:steps]
        # the scheduler draws from the generator (Euler's churn noise, unused at churn 0): a fresh one per run
        out["generator"] = torch.Generator(device=self.device).manual_seed(self.seed)
        out["latents"] = self.latents.clone()
        return out


def make_gen_inputs(
    spec: archs.Arch,
    height: int,
    width: int,
    *,
    steps: int,
    guidance: float,
    latent_kind: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    scheduler: str = "euler",
    strength: float = 1.0,
) -> GenInputs:
    """Seeded prompt embeddings [1, 77, ctx] (and SDXL's pooled [1, pooled_dim]) for the prompt and the negative
    prompt, and a start latent [1, 4, H/8, W/8]: white noise or a natural spectrum (`archs.natural_latent`),
    below `strength` 1 noised to where that fraction of the `scheduler`'s schedule remains (`noise_to_strength`).

    The embeddings are the same for both latent kinds.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (1, archs.LATENT_CHANNELS, height // archs.VAE_SCALE, width // archs.VAE_SCALE)
    if latent_kind == "noise":
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    elif latent_kind == "natural":
        latents = archs.natural_latent(shape, torch.Generator().manual_seed(seed))
    else:
        raise ValueError(f"latent kind must be 'noise' or 'natural', got {latent_kind!r}")

    def embeds(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen).to(device=device, dtype=dtype)

    fixed: dict[str, Any] = {
        "prompt_embeds": embeds(1, archs.TEXT_TOKENS, spec.context_dim),
        "negative_prompt_embeds": embeds(1, archs.TEXT_TOKENS, spec.context_dim),
        "height": height,
        "width": width,
        "num_inference_steps": steps,
        "guidance_scale": guidance,
        "output_type": "latent",
    }
    if spec.text_time:
        fixed["pooled_prompt_embeds"] = embeds(1, spec.pooled_dim)
        fixed["negative_pooled_prompt_embeds"] = embeds(1, spec.pooled_dim)
        fixed["original_size"] = fixed["target_size"] = (height, width)
        fixed["crops_coords_top_left"] = (0, 0)
    if strength >= 1.0:
        return GenInputs(fixed, latents.to(device=device, dtype=dtype), seed, device)
    latents, timesteps = noise_to_strength(latents, scheduler, steps, strength, seed)
    del fixed["num_inference_steps"]  # the pipeline runs the given timesteps
    fixed["timesteps"] = timesteps
    return GenInputs(fixed, latents.to(device=device, dtype=dtype), seed, device, timesteps)


def noise_to_strength(
    start: torch.Tensor, scheduler: str, steps: int, strength: float, seed: int
) -> tuple[torch.Tensor, list[float]]:
    """An img2img pass's start, as diffusers' img2img pipelines make it: the timesteps that run and the latent
    [1, 4, h, w] to hand a txt2img pipeline with them.

    The scheduler's `steps`-step schedule, its last int(steps * strength) timesteps (`timesteps[t_start:]`), and
    `start` noised to the first of them with seeded white noise (seed + 1: not the start latent's own stream) by
    the scheduler's `add_noise`. The txt2img pipeline multiplies the latents it is given by its scheduler's
    `init_noise_sigma` once it has set these timesteps, so the latent is returned divided by that: its first step
    sees the noised latent.
    """
    sched = make_scheduler(scheduler)
    sched.set_timesteps(steps)
    t_start = (steps - steps_at_strength(steps, strength)) * sched.order
    timesteps = sched.timesteps[t_start:]
    sched.set_begin_index(t_start)
    noise = torch.randn(start.shape, generator=torch.Generator().manual_seed(seed + 1))
    noised = sched.add_noise(start.float(), noise, timesteps[:1])
    pipeline_side = make_scheduler(scheduler)
    pipeline_side.set_timesteps(timesteps=timesteps.tolist())
    return noised / pipeline_side.init_noise_sigma, timesteps.tolist()


def run_generation(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    device: torch.device,
    *,
    sample_rss: bool,
    clock_name: str = "wall",
) -> tuple[float, torch.Tensor, int | None]:
    """One timed generation: (seconds, final latent [1, 4, H/8, W/8] as float32 on CPU, peak memory or None)."""
    seconds, out, mem = timed_call(lambda: fn(**kwargs), device, clock_name=clock_name, sample_rss=sample_rss)
    latents = out.images if hasattr(out, "images") else out[0]
    return seconds, latents.detach().float().cpu(), mem


# ---------------------------------------------------------------------------------------------- snapshot

#: Plain values compared by value; anything else by identity.
_SCALARS = (bool, int, float, str, type(None))


@dataclass
class Snapshot:
    """The attributes (instance __dict__) and classes of a pipeline and every module of its UNet.

    Peers patch by replacing classes, instance methods and attributes; `restore` puts back exactly what was
    there (deleting added attributes, restoring replaced and removed ones and classes) and says what it changed.
    Hook counts are checked apart (`run.hook_count`): restoring cannot remove a hook.
    """

    objects: list[tuple[str, Any, type, dict[str, Any]]]

    @classmethod
    def take(cls, pipe: Any) -> Snapshot:
        objects = [("the pipeline", pipe, type(pipe), dict(pipe.__dict__))]
        for name, module in pipe.unet.named_modules():
            objects.append((name or "the UNet", module, type(module), dict(module.__dict__)))
        return cls(objects)

    def restore(self) -> list[str]:
        """Put everything back; one line per kind of change, e.g. 'forward added on 38 modules (...)'."""
        changes: dict[str, list[str]] = {}
        for name, obj, cls, saved in self.objects:
            now = obj.__dict__
            if type(obj) is not cls:
                changes.setdefault(f"class {type(obj).__name__} left in place of {cls.__name__}", []).append(name)
                obj.__class__ = cls
            for key in [k for k in now if k not in saved]:
                changes.setdefault(f"{key} added", []).append(name)
                del now[key]
            for key, value in saved.items():
                if key not in now:
                    changes.setdefault(f"{key} removed", []).append(name)
                    now[key] = value
                    continue
                current = now[key]
                same = current == value if isinstance(value, _SCALARS) and isinstance(current, _SCALARS) else None
                if same is None:
                    same = current is value
                if not same:
                    what = f"{key} changed" + (f" ({value!r} -> {current!r})" if isinstance(value, _SCALARS) else "")
                    changes.setdefault(what, []).append(name)
                    now[key] = value
        lines = []
        for what, names in changes.items():
            where = names[0] if len(names) == 1 else f"{len(names)} objects, e.g. {names[0]}"
            lines.append(f"{what} on {where}")
        return lines


# ---------------------------------------------------------------------------------------------- variants


@dataclass
class GenVariant(run.Variant):
    """A variant of the whole-generation mode: `apply`/`remove` take the pipeline, `call` what to generate with."""

    setting: str = ""
    call: Callable[[Any], Callable[..., Any]] | None = None
    #: Ours and the baseline must leave nothing behind (a failed check); a peer's leftovers are put back and noted.
    strict: bool = True
    peer: str | None = None
    leftovers: list[str] = field(default_factory=list)


def _ours_pair(cfg: TomeConfig) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    # Patched through the pipeline, the core follows the scheduler's step index (its step window).
    return (lambda pipe: tome_core.apply_patch(pipe, cfg)), tome_core.remove_patch


def make_gen_variants(opts: Options, pipe: Any, spec: archs.Arch) -> list[GenVariant]:
    """baseline; ours at every ratio, each --ours configuration, each preset; tomesd (--variants) and --peers."""
    variants = [GenVariant("baseline", None, run.noop, run.noop, setting="unpatched")]
    base_cfg = TomeConfig.from_dict(opts.ours_fields)
    ours = [("ours", opts.ours_fields)] if "ours" in opts.variants else []
    ours += list(opts.extra_ours)
    for r in opts.ratios:
        for kind, fields in ours:
            apply, remove = _ours_pair(TomeConfig.from_dict(fields).replace(ratio=r))
            variants.append(GenVariant(kind, r, apply, remove, setting=_describe_ours(fields)))
    for name in opts.presets:
        variants.append(
            GenVariant(
                run.preset_variant_name(name),
                None,
                lambda pipe, name=name: tome_core.apply_patch(pipe, preset=name),
                tome_core.remove_patch,
                setting=f"preset={name}",
            )
        )
    names = list(opts.peers)
    if "tomesd" in opts.variants and "tomesd" not in names:
        names.insert(0, "tomesd")
    tomesd_md = run.tomesd_max_downsample(opts, pipe.unet)
    for name in names:
        found = peers.settings(
            name,
            spec=spec,
            ratios=opts.ratios,
            ours=lambda r: _ours_pair(base_cfg.replace(ratio=r)),
            tomesd_md=tomesd_md,
        )
        if name == "tomesd" and name not in opts.peers:
            found = [s for s in found if s.variant != "tomesd:fast"]  # --variants tomesd: its default only
        for s in found:
            variants.append(
                GenVariant(
                    s.variant,
                    s.ratio,
                    s.apply,
                    s.remove,
                    error=s.error,
                    setting=s.setting,
                    call=s.call,
                    strict=False,
                    peer=s.peer,
                )
            )
    return variants


def compiled_gen_twin(v: GenVariant, runner: compiled.Compiled) -> GenVariant:
    """The same variant with the pipeline's UNet swapped for its compiled wrapper while it runs (the way diffusers
    documents `pipe.unet = torch.compile(pipe.unet)`); the patch goes on the module the wrapper runs."""

    # Swapped past the pipeline's __setattr__, which would write the wrapper's class into the pipeline's config
    # (harmless for a user, but the benchmark checks that every variant leaves the pipeline exactly as it was).
    def apply(pipe: Any, v: GenVariant = v) -> None:
        plain = pipe.unet
        object.__setattr__(pipe, "unet", runner.of(plain))
        try:
            v.apply(pipe)
        except BaseException:
            object.__setattr__(pipe, "unet", plain)
            raise

    def remove(pipe: Any, v: GenVariant = v) -> None:
        try:
            v.remove(pipe)
        finally:
            object.__setattr__(pipe, "unet", getattr(pipe.unet, "_orig_mod", pipe.unet))

    return GenVariant(compiled.twin_name(v.kind), v.ratio, apply, remove, compiled=True, setting=v.setting)


def _describe_ours(fields: dict[str, Any]) -> str:
    """The TomeConfig fields set on the command line (--set, --ours), or 'defaults'."""
    return ", ".join(f"{k}={v!r}" for k, v in fields.items() if k != "ratio") or "defaults"


# ---------------------------------------------------------------------------------------------- measuring


class _StepProgress:
    """Moves a tqdm bar one step per sampler step (through the pipeline's callback_on_step_end)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def __call__(self, pipe: Any, step: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.progress.update(1)
        return {}

    def finish(self, start: int, steps: int) -> None:
        """Bring the bar to `start + steps` when a generation stopped early (an error)."""
        missing = start + steps - self.progress.n
        if missing > 0:
            self.progress.update(missing)


def bench_generation_size(
    opts: Options,
    pipe: Any,
    spec: archs.Arch,
    size: tuple[int, int],
    checks: list[tuple[bool, str]],
    notes: list[str],
    progress: Any,
) -> list[Row]:
    """Whole generations of every variant at one size; rows in the order of `make_gen_variants`."""
    assert opts.steps is not None and opts.steps_run is not None
    height, width = size
    label = run.size_label(size)
    kinds = opts.latents
    steps = opts.steps_run  # what one generation runs: below strength 1 the last ones of the schedule
    inputs = {
        kind: make_gen_inputs(
            spec,
            height,
            width,
            steps=opts.steps,
            guidance=opts.guidance,
            latent_kind=kind,
            dtype=opts.dtype,
            device=opts.device,
            seed=opts.seed,
            scheduler=opts.scheduler,
            strength=opts.strength,
        )
        for kind in kinds
    }
    variants = make_gen_variants(opts, pipe, spec)
    if opts.compile_mode:
        runner = compiled.Compiled(opts.compile_mode)
        peers_out = [v for v in variants if v.peer is not None]  # peers patch their own way: eager only
        variants = compiled.twins([v for v in variants if v.peer is None], lambda v: compiled_gen_twin(v, runner))
        variants += peers_out
        runner.of(pipe.unet)  # wrapped now: torch.compile marks the module it wraps, before the leftover check starts
    base = variants[0]
    rounds = [(rep, kinds[0]) for rep in range(opts.warmup + opts.repeats)] + [(-1, kind) for kind in kinds[1:]]
    # every variant's steps in every round (one that cannot run moves the bar on by its steps), plus the priming
    progress.total = (progress.total or 0) + steps * len(variants) * len(rounds) + (1 if opts.warmup == 0 else 0)
    progress.refresh()
    stepper = _StepProgress(progress)
    rng = run.SeededGlobalRng(opts.seed, opts.device)
    if opts.warmup == 0:
        # One untimed 1-step baseline generation: one-time costs (kernel selection, allocator growth, lazy
        # imports in the pipeline) would otherwise land on the first timed variant, the baseline.
        progress.set_postfix_str(f"{spec.name} {label}px priming generation (1 step)")
        rng.enter()
        try:
            run_generation(pipe, inputs[kinds[0]].kwargs(steps=1), opts.device, sample_rss=False)
        finally:
            rng.exit()
        progress.update(1)
    hooks0 = run.hook_count(pipe.unet)
    # Taken right after the baseline's first generation (the first of the first round), so that the attributes
    # every pipeline call sets (`_num_timesteps`, `_guidance_scale`, ...) hold their values for N steps.
    snapshot: Snapshot | None = None
    sample_rss = opts.device.type == "cpu"
    max_diff = 0.0
    compared = 0
    clean = True
    with timing.TimingLock(opts.lock, opts.lock_after) as lock:  # --lock: the timed runs, one process at a time
        for rep, kind in rounds:
            warm = 0 <= rep < opts.warmup
            if not warm:
                lock.hold()
            for v in variants:
                if v.error is not None:
                    progress.update(steps)  # counted in the total, skipped since it failed
                    continue
                what = " warm-up" if warm else (f" {kind} latent" if rep < 0 else "")
                progress.set_postfix_str(f"{spec.name} {label}px {v.label}{what}")
                start = progress.n
                kwargs = {**inputs[kind].kwargs(), "callback_on_step_end": stepper}
                # Every variant gets the same global RNG state: tomesd and CA-ToMe fork it for their random
                # partitions, HiDiffusion draws its window shifts from it. The caller's state is restored after.
                rng.enter()
                try:
                    v.apply(pipe)
                    fn = v.call(pipe) if v.call is not None else pipe
                    with compiled.counting(v, warm):
                        seconds, out, mem = run_generation(
                            fn, kwargs, opts.device, sample_rss=sample_rss and rep == 0, clock_name=opts.clock
                        )
                except Exception as exc:  # a peer that fails must not stop the benchmark: its row says why
                    if v is base:
                        raise
                    v.error = f"{type(exc).__name__}: {exc}"
                    print(f"\n{v.label} failed at {label}px: {v.error}", file=sys.stderr)
                finally:
                    try:
                        v.remove(pipe)
                    except Exception as exc:  # a removal that fails is reported; the snapshot restores the pipeline
                        v.error = v.error or f"removal failed: {type(exc).__name__}: {exc}"
                        checks.append((False, f"{spec.name} {label}px: removing {v.label} raised {exc!r}"))
                        clean = False
                    rng.exit()
                ran = progress.n - start
                if v.error is None and ran not in (0, steps):  # 0: a peer's own call without step callbacks
                    if v is base:
                        raise RuntimeError(f"the baseline ran {ran} sampler steps instead of {steps}")
                    v.error = f"ran {ran} sampler steps instead of {steps}: its call does not follow the schedule given"
                stepper.finish(start, steps)
                if snapshot is None:
                    snapshot = Snapshot.take(pipe)
                left = snapshot.restore()
                if run.hook_count(pipe.unet) != hooks0:
                    left.append("forward hooks left on the UNet")
                    clean = False
                if left and v.strict:
                    clean = False
                    checks.append((False, f"{spec.name} {label}px: {v.label} left behind: {'; '.join(left)}"))
                elif left and not v.leftovers:
                    v.leftovers = left
                if v.error is not None:
                    continue
                if rep == 0:
                    v.first_s = seconds
                diff = run.record(v, base, kind, out, seconds, mem, rep=rep, warm=warm, device=opts.device)
                if diff is not None:
                    compared += 1
                    max_diff = max(max_diff, diff)

    if base.output is not None and not torch.isfinite(base.output).all():
        checks.append((False, f"{spec.name} {label}px: the baseline's final latent is not finite ({opts.dtype_name})"))
    cycles = sum(1 for v in variants[1:] if v.error is None) * (opts.warmup + opts.repeats - 1)
    if compared:
        checks.append(
            run.baseline_check(
                f"{spec.name} {label}px: the baseline's final latent",
                f"{compared} later timed generation(s) after {cycles} apply/remove cycles of the other variants",
                max_diff,
            )
        )
    if clean:
        checks.append((True, f"{spec.name} {label}px: ours and the baseline left no hook, class or attribute behind"))
    for v in variants:
        if v.leftovers:
            notes.append(  # the same for every size: `main` keeps the first
                f"{spec.name} {v.label}: its own removal left {'; '.join(v.leftovers)}; put back by the benchmark"
                " before the next variant"
            )
    rows = []
    for v in variants:
        row = run.make_row(spec, label, v, run.base_of(v, variants), kinds)
        row.setting = v.setting
        rows.append(row)
    compiled.fill_rows(rows, variants)
    return collapse_peer_errors(rows, variants)


def collapse_peer_errors(rows: list[Row], variants: Sequence[GenVariant]) -> list[Row]:
    """A peer whose every setting failed with the same error gets one row (named after the peer) saying why."""
    out: list[Row] = []
    seen: set[str] = set()
    for row, v in zip(rows, variants):
        if v.peer is None:
            out.append(row)
            continue
        group = [(r, w) for r, w in zip(rows, variants) if w.peer == v.peer]
        errors = {r.error for r, _ in group}
        if len(group) > 1 and len(errors) == 1 and None not in errors:
            if v.peer not in seen:
                seen.add(v.peer)
                row.variant, row.ratio, row.setting = v.peer, None, "every setting"
                out.append(row)
            continue
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- main


def main(opts: Options, argv: Sequence[str]) -> int:
    """Run the whole-generation benchmark; write gen.md, gen.json and gen.png to --out. Exit status 0 = all checks
    passed."""
    from tqdm import tqdm

    assert opts.steps is not None
    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    notes: list[str] = []
    names = list(opts.peers) + (["tomesd"] if "tomesd" in opts.variants and "tomesd" not in opts.peers else [])
    peer_versions = peers.versions(names)
    info = report.machine_info(opts, peer_versions.get("tomesd"))
    info.update({f"peer {dist}": version for dist, version in peer_versions.items() if dist != "tomesd"})
    info["transformers"] = report.version("transformers")
    rows: list[Row] = []
    checks: list[tuple[bool, str]] = []
    with tqdm(total=0, unit="step", file=sys.stderr) as progress:
        for spec in opts.arches:
            progress.set_postfix_str(f"building {spec.name}")
            unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
            if opts.checkpoint:
                progress.set_postfix_str(f"loading {opts.checkpoint}")
                archs.load_checkpoint(unet, opts.checkpoint, spec)
            pipe = build_pipeline(spec, unet, opts.scheduler, name=opts.checkpoint)
            for size in opts.sizes_of(spec.name):
                rows += bench_generation_size(opts, pipe, spec, size, checks, notes, progress)
            del pipe, unet
            gc.collect()
            if opts.device.type == "cuda":
                torch.cuda.empty_cache()
    for r in rows:
        if not r.variant.startswith("baseline") and r.error is None and r.deviation == 0.0:
            notes.append(
                f"{r.arch} {r.size}px {r.variant}: final latent identical to the baseline's, nothing was changed"
                + (
                    " (tomesd's max_downsample=1 has no attention block on this architecture: see tomesd:fast, or"
                    " --tomesd-max-downsample auto)"
                    if r.variant == "tomesd"
                    else ""
                )
            )
    checks += compiled.checks(rows)
    notes = list(dict.fromkeys(notes + report.clock_notes(opts)))
    wall = time.perf_counter() - started
    opts.out.mkdir(parents=True, exist_ok=True)
    warning = report.spread_line(rows)
    table = report.format_table(rows, opts.device, opts.latents, generation=True)
    markdown = report.write_gen_report(opts, argv, rows, checks, notes, info, wall)
    paths = [opts.out / f"{OUTPUT_STEM}.{ext}" for ext in ("md", "json")] + [
        opts.plot or opts.out / f"{OUTPUT_STEM}.png"
    ]
    paths[0].write_text(markdown)
    mode_keys = {
        "steps": opts.steps,
        "strength": opts.strength,
        "steps_run": opts.steps_run,
        "scheduler": opts.scheduler,
        "guidance": opts.guidance,
    }
    data = report.payload(opts, argv, info, rows, checks, notes, warning, wall, mode_keys=mode_keys, extra={})
    paths[1].write_text(json.dumps(data, indent=2))
    report.write_plot(rows, paths[2], report.generation_steps(opts), opts.latents)

    print(table)
    if warning:
        print(warning)
    print()
    report.print_checks_and_notes(checks, notes)
    print(f"\nwrote {', '.join(map(str, paths))} ({wall:.1f} s)")
    return 0 if all(ok for ok, _ in checks) else 1
