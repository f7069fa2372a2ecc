"""The measured dispatch tables, kept: in this process, on disk per machine, and read for captions.

``table_for`` gives a model's table: one a test injected, one kept in this process, one cached
on disk as the machine peaks are (``$PREFILLVIZ_CACHE/dispatch/``, or ``$PREFILLVIZ_DISPATCH_CACHE``
where set, as the test suite does; with the timings, the date and
the machine's load), or one measured now (``dispatch_tuning.measure``). A cached table is measured
again when it is older than ``MAX_AGE``, was measured on a busy machine or noisily, or the
candidates that can run here changed (a build, a switch); ``refresh=True`` ("measure again")
always measures. The measured backend asks ``table_for`` at every step (~25 us).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from prefillviz.backends import dispatch, dispatch_tuning
from prefillviz.backends.dispatch import ATTENTION, LINEARS, DispatchTable
from prefillviz.backends.dispatch_buckets import BUCKETS
from prefillviz.backends.dispatch_tuning import candidate_statuses, fingerprint
from prefillviz.machine.devices import cache_root, machine_slug

# in the cache file's name and content (an older table is measured again); 2: stock linears timed as the engine
# calls them; 3: timed under the engine's allocator; 4: v8 a candidate (an fp32 table says why it is out); 5: v8 runs
# fp32 too; 6: the brgemm linear a candidate, gate|up timed with its SiLU; 7: the slab linear a candidate
FORMAT = 7
MAX_AGE = datetime.timedelta(days=7)


# caps that change which code a candidate runs
ISA_CAP_ENVS = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def table_key(model: torch.nn.Module, parameter: torch.Tensor | None = None) -> tuple:
    """(device, dtype, threads, shape, ISA caps): what a table is measured for (``parameter``: any of the model's,
    if at hand)."""
    parameter = next(model.parameters()) if parameter is None else parameter
    caps = ",".join(f"{name}={os.environ[name]}" for name in ISA_CAP_ENVS if os.environ.get(name))
    return (str(parameter.device), str(parameter.dtype).removeprefix("torch."), torch.get_num_threads(),
            dispatch_tuning.model_signature(model), caps)


# --------------------------------------------------------------------------- the cache
def cache_folder() -> Path:
    """Where tables are kept on disk: ``$PREFILLVIZ_DISPATCH_CACHE`` if set (the tests' own folder, so
    tables measured on their tiny models and under their load never reach the user's), else
    ``$PREFILLVIZ_CACHE/dispatch`` (default ``~/.cache/prefillviz/dispatch``)."""
    if os.environ.get("PREFILLVIZ_DISPATCH_CACHE"):
        return Path(os.environ["PREFILLVIZ_DISPATCH_CACHE"]).expanduser()
    return cache_root() / "dispatch"


def cache_path(model: torch.nn.Module) -> Path:
    device, dtype, threads, signature, caps = table_key(model)
    digest = hashlib.sha1(f"{signature};{caps}".encode()).hexdigest()[:10]
    return cache_folder() / (f"{machine_slug(device)}_{device.replace(':', '')}_{dtype}_{threads}threads_"
                             f"{digest}_v{FORMAT}.json")


def read_cached(path: Path) -> DispatchTable | None:
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return None
        table = DispatchTable.from_dict(data["table"])
        table.choices()  # every bucket has a choice
    except (OSError, ValueError, TypeError, KeyError, RuntimeError):
        return None
    table.source = "cache"
    return table


def is_stale(table: DispatchTable, model: torch.nn.Module, now: datetime.datetime | None = None) -> str:
    """Why a cached table must be measured again ('' when it is fresh)."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        measured = datetime.datetime.fromisoformat(table.measured_at)
    except ValueError:
        return "its time can't be read"
    if measured.tzinfo is None:
        measured = measured.replace(tzinfo=datetime.UTC)
    if now - measured > MAX_AGE:
        return f"it is older than {MAX_AGE.days} days"
    if table.busy:
        return "it was measured on a busy machine"
    if table.noisy:
        return "its runs varied too much (another program competed for the cores)"
    if table.fingerprint != fingerprint(candidate_statuses(model)):
        return "the candidates that run here changed"
    if set(table.timings) != {b.name for b in BUCKETS}:
        return "its buckets are not today's"
    return ""


def write_cached(path: Path, table: DispatchTable) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, "table": table.as_dict()}, indent=1))
    tmp.replace(path)


# --------------------------------------------------------------------------- per model
_injected: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> table a test put there




def injected_for(model: torch.nn.Module) -> DispatchTable | None:
    """The table a test injected for this model, if any."""
    return _injected.get(model)


@contextlib.contextmanager
def injected_table(model: torch.nn.Module, table: DispatchTable) -> Iterator[DispatchTable]:
    """Make the engine's steps on ``model`` use ``table`` inside the block (tests force each candidate this way)."""
    previous = _injected.get(model)
    _injected[model] = table
    try:
        yield table
    finally:
        if previous is None:
            _injected.pop(model, None)
        else:
            _injected[model] = previous


_tables: dict[tuple, DispatchTable] = {}
_lock = threading.Lock()


