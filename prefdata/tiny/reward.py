"""A tiny sequence-classification reward model with its own tokenizer, built from code.

Its tokenizer differs from `prefdata.tiny`'s policy tokenizer on purpose (another vocabulary, other
special tokens, another chat template), so tests show that scoring re-renders each conversation with
the reward model's own template instead of reusing the policy's ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# A Zephyr-like template: <|user|> ... </s>, no generation prompt needed for scoring.
REWARD_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
_SPECIALS = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
_CORPUS = [
    "The reward model reads whole conversations and returns one number.",
    "A good answer is helpful, honest and short. A bad answer rambles.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and letters a b c d e f g h i j k l m n o p q r s t u v w x y z",
]


def build_tiny_reward_model(out_dir: str | Path, hidden_size: int = 32, num_layers: int = 2, seed: int = 1) -> Any:
    """Save a tiny random LlamaForSequenceClassification (num_labels=1) and its tokenizer to `out_dir`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token=None)
    tokenizer.chat_template = REWARD_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, num_labels=1,
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model
