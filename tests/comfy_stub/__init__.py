"""A ComfyUI-shaped stand-in for the node tests (CI has no ComfyUI): the pieces ToMe's nodes touch, with ComfyUI's
call order and clone/patch semantics, written from the facts in docs/comfyui-contract.md (no ComfyUI code).

    patcher   ModelPatcher (clone, model_options, wrappers, attn patches/replacements, object patches),
              WrapperExecutor, get_all_wrappers, the OUTER_SAMPLE, APPLY_MODEL and DIFFUSION_MODEL wrapper types
    unet      a tiny UNetModel (forward through the DIFFUSION_MODEL wrappers) with ComfyUI's block numbering,
              transformer_options and BasicTransformerBlock patch points (attn1_patch, patches_replace,
              attn1_output_patch), SD-like and SDXL-like layouts, and a UNet-less "DiT"
    dit       tiny Flux, Chroma and Wan 2.1 models under ComfyUI's module names, their attention through a stand-in of
              `wrap_attn` and `transformer_options["optimized_attention_override"]`, and a diffusion transformer no
              layout describes
    sampling  BaseModel.apply_model (through the APPLY_MODEL wrappers, extra conds such as Kontext's `ref_latents`,
              video latents), model configs and latent formats by ComfyUI's class names, calc_cond_batch,
              CFGGuider.sample/outer_sample/inner_sample, an Euler sampler with ComfyUI's per-step callback, and
              `sample` (what KSampler runs)
    torch_compile  the TorchCompileModel node and set_torch_compile_wrapper (compile now, swap in per model call)
    model_management  InterruptProcessingException, what ComfyUI's interrupt raises out of the step callback
"""
