"""Forge Neo's `backend` package, as far as the stand-in needs it: the attention function its diffusion transformers
call (`backend.attention`) and tiny transformers of the classes Neo builds (`backend.nn`), each with the name and
module path of Neo's own class (`nolanlane/sd-webui-forge-classic` 3df257ae, `backend/loader.py`), so `tome_core`'s
Forge Neo layouts match them as they match Neo's. Written here, not copied: a few blocks, a few dozen channels, the
call structure of Neo's forward (the latent and the text as its arguments, joint attention text first)."""
