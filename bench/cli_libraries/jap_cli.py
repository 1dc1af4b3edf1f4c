# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
from typing import Literal, Optional
from jsonargparse import CLI
def prepare(raw: str, out: str, tokenizer: Optional[str] = None, max_length: Optional[int] = None,
            max_prompt_length: Optional[int] = None, chat_template: bool = False,
            pairing: Literal["best-worst", "best-vs-random-lower", "all-pairs", "top-k"] = "best-worst",
            top_k: int = 2, workers: Optional[int] = None, batch_size: int = 1000):
    """Read raw pairs, tokenize, check, write OUT/.

    Args:
        raw: input file or directory
        out: output directory
        tokenizer: Hugging Face tokenizer directory
        max_length: max prompt+completion tokens per half
        max_prompt_length: max prompt tokens
        chat_template: render plain-string rows through the chat template
        pairing: scored completions -> pairs
        top_k: pairs per prompt
        workers: processes that tokenize
        batch_size: records per batch
    """
    return raw
def validate(input: str, max_length: Optional[int] = None):
    """Validate.

    Args:
        input: input
        max_length: max tokens
    """
    return input
if __name__ == "__main__":
    print(CLI([prepare, validate]))
