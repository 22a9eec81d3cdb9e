"""Like modules/processing.py: the callback order of `process_images` (docs/webui-contract.md, section 2.3).

Sampling is delegated to `p.sampler.sample(p, pass_name, steps)` (the harness's fake sampler), which runs the
per-step `on_cfg_denoiser` callbacks. Runners without `process_before_every_sampling` behave like v1.6-1.9.
"""

from __future__ import annotations

import json
from typing import Any

from modules import sd_models
from modules.shared import opts


def _every_sampling(p: Any) -> None:
    hook = getattr(p.scripts, "process_before_every_sampling", None)
    if hook is not None:
        hook(p, x=None, noise=None, c=None, uc=None)


class StableDiffusionProcessing:
    token_merging_ratio = 0
    token_merging_ratio_hr = 0

    def __init__(
        self,
        *,
        scripts: Any = None,
        script_args: Any = (),
        sampler: Any = None,
        steps: int = 3,
        n_iter: int = 1,
        width: int = 64,
        height: int = 64,
        prompt: str = "a tiny test",
        seed: int = 1,
        override_settings: dict[str, Any] | None = None,
        override_settings_restore_afterwards: bool = True,
        is_api: bool = False,
    ) -> None:
        self.scripts = scripts
        self.script_args = tuple(script_args)
        self.sampler = sampler
        self.steps = steps
        self.n_iter = n_iter
        self.batch_size = 1
        self.width = width
        self.height = height
        self.prompt = prompt
        self.seed = seed
        self.override_settings = dict(override_settings or {})
        self.override_settings_restore_afterwards = override_settings_restore_afterwards
        self.is_api = is_api
        self.extra_generation_params: dict[str, Any] = {}
        self.is_hr_pass = False
        self.enable_hr = False
        self.iteration = 0

    @property
    def sd_model(self) -> Any:
        return sd_models.model_data.sd_model

    @sd_model.setter
    def sd_model(self, value: Any) -> None:
        pass

    def get_token_merging_ratio(self, for_hr: bool = False) -> float:
        raise NotImplementedError


class StableDiffusionProcessingTxt2Img(StableDiffusionProcessing):
    def __init__(
        self,
        *,
        enable_hr: bool = False,
        hr_second_pass_steps: int = 2,
        hr_checkpoint: Any = None,
        firstpass_image: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.enable_hr = enable_hr
        self.hr_second_pass_steps = hr_second_pass_steps
        self.hr_checkpoint = hr_checkpoint  # a model object in the stub
        self.firstpass_image = firstpass_image
        self.txt2img_upscale = firstpass_image is not None

    def get_token_merging_ratio(self, for_hr: bool = False) -> float:
        if for_hr:
            return (
                self.token_merging_ratio_hr
                or opts.token_merging_ratio_hr
                or self.token_merging_ratio
                or opts.token_merging_ratio
            )
        return self.token_merging_ratio or opts.token_merging_ratio

    def sample(self) -> Any:
        samples = None
        if not (self.firstpass_image is not None and self.enable_hr):
            _every_sampling(self)
            samples = self.sampler.sample(self, "first", self.steps)
            if not self.enable_hr:
                return samples
        if self.hr_checkpoint is not None:
            sd_models.reload_model_weights(info=self.hr_checkpoint)
        return self.sample_hr_pass()

    def sample_hr_pass(self) -> Any:
        self.is_hr_pass = True
        sd_models.apply_token_merging(self.sd_model, self.get_token_merging_ratio(for_hr=True))
        self.scripts.before_hr(self)
        _every_sampling(self)
        samples = self.sampler.sample(self, "hires", self.hr_second_pass_steps)
        sd_models.apply_token_merging(self.sd_model, self.get_token_merging_ratio())
        self.is_hr_pass = False
        return samples


class StableDiffusionProcessingImg2Img(StableDiffusionProcessing):
    def get_token_merging_ratio(self, for_hr: bool = False) -> float:
        return (
            self.token_merging_ratio
            or ("token_merging_ratio" in self.override_settings and opts.token_merging_ratio)
            or opts.token_merging_ratio_img2img
            or opts.token_merging_ratio
        )

    def sample(self) -> Any:
        _every_sampling(self)
        return self.sampler.sample(self, "img2img", self.steps)


def quote(text: Any) -> Any:
    if "," not in str(text) and "\n" not in str(text) and ":" not in str(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def create_infotext(p: StableDiffusionProcessing, iteration: int) -> str:
    params: dict[str, Any] = {
        "Steps": p.steps,
        "Sampler": "Euler",
        "CFG scale": 7,
        "Seed": p.seed + iteration,
        "Size": f"{p.width}x{p.height}",
        "Token merging ratio": p.get_token_merging_ratio() or None,
        "Token merging ratio hr": (p.get_token_merging_ratio(for_hr=True) or None) if p.enable_hr else None,
        **p.extra_generation_params,
    }
    line = ", ".join(k if k == v else f"{k}: {quote(v)}" for k, v in params.items() if v is not None)
    return f"{p.prompt}\n{line}"


class Processed:
    def __init__(self, p: StableDiffusionProcessing, images: list[Any], infotexts: list[str]) -> None:
        self.images = images
        self.infotexts = infotexts
        self.extra_generation_params = dict(p.extra_generation_params)

    def js(self) -> str:
        extra = {k: (None if callable(v) else v) for k, v in self.extra_generation_params.items()}
        return json.dumps({"infotexts": self.infotexts, "extra_generation_params": extra})


def process_images(p: StableDiffusionProcessing) -> Processed:
    if p.scripts is not None:
        p.scripts.before_process(p)
    stored_opts = {k: opts.data[k] for k in p.override_settings if k in opts.data}
    try:
        sd_models.reload_model_weights()
        for k, v in p.override_settings.items():
            opts.set(k, v, is_api=True, run_callbacks=False)
        sd_models.apply_token_merging(p.sd_model, p.get_token_merging_ratio())
        res = process_images_inner(p)
    finally:
        sd_models.apply_token_merging(p.sd_model, 0)
        if p.override_settings_restore_afterwards:
            for k, v in stored_opts.items():
                setattr(opts, k, v)
    return res


def process_images_inner(p: StableDiffusionProcessing) -> Processed:
    p.scripts.process(p)
    images: list[Any] = []
    infotexts: list[str] = []
    for n in range(p.n_iter):
        p.iteration = n
        sd_models.reload_model_weights()
        batch = {"batch_number": n, "prompts": [p.prompt], "seeds": [p.seed + n], "subseeds": [0]}
        p.scripts.before_process_batch(p, **batch)
        p.scripts.process_batch(p, **batch)
        samples = p.sample()
        p.scripts.postprocess_batch(p, samples, batch_number=n)
        images.append(samples)
        infotexts.append(create_infotext(p, n))
    res = Processed(p, images, infotexts)
    p.scripts.postprocess(p, res)
    return res
