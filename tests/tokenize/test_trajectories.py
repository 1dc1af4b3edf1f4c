"""Agent trajectories and multi-turn pairs through the whole pipeline: prepare splits them where the
decision differs and writes per-token loss masks; refs and train sum only the model's turns (against an
independent masked forward); show brackets only those; the TRL hand-off refuses in one line; the
checks drop what is not a preference between model decisions; hostile records are each accounted
for with a one-line reason. A tiny tokenizer with a tool-calling template and a tiny random model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.schema import check_out
from prefdata.prepare import prepare
from prefdata.refs import compute_refs
from prefdata.show import LOSS_CLOSE, LOSS_OPEN, show_row


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def call(call_id, name, city):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps({"city": city})}}]}


def tool(call_id, text):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}} for n in ("weather", "forecast", "clock")]
START = [user("Weather in Paris? Umbrella?"), call("c1", "weather", "Paris"), tool("c1", "14C, cloudy")]

TRAJECTORY = {"chosen": START + [call("c2", "forecast", "Paris"), tool("c2", "rain 80%"), assistant("Bring one.")],
              "rejected": START + [call("c3", "clock", "Paris"), tool("c3", "14:02"), assistant("No need.")],
              "tools": TOOLS}
CHAT = {"chosen": [user("Hi"), assistant("Hello there!"), user("A joke?"), assistant("Sure, a short one.")],
        "rejected": [user("Hi"), assistant("Go away."), user("A joke?"), assistant("No.")]}
SINGLE = {"prompt": "Say hello.", "chosen": "Hello!", "rejected": "No."}
ENVIRONMENT = {"chosen": START[:2] + [tool("c1", "14C, cloudy"), assistant("Take it.")],
               "rejected": START[:2] + [tool("c1", "25C, sunny"), assistant("Leave it.")], "tools": TOOLS}
AT_USER = {"chosen": [user("Hi"), assistant("Hello!"), user("A joke?"), assistant("Sure.")],
           "rejected": [user("Hi"), assistant("Hello!"), user("A poem?"), assistant("Roses.")]}
NO_CALL = {"chosen": [user("Hi"), tool("c9", "orphan"), assistant("A")], "rejected": [user("Hi"), tool("c9", "orphan"),
                                                                                     assistant("B")]}
BAD_ID = {"chosen": START[:2] + [tool("zz", "14C"), assistant("A")], "rejected": START[:2] + [tool("zz", "14C"),
                                                                                            assistant("B")],
          "tools": TOOLS}
NOTHING_SHARED = {"chosen": [user("One"), assistant("A")], "rejected": [user("Two"), assistant("B")]}
UNEQUAL = {"chosen": [user("Go")] + [m for i in range(5) for m in (call(f"u{i}", "clock", "Oslo"), tool(f"u{i}", "t"))]
           + [assistant("Done after five calls.")],
           "rejected": [user("Go"), assistant("Done at once.")], "tools": TOOLS}
LONG = {"chosen": [user("Go")] + [m for i in range(100) for m in (assistant(f"step {i}"), user(f"ok {i}"))]
        + [assistant("finished")],
        "rejected": [user("Go")] + [m for i in range(100) for m in (assistant(f"move {i}"), user(f"ok {i}"))]
        + [assistant("stopped")]}
ROWS = [TRAJECTORY, CHAT, SINGLE, ENVIRONMENT, AT_USER, NO_CALL, BAD_ID, NOTHING_SHARED, UNEQUAL, LONG]


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 with the tiny tokenizer and a tool-calling template (tool turns, <tool_call>)."""
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer
    from prefdata.tiny.text import REASONING_TEMPLATE

    root = tmp_path_factory.mktemp("tool-model")
    build_tiny_tokenizer(root / "tok", chat_template=REASONING_TEMPLATE)
    build_tiny_model(root / "model", tokenizer_dir=root / "tok")
    return str(root / "model")


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tool_model_dir):
    root = tmp_path_factory.mktemp("trajectories")
    out = root / "out"
    result = prepare(_write(root / "raw.jsonl", ROWS), out, tokenizer=tool_model_dir, progress=False, workers=1)
    return result, out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def test_every_record_is_accounted_for_with_a_one_line_reason(prepared):
    result, out = prepared
    assert result.rows_in == len(ROWS) == result.rows_out + result.rows_dropped + result.rows_quarantined
    quarantined = {row["source_line"]: row["error"] for row in _lines(out / "quarantine.jsonl")}
    assert sorted(quarantined) == [6, 7, 8]
    assert "a tool result with no assistant turn" in quarantined[6] and "chosen[1]" in quarantined[6]
    assert "tool_call_id 'zz' matches no call" in quarantined[7]
    assert "share no leading prompt messages" in quarantined[8]
    assert all("\n" not in error for error in quarantined.values())
    dropped = {row["source_line"]: row["flags"] for row in _lines(out / "dropped.jsonl")}
    assert dropped == {4: [F.ENVIRONMENT_DIFFERS], 5: [F.DIVERGES_AT_NON_MODEL_TURN]}
    kept = datasets.load_from_disk(str(out))
    assert kept["source_line"] == [1, 2, 3, 9, 10]
    flags = dict(zip(kept["source_line"], kept["flags"]))
    assert F.UNEQUAL_TURNS in flags[9] and F.UNEQUAL_TURNS not in flags[10]
    check_out(out)  # the mask columns pass OUT's contract