def table_for(model: torch.nn.Module, refresh: bool = False, progress: Callable[[float, str], None] | None = None,
              buckets: tuple[str, ...] | None = None, part_will_do: bool = False) -> DispatchTable:
    """The model's dispatch table here: injected by a test, kept from earlier in this process, cached on disk, or
    measured now.

    Args:
        refresh: measure again even when a fresh table is kept or cached ("measure again").
        progress: called with (fraction done, what) while it measures.
        buckets: a first start's first part: where no table is kept or cached, time only these buckets now and
            keep that part in this process (``time_next_bucket`` times the others later).
        part_will_do: a kept part is good enough (the engine's steps: a bucket not timed yet runs the nearest
            timed bucket's choice, ``DispatchTable.nearest_timed``); otherwise a kept part is completed first.
    """
    table = injected_for(model)
    if table is not None:
        return table
    parameter = next(model.parameters())
    # a switch or a build measures anew
    key = (*table_key(model, parameter), fingerprint(candidate_statuses(model, parameter)))
    table = _tables.get(key)
    if table is not None and not refresh and (not table.partial or buckets is not None or part_will_do):
        return table
    with _lock:  # sessions share the model: measure once
        table = _tables.get(key)
        if table is not None and table.partial and not refresh and buckets is None:
            table = dispatch_tuning.complete(model, table)
            _keep_on_disk(model, table)
        elif table is None or refresh:
            cached = None if refresh else read_cached(cache_path(model))
            if cached is not None and not is_stale(cached, model):
                table = cached
            else:  # through the module: a test can stand in for it
                table = dispatch_tuning.measure(model, progress, buckets)
                if not table.partial:
                    _keep_on_disk(model, table)
        _tables[key] = table
    return table


def _keep_on_disk(model: torch.nn.Module, table: DispatchTable) -> None:
    try:
        write_cached(cache_path(model), table)
    except OSError:
        pass  # it only costs a measurement next time


def time_next_bucket(model: torch.nn.Module) -> bool:
    """Time one more bucket of the model's kept part (its candidates' checks stand); False when none is left. The
    whole table, once every bucket is timed, goes to disk."""
    key = (*table_key(model), fingerprint(candidate_statuses(model)))
    with _lock:
        table = _tables.get(key)
        if table is None or not table.partial:
            return False
        missing = [b.name for b in BUCKETS if b.name not in table.timings]
        table = _tables[key] = dispatch_tuning.complete(model, table, (missing[0],))
        if not table.partial:
            _keep_on_disk(model, table)
        return True


def table_for_heads(num_heads: int, num_kv_heads: int, head_dim: int, device: str, dtype: str) -> DispatchTable | None:
    """The newest table measured on this machine for a model with these attention heads (kept in this
    process or cached on disk), or None: what the kernels command marks as the engine's choice."""
    prefix = f"H{num_heads}-KVH{num_kv_heads}-D{head_dim}-"
    threads = torch.get_num_threads()
    found = [t for t in _tables.values()
             if t.shape.startswith(prefix) and (t.device, t.dtype, t.num_threads) == (device, dtype, threads)]
    folder = cache_folder()
    pattern = f"*_{device.replace(':', '')}_{dtype}_{threads}threads_*_v{FORMAT}.json"
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        table = read_cached(path)
        if table is not None and table.shape.startswith(prefix):
            found.append(table)
    return max(found, key=lambda t: t.measured_at, default=None)


def known_table(model: torch.nn.Module) -> DispatchTable | None:
    """The table the engine uses for this model if one is at hand already (nothing is measured)."""
    return injected_for(model) or _tables.get((*table_key(model), fingerprint(candidate_statuses(model))))


def choice_label(model: torch.nn.Module, with_reason: bool = False) -> str:
    """What the measured dispatch runs for this model, for captions (nothing is measured here).

    Args:
        with_reason: each family's sentence with the times that chose it, and where they come from (the sidebar's
            card).
    """
    table = known_table(model)
    if table is None:
        return "measured dispatch: not measured yet (the warm-up times the candidates)"
    if with_reason:
        return f"{table.sentence(ATTENTION)}. {table.sentence(LINEARS)}. Chosen by timing: {table.provenance()}."
    parts = []
    for family in dispatch.FAMILIES:
        by_choice: dict[str, list[str]] = {}
        for bucket in table.timings:
            by_choice.setdefault(table.choice(bucket, family), []).append(bucket.replace("_", " "))
        if len(by_choice) == 1:
            parts.append(f"{family}: {dispatch.PLAIN_NAMES[next(iter(by_choice))]}")
        else:
            parts.append(f"{family}: " + ", ".join(f"{dispatch.PLAIN_NAMES[n]} ({', '.join(b)})"
                                                   for n, b in by_choice.items()))
    return "; ".join(parts) + " (measured here)"


def summary(model: torch.nn.Module, trace=None) -> dict:
    """The measured dispatch as ``run --json``, ``tune`` and ``bench --json`` report it: the sentences, the
    choice per bucket, every timing in ms, what is excluded and why, and (with a trace) what each step ran."""
    table = table_for(model)
    result = {
        ATTENTION: table.sentence(ATTENTION),
        LINEARS: table.sentence(LINEARS),
        "provenance": table.provenance(),
        "choices": table.choices(),
        "timings_ms": {b: {f: {c: round(s * 1e3, 4) for c, s in t.items()} for f, t in fams.items()}
                       for b, fams in table.timings.items()},
        "excluded": table.excluded,
    }
    if trace is not None:
        result["steps"] = [step.ran for step in trace.steps if step.ran]
    return result
