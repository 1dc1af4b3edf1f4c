"""Start-up: `validate` and `prepare` load a tokenizer without torch (issue 45), and the tokenizer
they load that way is the one AutoTokenizer gives: same class, same ids, same chat renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.core.tokenizer_class import AUTO_BACKEND_NAMES, direct_tokenizer_class

REPO = Path(__file__).resolve().parents[1]
SHARED_TOKENIZERS = REPO.parent / "shared" / "assets" / "tokenizers"

TEXTS = [
    "Hello world",
    " leading space, trailing space ",
    "Line one\nline two\n\n  indented\tand tabbed",
    "Ünïcödé — 中文 — emoji 🙂",
    "",
    "a" * 300,
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


def _tokenizer_dirs() -> list[str]:
    if not SHARED_TOKENIZERS.is_dir():
        return []
    return sorted(str(p) for p in SHARED_TOKENIZERS.iterdir() if (p / "tokenizer_config.json").is_file())


def _assert_same(path: str) -> None:
    from transformers import AutoTokenizer

    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
    from prefdata.io.manifest import tokenizer_fingerprint

    direct = direct_tokenizer_class(path)
    assert direct is not None, f"{path}: expected the direct path to apply"
    fast = load_pretrained_tokenizer(path)
    auto = AutoTokenizer.from_pretrained(path)
    assert type(fast) is type(auto)
    assert len(fast) == len(auto)
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "padding_side", "truncation_side"):
        assert getattr(fast, attr) == getattr(auto, attr), attr
    assert fast.all_special_tokens == auto.all_special_tokens
    assert fast.chat_template == auto.chat_template
    assert tokenizer_fingerprint(fast) == tokenizer_fingerprint(auto)
    specials = " ".join(t for t in (auto.bos_token, auto.eos_token, auto.pad_token) if t)
    texts = TEXTS + [f"{specials} between {specials}", f"{auto.eos_token or ''}tail"]
    for text in texts:
        for add in (True, False):
            assert fast(text, add_special_tokens=add)["input_ids"] == auto(text, add_special_tokens=add)["input_ids"], (text, add)
    assert fast(texts)["input_ids"] == auto(texts)["input_ids"]
    if auto.chat_template is not None:
        for messages, generation in ((CONVERSATION, True), (CONVERSATION[:3], False)):
            kwargs = {"add_generation_prompt": generation}
            assert fast.apply_chat_template(messages, tokenize=False, **kwargs) == auto.apply_chat_template(
                messages, tokenize=False, **kwargs
            )
            fast_ids = fast.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"]
            auto_ids = auto.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"]
            assert fast_ids == auto_ids


@pytest.mark.parametrize("path", _tokenizer_dirs() or [pytest.param(None, marks=pytest.mark.skip(
    reason="../shared/assets/tokenizers is not present"))], ids=lambda p: os.path.basename(p or "none"))
def test_direct_load_equals_autotokenizer_for_shared_tokenizers(path):
    _assert_same(path)


def test_direct_load_equals_autotokenizer_for_the_tiny_tokenizer(tiny_tokenizer_dir):
    _assert_same(tiny_tokenizer_dir)


# One of each kind: mapped to a class (qwen2, gpt2), unmapped (llama), on the wrong-hub-class list
# (phi3, qwen2), mapped by condition (mistral).
MODEL_TYPES = ("qwen2", "llama", "gpt2", "phi3", "mistral")


def test_model_directories_load_as_autotokenizer_loads_them(tmp_path):
    """A tokenizer inside a model directory: config.json's model_type can change AutoTokenizer's class
    (phi3 and qwen2 are on transformers' list of wrong hub classes). Where the direct path answers, the
    class and ids are AutoTokenizer's."""
    from transformers import AutoTokenizer

    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer

    tokenizers = _tokenizer_dirs()
    if not tokenizers:
        pytest.skip("../shared/assets/tokenizers is not present")
    direct_paths = []
    for source in tokenizers:
        for model_type in MODEL_TYPES:
            model_dir = tmp_path / f"{os.path.basename(source)}-{model_type}"
            model_dir.mkdir()
            for entry in Path(source).iterdir():
                (model_dir / entry.name).symlink_to(entry)
            (model_dir / "config.json").write_text(json.dumps({"model_type": model_type}))
            if direct_tokenizer_class(str(model_dir)) is None:
                continue
            direct_paths.append(model_dir.name)
            fast = load_pretrained_tokenizer(model_dir)
            auto = AutoTokenizer.from_pretrained(str(model_dir))
            assert type(fast) is type(auto), model_dir.name
            assert len(fast) == len(auto) and fast.eos_token == auto.eos_token and fast.bos_token == auto.bos_token
            for text in TEXTS[:4]:
                assert fast(text)["input_ids"] == auto(text)["input_ids"], (model_dir.name, text)
    # The usual pairs take the direct path: a Qwen model with its tokenizer, a Llama-style one.
    assert "qwen2.5-instruct-qwen2" in direct_paths or not (SHARED_TOKENIZERS / "qwen2.5-instruct").is_dir()
    assert "smollm2-135m-instruct-llama" in direct_paths or not (SHARED_TOKENIZERS / "smollm2-135m-instruct").is_dir()


def test_autotokenizer_still_decides_where_the_class_depends_on_more(tmp_path, tiny_tokenizer_dir):
    import shutil

    model_like = tmp_path / "model"
    shutil.copytree(tiny_tokenizer_dir, model_like)
    (model_like / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert direct_tokenizer_class(str(model_like)) is None  # qwen2 maps to Qwen2Tokenizer, not the declared class
    assert direct_tokenizer_class(tiny_tokenizer_dir, trust_remote_code=True) is None
    remote = tmp_path / "remote"
    shutil.copytree(tiny_tokenizer_dir, remote)
    config = json.loads((remote / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tok.MyTokenizer"]}
    (remote / "tokenizer_config.json").write_text(json.dumps(config))
    assert direct_tokenizer_class(str(remote)) is None


def test_autotokenizers_backend_names_are_all_known():
    """The copy of the names AutoTokenizer forces onto TokenizersBackend covers transformers' list."""
    from transformers.models.auto import tokenization_auto

    assert set(tokenization_auto.MODEL_IDS_TO_TOKENIZERS_BACKEND) <= set(AUTO_BACKEND_NAMES)


_PROBE = """
import json, os, sys
from prefdata.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = ("torch", "transformers", "datasets", "pandas", "pandera", "polars", "matplotlib", "prefdata.tokenize.pairs")
walked = folders = 0
if "transformers" in sys.modules:  # folders under transformers/models read for its lazy tables, and how many there are
    from transformers.utils import import_utils
    walked = import_utils.create_import_structure_from_path.cache_info().misses
    models = os.path.join(os.path.dirname(import_utils.__file__), os.pardir, "models")
    folders = sum(len([d for d in dirs if d != "__pycache__"]) for _, dirs, _ in os.walk(models)) + 1
print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules], "walked": walked,
                  "folders": folders}), file=sys.stderr)
"""


def _modules_after(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("startup") / "pairs.jsonl"
    rows = [{"prompt": f"Question {i}?", "chosen": f"A good answer {i}.", "rejected": f"A bad one {i}."}
            for i in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_validate_text_only_imports_no_tokenizer_library(tiny_file):
    result = _modules_after(["validate", str(tiny_file), "--no-progress"])
    assert result["code"] in (0, 1, None)
    assert result["loaded"] == []


@pytest.mark.parametrize("which", ["tiny", "qwen2.5-instruct"])
def test_validate_with_a_tokenizer_does_not_import_torch(which, tiny_file, tiny_tokenizer_dir, shared_tokenizer):
    # The tiny tokenizer loads as TokenizersBackend; Qwen2.5's class lives under transformers.models.
    tokenizer = tiny_tokenizer_dir if which == "tiny" else shared_tokenizer(which)
    result = _modules_after(["validate", str(tiny_file), "--tokenizer", tokenizer, "--no-progress"])
    assert result["code"] in (0, 1, None)
    assert "transformers" in result["loaded"]  # the tokenizer was really loaded
    assert "torch" not in result["loaded"]
    # transformers/models (560 folders) is walked once, not again when transformers.models is imported
    assert result["walked"] <= result["folders"] + 10, result


def test_prepare_does_not_import_torch(tiny_file, tiny_tokenizer_dir, tmp_path):
    out = tmp_path / "out"
    result = _modules_after(["prepare", str(tiny_file), str(out), "--tokenizer", tiny_tokenizer_dir,
                             "--workers", "1", "--no-progress"])
    assert result["code"] in (0, None)
    assert (out / "manifest.json").is_file()
    # datasets (OUT's features) and pandas (pyarrow's first pa.array) cost ~1.3 s together (issue 45)
    assert not {"torch", "datasets", "pandas"} & set(result["loaded"])


def test_a_read_only_first_load_is_kept_uncopied_and_others_still_get_copies(tiny_tokenizer_dir, tmp_path):
    import shutil

    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer

    path = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer_dir, path)
    shared = load_pretrained_tokenizer(path, read_only=True)
    assert load_pretrained_tokenizer(path, read_only=True) is shared
    mine = load_pretrained_tokenizer(path)
    assert mine is not shared
    mine.chat_template = "{{ 'changed' }}"
    assert load_pretrained_tokenizer(path, read_only=True).chat_template != "{{ 'changed' }}"


def test_the_tokenizer_fingerprint_is_taken_when_asked_and_is_the_loaded_tokenizers(tiny_tokenizer_dir):
    """validate never asks for the fingerprint (serializing a large tokenizer costs ~0.2 s); prepare does,
    and gets the fingerprint of the tokenizer as loaded, also when a replacement template is in effect."""
    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
    from prefdata.io.manifest import tokenizer_fingerprint
    from prefdata.tokenize.pairs import PairTokenizer
    from prefdata.tokenize.settings import TokenizeSettings
    from prefdata.tokenize.template import TemplateSettings

    expected = tokenizer_fingerprint(load_pretrained_tokenizer(tiny_tokenizer_dir))
    plain = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings())
    plain.setup()
    assert plain._fingerprint == ""
    assert plain.fingerprint() == expected
    replaced = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings(
        template=TemplateSettings(chat_template_text="{{ messages[0]['content'] }}")))
    assert replaced.fingerprint() == expected
    assert replaced.tokenizer.chat_template == "{{ messages[0]['content'] }}"
    assert replaced.template_fingerprint() != plain.template_fingerprint()


_FROM_CACHE = """
import json, sys
from prefdata.tokenize.tokenizer import load_tokenizer
mine = load_tokenizer(sys.argv[1])
torch_loaded = "torch" in sys.modules
from transformers import AutoTokenizer
auto = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
texts = ["Hello world", "<|im_end|> tail", " two  spaces"]
print(json.dumps({"torch": torch_loaded, "same_class": type(mine) is type(auto), "same_len": len(mine) == len(auto),
                  "same_ids": [mine(t)["input_ids"] for t in texts] == [auto(t)["input_ids"] for t in texts],
                  "same_eos": mine.eos_token == auto.eos_token}))
"""


def test_a_name_in_the_hf_cache_loads_without_torch_as_autotokenizer_loads_it(tmp_path, tiny_tokenizer_dir):
    import shutil

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--prefdata-test--tiny-model"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(tiny_tokenizer_dir, snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _FROM_CACHE, "prefdata-test/tiny-model"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"torch": False, "same_class": True, "same_len": True, "same_ids": True, "same_eos": True}


_MODELS_TABLE = """
import hashlib, json, sys
import transformers
from transformers.utils import import_utils
before = import_utils.create_import_structure_from_path.cache_info().misses
if sys.argv[1] == "prefdata":
    from prefdata.core.tokenizer_class import import_models_package
    import_models_package()
else:
    import transformers.models
walked = import_utils.create_import_structure_from_path.cache_info().misses - before
models = sys.modules["transformers.models"]
table = [sorted(models._modules), sorted(models._class_to_module.items()), sorted(models.__all__),
         sorted((k, sorted(v)) for k, v in models._object_missing_backend.items()),
         sorted((k, sorted(v)) for k, v in models._import_structure.items())]
print(json.dumps({"walked": walked, "classes": len(models._class_to_module),
                  "table": hashlib.sha256(json.dumps(table).encode()).hexdigest(),
                  "qwen2": transformers.Qwen2Tokenizer.__module__}))
"""


def _models_table(how: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _MODELS_TABLE, how], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_transformers_models_is_imported_without_a_second_walk_and_has_the_same_table():
    """import_models_package answers transformers.models' walk of its folders with the walk that
    `import transformers` made (~0.3 s on 2 cores); the lazy table it builds is a plain import's."""
    ours, plain = _models_table("prefdata"), _models_table("plain")
    assert ours["walked"] <= 2, ours  # the models folder itself at most, not its 560 subfolders
    assert ours["classes"] > 1000 and ours["table"] == plain["table"]
    assert ours["qwen2"] == plain["qwen2"] == "transformers.models.qwen2.tokenization_qwen2"
