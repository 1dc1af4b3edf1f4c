"""Online fixtures: a tiny reward model with its own tokenizer, prompt files, rule reward functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

QUESTIONS = [
    "What is the capital of France?", "Write a short poem about the sea.", "Give me three tips for sleep.",
    "How many legs does a spider have?", "Translate good morning to German.", "Explain how to add numbers.",
    "Suggest a name for a cat.", "What is 2 + 2?", "Tell me about the quick brown fox.", "Why is the sea blue?",
    "Name a color.", "Say hello.", "Describe a lazy dog.", "What do cats eat?", "Count to five.", "Write one word.",
]

RULES = '''
def count_e(prompts, completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.count("e")) for t in texts]


def constant(prompts, completions, **kwargs):
    return [1.0 for _ in completions]


def length(prompts, completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(len(t)) for t in texts]


def shapes(prompts, completions, **kwargs):
    # Records what TRL's convention hands a reward function, for the test to read back.
    import json, os
    with open(os.environ["PREFDATA_TEST_SHAPES"], "w") as f:
        json.dump({"prompts": prompts, "completions": completions, "kwargs": sorted(kwargs)}, f)
    return [None if i == 0 else float(i) for i in range(len(completions))]
'''


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory) -> str:
    from prefdata.tiny.reward import build_tiny_reward_model

    path = tmp_path_factory.mktemp("tiny-reward-model")
    build_tiny_reward_model(path)
    return str(path)


@pytest.fixture(scope="session")
def rules_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.py"
    path.write_text(RULES)
    return path


@pytest.fixture()
def prompts_file(tmp_path) -> Path:
    """16 conversational prompt-only rows."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    return path


@pytest.fixture(scope="session")
def varied_policy_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    """The tiny Qwen2 policy with larger random weights, so greedy completions differ per prompt."""
    import torch
    from transformers import Qwen2ForCausalLM

    from prefdata.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("varied-policy")
    config = build_tiny_model(path, tokenizer_dir=tiny_tokenizer_dir).config
    config.initializer_range = 0.2
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(str(path))
    return str(path)
