"""The step profile of a grid row (--profile): device kernels per decode step, their summed device time (kernels that
overlap under programmatic dependent launch count twice), the captured graph's wall time on the device and its
kernels ranked by the part of it each adds (common.critical_path) and one decoder layer's kernels with the part each
adds (common.layer_critical_path), and the host wall time until the step's launch returned, over the same prompts and
sampling as the row (common.profile_steps), at the row's mean decode context (its KV, not the prompt's, sets a large
batch's attention time)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace
from typing import Any

from engine import Engine

from ..common import DecodeStep, graph_critical_path, graph_device_ms, graphs, profile_steps
from .sampling import request_params

STEPS = 10  # profiled steps, and as many host-timed ones, per row


def profile_row(engine: Engine, bs: int, context: int, mode: str, use_graphs: bool, method: str) -> dict[str, Any]:
    device = engine.device.torch_device
    with graphs(engine, use_graphs):
        harness = DecodeStep(engine, bs, context, seed=bs, params=request_params(mode, [1] * bs))
        for _ in range(3):  # warm-up: the sampling path's first calls
            harness.step()
        host_s = statistics.median(harness.host_step() for _ in range(STEPS))
        step, _ = profile_steps(harness.step, device, STEPS)
        runner = engine.graph_runner
        on = use_graphs and runner.enabled
        graph_ms = graph_device_ms(engine, runner.padded_size(bs), harness.graph_mode) if on else None
        critical, layer = graph_critical_path(engine, runner.padded_size(bs), harness.graph_mode) if on else ([], [])
    engine.release_rows(range(bs))  # the grid's driver maps its rows again
    return {"batch": bs, "sampling": mode, "method": method, "graph_ms_per_step": graph_ms,
            **asdict(replace(step, host_ms_per_step=host_s * 1e3)), "critical_kernels": critical,
            "critical_layer": layer}
