"""A tiny tokenizer and a tiny random causal LM, built from code.

They make the demo and the tests self-contained: no download, a real chat template, a real
transformer architecture (Qwen2 or Llama) small enough to train on a CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path

# ChatML, as Qwen2.5 and SmolLM2 use it; no BOS, each turn ends with <|im_end|>.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A reasoning/tool template in the style of Qwen3's: tools listed in a system turn, tool calls as
# <tool_call> JSON, `tool` turns, the reasoning of the last assistant turn kept in a think block
# (earlier turns lose theirs), `enable_thinking=false` adds an empty block to the generation
# prompt, and a date line from `strftime_now` (the thing a pinned template date is for).
REASONING_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\nDate: ' + strftime_now('%Y-%m-%d') + '\nTools:' }}"
    "{%- for tool in tools %}{{ '\n' + (tool.function.name if tool.function is defined else tool.name) }}{%- endfor %}"
    "{{ '<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if loop.last and message.reasoning_content is string %}"
    "{{ '<think>\n' + message.reasoning_content.strip() + '\n</think>\n\n' }}"
    "{%- elif loop.last and enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Human: What is the capital of France?\n\nAssistant: The capital of France is Paris.",
    "Write a short poem about the sea. The sea is wide and deep and blue.",
    "def add(a, b):\n    return a + b\n",
    "I'm sorry, I can't help with that. Here is a safer alternative you could try instead.",
    "Sure! Here are three tips: drink water, sleep well, and take a walk every day.",
    "Translate to German: good morning -> Guten Morgen. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "Question: how many legs does a spider have? Answer: eight. A cat has four legs.",
    "system user assistant tool: You are a helpful assistant. Explain step by step.",
    "Unicode: café, naïve, 日本語, emoji 🙂, ümlaut, ß, ñ, русский, العربية.",
]


def build_tiny_tokenizer(out_dir: str | Path, vocab_size: int = 512, chat_template: str = CHATML_TEMPLATE):
    """Train a byte-level BPE tokenizer on a small built-in corpus and save it with a chat template
    (ChatML unless `chat_template` says otherwise).

    Byte-level means every string tokenizes (no unknown token), like the real GPT-2/Qwen tokenizers.
    Returns the loaded `PreTrainedTokenizerFast`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        bos_token=None,
    )
    fast.chat_template = chat_template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def build_tiny_model(
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    architecture: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
):
    """Build a tiny random-init causal LM (Qwen2 or Llama architecture) and save it.

    When `tokenizer_dir` is given, its tokenizer is saved beside the weights and sets the vocabulary
    size. Prepare with the model directory as `--tokenizer`: transformers 5 loads a tokenizer next to
    a Qwen2 config as Qwen2Tokenizer (its own normalizer), so its fingerprint differs from the bare
    tokenizer directory's, and refs/train refuse a mismatch. Returns the model.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = 512
    pad_id = None
    tokenizer = None
    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        vocab_size = len(tokenizer)
        pad_id = tokenizer.pad_token_id
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        # A real small model's context (Qwen2.5-0.5B's): refs and train refuse pairs past it, and the tests'
        # long trajectories run past 2,048. Rotary positions: the weights do not depend on it.
        max_position_embeddings=32768,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown architecture {architecture!r} (qwen2 or llama)")
    model.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return model
