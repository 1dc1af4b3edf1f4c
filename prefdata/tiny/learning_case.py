"""The online-DPO learning case, built from code: does a run make the policy better?

One small, fixed problem shared by `bench/bench_online.py --learn`, the test suite's learning test
and the online demo, so that all three measure the same thing:

- a tokenizer with a ~6k vocabulary (byte-level BPE on a seeded synthetic corpus) and a ChatML
  template, and a tiny random Llama-architecture policy built on it;
- conversational prompts ("Question i: tell me about <topic>.");
- a rule reward over the characters of the answer: the share of its characters that are lowercase
  letters from the first half of the alphabet (a to m). Tokens differ a lot in it ("ka" scores 1,
  "to" 0), so a policy that learns can move it; a random policy scores about 0.3.

The reward follows TRL's reward-function convention (`f(prompts, completions, **kwargs)`), so TRL's
`OnlineDPOTrainer(reward_funcs=...)` and `prefdata online --reward-fn` call the very same function.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CHARACTER_CLASS = frozenset("abcdefghijklm")
REWARD_NAME = "first_half_share"
# Written to a file for `--reward-fn FILE.py:first_half_share`; `first_half_share` below is the same code.
REWARD_SOURCE = '''def first_half_share(prompts, completions, **kwargs):
    """Share of the answer's characters that are lowercase a to m (0 for an empty answer)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum("a" <= ch <= "m" for ch in t) / len(t) if t else 0.0 for t in texts]
'''
TOPICS = ["the sea", "a cat", "France", "sleep", "numbers", "a lazy dog", "German", "colors", "rain", "music",
          "bread", "the moon"]
_SYLLABLES = ["ka", "to", "ri", "mun", "sel", "dra", "pe", "lo", "qui", "zar", "ne", "bo", "st", "ght", "th", "sh",
              "ck", "ly", "ing", "ed", "on", "er", "an", "us", "ix", "ph", "wr", "kn", "xy", "zz", "mp", "nd"]


def first_half_share(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """The case's rule reward (the same code as REWARD_SOURCE)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in CHARACTER_CLASS for ch in t) / len(t) if t else 0.0 for t in texts]


def _corpus(seed: int, words: int = 40_000) -> list[str]:
    """Seeded synthetic text: enough distinct words and digits for BPE to learn ~6k merges."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(9000)]
    vocab += [str(n) for n in range(1000)] + [t for topic in TOPICS for t in topic.split()]
    lines, line = [], []
    for _ in range(words):
        word = rng.choice(vocab)
        line.append(word.capitalize() if rng.random() < 0.1 else word)
        if len(line) >= 12:
            lines.append(" ".join(line) + rng.choice([".", "?", "!", ","]))
            line = []
    return lines


def build_case_tokenizer(out_dir: str | Path, vocab_size: int = 6000, seed: int = 0) -> Any:
    """A ~`vocab_size` byte-level BPE tokenizer with prefdata.tiny's ChatML template, saved to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from prefdata.tiny.text import CHATML_TEMPLATE, SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   unk_token=None, bos_token=None)
    fast.chat_template = CHATML_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def write_prompts(path: str | Path, n: int) -> list[list[dict[str, str]]]:
    """n conversational prompt rows to `path` (JSONL); returns the prompts (TRL's dataset column)."""
    prompts = [[{"role": "user", "content": f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}."}]
               for i in range(n)]
    Path(path).write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return prompts


def build_learning_case(work: str | Path, *, prompts: int = 48, hidden_size: int = 64, num_layers: int = 2,
                        vocab_size: int = 6000, seed: int = 0, warm_start_steps: int = 0) -> dict[str, Path]:
    """Tokenizer, policy, prompts and reward file under `work`; returns their paths
    (`policy`, `prompts`, `reward_file`; `reward_fn` is the `--reward-fn` argument).

    `warm_start_steps`: that many supervised steps on short answers of corpus words that end with
    EOS, so the policy writes word-like answers and ends them (a random policy over 6k tokens almost
    never samples EOS: every sample would be cut off at the token limit)."""
    from prefdata.core.quiet import quiet_libraries
    from prefdata.tiny.text import build_tiny_model

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    # Building a case is set-up, not output: transformers' loading and shard-writing bars stay hidden
    # for every caller (benches, tests), as the demo's own quiet block hides them.
    with quiet_libraries(True):
        build_case_tokenizer(work / "tokenizer", vocab_size=vocab_size, seed=seed)
        build_tiny_model(work / "policy", tokenizer_dir=work / "tokenizer", architecture="llama",
                         hidden_size=hidden_size, num_layers=num_layers, seed=seed)
        rows = write_prompts(work / "prompts.jsonl", prompts)
        if warm_start_steps:
            warm_start(work / "policy", rows, warm_start_steps, seed)
    (work / "rewards.py").write_text(REWARD_SOURCE, encoding="utf-8")
    return {"policy": work / "policy", "prompts": work / "prompts.jsonl", "reward_file": work / "rewards.py",
            "reward_fn": Path(f"{work / 'rewards.py'}:{REWARD_NAME}")}


def warm_start(policy_dir: Path, prompts: list[list[dict[str, str]]], steps: int, seed: int = 0,
               lr: float = 3e-3, batch: int = 16) -> None:
    """A few AdamW steps of next-token loss on (prompt, 3-12 corpus words + EOS) rows, saved in place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    rng = random.Random(seed)
    lines = _corpus(seed + 1, 6000)
    rendered = [tokenizer(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)["input_ids"] for p in prompts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    model.train()
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            answer = " ".join(rng.choice(lines).split()[: rng.randint(3, 12)])
            rows.append((rng.choice(rendered), tokenizer(answer, add_special_tokens=False)["input_ids"]
                         + [tokenizer.eos_token_id]))
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.tensor([p + a + [tokenizer.pad_token_id] * (width - len(p) - len(a)) for p, a in rows])
        labels = torch.tensor([[-100] * len(p) + a + [-100] * (width - len(p) - len(a)) for p, a in rows])
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(policy_dir))