def test_masks_align_with_the_ids_and_only_rows_with_non_model_turns_carry_them(prepared, tool_model_dir):
    from transformers import AutoTokenizer

    _, out = prepared
    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    rows = {row["source_line"]: row for row in datasets.load_from_disk(str(out))}
    assert rows[3]["chosen_loss_mask"] is None and rows[3]["rejected_loss_mask"] is None  # single turn: as before
    # A one-turn half next to a trajectory: every token of it is trained (masks come in pairs).
    assert rows[9]["rejected_loss_mask"] == [1] * len(rows[9]["rejected_ids"])
    for line, half in [(1, "chosen"), (1, "rejected"), (2, "chosen"), (2, "rejected"), (9, "chosen"),
                       (10, "chosen"), (10, "rejected")]:
        ids, mask = rows[line][f"{half}_ids"], rows[line][f"{half}_loss_mask"]
        assert len(mask) == len(ids) and 0 < sum(mask) < len(mask)
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert "<|im_start|>" not in trained and "ok 3" not in trained
        assert "<|im_start|>" in untrained
    assert "rain 80%" in tok.decode([t for t, m in zip(rows[1]["chosen_ids"], rows[1]["chosen_loss_mask"]) if not m])
    assert "A joke?" in tok.decode([t for t, m in zip(rows[2]["chosen_ids"], rows[2]["chosen_loss_mask"]) if not m])


@pytest.fixture(scope="module")
def scored(tmp_path_factory, prepared, tool_model_dir) -> Path:
    import shutil

    out = tmp_path_factory.mktemp("trajectories-refs") / "out"
    shutil.copytree(prepared[1], out)
    compute_refs(out, tool_model_dir, device="cpu", dtype="float32", progress=False)
    return out


def _masked_plain(model, prompt, completion, mask) -> tuple[float, int]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    mask = [1] * len(completion) if mask is None else mask
    positions = [len(prompt) + k for k, m in enumerate(mask) if m]
    return float(sum(logp[t - 1, ids[0, t]] for t in positions)), len(positions)


def assert_refs_sum_the_masked_tokens(out: Path, model) -> None:
    """Each stored ref sum and token count equals a plain forward summed over the mask's 1s."""
    model.eval()
    for row in datasets.load_from_disk(str(out)):
        for half in ("chosen", "rejected"):
            expected, count = _masked_plain(model, row["prompt_ids"], row[f"{half}_ids"], row[f"{half}_loss_mask"])
            assert row[f"ref_{half}_logps"] == pytest.approx(expected, rel=1e-4, abs=1e-3)
            assert row[f"{half}_token_count"] == count


def test_refs_sum_only_the_model_turns(scored, tool_model_dir):
    from transformers import AutoModelForCausalLM

    assert_refs_sum_the_masked_tokens(scored, AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32))
    check_out(scored)  # counts agree with the masks (the contract's rule)


