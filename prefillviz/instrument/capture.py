"""Capture levels: what a run records besides its step times.

    none      step wall times only (the engine always records these)
    timing    + per layer and sub-layer time (attention, MLP, norms, embedding, final norm,
              lm_head): perf_counter on CPU, CUDA events on GPU, read once per step
    inspect   + the KV write log (positions, slots, blocks, bytes, K/V norms per kv head and
              token), post-RoPE queries, keys and values of every layer, hidden-state norms
    profile   timing under torch.profiler, with a record_function scope per layer and
              sub-layer, a per-op table and a Chrome trace

A ``Capture`` is the engine's run observer (``engine/observer.py``): the engine's own forward
tells it of its spans, q/k/v and residual stream, so every level observes the forward that a
timing pass times. A model the engine's forward does not know runs the stock forward; there
the spans and the residual stream come from module hooks, which are global state on a shared
model (TransformerLens' lesson): they exist only inside ``installed()``, which removes every one
of them in ``finally``, even when the run fails.

Names are dotted: ``layers.3.attention``, ``layers.3.mlp``, ``layers.3.input_layernorm``,
``layers.3``, ``embedding``, ``final_norm``, ``lm_head``.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import ContextManager

import torch

from prefillviz.engine.errors import ConfigError
from prefillviz.engine.kv_cache import kv_bytes_per_token
from prefillviz.engine.trace import StepRecord, Trace
from prefillviz.instrument.capture_buffers import Rows, StepNorms
from prefillviz.instrument.model_parts import SUB_LAYER_KINDS, model_parts
from prefillviz.instrument.records import CAPTURE_LEVELS, CapturedQK, KVWriteRecord, LayerTimes, ProfileRecord
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.timers import SpanClock


class Capture:
    """Records what ``level`` asks for while installed on an engine: the engine's ``RunObserver`` (``run_captured``)."""

    def __init__(self, engine, level: str, profile_dir: str | None = None) -> None:
        if level not in CAPTURE_LEVELS:
            raise ConfigError(f"capture level must be one of {', '.join(CAPTURE_LEVELS)}; got {level!r}.")
        self.engine = engine
        self.level = level
        self.profile_dir = profile_dir
        self.parts = model_parts(engine.model) if level != "none" else None
        self.sees_tensors = level == "inspect"
        self.clock = SpanClock(engine.device)
        self.profiler = None
        self._scopes: dict[str, ContextManager] = {}  # the spans a stock forward's hooks opened
        self._norms: StepNorms | None = None  # this step's per-token norms (inspect)
        self._kv_step_meta = None
        self._qk: dict[str, dict] = {}

    # ---------------------------------------------------------------- hooks
    def _span_hooks(self, name: str, module: torch.nn.Module, handles: list) -> None:
        """The module's call as the span ``name`` (``span``): opened before it runs, closed after."""

        def pre_hook(_module, _args):
            self._scopes[name] = self.span(name)
            self._scopes[name].__enter__()

        def post_hook(_module, _args, _output):
            opened = self._scopes.pop(name, None)
            if opened is not None:
                opened.__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))

    def _install(self, handles: list) -> None:
        parts = self.parts
        self._span_hooks("embedding", parts.embedding, handles)
        if parts.final_norm is not None:
            self._span_hooks("final_norm", parts.final_norm, handles)
        self._span_hooks("lm_head", parts.lm_head, handles)
        for i, (layer, children) in enumerate(zip(parts.layers, parts.sub_layers)):
            self._span_hooks(f"layers.{i}", layer, handles)
            for child_name, (kind, child) in children.items():
                name = f"layers.{i}.{kind}" if kind != "norm" else f"layers.{i}.{child_name}"
                self._span_hooks(name, child, handles)
        if self.level == "inspect":
            handles.append(parts.embedding.register_forward_hook(self._hidden_hook(0)))
            for i, layer in enumerate(parts.layers):
                handles.append(layer.register_forward_hook(self._hidden_hook(i + 1)))

    def _hidden_hook(self, index: int):
        def hook(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # (1, T, hidden)
            self.hidden(index, hidden[0])

        return hook

    # ---------------------------------------------------------------- what the forward tells
    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """A named part of the forward: timed on the clock, and a ``record_function`` scope at the profile level."""
        scope = torch.autograd.profiler.record_function(name) if self.level == "profile" else None
        if scope is not None:
            scope.__enter__()
        self.clock.start(name)
        try:
            yield
        finally:
            self.clock.stop(name)
            if scope is not None:
                scope.__exit__(None, None, None)

    def hidden(self, index: int, hidden: torch.Tensor) -> None:
        """Inspect: the norm of each token's residual stream (T, hidden) after the embedding (0) or layer index - 1."""
        self._step_norms(hidden.shape[0]).keep_hidden(index, hidden.float().norm(dim=-1))  # (T,)

    def _step_norms(self, tokens: int) -> StepNorms:
        if self._norms is None:
            self._norms = StepNorms(self.engine.num_layers, self.engine.num_kv_heads, tokens)
        return self._norms

    def attention(
        self, layer_idx: int, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta
    ) -> None:
        """Inspect: the K/V just written, and the post-RoPE q/k/v of each request: q (T, H, D), k and v (T, KVH, D)."""
        self._kv_step_meta = meta
        # each now (1, heads, T, D)
        query, key, value = query.transpose(0, 1)[None], key.transpose(0, 1)[None], value.transpose(0, 1)[None]
        # the norms: (KVH, T)
        self._step_norms(key.shape[2]).keep_kv(layer_idx, key[0].float().norm(dim=-1), value[0].float().norm(dim=-1))
        for r, request_id in enumerate(meta.request_ids):
            start, end = meta.query_start_loc[r], meta.query_start_loc[r + 1]
            if request_id not in self._qk:
                self._qk[request_id] = self._new_store(request_id)
            store = self._qk[request_id]
            if layer_idx == 0:
                store["positions"].append(meta.positions[start:end].clone())
            store["scaling"][layer_idx] = float(module.scaling)
            store["q"].keep(layer_idx, query[0, :, start:end].detach())  # (H, q, D)
            store["k"].keep(layer_idx, key[0, :, start:end].detach())  # (KVH, q, D)
            store["v"].keep(layer_idx, value[0, :, start:end].detach())  # (KVH, q, D)

    def _new_store(self, request_id: str) -> dict:
        """A request's captures, its q/k/v buffers made for the most tokens it feeds the model: its prompt
        and every new token but the last (as many as its first chunk where the request is unknown)."""
        request = self.engine.scheduler.requests.get(request_id)
        capacity = request.num_prompt_tokens + request.sampling_params.max_new_tokens - 1 if request is not None else 0
        num_layers = self.engine.num_layers
        return {"positions": [], "scaling": {}, **{kind: Rows(num_layers, capacity) for kind in ("q", "k", "v")}}

    # ---------------------------------------------------------------- the engine's RunObserver
    @contextmanager
    def installed(self) -> Iterator[Capture]:
        """Start the profiler (profile level) and, on a stock forward, hook its modules; undo all on exit,
        even on error."""
        handles: list = []
        with ExitStack() as stack:
            try:
                if self.level != "none" and self.engine.runner.own_forward is None:
                    self._install(handles)  # the stock forward: its modules' hooks time the spans
                if self.level == "profile":
                    activities = [torch.profiler.ProfilerActivity.CPU]
                    if self.engine.device.type == "cuda":
                        activities.append(torch.profiler.ProfilerActivity.CUDA)
                    self.profiler = stack.enter_context(
                        torch.profiler.profile(activities=activities, record_shapes=True, with_flops=True)
                    )
                yield self
            finally:
                for handle in handles:
                    handle.remove()
                for scope in self._scopes.values():  # a failure mid-forward left spans open
                    scope.__exit__(None, None, None)
                self._scopes.clear()

    # ---------------------------------------------------------------- per step
    def end_step(self, record: StepRecord) -> None:
        """Attach this step's measurements to its record (the engine calls it after each step)."""
        record.capture_level = self.level
        if self.level == "none":
            return
        record.layer_times = self._layer_times(self.clock.collect())
        if self.level == "inspect" and self._kv_step_meta is not None:
            meta, norms = self._kv_step_meta, self._norms
            slots = meta.slot_mapping.cpu().numpy()
            kv_cache = self.engine.kv_cache
            element_size = kv_cache.key_cache[0].element_size()
            num_kv_heads, head_dim = kv_cache.key_cache[0].shape[2:]
            record.kv_writes = KVWriteRecord(
                positions=meta.positions.numpy().copy(),
                slots=slots,
                blocks=slots // kv_cache.block_size,
                layers_written=list(norms.layers),
                bytes_per_layer=len(slots) * kv_bytes_per_token(1, num_kv_heads, head_dim, element_size),
                key_norms=norms.kv_array(norms.keys),  # (layers, T, KVH)
                value_norms=norms.kv_array(norms.values),
            )
            record.hidden_norms = norms.hidden_array()  # (layers + 1, T)
        self._norms, self._kv_step_meta = None, None

    def _layer_times(self, spans: dict[str, float]) -> LayerTimes:
        num_layers = len(self.parts.layers)
        per_layer = {kind: [0.0] * num_layers for kind in SUB_LAYER_KINDS}
        for i, children in enumerate(self.parts.sub_layers):
            for child_name, (kind, _) in children.items():
                name = f"layers.{i}.{kind}" if kind != "norm" else f"layers.{i}.{child_name}"
                per_layer[kind][i] += spans.get(name, 0.0)
        return LayerTimes(
            clock=self.clock.name,
            attention_s=per_layer["attention"],
            mlp_s=per_layer["mlp"],
            norms_s=per_layer["norm"],
            layer_s=[spans.get(f"layers.{i}", 0.0) for i in range(num_layers)],
            embedding_s=spans.get("embedding", 0.0),
            final_norm_s=spans.get("final_norm", 0.0),
            lm_head_s=spans.get("lm_head", 0.0),
        )

    # ---------------------------------------------------------------- end of run
    def attach(self, trace: Trace) -> None:
        """Add the run-level results (captured q/k, profiler output) to the trace."""
        trace.capture_level = self.level
        for request_id, store in self._qk.items():
            layers = sorted(store["q"].filled)
            trace.captured_qk[request_id] = CapturedQK(
                dtype=dtype_name(self.engine.dtype),
                positions=torch.cat(store["positions"]).numpy(),
                scaling=[store["scaling"][layer] for layer in layers],
                queries=store["q"].arrays(layers),
                keys=store["k"].arrays(layers),
                values=store["v"].arrays(layers),
            )
        if self.profiler is not None:
            trace.profile = self._profile_record()

    def _profile_record(self) -> ProfileRecord:
        with ExitStack() as stack:  # without a profile_dir the export's file goes with a temporary folder
            directory = self.profile_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="prefillviz-profile-")
            )
            os.makedirs(directory, exist_ok=True)
            export = os.path.join(directory, "chrome_trace.json")
            self.profiler.export_chrome_trace(export)
            with open(export, "rb") as handle:
                chrome_trace = handle.read()
        path = export if self.profile_dir else ""  # a file only where the caller asked for one
        rows = []
        for event in self.profiler.key_averages():
            rows.append(
                {
                    "op": event.key,
                    "calls": event.count,
                    "self_time_s": event.self_cpu_time_total / 1e6,
                    "total_time_s": event.cpu_time_total / 1e6,
                    "device_time_s": getattr(event, "self_device_time_total", 0.0) / 1e6,
                    "device_total_s": getattr(event, "device_time_total", 0.0) / 1e6,  # a scope's: its kernels
                    "flops": int(event.flops or 0),
                }
            )
        rows.sort(key=lambda row: row["self_time_s"] + row["device_time_s"], reverse=True)
        activities = ["cpu"] + (["cuda"] if self.engine.device.type == "cuda" else [])
        return ProfileRecord(
            op_table=rows, chrome_trace_path=path, activities=activities, chrome_trace_gz=gzip.compress(chrome_trace, 6)
        )


def capture(engine, level: str = "timing", profile_dir: str | None = None):
    """``Capture(engine, level, profile_dir).installed()``: the instruments of ``level`` on the engine while
    the block runs.

    Args:
        engine: the ``LLMEngine`` whose steps are measured.
        level: one of ``CAPTURE_LEVELS``.
        profile_dir: where the profile level writes its Chrome trace (a temp folder if None).
    """
    return Capture(engine, level, profile_dir).installed()


def run_captured(
    engine, capture_level: str = "none", profile_dir: str | None = None, max_steps: int | None = None, progress=None
) -> Trace:
    """``engine.run`` with the instruments of ``capture_level`` installed for the run (the engine's ``RunObserver``).

    Raises:
        ConfigError: an unknown capture level (before anything runs).
    """
    return engine.run(max_steps=max_steps, progress=progress, observer=Capture(engine, capture_level, profile_dir))
