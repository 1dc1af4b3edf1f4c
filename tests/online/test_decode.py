"""The decode loop's draw: the same distribution `torch.multinomial` samples, top-p, greedy; and the
loop itself against a plain one-sequence-at-a-time reference."""

from __future__ import annotations

import torch

from prefdata.online.decode import draw, sample


def test_draw_follows_the_softmax_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20_000, 1)
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(draw(logits, 1.0, 1.0, generator), minlength=4).double() / 20_000
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), atol=0.015)
    # top_p 0.7: the nucleus is {0.5, 0.3} (0.5 alone is below 0.7), renormalized to 5/8, 3/8.
    counts = torch.bincount(draw(logits, 1.0, 0.7, generator), minlength=4).double() / 20_000
    assert counts[2] == 0 and counts[3] == 0 and abs(counts[0] - 0.625) < 0.015
    # temperature sharpens: at 0.5 the probabilities go as p^2.
    sharp = torch.tensor([0.25, 0.09, 0.0225, 0.0025], dtype=torch.float64)
    counts = torch.bincount(draw(logits, 0.5, 1.0, generator), minlength=4).double() / 20_000
    assert torch.allclose(counts, sharp / sharp.sum(), atol=0.015)
    assert draw(logits[:3], 0.0, 1.0, None).tolist() == [0, 0, 0]  # greedy


def test_left_padded_batches_decode_as_single_sequences(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batched = sample(model, ids, mask, max_new_tokens=6, temperature=0.0, top_p=1.0, stop_ids=[1], pad_id=0)
    for row, prompt in enumerate(prompts):  # greedy: each row alone, without padding, gives the same tokens
        alone = sample(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                       max_new_tokens=6, temperature=0.0, top_p=1.0, stop_ids=[1], pad_id=0)
        assert batched[row, : alone.shape[1]].tolist() == alone[0].tolist()
        # and equal to transformers' own greedy generate
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=1,
                                   pad_token_id=0)[0, len(prompt):]
        assert alone[0, : len(reference)].tolist() == reference.tolist()


def test_the_decode_loop_raises_no_deprecation_warnings(tiny_model_dir, capfd):
    """With today's transformers the loop passes its KV cache under the current name: no
    FutureWarning (`past_key_values is deprecated`) and no logged notice, from prefdata's modules or
    from the model call they make."""
    import warnings

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", module="prefdata")
        sample(model, ids, mask, max_new_tokens=4, temperature=1.0, top_p=1.0, stop_ids=[1], pad_id=0,
               generator=torch.Generator().manual_seed(0))
    cache_warnings = [str(w.message) for w in caught if "cache" in str(w.message) or "past_key" in str(w.message)]
    assert cache_warnings == []
    assert "deprecated" not in capfd.readouterr().err


def test_the_prompt_forward_keeps_only_the_last_positions_logits(tiny_model_dir):
    """Long prompts must not cost rows x prompt length x vocabulary floats: only the last position's
    logits are computed on the prompt (the sample is the same as with all of them)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids, mask = torch.tensor([[5, 6, 7, 8, 9] * 40]), torch.ones(1, 200, dtype=torch.long)
    shapes = []
    hook = model.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.logits.shape)))
    try:
        kept = sample(model, ids, mask, max_new_tokens=3, temperature=0.0, top_p=1.0, stop_ids=[1], pad_id=0)
    finally:
        hook.remove()
    assert shapes[0][1] == 1 and all(shape[1] == 1 for shape in shapes)
    full = model(input_ids=ids).logits[:, -1].argmax(-1)
    assert kept[0, 0].item() == full.item()


def test_a_prompt_with_several_samples_runs_once_and_its_samples_draw_as_separate_rows(tiny_model_dir, monkeypatch):
    """`samples=k`: the prompts' forward has one row per prompt (not k: a third of SmolLM2's sampling
    time on CPU), and the draws equal those of k copies of each prompt sampled as separate rows, each
    prompt's samples next to each other; a cache that cannot be copied row-wise gives the same."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    settings = {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "stop_ids": [1], "pad_id": 0}
    rows = []
    hook = model.register_forward_hook(lambda module, args, kwargs, output: rows.append(kwargs["input_ids"].shape[0]),
                                       with_kwargs=True)
    try:
        shared = sample(model, ids, mask, samples=3, generator=torch.Generator().manual_seed(0), **settings)
    finally:
        hook.remove()
    assert rows[0] == 2 and set(rows[1:]) == {6}
    copies = sample(model, ids.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0),
                    generator=torch.Generator().manual_seed(0), **settings)
    assert shared.tolist() == copies.tolist()
    assert len({tuple(row) for row in shared.tolist()}) > 2  # the copies of a prompt draw apart
    owner = next(cls for cls in DynamicCache.__mro__ if "batch_repeat_interleave" in vars(cls))
    monkeypatch.delattr(owner, "batch_repeat_interleave")
    fallback = sample(model, ids, mask, samples=3, generator=torch.Generator().manual_seed(0), **settings)
    assert fallback.tolist() == shared.tolist()
