# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
from typing import Literal, Optional
from pydantic import Field
from pydantic_settings import BaseSettings, CliApp, CliSubCommand, CliPositionalArg
class Prepare(BaseSettings):
    raw: CliPositionalArg[str]
    out: CliPositionalArg[str]
    tokenizer: Optional[str] = Field(None, description="Hugging Face tokenizer directory")
    max_length: Optional[int] = Field(None, description="max prompt+completion tokens per half")
    max_prompt_length: Optional[int] = Field(None, description="max prompt tokens")
    chat_template: bool = Field(False, description="render through the chat template")
    pairing: Literal["best-worst", "best-vs-random-lower", "all-pairs", "top-k"] = Field("best-worst", description="pairs")
    top_k: int = Field(2, description="pairs per prompt")
    workers: Optional[int] = Field(None, description="processes")
    batch_size: int = Field(1000, description="records per batch")
class Validate(BaseSettings):
    input: CliPositionalArg[str]
    max_length: Optional[int] = Field(None, description="max tokens")
class Root(BaseSettings, cli_prog_name="prefdata", cli_kebab_case=True):
    prepare: CliSubCommand[Prepare]
    validate: CliSubCommand[Validate]
    def cli_cmd(self): pass
if __name__ == "__main__":
    CliApp.run(Root)
