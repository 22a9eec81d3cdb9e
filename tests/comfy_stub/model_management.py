"""`comfy.model_management`'s interrupt: `POST /interrupt` makes the progress hook, reached from the sampler's step
callback, raise `InterruptProcessingException` (an `Exception`) inside the sampling loop."""


class InterruptProcessingException(Exception):
    pass
