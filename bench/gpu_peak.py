"""Dense bf16 peak of NVIDIA GPUs (TFLOP/s, no sparsity), looked up from torch's device name, and
model FLOPs utilisation against it. The most specific name wins ("H100 PCIe" before "H100", "A10G"
before "A10"); an unknown GPU gives None, and MFU is then not reported rather than guessed."""

from __future__ import annotations

# Datasheet figures, dense bf16 with fp32 accumulation.
BF16_PEAK_TFLOPS: dict[str, float] = {
    "GB200": 2500.0, "B200": 2250.0, "B100": 1750.0,
    "GH200": 989.0, "H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H800": 989.0, "H20": 148.0,
    "A100": 312.0, "A800": 312.0, "A40": 149.7, "A30": 165.0, "A10G": 70.0, "A10": 125.0,
    "L40S": 362.0, "L40": 181.0, "L4": 121.0,
    "RTX 6000 Ada": 364.0, "RTX A6000": 154.8, "RTX 4090": 165.2, "RTX 3090": 71.0,
}


def peak_bf16_tflops(gpu_name: str | None) -> float | None:
    """The dense bf16 peak of the GPU torch calls `gpu_name` (e.g. "NVIDIA H100 80GB HBM3"), or None."""
    if not gpu_name:
        return None
    for key in sorted(BF16_PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in gpu_name.lower():
            return BF16_PEAK_TFLOPS[key]
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_tflops: float | None) -> float | None:
    """Share of the peak used: FLOPs per token x tokens/s over peak FLOP/s (None without a peak)."""
    if not peak_tflops or not tokens_per_s:
        return None
    return flops_per_token * tokens_per_s / (peak_tflops * 1e12)
