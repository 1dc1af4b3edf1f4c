"""Fixtures for image pairs: a tiny LLaVA-style processor built in code and images made by Pillow."""

from __future__ import annotations

from pathlib import Path

import pytest

PIL = pytest.importorskip("PIL.Image", reason="image pairs need Pillow (the [vision] extra)")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "LlavaProcessor") or not hasattr(transformers, "CLIPImageProcessorPil"):
    pytest.skip("this transformers has no LlavaProcessor / CLIPImageProcessorPil", allow_module_level=True)


def _tiny_processor(factory: pytest.TempPathFactory, name: str, needs: tuple[str, ...] = ()) -> Path:
    """A tiny processor built by `prefdata.tiny.build_tiny_<name>_processor` in its own temporary
    folder; skipped where this transformers lacks one of the classes in `needs`."""
    if not all(hasattr(transformers, cls) for cls in needs):
        pytest.skip(f"this transformers has no {' / '.join(needs)}")
    from prefdata import tiny

    path = factory.mktemp(name) / "processor"
    getattr(tiny, f"build_tiny_{name}_processor")(path)
    return path


@pytest.fixture(scope="session")
def llava_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_processor(tmp_path_factory, "llava")  # 28px, patch 14: one <image> expands to 4 tokens


@pytest.fixture(scope="session")
def qwen2vl_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 28px cells, 1 to 16 per image: the count depends on the size
    return _tiny_processor(tmp_path_factory, "qwen2vl", ("Qwen2VLImageProcessorPil",))


@pytest.fixture(scope="session")
def gemma3_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 28px, 4 soft tokens per image between <start_of_image> and <end_of_image>
    return _tiny_processor(tmp_path_factory, "gemma3", ("Gemma3Processor", "Gemma3ImageProcessorPil"))


@pytest.fixture(scope="session")
def idefics3_processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # longest edge 84 px in 28-px tiles: 1 x 3 up to 3 x 3 tiles per image
    return _tiny_processor(tmp_path_factory, "idefics3", ("Idefics3Processor", "Idefics3ImageProcessorPil"))
