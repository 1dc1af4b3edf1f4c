# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
import tyro
from dataclasses import dataclass
from typing import Literal, Optional

@dataclass
class Prepare:
    """Read raw pairs, tokenize, check, write OUT/."""
    raw: tyro.conf.Positional[str]
    """input file or directory"""
    out: tyro.conf.Positional[str]
    """output directory"""
    tokenizer: Optional[str] = None
    """Hugging Face tokenizer directory"""
    max_length: Optional[int] = None
    """max prompt+completion tokens per half"""
    max_prompt_length: Optional[int] = None
    """max prompt tokens"""
    chat_template: bool = False
    """render plain-string rows through the chat template"""
    pairing: Literal["best-worst", "best-vs-random-lower", "all-pairs", "top-k"] = "best-worst"
    """scored completions -> pairs"""
    top_k: int = 2
    """pairs per prompt with --pairing top-k"""
    workers: Optional[int] = None
    """processes that tokenize"""
    batch_size: int = 1000
    """records per batch"""