def test_train_scores_the_policy_on_the_same_tokens_as_the_refs(scored, tool_model_dir, tmp_path):
    import numpy as np
    from transformers import AutoModelForCausalLM

    from prefdata.train.data import load_pairs
    from prefdata.train.recipe import train
    from prefdata.train.step import PairForward, forward_pairs

    data = load_pairs(scored, need_refs=True)
    assert data.has_loss_masks
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32).eval()
    fwd = PairForward(model=model, layout="right", pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": 0.1})
    with torch.no_grad():
        _, logps, _ = forward_pairs(fwd, data, data.rows)
    rows = datasets.load_from_disk(str(scored))
    np.testing.assert_allclose(logps.chosen.numpy(), np.asarray(rows["ref_chosen_logps"]), rtol=1e-4, atol=1e-3)
    assert logps.rejected_counts.tolist() == rows["rejected_token_count"]
    output = tmp_path / "run"
    run = train(scored, model=tool_model_dir, output=output, max_steps=2, shuffle=False, lr=1e-3, batch_pairs=5,
                warmup_ratio=0.0, progress=False, device="cpu", save_every=None)
    first = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if '"loss"' in line][0]
    assert run.steps == 2 and first["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference


def test_show_brackets_only_the_trained_turns(prepared):
    _, out = prepared
    text = show_row(out, line=1)
    chosen = text.split("--- chosen")[1].split("--- rejected")[0].split("\n", 1)[1]  # past the legend line
    inside = [part.split(LOSS_CLOSE)[0] for part in chosen.split(LOSS_OPEN)[1:]]
    assert len(inside) == 2 and "forecast" in inside[0] and inside[1] == "Bring one.<|im_end|>"
    assert all("rain 80%" not in part and "<|im_start|>" not in part for part in inside)


@pytest.fixture(scope="module")
def other_tool_policy_dir(tmp_path_factory, tool_model_dir) -> str:
    """Another random policy (another seed) with the same tokenizer as `tool_model_dir`."""
    from prefdata.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("other-tool-policy")
    build_tiny_model(path, tokenizer_dir=tool_model_dir, seed=1)
    return str(path)


def test_trl_hand_off_trains_on_the_masked_tokens_only(scored, other_tool_policy_dir, tool_model_dir, tmp_path):
    """TRL's loss on a different policy equals the DPO loss of its masked sums (a plain masked forward)
    against the stored refs: the collator handed TRL the masks. Summing whole completions would not."""
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefdata.trl import DPOConfig, DPOTrainer
    from prefdata.trl.collator import LossMaskCollator

    rows = datasets.load_from_disk(str(scored)).to_list()
    policy = AutoModelForCausalLM.from_pretrained(other_tool_policy_dir, dtype=torch.float32).eval()
    beta = 1.0
    margins, whole = [], []
    for row in rows:
        (c, _), (r, _) = (_masked_plain(policy, row["prompt_ids"], row[f"{h}_ids"], row[f"{h}_loss_mask"])
                          for h in ("chosen", "rejected"))
        margins.append((c - row["ref_chosen_logps"]) - (r - row["ref_rejected_logps"]))
        (c, _), (r, _) = (_masked_plain(policy, row["prompt_ids"], row[f"{h}_ids"], None) for h in ("chosen", "rejected"))
        whole.append((c - row["ref_chosen_logps"]) - (r - row["ref_rejected_logps"]))
    expected = -torch.nn.functional.logsigmoid(beta * torch.tensor(margins)).mean().item()
    unmasked = -torch.nn.functional.logsigmoid(beta * torch.tensor(whole)).mean().item()
    assert abs(expected - unmasked) > 0.05  # the masks change the loss: the check below can fail

    args = DPOConfig(output_dir=str(tmp_path / "run"), max_length=None, per_device_train_batch_size=len(rows),
                     max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                     learning_rate=1e-6, disable_tqdm=True, beta=beta, seed=0)
    trainer = DPOTrainer(other_tool_policy_dir, args=args, train_dataset=str(scored),
                         processing_class=AutoTokenizer.from_pretrained(tool_model_dir))
    assert isinstance(trainer.data_collator, LossMaskCollator) and trainer.ref_model is None
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=2e-3)
    with pytest.raises(PrefdataError, match="custom data_collator") as error:
        DPOTrainer(other_tool_policy_dir, args=args, train_dataset=str(scored), data_collator=lambda rows: rows,
                   processing_class=AutoTokenizer.from_pretrained(tool_model_dir))
    assert "\n" not in str(error.value)


