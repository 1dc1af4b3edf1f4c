"""The engine a command runs on: `local` (worker processes here) or `ray` (a Ray cluster)."""

from __future__ import annotations

from typing import Any

from prefdata.core.errors import PrefdataError

ENGINES = ("local", "ray")


def check_engine(engine: str) -> str:
    """`engine`, or a one-line error naming the choices."""
    if engine not in ENGINES:
        raise PrefdataError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    return engine


def select_engine(engine: str, workers: int, ray_address: str | None = None) -> Any | None:
    """A RayEngine with `workers` actors (0: one per cluster CPU) at `ray_address` (else
    RAY_ADDRESS, else a local Ray); None for "local": the caller's own LocalEngine, tuned to its
    work (how many units in flight), runs then."""
    if check_engine(engine) == "ray":
        from prefdata.engine.ray import RayEngine

        return RayEngine(ray_address, workers=workers or None)
    return None
