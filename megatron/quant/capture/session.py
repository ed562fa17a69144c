"""One capture session: which iterations, micro-batches and sites to record, and how."""
from __future__ import annotations

import secrets
import threading
import warnings
from dataclasses import replace
from datetime import datetime
from typing import Mapping, Optional, Union

from torch import Tensor

from megatron.quant.capture.config import IterationWindow, SaverConfig
from megatron.quant.capture.directory import check_writable
from megatron.quant.capture.extras import ExtraNeeds, OperandExtras
from megatron.quant.capture.inspect_plan import InspectPlan, RecordRequest
from megatron.quant.capture.naming import capture_directory
from megatron.quant.capture.ranks import current_ranks
from megatron.quant.capture.site import CaptureSite, Operand
from megatron.quant.capture.snapshot import Snapshot, StatsMemo, take_snapshot
from megatron.quant.capture.summary import IterationSummary
from megatron.quant.capture.te_log import TeStatsLog
from megatron.quant.capture.whatif import ORIENTATIONS, WhatIfFormats, check_layer_count
from megatron.quant.capture.writer import BackgroundWriter, WriteJob

OPERATIONS = ("forward", "backward")
PHASES = ("pre", "post")


class CaptureSession:
    """State of capture for one configured run.

    At-least-one-iteration rule: the window is resolved at the first ``set_iteration``.
    With ``run_iterations`` known, it is intersected with them; otherwise it keeps the
    iterations at or after the first one set. If nothing remains, the run's first iteration
    is captured instead (one warning). Unset ``iterations`` means that first iteration.

    With an ``InspectPlan`` (an nvdlfw-inspect config resolved against the run), the plan chooses
    instead what each capture records at each step (TE's step: iteration - 1), and the step's
    statistics go to the TE-named log (``te_log``) at its end.
    """

    def __init__(self, config: SaverConfig, run_iterations: Optional[range] = None,
                 plan: Optional[InspectPlan] = None, num_layers: Optional[int] = None) -> None:
        if run_iterations is not None and (run_iterations.step != 1 or len(run_iterations) == 0):
            raise ValueError(f"run_iterations={run_iterations!r} is invalid; allowed: a non-empty range(start, stop)")
        if config.inspect is not None and plan is None:
            raise ValueError(f"{config.inspect.source}: an inspect config needs the run's layers and formats; pass "
                             f"plan=tensor_saver.resolve_inspect(...)[1] to configure")
        check_layer_count(config.whatif, num_layers)
        if config.enabled:
            check_writable(config.save_dir)
        self.config = config
        self._run_iterations = run_iterations
        self._window: Optional[IterationWindow] = None
        self._writer = BackgroundWriter(config.queue_mb * 2**20,
                                        None if config.max_gb is None else int(config.max_gb * 2**30),
                                        on_stats=self._add_to_summary)
        self._iteration: Optional[int] = None
        self._microbatch = 0
        self._first_sample: Optional[int] = None
        self._ranks = current_ranks()
        self._run_id = secrets.token_hex(6)  # tells apart runs sharing a directory
        self._summary = IterationSummary()
        self._memo = StatsMemo()
        self._summary_lock = threading.Lock()  # the writer thread adds, the training thread reads
        self._wait_at_iteration_start = 0.0
        self._directories: dict[str, str] = {}  # quant_type -> its checked capture directory
        self._paused = False
        self._plan = plan
        self._formats = WhatIfFormats(num_layers) if plan is None else plan.formats
        self._te_log = TeStatsLog(config.save_dir)
        self.active = False

    # -- training-loop side -------------------------------------------------------------
    def set_iteration(self, iteration: int) -> None:
        self._finish_te_step()
        if self._window is None:
            self._window = self._resolve_window(iteration)
        self._iteration = iteration
        self._microbatch, self._first_sample = 0, None
        self._ranks = current_ranks()  # parallel state may have been set up after configure
        self._memo = StatsMemo()
        with self._summary_lock:
            self._summary = IterationSummary()
        self._wait_at_iteration_start = self._writer.wait_seconds
        self._update_active()

    def set_microbatch(self, index: int, first_sample: int) -> None:
        self._microbatch, self._first_sample = index, first_sample
        self._update_active()

    def set_paused(self, paused: bool) -> None:
        self._paused = paused
        self._update_active()

    def capture_complete(self) -> bool:
        if not (self.config.enabled and self.config.exit_after_capture) or self._window is None:
            return False
        last = self._window.last()
        return last is not None and self._iteration is not None and self._iteration >= last

    def iteration_summary(self) -> dict[str, float]:
        self._writer.wait_for_stats()
        te_values = self._finish_te_step()
        with self._summary_lock:
            if self._summary.records == 0:
                return te_values
            summary = {**self._summary.as_dict(), "capture/records": float(self._summary.records), **te_values}
        return {**summary, "capture/wait_s": self._writer.wait_seconds - self._wait_at_iteration_start}

    def _add_to_summary(self, metadata: dict) -> None:
        with self._summary_lock:
            if metadata["iteration"] != self._iteration:  # late results of an earlier iteration are not mixed in
                return
            self._summary.add(metadata["role"], metadata["tensor_name"], metadata["stats"])
            request = self._request(metadata["module"], metadata["tensor_name"], metadata["operation"])
            if request is not None and request.stats and not metadata["quantized"]:
                self._te_log.add(metadata["module"], request.te_tensor, request.stats, metadata["stats"])

    def _request(self, module: str, tensor_name: str, operation: str) -> Optional[RecordRequest]:
        if self._plan is None or self._iteration is None:
            return None
        return self._plan.request(module, tensor_name, operation, self._iteration - 1)

    def _finish_te_step(self) -> dict[str, float]:
        """The current step's TE-named statistics, logged once (later calls in the step give nothing)."""
        if self._plan is None or self._iteration is None:
            return {}
        self._writer.wait_for_stats()
        with self._summary_lock:
            return self._te_log.finish(self._iteration - 1, self._ranks["rank"] or 0)

    def writer_stats(self) -> dict[str, float]:
        return self._writer.stats()

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Finish the session: flush, close files, and say so if the window was never reached."""
        self._finish_te_step()
        self._writer.close()
        self._te_log.close()
        if self._window_unreached():
            warnings.warn(f"tensor capture window {self._window.spec!r} was never reached (the last "
                          f"iteration run was {self._iteration}); nothing was captured. Pass "
                          f"run_iterations to configure() to capture the run's first iteration instead",
                          RuntimeWarning, stacklevel=3)

    def _window_unreached(self) -> bool:
        """Enabled, iterations ran, and all of them lie before the (finite) window."""
        if not self.config.enabled or self._window is None or self._window.members is None:
            return False
        return self._iteration is not None and self._iteration < self._window.members.min()

    # -- layer side -----------------------------------------------------------------------
    def capture(self, site: CaptureSite, operation: str, phase: str,
                tensors: Mapping[str, Union[Tensor, Operand]]) -> None:
        if operation not in OPERATIONS or phase not in PHASES:
            raise ValueError(f"capture(operation={operation!r}, phase={phase!r}) is invalid; allowed: "
                             f"operation {' or '.join(OPERATIONS)}, phase {' or '.join(PHASES)}")
        cfg = self.config
        if (cfg.layers is not None and site.layer_idx not in cfg.layers) or \
                (cfg.roles is not None and site.role not in cfg.roles):
            return
        self._check_directory(site.quant_type)
        for name, value in tensors.items():
            request = self._request(site.module, name, operation)
            if (self._plan is not None and request is None) or (cfg.tensors is not None and name not in cfg.tensors):
                continue
            operand = value if isinstance(value, Operand) else Operand(value)
            self._record(site, operation, phase, name, operand, request)
            if self._writer.stopped:
                self.active = False
                return

    def _record(self, site: CaptureSite, operation: str, phase: str, name: str, operand: Operand,
                request: Optional[RecordRequest]) -> None:
        cfg = self.config
        if request is None:
            full = cfg.mode == "full"
            save_quantized = full and cfg.save_quantized and operand.fmt is not None
            needs = ExtraNeeds(whatif=cfg.whatif if name in ORIENTATIONS else (),
                               block_scales=cfg.block_scales and not full)
        else:
            full, save_quantized = request.keep_tensor, request.keep_quantized and operand.fmt is not None
            needs = replace(request.needs, block_scales=cfg.block_scales)
        extras = OperandExtras(site, name, needs, cfg.stats, self._formats) if needs else None
        if save_quantized and operand.quantized is None:
            # Quantize once: the statistics and the saved copy then describe the same values.
            quantized, scale = operand.fmt.quantize_with_scale(operand.tensor.detach(), axis=operand.axis,
                                                               amax=operand.amax)
            operand = replace(operand, quantized=quantized, scale=scale)
        self._submit(site, self._metadata(site, operation, phase, name, operand, operand.tensor),
                     take_snapshot(operand, full, self._memo, cfg.stats, extras))
        if save_quantized:
            metadata = self._metadata(site, operation, phase, f"{name}_quantized", operand, operand.quantized)
            self._submit(site, {**metadata, "quantized": True},
                         take_snapshot(Operand(operand.quantized), True, self._memo, self.config.stats))

    def _metadata(self, site: CaptureSite, operation: str, phase: str, name: str, operand: Operand,
                  tensor: Tensor) -> dict:
        """Everything but "stats", which the writer adds when the snapshot's statistics are done."""
        fmt = operand.fmt
        return {
            "layer_type": site.layer_type, "layer_idx": site.layer_idx, "module": site.module, "role": site.role,
            "operation": operation, "phase": phase, "component": site.component, "quant_type": site.quant_type,
            "format": None if fmt is None else {"name": fmt.name, "options": _as_json(fmt.options)},
            "axis": operand.axis, "tensor_name": name,
            "iteration": self._iteration, "microbatch": self._microbatch, "sample": self._microbatch,
            "first_sample": self._first_sample, **self._ranks,
            "shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
            "saved_at": datetime.now().isoformat(timespec="microseconds"), "quantized": False,
            "run_id": self._run_id,
        }

    def _submit(self, site: CaptureSite, metadata: dict, snapshot: Snapshot) -> None:
        self._writer.submit(WriteJob(self._directories[site.quant_type], metadata, snapshot))

    # -- helpers ----------------------------------------------------------------------------
    def _resolve_window(self, first_iteration: int) -> IterationWindow:
        configured = self.config.iterations
        if configured is None:
            start = first_iteration if self._run_iterations is None else self._run_iterations.start
            return IterationWindow.only(start)
        if self._run_iterations is not None:
            window = configured.restricted_to(self._run_iterations.start, self._run_iterations.stop)
            fallback, run = self._run_iterations.start, f"iterations {self._run_iterations.start}.." \
                                                        f"{self._run_iterations.stop - 1}"
        else:
            window = configured.restricted_to(first_iteration, None)
            fallback, run = first_iteration, f"iterations from {first_iteration}"
        if window.is_empty():
            if self.config.enabled:
                warnings.warn(f"tensor capture window {configured.spec!r} has no iteration in this run ({run}); "
                              f"capturing iteration {fallback} instead", RuntimeWarning, stacklevel=4)
            return IterationWindow.only(fallback)
        return window

    def _update_active(self) -> None:
        cfg = self.config
        selected = self._iteration in self._window if self._plan is None else self._plan.runs_at(self._iteration - 1)
        self.active = (cfg.enabled and not self._paused and not self._writer.stopped and self._window is not None
                       and selected
                       and (cfg.ranks is None or self._ranks["rank"] in cfg.ranks)
                       and (cfg.microbatches is None or self._microbatch in cfg.microbatches))

    def _check_directory(self, quant_type: str) -> None:
        if quant_type not in self._directories:
            try:
                self._directories[quant_type] = capture_directory(self.config.save_dir, quant_type)
            except ValueError as exc:
                raise ValueError(f"CaptureSite.{exc}") from None


def _as_json(options: Mapping) -> dict:
    """Format options as JSON reads them back (tuples become lists), so the file's metadata
    and its manifest line say the same."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in options.items()}
