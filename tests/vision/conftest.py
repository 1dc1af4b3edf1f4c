"""Fixtures for image pairs: a tiny LLaVA-style processor built in code and images made by Pillow."""

from __future__ import annotations

from pathlib import Path

import pytest

PIL = pytest.importorskip("PIL.Image", reason="image pairs need Pillow (the [vision] extra)")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "LlavaProcessor") or not hasattr(transformers, "CLIPImageProcessorPil"):
    pytest.skip("this transformers has no LlavaProcessor / CLIPImageProcessorPil", allow_module_level=True)


@pytest.fixture(scope="session")
def llava_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from prefdata.tiny import build_tiny_llava_processor

    path = tmp_path_factory.mktemp("llava") / "processor"
    build_tiny_llava_processor(path)  # 28px, patch 14: one <image> expands to 4 tokens
    return path


