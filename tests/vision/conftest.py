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




@pytest.fixture(scope="session")
def qwen2vl_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not hasattr(transformers, "Qwen2VLImageProcessorPil"):
        pytest.skip("this transformers has no Qwen2VLImageProcessorPil")
    from prefdata.tiny import build_tiny_qwen2vl_processor

    path = tmp_path_factory.mktemp("qwen2vl") / "processor"
    build_tiny_qwen2vl_processor(path)  # 28px cells, 1 to 16 per image: the count depends on the size
    return path


@pytest.fixture(scope="session")
def gemma3_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not hasattr(transformers, "Gemma3Processor") or not hasattr(transformers, "Gemma3ImageProcessorPil"):
        pytest.skip("this transformers has no Gemma3Processor / Gemma3ImageProcessorPil")
    from prefdata.tiny import build_tiny_gemma3_processor

    path = tmp_path_factory.mktemp("gemma3") / "processor"
    build_tiny_gemma3_processor(path)  # 28px, 4 soft tokens per image between <start_of_image> and <end_of_image>
    return path


@pytest.fixture(scope="session")
def idefics3_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not hasattr(transformers, "Idefics3Processor") or not hasattr(transformers, "Idefics3ImageProcessorPil"):
        pytest.skip("this transformers has no Idefics3Processor / Idefics3ImageProcessorPil")
    from prefdata.tiny import build_tiny_idefics3_processor

    path = tmp_path_factory.mktemp("idefics3") / "processor"
    build_tiny_idefics3_processor(path)  # longest edge 84 px in 28-px tiles: 1 x 3 up to 3 x 3 tiles per image
    return path
