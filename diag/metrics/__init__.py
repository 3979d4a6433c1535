"""Live metrics, torch-free: the Prometheus metric set folded from capture's rows (``prometheus``) and NVML
reading shared by the rank's GPU sampler and the node agent (``nvml``). Capture hands rows here; the node agent
(``diag telemetry``) reads trace files and NVML and folds them the same way."""
