"""`prefdata show`: each span (prompt, loss span) decoded as a whole, byte-exact for SentencePiece
and byte-level tokenizers, CJK and emoji included, with no transformers warning (issue 24, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.show import LOSS_CLOSE, LOSS_OPEN, decode_spans, show_row

CHOSEN = "北京是中国的首都，有着悠久的历史。 Spaces  double and émoji 🎉."
ROWS = [
    {"prompt": "你好，请介绍一下北京。", "chosen": CHOSEN, "rejected": "不知道。"},
    {"prompt": [{"role": "user", "content": "Say hi in Japanese"}],
     "chosen": [{"role": "assistant", "content": "こんにちは！ Hello there."}],
     "rejected": [{"role": "assistant", "content": "Bye now"}]},
]
REAL = ["phi-3-mini-4k-instruct", "mistral-7b-instruct-v0.3", "qwen2.5-instruct"]


def _prepare(tmp_path: Path, tokenizer: str) -> Path:
    from prefdata.prepare import prepare

    raw = tmp_path / "rows.jsonl"
    raw.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS), encoding="utf-8")
    out = tmp_path / "out"
    result = prepare(raw, out, tokenizer=tokenizer, progress=False, workers=1)
    assert result.rows_out == len(ROWS), result.flag_counts
    return out


def _halves(text: str) -> dict[str, str]:
    """The rendered text of each half (it may span several lines), by name."""
    header = f" (loss tokens inside {LOSS_OPEN} {LOSS_CLOSE}) ---\n"
    chosen = text.split("--- chosen" + header, 1)[1]
    chosen, rejected = chosen.split("\n\n--- rejected" + header, 1)
    return {"chosen": chosen, "rejected": rejected.rstrip("\n")}  # no refs in these OUTs


def _check_out(out: Path, capfd) -> None:
    import datasets
    from transformers import AutoTokenizer

    manifest = json.loads((out / "manifest.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(manifest["tokenizer"]["path"])
    rows = datasets.load_from_disk(str(out))
    capfd.readouterr()
    for index, source in enumerate(ROWS):
        shown = _halves(show_row(out, row=index))
        assert not capfd.readouterr().err  # no transformers warning in the view
        row = rows[index]
        for name in ("chosen", "rejected"):
            line = shown[name]
            assert "\ufffd" not in line, line
            ids = row["prompt_ids"] + row[f"{name}_ids"]
            whole = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            assert line.replace(LOSS_OPEN, "").replace(LOSS_CLOSE, "") == whole  # nothing lost, nothing added
            assert line.count(LOSS_OPEN) == 1 and line.endswith(LOSS_CLOSE)
            loss_span = line[line.index(LOSS_OPEN) + 1 : -1]
            text = source[name] if isinstance(source[name], str) else source[name][0]["content"]
            assert text in loss_span, (loss_span, text)  # spaces and CJK byte-exact
            prompt = source["prompt"] if isinstance(source["prompt"], str) else source["prompt"][0]["content"]
            assert prompt in line[: line.index(LOSS_OPEN)]


@pytest.mark.parametrize("name", REAL)
def test_show_is_byte_exact_with_real_tokenizers(name, shared_tokenizer, tmp_path, capfd):
    _check_out(_prepare(tmp_path, shared_tokenizer(name)), capfd)


def test_show_is_byte_exact_with_the_tiny_tokenizer(tiny_tokenizer_dir, tmp_path, capfd):
    _check_out(_prepare(tmp_path, tiny_tokenizer_dir), capfd)


def test_a_character_split_across_the_cut_goes_to_the_later_span(tiny_tokenizer_dir):
    """Byte-level BPE may split one CJK character over two tokens; a cut between them must not
    show U+FFFD on either side, and the spans still join to the whole."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    ids = tokenizer.encode("悠久", add_special_tokens=False)
    assert len(ids) > 2  # the tiny vocabulary spells these characters in byte tokens
    spans = decode_spans(tokenizer, ids, [0, 1, len(ids)])
    assert "".join(spans) == "悠久" and "\ufffd" not in "".join(spans)


