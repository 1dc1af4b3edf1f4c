"""What every generation engine is given: how each prompt is sampled (`SamplingSettings`).

`prefdata generate` and each online round build one from their settings; the transformers engine
(prefdata.online.generate) and the vLLM engine (prefdata.online.vllm_engine) read it. The command's
own settings (model, overwrite, progress...) are `prefdata.settings.commands.GenerateSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefdata.core.errors import PrefdataError
from prefdata.tokenize.template import TemplateSettings

ENGINES = ("transformers", "vllm")


@dataclass
class SamplingSettings:
    """K samples per prompt, how they are drawn and on which engine; checked once, here."""

    samples: int = 2
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 8  # prompts per generate call (each yields `samples` sequences)
    chat_template: bool = False
    engine: str = "transformers"
    device: str = "auto"
    template: TemplateSettings = field(default_factory=TemplateSettings)  # as prepare renders

    def __post_init__(self) -> None:
        if self.samples < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise PrefdataError("--samples, --max-new-tokens and --batch-size must be at least 1")
        if self.temperature < 0:
            raise PrefdataError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PrefdataError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.engine not in ENGINES:
            raise PrefdataError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