def test_loss_on_answer_composes_with_the_masks(tmp_path, tool_model_dir):
    """A reasoning block at the start of the first trained turn stays out (loss start), the tool result
    stays out (mask): refs count exactly the masked tokens past the start."""
    think = {"role": "assistant", "content": "<think>\nCheck the forecast.\n</think>\n\nLet me look.",
             "tool_calls": call("c2", "forecast", "Paris")["tool_calls"]}
    row = {**TRAJECTORY, "chosen": START + [think, tool("c2", "rain 80%"), assistant("Bring one.")]}
    out = tmp_path / "out"
    prepare(_write(tmp_path / "raw.jsonl", [row]), out, tokenizer=tool_model_dir, progress=False, workers=1,
            loss_on="answer")
    compute_refs(out, tool_model_dir, device="cpu", dtype="float32", progress=False)
    check_out(out)
    kept = datasets.load_from_disk(str(out))[0]
    start, mask = kept["chosen_loss_start"], kept["chosen_loss_mask"]
    assert start > 0 and mask[:start] == [1] * start  # the think block is inside the first trained turn
    assert kept["chosen_token_count"] == sum(mask[start:]) < sum(mask)


def test_train_turns_last_reaches_the_output(tmp_path, tool_model_dir):
    out = tmp_path / "out"
    prepare(_write(tmp_path / "raw.jsonl", [TRAJECTORY, SINGLE]), out, tokenizer=tool_model_dir, progress=False,
            workers=1, train_turns="last")
    rows = datasets.load_from_disk(str(out))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    trained = tok.decode([t for t, m in zip(rows[0]["chosen_ids"], rows[0]["chosen_loss_mask"]) if m])
    assert trained == "Bring one.<|im_end|>"
    assert rows[1]["chosen_loss_mask"] is None
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["train_turns"] == "last"
    with pytest.raises(PrefdataError, match="--train-turns must be one of all, last"):
        prepare(tmp_path / "raw.jsonl", tmp_path / "bad", tokenizer=tool_model_dir, progress=False, train_turns="first")


def test_a_trajectory_too_long_to_mask_is_refused_in_one_line():
    from prefdata.core.errors import RecordError
    from prefdata.core.records import RawRecord
    from prefdata.io.formats import normalize_record
    from prefdata.io.trajectory import MAX_COMPLETION_MESSAGES

    steps = MAX_COMPLETION_MESSAGES // 2 + 1
    row = {"chosen": [user("Go")] + [m for i in range(steps) for m in (assistant(f"a{i}"), user("ok"))],
           "rejected": [user("Go")] + [m for i in range(steps) for m in (assistant(f"b{i}"), user("ok"))]}
    with pytest.raises(RecordError, match=r"field 'chosen': 1026 messages after the split.*split the trajectory"):
        normalize_record(RawRecord("t.jsonl", 1, row))
    row = {key: value[: 2 * (steps - 1)] for key, value in row.items()}  # 1023 messages after the split: kept
    assert len(normalize_record(RawRecord("t.jsonl", 1, row)).chosen_messages) < MAX_COMPLETION_MESSAGES


def test_the_shipped_agent_example_prepares_with_a_real_template(tmp_path, shared_tokenizer):
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    result = prepare(repo / "examples" / "agent" / "trajectories.jsonl", out,
                     tokenizer=shared_tokenizer("qwen2.5-instruct"), progress=False, workers=1)
    assert result.exit_code == 0 and (result.rows_in, result.rows_out, result.rows_dropped) == (7, 6, 1)
    assert [row["flags"] for row in _lines(out / "dropped.jsonl")] == [[F.ENVIRONMENT_DIFFERS]]
    rows = datasets.load_from_disk(str(out))
    masks = list(rows["chosen_loss_mask"]) + list(rows["rejected_loss_mask"])
    assert all(mask is not None and sum(mask) > 0 for mask in masks)
    # Every half holds a non-model turn but two one-turn answers beside a trajectory, trained whole.
    assert sum(0 in mask for mask in masks) == len(masks) - 2
    check_out(out)