def test_show_without_the_tokenizer_prints_the_ids(tiny_tokenizer_dir, tmp_path):
    out = _prepare(tmp_path, tiny_tokenizer_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["path"] = str(tmp_path / "moved")
    (out / "manifest.json").write_text(json.dumps(manifest))
    shown = show_row(out, row=0)
    line = _halves(shown)["chosen"]
    assert line.startswith("<") and LOSS_OPEN + "<" in line
    # ... and says so in one line, naming the tokenizer it looked for
    said = [text for text in shown.splitlines() if "token ids are shown" in text]
    assert len(said) == 1 and str(tmp_path / "moved") in said[0] and "not found" in said[0]


# --- issue 40, item 5: show from another directory; --line on a directory input ---------------


def _prepare_relative(root: Path, tokenizer_dir: str, monkeypatch) -> Path:
    """OUT prepared the way a user types it: `prefdata prepare data out --tokenizer tok` in `root`."""
    import shutil

    from prefdata.prepare import prepare

    shutil.copytree(tokenizer_dir, root / "tok")
    data = root / "data"
    data.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (data / name).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS), encoding="utf-8")
    monkeypatch.chdir(root)
    prepare("data", "out", tokenizer="tok", progress=False, workers=1)
    return root / "out"


def _decoded(shown: str) -> bool:
    return "token ids are shown" not in shown and "Bye now" in _halves(shown)["rejected"]


def test_show_decodes_from_another_directory(tiny_tokenizer_dir, tmp_path, monkeypatch):
    out = _prepare_relative(tmp_path, tiny_tokenizer_dir, monkeypatch)
    recorded = json.loads((out / "manifest.json").read_text())["tokenizer"]["path"]
    assert Path(recorded).is_absolute() and Path(recorded).resolve() == (tmp_path / "tok").resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _decoded(show_row(out, line="b.jsonl:2"))


def test_show_finds_an_older_outs_relative_tokenizer_above_out(tiny_tokenizer_dir, tmp_path, monkeypatch):
    """An OUT from before issue 40 recorded `tok` as typed: found beside OUT, from any directory."""
    out = _prepare_relative(tmp_path, tiny_tokenizer_dir, monkeypatch)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["path"] = "tok"
    (out / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _decoded(show_row(Path("..") / "out", line="a.jsonl:2"))


def test_show_line_on_a_directory_input_needs_the_file(tiny_tokenizer_dir, tmp_path, monkeypatch):
    from prefdata.core.errors import PrefdataError

    out = _prepare_relative(tmp_path, tiny_tokenizer_dir, monkeypatch)
    with pytest.raises(PrefdataError) as caught:
        show_row(out, line=2)
    message = str(caught.value)
    assert "\n" not in message and "a.jsonl:2" in message and "b.jsonl:2" in message and "FILE:2" in message
    # the form every report prints picks the row; so does the path as typed
    for given in ("b.jsonl:2", "data/b.jsonl:2"):
        assert show_row(out, line=given).splitlines()[0] == "row 3  (b.jsonl:2)"
    with pytest.raises(PrefdataError, match="no kept row comes from b.jsonl:9"):
        show_row(out, line="b.jsonl:9")


def test_show_cli_takes_file_colon_line(tiny_tokenizer_dir, tmp_path, monkeypatch, capsys):
    from prefdata.cli import main

    out = _prepare_relative(tmp_path, tiny_tokenizer_dir, monkeypatch)
    assert main(["show", str(out), "--line", "a.jsonl:1"]) == 0
    assert capsys.readouterr().out.startswith("row 0  (a.jsonl:1)")
    with pytest.raises(SystemExit) as caught:
        main(["show", str(out), "--line", "a.jsonl:x"])
    assert caught.value.code == 2 and "FILE:N" in capsys.readouterr().err
