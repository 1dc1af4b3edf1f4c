"""Each setting is declared once (prefdata/settings/commands.py): the flags, TOML keys, `--help`, the
docs' tables and the Python functions' keywords all agree with that declaration."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from prefdata.core.trainer_names import EXPORT_TRAINERS
from prefdata.cli import build_parser, main
from prefdata.settings import tables
from prefdata.settings.commands import COMMANDS, PrepareSettings
from prefdata.settings.config import load_settings
from prefdata.settings.declare import declared, names

REPO = Path(__file__).resolve().parents[2]

# Every flag each command had before the settings were declared once (flag:setting), so none is lost.
FLAGS_BEFORE = {
    "prepare": "--balance-length:balance_length --batch-size:batch_size --chat-template:chat_template --chat-template-file:chat_template_file --config:config --decontaminate-against:decontaminate_against --decontaminate-completions:decontaminate_completions --decontaminate-field:decontaminate_field --decontaminate-ngram:decontaminate_ngram --engine:engine --loss-on:loss_on --max-length:max_length --max-prompt-length:max_prompt_length --min-score-margin:min_score_margin --no-progress:progress --overwrite:overwrite --pairing:pairing --pairing-seed:pairing_seed --policy:policy --processor:processor --rating:rating --ray-address:ray_address --seed:seed --template-date:template_date --template-kwargs:template_kwargs --tokenizer:tokenizer --top-k:top_k --trust-remote-code:trust_remote_code --workers:workers",  # noqa: E501
    "validate": "--against:against --baseline:baseline --chat-template:chat_template --chat-template-file:chat_template_file --config:config --decontaminate-against:decontaminate_against --decontaminate-completions:decontaminate_completions --decontaminate-field:decontaminate_field --decontaminate-ngram:decontaminate_ngram --engine:engine --format:format --max-length:max_length --max-prompt-length:max_prompt_length --min-score-margin:min_score_margin --no-progress:progress --output:output --pairing:pairing --pairing-seed:pairing_seed --policy:policy --processor:processor --rating:rating --ray-address:ray_address --template-date:template_date --template-kwargs:template_kwargs --tokenizer:tokenizer --top-k:top_k --trust-remote-code:trust_remote_code --workers:workers",  # noqa: E501
    "refs": "--batch-tokens:batch_tokens --config:config --device:device --dtype:dtype --engine:engine --model:model --no-progress:progress --processor:processor --ray-address:ray_address --recompute:recompute --trust-remote-code:trust_remote_code --workers:workers",  # noqa: E501
    "train": "--batch-pairs:batch_pairs --batch-tokens:batch_tokens --beta:beta --config:config --device:device --epochs:epochs --eval:eval_dir --eval-every:eval_every --fail-on-stall:fail_on_stall --grad-accum:grad_accum --label-smoothing:label_smoothing --ld-alpha:ld_alpha --lora:lora --loss:loss --lr:lr --lr-schedule:lr_schedule --max-grad-norm:max_grad_norm --max-steps:max_steps --model:model --no-progress:progress --no-shuffle:shuffle --output:output --processor:processor --resume:resume --save-every:save_every --seed:seed --simpo-gamma:simpo_gamma --stall-steps:stall_steps --trust-remote-code:trust_remote_code --warmup-ratio:warmup_ratio",  # noqa: E501
    "generate": "--batch-size:batch_size --chat-template:chat_template --chat-template-file:chat_template_file --config:config --device:device --engine:engine --max-new-tokens:max_new_tokens --model:model --no-progress:progress --overwrite:overwrite --samples:samples --seed:seed --temperature:temperature --template-date:template_date --template-kwargs:template_kwargs --top-p:top_p --trust-remote-code:trust_remote_code",  # noqa: E501
    "score": "--batch-size:batch_size --config:config --device:device --missing-eos-penalty:missing_eos_penalty --no-progress:progress --output:output --pairs:pairs --reward-fn:reward_fn --reward-model:reward_model --score-reasoning:score_reasoning --trust-remote-code:trust_remote_code",  # noqa: E501
    "online": "--batch-pairs:batch_pairs --batch-size:batch_size --beta:beta --chat-template:chat_template --chat-template-file:chat_template_file --config:config --device:device --engine:engine --epochs:epochs --keep-round-policies:keep_round_policies --loss:loss --lr:lr --lr-schedule:lr_schedule --max-length:max_length --max-new-tokens:max_new_tokens --max-prompt-length:max_prompt_length --missing-eos-penalty:missing_eos_penalty --model:model --no-progress:progress --output:output --policy:policy --prompts-per-round:prompts_per_round --ref-model:ref_model --reward-fn:reward_fn --reward-model:reward_model --rounds:rounds --samples:samples --score-reasoning:score_reasoning --seed:seed --temperature:temperature --template-date:template_date --template-kwargs:template_kwargs --top-p:top_p --trust-remote-code:trust_remote_code --warmup-ratio:warmup_ratio",  # noqa: E501
    "show": "--config:config --line:line --no-progress:progress --row:row",
    "export": "--config:config --overwrite:overwrite --trainer:trainer --trainer-arg:trainer_args",
    "select": "--by:by --config:config --keep:keep --lowest:lowest --max:max_signal --min:min_signal --no-progress:progress --offset-by:offset_by --offset-scale:offset_scale --overwrite:overwrite --policy-model:policy_model --device:device --seed:seed --weight-by:weight_by",  # noqa: E501
}


def _function(command: str):
    module, name = COMMANDS[command].function.split(":")
    return getattr(importlib.import_module(module), name)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_function_takes_exactly_the_declared_settings_with_the_declared_defaults(command):
    spec = COMMANDS[command]
    # the signature Python shows: the function's own, or the one settings_command generates from the declaration
    params = [p for p in inspect.signature(_function(command)).parameters.values() if p.name != "settings"]
    keywords = {p.name: p for p in params[len(spec.positionals):]}
    cls = spec.settings
    assert set(keywords) - cls.python_only == names(cls) - cls.routed
    for item in declared(cls):
        if item.name in cls.routed:
            continue
        param = keywords[item.name]
        expected = None if param.default is inspect.Parameter.empty else param.default  # required: None when unset
        assert item.default == expected, f"{command} {item.name}: declared {item.default!r}, function {expected!r}"



@pytest.mark.parametrize("command", list(COMMANDS))
def test_settings_takes_the_declared_settings_object(command):
    """`settings=` takes the command's declared class (prefdata.settings.commands), not another class
    of the same name (generate's engine-level SamplingSettings once shadowed GenerateSettings)."""
    function = _function(command)
    assert function.settings_class is COMMANDS[command].settings
    with pytest.raises(TypeError, match=f"takes settings={COMMANDS[command].settings.__name__}"):
        function(*(["x"] * len(COMMANDS[command].positionals)), settings=object())

def test_refs_on_ray_takes_the_settings_the_cli_routes_to_it():
    from prefdata.refs.ray import compute_refs_on_ray

    params = set(inspect.signature(compute_refs_on_ray).parameters)
    assert {"ray_address", "workers"} <= params


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_of_before_still_sets_the_same_setting(command):
    parser = _subparsers()[command]
    now = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    for pair in FLAGS_BEFORE[command].split():
        flag, dest = pair.split(":")
        assert now.get(flag) == dest, (command, flag)


def _sample(item) -> object:
    """A value of the setting's declared type that its range check accepts."""
    if item.spec.action in ("on", "off", "on/off") or item.type == "bool":
        return True
    if item.spec.choices:
        return item.spec.choices[-1]
    if "list[" in item.type:
        return [f"value-of-{item.name}"]
    if item.type.startswith("int"):
        return 3
    if item.type.startswith("float"):
        return 0.5
    return f"value-of-{item.name}"


def _toml(value: object) -> str:
    return json.dumps(value)  # JSON's strings, numbers, arrays and booleans are TOML's


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_declared_setting_is_a_toml_key_at_the_top_level_and_in_the_command_table(command, tmp_path):
    values = {item.name: _sample(item) for item in declared(COMMANDS[command].settings)}
    config = tmp_path / "in-table.toml"
    config.write_text(f"[{command}]\n" + "".join(f"{name} = {_toml(value)}\n" for name, value in values.items()))
    assert load_settings(command, str(config), cwd=tmp_path) == values
    top = tmp_path / "top.toml"
    top.write_text("".join(f'{name.replace("_", "-")} = {_toml(value)}\n' for name, value in values.items()))
    assert load_settings(command, str(top), cwd=tmp_path) == values
    pyproject_layout = tmp_path / "pyproject-layout.toml"
    pyproject_layout.write_text(f"[tool.prefdata.{command}]\n" + "".join(
        f"{name} = {_toml(value)}\n" for name, value in values.items()))
    assert load_settings(command, str(pyproject_layout), cwd=tmp_path) == values


def test_a_top_level_key_of_one_command_is_ignored_by_the_others_and_a_typo_is_named(tmp_path):
    config = tmp_path / "prefdata.toml"
    config.write_text("rounds = 3\nmax_length = 64\n")
    assert load_settings("online", str(config), cwd=tmp_path) == {"rounds": 3, "max_length": 64}
    assert load_settings("prepare", str(config), cwd=tmp_path) == {"max_length": 64}
    config.write_text("[online]\nround = 3\n")
    with pytest.raises(Exception, match=r"unknown setting 'round' in \[online\] for `prefdata online`; did you mean 'rounds'"):
        load_settings("online", str(config), cwd=tmp_path)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_shows_every_flag_in_its_section_with_its_declared_default(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for item in declared(COMMANDS[command].settings):
        if item.flag is None:
            continue
        assert item.flag in text and f"{item.spec.group}:" in text, (command, item.name)
        words = item.default_words()
        if words:
            assert f"(default {words})" in text, (command, item.name)
    assert "examples: prefdata " + command in text


def test_the_docs_flag_tables_are_made_from_the_declaration():
    assert (REPO / "docs" / "cli.md").read_text(encoding="utf-8") == tables.reference(), (
        "docs/cli.md is out of date: run python -m prefdata.settings.tables")
    blocks = []
    for path in tables.documents():
        text = path.read_text(encoding="utf-8")
        assert tables.rewritten(text) == text, f"{path.name}: run python -m prefdata.settings.tables"
        blocks += [(path.name, m.group("command")) for m in tables.BLOCK.finditer(text)]
    assert {("commands.md", "prepare"), ("commands.md", "train")} <= set(blocks)  # docs/commands.md
    assert {command for name, command in blocks if name == "cli.md"} == set(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_docs_table_lists_exactly_the_declared_flags_and_defaults(command):
    """The generated table read back as a user reads it: one row per flag, its TOML key and default."""
    rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in tables.flag_table(command).splitlines()[2:]]
    read = {key.strip("`"): default for flag, key, default, meaning in rows if key}
    flagged = [item for item in declared(COMMANDS[command].settings) if item.flag]
    assert read == {item.name: tables._cell(item.default_words() or ("off" if item.spec.action in ("on", "off") else ""))
                    for item in flagged}
    assert rows[-1][0] == "`--config FILE`"


def test_a_bad_flag_or_value_is_one_line_exit_2_naming_the_near_flag(capsys):
    for argv, words in ((["prepare", "r", "o", "--max-lenght", "3"], "did you mean --max-length?"),
                        (["prepare", "r", "o", "--max-length", "x"], "expected a positive integer, got 'x'"),
                        (["train", "o", "--epochs", "1", "--max-steps", "2"], "not allowed with argument --epochs")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert info.value.code == 2 and len(err) == 1 and words in err[0], err
        assert err[0].startswith(f"prefdata {argv[0]}: error:")


# What each command needs before it runs (flag or config key); one of an exclusive group is enough.
REQUIRED = {"prepare": ["(--tokenizer PATH | --processor PATH)"], "refs": ["--model PATH"],
            "train": ["--model PATH", "--output DIR"], "generate": ["--model POLICY"],
            "online": ["--model POLICY", "--output DIR"], "export": [f"--trainer {{{','.join(EXPORT_TRAINERS)}}}"],
            "select": ["--by {reward_margin,reward_rejected,implicit_margin,implicit_margin_per_token,rejected_length,"
                       "length_difference,rip,random,on_policy}"]}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_usage_shows_required_settings_unbracketed_and_only_those(command):
    usage = " ".join(_subparsers()[command].format_usage().split())
    for shown in REQUIRED.get(command, []):
        assert f" {shown}" in usage and f"[{shown}]" not in usage, usage
    required = [item for item in declared(COMMANDS[command].settings) if item.spec.required]
    assert sorted(item.name for item in required) == sorted(
        re.search(r"--(\w+)", shown).group(1) for shown in REQUIRED.get(command, []))
    for item in declared(COMMANDS[command].settings):
        if item.flag and not item.spec.required:
            # everything else stays optional: `[--flag ...]`, or `| --flag` inside an exclusive group's brackets
            assert re.search(rf"(\[|\| ){re.escape(item.flag)}\b", usage), (command, item.flag)
    text = " ".join(_subparsers()[command].format_help().split())
    for item in required:
        assert "(required" in item.meaning and item.meaning in text


@pytest.mark.parametrize(("argv", "line"), [
    (["online", "p.jsonl"], "--model POLICY and --output DIR are required (or set `model` and `output` in the config file)"),
    (["online", "p.jsonl", "--model", "m"], "--output DIR is required (or set `output` in the config file)"),
    (["train", "out", "--output", "ckpt"], "--model PATH is required (or set `model` in the config file)"),
    (["refs", "out"], "--model PATH is required"),
    (["generate", "p.jsonl", "out"], "--model POLICY is required"),
    (["prepare", "raw.jsonl", "out"], "--tokenizer PATH or --processor PATH is required"),
    (["select", "out", "new"], "--by SIGNAL is required (or set `by` in the config file)"),
])
def test_a_missing_required_setting_is_one_line_exit_2(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml around that could set it
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith(f"prefdata {argv[0]}: error: {line}"), err


def test_a_required_setting_from_the_config_file_is_enough(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prefdata.toml").write_text('[online]\nmodel = "m"\noutput = "run"\n', encoding="utf-8")
    main(["online", "missing.jsonl", "--config", "prefdata.toml"])
    assert "required" not in capsys.readouterr().err  # it went on, and failed on the missing prompts instead


def test_a_settings_object_and_keywords_give_the_same_out(tmp_path, tiny_tokenizer_dir):
    from prefdata.prepare import prepare

    examples = REPO / "examples" / "pairs"
    by_keywords = prepare(examples, tmp_path / "a", tokenizer=tiny_tokenizer_dir, max_length=64, progress=False)
    settings = PrepareSettings(tokenizer=tiny_tokenizer_dir, max_length=512, progress=False)
    by_object = prepare(examples, tmp_path / "b", settings=settings, max_length=64)  # a keyword wins
    assert (by_object.rows_out, by_object.flag_counts) == (by_keywords.rows_out, by_keywords.flag_counts)
    config = [json.loads((tmp_path / out / "manifest.json").read_text())["config"] for out in ("a", "b")]
    assert config[0] == config[1] and config[0]["max_length"] == 64
    with pytest.raises(TypeError):
        prepare(examples, tmp_path / "c", settings={"tokenizer": tiny_tokenizer_dir})


@pytest.mark.parametrize("command", ["prepare", "validate"])
def test_the_removed_partitioned_checks_flag_and_key_are_refused_in_one_line(command, tmp_path, capsys):
    """Issue 44: the dataset-wide checks are always partitioned, so --partitioned-checks and its key
    went; an old command line or config file gets the usual one-line usage error, not a traceback."""
    paths = ["in.jsonl", "out"] if command == "prepare" else ["in.jsonl"]
    with pytest.raises(SystemExit) as info:
        main([command, *paths, "--partitioned-checks"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("usage:")]
    assert info.value.code == 2 and len(lines) == 1 and "unrecognized arguments: --partitioned-checks" in lines[0]
    config = tmp_path / "prefdata.toml"
    config.write_text(f"[{command}]\npartitioned_checks = true\n")
    with pytest.raises(Exception, match=rf"unknown setting 'partitioned_checks' in \[{command}\]"):
        load_settings(command, str(config), cwd=tmp_path)
    assert main([command, *(str(tmp_path / p) for p in paths), "--config", str(config)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "partitioned_checks" in err[0], err
