"""Dense (no 2:4 sparsity) peak tensor-core TFLOP/s of the accelerators people train on.

Vendors print sparse figures next to dense ones; MFU must use the dense ones (PaLM, Megatron and torchtitan
all do), so every number below is the datasheet's dense value, i.e. half the "with sparsity" figure.
Sources (vendor datasheets, checked against the figures printed there):

* A100: NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
  nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP32 19.5, TF32 156, BF16/FP16 312 (SXM and PCIe alike).
* H100 SXM / PCIe / NVL: NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/
  nvidia-tensor-core-gpu-datasheet): SXM FP32 67, TF32 494.7, BF16/FP16 989.4, FP8 1978.9; PCIe FP32 51,
  TF32 378, BF16/FP16 756, FP8 1513; NVL FP32 60, TF32 417.5, BF16/FP16 835, FP8 1670.5.
* H200: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/): SXM same tensor cores as H100 SXM
  (FP32 67, TF32 494.7, BF16/FP16 989.4, FP8 1978.9); NVL as H100 NVL.
* B200: NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx/), 8-GPU totals divided by 8, sparse halved:
  TF32 1125, BF16/FP16 2250, FP8 4500. The datasheet gives no plain FP32 figure, so none is listed.
* L40S: NVIDIA L40S datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413): FP32 91.6, TF32 183,
  BF16/FP16 362.05, FP8 733.
* A10G: AWS publishes no figures for this A10 variant (g5 instances); listed with the NVIDIA A10 datasheet
  values (nvidia.com/en-us/data-center/products/a10-gpu/): FP32 31.2, TF32 62.5, BF16/FP16 125. Approximate.
* V100: NVIDIA V100 datasheet (images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-
  us-1165301-r5.pdf): SXM2 FP16 tensor 125, FP32 15.7; PCIe FP16 112, FP32 14. No BF16/TF32 on Volta.
* MI300X: AMD Instinct MI300X datasheet (amd.com/.../instinct-mi300x-data-sheet.pdf): FP32 matrix 163.4,
  TF32 653.7, BF16/FP16 1307.4, FP8 2614.9.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (pattern matched against the manifest's device_name, case-insensitive; first match wins) -> peaks by dtype.
# Order matters: more specific names (PCIe, NVL) come before the generic SXM patterns.
PEAK_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    ("A100", r"A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("H100 PCIe", r"H100.*PCIE", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    ("H100 NVL", r"H100.*NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0, "fp8": 1670.5}),
    ("H100 SXM", r"H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("H200 NVL", r"H200.*NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0, "fp8": 1670.5}),
    ("H200", r"H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("B200", r"B200", {"tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}),
    ("L40S", r"L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0}),
    ("A10G", r"A10G", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100 PCIe", r"V100.*PCIE", {"fp32": 14.0, "fp16": 112.0}),
    ("V100 SXM2", r"V100", {"fp32": 15.7, "fp16": 125.0}),
    ("MI300X", r"MI300X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9}),
]

_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
}


@dataclass(frozen=True)
class PeakLookup:
    tflops: float | None
    device: str | None  # table entry matched, e.g. "H100 SXM"
    dtype: str | None  # normalised dtype, e.g. "bf16"
    reason: str  # where the number came from, or why there is none


def normalise_dtype(dtype: str | None) -> str | None:
    if not dtype:
        return None
    return _DTYPE_ALIASES.get(str(dtype).lower().removeprefix("torch."))


def match_device(device_name: str | None) -> tuple[str, dict[str, float]] | None:
    if not device_name:
        return None
    for label, pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return label, peaks
    return None


def lookup_peak_tflops(device_name: str | None, dtype: str | None) -> PeakLookup:
    """Dense peak TFLOP/s of ``device_name`` for ``dtype`` (default bf16, what people train in)."""
    match = match_device(device_name)
    if match is None:
        what = f"device {device_name!r}" if device_name else "an unknown device"
        return PeakLookup(None, None, None, f"no peak known for {what} (CPU or not in the table); pass --peak-tflops")
    label, peaks = match
    key = normalise_dtype(dtype) or "bf16"
    assumed = "" if normalise_dtype(dtype) else f" (dtype {dtype!r} unknown, bf16 assumed)"
    if key not in peaks:
        return PeakLookup(None, label, key, f"{label} has no {key} tensor-core peak in the table; pass --peak-tflops")
    return PeakLookup(peaks[key], label, key, f"datasheet dense {key} peak of {label}{assumed}")


def peak_flops_per_s(given_tflops: float | None, device_name: str | None, dtype: str | None) -> float | None:
    """Dense peak FLOP/s of one device: the user's ``peak_tflops``, else the datasheet table's."""
    if given_tflops:
        return given_tflops * 1e12
    looked_up = lookup_peak_tflops(device_name, dtype)
    return looked_up.tflops * 1e12 if looked_up.tflops else None


def mfu_of(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation, the one formula of the report (analysis.mfu) and the live metrics
    (metrics.prometheus): the model FLOPs done in ``seconds`` over what the devices' dense peak allows then."""
    return flops / seconds / peak_flops_per_s