def test_validate_out_rechecks_the_stored_masks(prepared, tmp_path):
    """`validate OUT` flags a stored mask with no trained token (what refs and train would sum: nothing)."""
    import shutil

    from prefdata.validate import validate

    _, out = prepared
    assert F.NO_TRAINED_TOKENS not in validate(out, format="json").report["flags"]
    rows = datasets.load_from_disk(str(out))
    zeroed = [[0] * len(mask) if line == 2 else mask for line, mask in zip(rows["source_line"], rows["chosen_loss_mask"])]
    rows = rows.remove_columns("chosen_loss_mask").add_column("chosen_loss_mask", zeroed)
    broken = tmp_path / "broken"
    rows.save_to_disk(str(broken))
    for name in ("manifest.json", "dropped.jsonl", "quarantine.jsonl"):  # the ledger stays whole: only a mask changed
        shutil.copy(out / name, broken / name)
    report = validate(broken, format="json").report
    assert report["flags"][F.NO_TRAINED_TOKENS]["count"] == 1
    assert report["flags"][F.NO_TRAINED_TOKENS]["examples"][0]["source_line"] == 2
    assert report["flags"][F.UNEQUAL_TURNS]["count"] == 1  # kept from prepare, as stored


def test_hh_transcripts_that_differ_first_in_a_human_turn_are_flagged():
    from prefdata.core.records import RawRecord
    from prefdata.io.formats import normalize_record

    same_answer = "\n\nHuman: Hi\n\nAssistant: Hello!"
    at_human = normalize_record(RawRecord("t.jsonl", 1, {
        "chosen": same_answer + "\n\nHuman: A joke?\n\nAssistant: Sure.",
        "rejected": same_answer + "\n\nHuman: A poem?\n\nAssistant: Roses."}))
    assert at_human.flags == [F.MULTI_TURN_COMPLETION, F.DIVERGES_AT_NON_MODEL_TURN]
    at_answer = normalize_record(RawRecord("t.jsonl", 1, {
        "chosen": same_answer + "\n\nHuman: A joke?\n\nAssistant: Sure.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: A joke?\n\nAssistant: No."}))
    assert at_answer.flags == [F.MULTI_TURN_COMPLETION]


def test_shards_give_the_same_out_with_masks_in_some_shards(tmp_path, tool_model_dir):
    """Mask columns on a few rows only: shards without them get nulls of the same type, and the OUT
    equals the one-worker write's (content hash)."""
    rows = [SINGLE, TRAJECTORY, SINGLE | {"prompt": "Say hi."}, CHAT, SINGLE | {"prompt": "Wave."}, SINGLE | {"prompt": "Bow."}]
    raw = _write(tmp_path / "raw.jsonl", rows)
    main = prepare(raw, tmp_path / "main", tokenizer=tool_model_dir, progress=False, workers=1)
    sharded = prepare(raw, tmp_path / "sharded", tokenizer=tool_model_dir, progress=False, workers=2, batch_size=2)
    hashes = [json.loads((tmp_path / name / "manifest.json").read_text())["content_hash"] for name in ("main", "sharded")]
    assert hashes[0] == hashes[1] and main.rows_out == sharded.rows_out == len(rows)
    masks = datasets.load_from_disk(str(tmp_path / "sharded"))["chosen_loss_mask"]
    assert [mask is not None for mask in masks] == [False, True, False, True, False, False]
    check_out(tmp_path / "sharded")


def test_parallel_calls_whose_second_result_differs_are_environment_differs():
    from prefdata.core.records import RawRecord
    from prefdata.io.formats import normalize_record

    both = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "p1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "p2", "type": "function", "function": {"name": "clock", "arguments": '{"city": "Oslo"}'}}]}
    start = [user("Oslo now?"), both, tool("p1", "cold")]
    pair = normalize_record(RawRecord("t.jsonl", 1, {
        "chosen": start + [tool("p2", "09:00"), assistant("Cold, 9 am.")],
        "rejected": start + [tool("p2", "21:00"), assistant("Cold, 9 pm.")]}))
    assert pair.prompt_messages == start and F.ENVIRONMENT_DIFFERS in pair.flags
    assert F.DIVERGES_AT_NON_MODEL_TURN not in pair.flags


