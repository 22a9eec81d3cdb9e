"""Whole generations (the `peers` job, `images`): the diffusers pipeline (StableDiffusionPipeline or
StableDiffusionXLPipeline) around a UNet of `archs`, with no VAE, text encoders or tokenizers unless given: prompt
embeddings are seeded random tensors passed through the pipeline's own arguments (SDXL: pooled embeddings too), the
output is the final latent, guidance 7 (batch 2 per UNet call), Euler or DPM++ 2M from SD's noise schedule, every
variant from the same latent and generator. With `--strength S` below 1 a generation is an img2img pass, as the
WebUI's hires fix runs one (`noise_to_strength`). The rounds are `run.run_rounds`'; the pipeline is compared with a
snapshot taken after the first generation: what a peer's own removal leaves behind is put back and reported,
anything ours leaves behind fails a check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tome_bench import archs, run
from tome_bench.options import Options, Row, steps_at_strength
from tome_bench.timing import timed_call

#: SD's noise schedule (scaled-linear betas, as in the SD1.5 and SDXL-base scheduler configs), shared by both
#: samplers; "leading" spacing with steps_offset 1 as in SDXL-base's EulerDiscreteScheduler config.
SCHEDULER_CONFIG: dict[str, Any] = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012}
SCHEDULER_CONFIG |= {"beta_schedule": "scaled_linear", "prediction_type": "epsilon", "steps_offset": 1}
SCHEDULER_CONFIG |= {"timestep_spacing": "leading"}


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
    logging = importlib.import_module("transformers.utils.logging")  # in requirements-nodeps.txt
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
        none = {"safety_checker": None, "feature_extractor": None, "image_encoder": None}
        pipe = sd_pipeline(**components, **none, unet=unet, scheduler=sched, requires_safety_checker=False)
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


def make_gen_inputs(spec: archs.Arch, height: int, width: int, *, steps: int, guidance: float, latent_kind: str,
                    dtype: torch.dtype, device: torch.device, seed: int, scheduler: str = "euler", strength: float = 1.0) -> GenInputs:  # fmt: skip
    """Seeded prompt embeddings [1, 77, ctx] (and SDXL's pooled [1, pooled_dim]) for the prompt and the negative
    prompt, the same for both latent kinds, and a start latent [1, 4, H/8, W/8]: white noise or a natural spectrum
    (`archs.natural_latent`), below `strength` 1 noised to where that fraction of the schedule remains."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, archs.LATENT_CHANNELS, height // archs.VAE_SCALE, width // archs.VAE_SCALE)
    if latent_kind not in ("noise", "natural"):
        raise ValueError(f"latent kind must be 'noise' or 'natural', got {latent_kind!r}")
    draw = torch.randn if latent_kind == "noise" else archs.natural_latent
    latents = draw(shape, generator=torch.Generator().manual_seed(seed))
    embeds = lambda *size: torch.randn(size, generator=gen).to(device=device, dtype=dtype)
    text = (1, archs.TEXT_TOKENS, spec.context_dim)
    fixed: dict[str, Any] = {"prompt_embeds": embeds(*text), "negative_prompt_embeds": embeds(*text), "height": height}
    fixed |= {"width": width, "num_inference_steps": steps, "guidance_scale": guidance, "output_type": "latent"}
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


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class GenVariant(run.Variant):
    """A variant of whole generations: `apply`/`remove` take the pipeline, `call` what to generate with."""

    setting: str = ""
    call: Callable[[Any], Callable[..., Any]] | None = None
    #: Ours and the baseline must leave nothing behind (a failed check); a peer's leftovers are put back and noted.
    strict: bool = True
    peer: str | None = None
    leftovers: list[str] = field(default_factory=list)


def bench_generation_size(
    opts: Options,
    pipe: Any,
    spec: archs.Arch,
    size: tuple[int, int],
    variants: list[GenVariant],
    checks: list[tuple[bool, str]],
    notes: list[str],
    progress: Any,
) -> list[Row]:
    """Whole generations of every variant at one size, round-robin (`run.run_rounds`); rows in their order."""
    assert opts.steps is not None and opts.steps_run is not None
    label, kinds, steps = run.size_label(size), opts.latents, opts.steps_run
    common = {"steps": opts.steps, "guidance": opts.guidance, "dtype": opts.dtype, "device": opts.device}
    common |= {"seed": opts.seed, "scheduler": opts.scheduler, "strength": opts.strength}
    inputs = {kind: make_gen_inputs(spec, *size, latent_kind=kind, **common) for kind in kinds}
    # every variant's steps in every round (one that cannot run moves the bar on by its steps), plus the priming
    progress.total = (progress.total or 0) + steps * len(variants) * len(run.rounds(opts)) + run.primes(opts)
    progress.refresh()
    subject = f"{spec.name} {label}px"
    rng = run.SeededGlobalRng(opts.seed, opts.device)
    if run.primes(opts):  # one untimed 1-step baseline generation: one-time costs would land on the baseline
        progress.set_postfix_str(f"{subject} priming generation (1 step)")
        rng.enter()
        try:
            run_generation(pipe, inputs[kinds[0]].kwargs(steps=1), opts.device, sample_rss=False)
        finally:
            rng.exit()
        progress.update(1)
    hooks = run.hook_count(pipe.unet)
    # Taken after the baseline's first generation, so that the attributes every pipeline call sets
    # (`_num_timesteps`, `_guidance_scale`, ...) hold their values for N steps.
    snapshot: list[Snapshot] = []
    clean = [True]

    def on_step(pipe: Any, step: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        progress.update(1)
        return {}

    def measure(v: GenVariant, kind: str, rep: int) -> run.Run:
        what = " warm-up" if 0 <= rep < opts.warmup else f" {kind} latent" if rep < 0 else ""
        progress.set_postfix_str(f"{subject} {v.label}{what}")
        start = progress.n
        kwargs = {**inputs[kind].kwargs(), "callback_on_step_end": on_step}
        # Every variant gets the same global RNG state: tomesd and CA-ToMe fork it for their random partitions,
        # HiDiffusion draws its window shifts from it. The caller's state is restored after.
        rng.enter()
        try:
            v.apply(pipe)
            sample = opts.device.type == "cpu" and rep == 0
            result = run_generation(
                v.call(pipe) if v.call else pipe, kwargs, opts.device, sample_rss=sample, clock_name=opts.clock
            )
        finally:
            try:
                v.remove(pipe)
            except Exception as exc:  # a removal that fails is reported; the snapshot restores the pipeline
                checks.append((False, f"{subject}: removing {v.label} raised {exc!r}"))
                clean[0] = False
            rng.exit()
            ran = progress.n - start
            progress.update(max(start + steps - progress.n, 0))  # a generation that stopped early (an error)
            if not snapshot:
                snapshot.append(Snapshot.take(pipe))
            left = snapshot[0].restore() + (
                ["forward hooks left on the UNet"] if run.hook_count(pipe.unet) != hooks else []
            )
            if left and v.strict:
                clean[0] = False
                checks.append((False, f"{subject}: {v.label} left behind: {'; '.join(left)}"))
            v.leftovers = v.leftovers or left
        if ran not in (0, steps):  # 0: a peer's own call without step callbacks
            raise RuntimeError(
                f"ran {ran} sampler steps instead of {steps}: its call does not follow the schedule given"
            )
        return result

    run.run_rounds(opts, variants, measure, lambda v: progress.update(steps), subject, checks)
    if clean[0]:
        checks.append((True, f"{subject}: ours and the baseline left no hook, class or attribute behind"))
    for v in variants:
        if v.leftovers and not v.strict:  # the same for every size: the notes keep one
            notes.append(
                f"{spec.name} {v.label}: its own removal left {'; '.join(v.leftovers)}; put back by the benchmark before the next variant"
            )
    rows = [run.make_row(spec.name, label, v, variants[0], kinds, v.setting) for v in variants]
    return collapse_peer_errors(rows, variants)


def collapse_peer_errors(rows: list[Row], variants: Sequence[GenVariant]) -> list[Row]:
    """A peer whose every setting failed with the same error gets one row (named after the peer) saying why."""
    out: list[Row] = []
    seen: set[str] = set()
    for row, v in zip(rows, variants):
        group = [r.error for r, w in zip(rows, variants) if v.peer is not None and w.peer == v.peer]
        if len(group) > 1 and len(set(group)) == 1 and group[0] is not None:
            if v.peer not in seen:
                seen.add(v.peer)
                row.variant, row.ratio, row.setting = v.peer, None, "every setting"
                out.append(row)
            continue
        out.append(row)
    return out
