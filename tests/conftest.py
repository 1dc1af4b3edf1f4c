"""Shared fixtures: the tiny tokenizer/model built from code, and the optional ../shared assets."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared next to the checkout; tests that need it skip without it."""
    if not (SHARED / "assets").is_dir():
        pytest.skip("../shared/assets is not present (real tokenizers and datasets live there)")
    return SHARED


@pytest.fixture(scope="session")
def shared_tokenizer(shared_dir):
    def _path(name: str) -> str:
        path = shared_dir / "assets" / "tokenizers" / name
        if not path.is_dir():
            pytest.skip(f"tokenizer {name} is not in ../shared/assets/tokenizers")
        return str(path)

    return _path


@pytest.fixture(scope="session")
def shared_data(shared_dir):
    def _path(relative: str) -> Path:
        path = shared_dir / "assets" / "data" / relative
        if not path.exists():
            pytest.skip(f"{relative} is not in ../shared/assets/data")
        return path

    return _path


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> str:
    from prefdata.tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    """A tiny random Qwen2 model saved with the tiny tokenizer beside it."""
    from prefdata.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(path, tokenizer_dir=tiny_tokenizer_dir, architecture="qwen2")
    return str(path)