def test_validate_takes_train_turns_as_prepare_does(tmp_path, tool_model_dir):
    """`validate --train-turns last` predicts what `prepare --train-turns last` drops: a completion whose
    last assistant turn truncation cut away has no trained token left."""
    from prefdata.validate import validate

    raw = _write(tmp_path / "raw.jsonl", [TRAJECTORY])
    whole = prepare(raw, tmp_path / "whole", tokenizer=tool_model_dir, progress=False, workers=1)
    row = datasets.load_from_disk(str(tmp_path / "whole"))[0]
    cut = len(row["prompt_ids"]) + row["chosen_loss_mask"].index(0) + 2  # past the first trained turn only
    for turns, flagged in (("all", False), ("last", True)):
        report = validate(raw, tokenizer=tool_model_dir, max_length=cut, train_turns=turns, format="json").report
        result = prepare(raw, tmp_path / f"out-{turns}", tokenizer=tool_model_dir, progress=False, workers=1,
                         max_length=cut, train_turns=turns, policy=None)
        assert (F.NO_TRAINED_TOKENS in report["flags"]) == flagged == (result.rows_dropped == 1)
    assert whole.rows_out == 1


def test_pre_tokenized_rows_give_their_own_loss_masks(tmp_path, tool_model_dir):
    """`chosen_loss_mask`/`rejected_loss_mask` next to pre-tokenized ids are OUT's mask columns (cut
    with the completions), honoured by refs; a mask that trains nothing is dropped, and a mask that
    does not fit its ids is quarantined in one line. They passed through as unused raw_* columns."""
    from transformers import AutoModelForCausalLM

    rows = [
        {"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 10, 11, 2], "rejected_ids": [12, 13, 2],
         "chosen_loss_mask": [0, 0, 1, 1, 1], "rejected_loss_mask": [1, 0, 1]},
        {"prompt_ids": [5, 6], "chosen_ids": [8, 9, 2], "rejected_ids": [14, 2],
         "chosen_loss_mask": [0, 0, 0], "rejected_loss_mask": [1, 1]},
        {"prompt_ids": [5, 6], "chosen_ids": [8, 9, 2], "rejected_ids": [15, 2],
         "chosen_loss_mask": [0, 1], "rejected_loss_mask": [1, 1]},
        {"prompt_ids": [5, 6], "chosen_ids": [8, 9, 2], "rejected_ids": [16, 2], "chosen_loss_mask": [0, 1, 1]},
        {"prompt_ids": [5, 6], "chosen_ids": [8, 9, 2], "rejected_ids": [17, 2],
         "chosen_loss_mask": [0, 2, 1], "rejected_loss_mask": [1, 1]},
        {"prompt_ids": [5, 6], "chosen_ids": [8, 9, 2], "rejected_ids": [18, 19, 2]},
    ]
    out = tmp_path / "out"
    lenient = tmp_path / "lenient.toml"  # this file drops and quarantines most of its rows on purpose
    lenient.write_text("[thresholds]\nmax_dropped_share = 1.0\n", encoding="utf-8")
    prepare(_write(tmp_path / "raw.jsonl", rows), out, tokenizer=tool_model_dir, progress=False, workers=1,
            max_length=7, policy=lenient)
    ds = datasets.load_from_disk(str(out))
    assert not [c for c in ds.column_names if c.startswith("raw_")]
    kept = {row["source_line"]: row for row in ds}
    assert sorted(kept) == [1, 6]
    # max_length 7 leaves 4 tokens per completion: the masks are cut with the ids.
    assert kept[1]["chosen_ids"] == [8, 9, 10, 11] and kept[1]["chosen_loss_mask"] == [0, 0, 1, 1]
    assert kept[1]["rejected_loss_mask"] == [1, 0, 1] and kept[6]["chosen_loss_mask"] is None
    assert [d["flags"] for d in _lines(out / "dropped.jsonl")] == [[F.NO_TRAINED_TOKENS]]
    errors = {q["source_line"]: q["error"] for q in _lines(out / "quarantine.jsonl")}
    assert sorted(errors) == [3, 4, 5] and all("\n" not in e for e in errors.values())
    assert "2 entries for 3 chosen_ids" in errors[3] and "give both or neither" in errors[4] and "0 or 1" in errors[5]

    compute_refs(out, tool_model_dir, device="cpu", dtype="float32", progress=False)
    assert_refs_sum_the_masked_tokens(out, AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32))
