"""The machine peaks' cached history: the best of the measurements counts, a stale cache (old,
or taken on a busy machine) is measured again once per start-up, a fresh quiet one is not,
older formats are ignored and the list is capped. No real timing: ``measure_peaks`` is a fake
that hands out planned figures."""

import datetime
import json

import pytest

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.machine.load import BUSY_PERCENT
from prefillviz.measure import peaks as peaks_module
from prefillviz.measure import peaks_history
from prefillviz.measure.peaks_history import (
    MAX_AGE,
    MAX_MEASUREMENTS,
    machine_peaks,
    peaks_cache_path,
    write_measurements,
)

QUIET, BUSY = 2.0, 80.0  # other processes' CPU percent
assert QUIET < BUSY_PERCENT < BUSY


def peaks(matmul_gflops: float, memory_gb_s: float, other_cpu_percent: float | None = QUIET,
          age: datetime.timedelta = datetime.timedelta()) -> MachinePeaks:
    measured_at = (datetime.datetime.now(datetime.UTC) - age).isoformat(timespec="seconds")
    return MachinePeaks(
        "cpu", "float32", matmul_gflops, memory_gb_s, measured_at, "test cpu", 2,
        gemv_gb_s=memory_gb_s, copy_gb_s=memory_gb_s / 2, other_cpu_percent=other_cpu_percent,
    )


class PlannedMeasurements:
    """Stands in for ``measure_peaks``: returns the planned measurements in order, counting calls."""

    def __init__(self) -> None:
        self.planned: list[MachinePeaks] = []
        self.num_calls = 0

    def plan(self, *measurements: MachinePeaks) -> None:
        self.planned.extend(measurements)

    def __call__(self, device, dtype) -> MachinePeaks:
        if not self.planned:
            raise AssertionError("measured although no measurement was expected")
        self.num_calls += 1
        return self.planned.pop(0)


@pytest.fixture
def measure(tmp_path, monkeypatch) -> PlannedMeasurements:
    monkeypatch.setenv("PREFILLVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks_history, "_checked_this_process", set())
    fake = PlannedMeasurements()
    monkeypatch.setattr(peaks_history, "measure_peaks", fake)
    return fake


def start_up() -> None:
    """What a new process sees: the cache file, and no check made yet."""
    peaks_history._checked_this_process.clear()


def cached_records() -> list[dict]:
    return json.loads(peaks_cache_path("cpu", "float32").read_text())["measurements"]


def test_the_best_figures_are_kept_across_calls_each_from_its_own_measurement(measure):
    measure.plan(peaks(159.0, 10.0), peaks(77.0, 12.0))
    first = machine_peaks("cpu", "float32")
    assert (first.matmul_gflops, first.memory_gb_s, first.num_measurements) == (159.0, 10.0, 1)

    second = machine_peaks("cpu", "float32", refresh=True)  # slower matmul, faster memory
    assert measure.num_calls == 2
    assert (second.matmul_gflops, second.memory_gb_s) == (159.0, 12.0)
    assert (second.matmul_gflops_min, second.memory_gb_s_min, second.num_measurements) == (77.0, 10.0, 2)
    assert second.gemv_gb_s == 12.0 and second.copy_gb_s == 6.0
    assert second.memory_gb_s == max(second.gemv_gb_s, second.copy_gb_s)
    assert second.measured_at == first.measured_at == second.oldest_measured_at  # of the best matmul figure
    assert second.ridge_intensity == pytest.approx(159.0 / 12.0)
    assert "best of 2 measurements" in second.history_label() and "77–159 GFLOP/s" in second.history_label()

    start_up()  # fresh and quiet: read, not measured
    assert machine_peaks("cpu", "float32") == second
    assert measure.num_calls == 2
    assert [record["matmul_gflops"] for record in cached_records()] == [159.0, 77.0]
    assert [record["other_cpu_percent"] for record in cached_records()] == [QUIET, QUIET]


def test_a_busy_measurement_is_measured_again_once_per_start_up(measure):
    measure.plan(peaks(77.0, 10.0, BUSY))
    busy = machine_peaks("cpu", "float32")
    assert busy.busy and busy.other_cpu_percent == BUSY and "Busy" in busy.history_label()
    assert machine_peaks("cpu", "float32") == busy  # same process: not measured again
    assert measure.num_calls == 1

    start_up()
    measure.plan(peaks(159.0, 11.0, QUIET))
    quiet = machine_peaks("cpu", "float32")
    assert measure.num_calls == 2
    assert (quiet.matmul_gflops, quiet.memory_gb_s, quiet.num_measurements) == (159.0, 11.0, 2)
    assert not quiet.busy and "Quiet" in quiet.history_label()

    start_up()  # the best figures are quiet now
    assert machine_peaks("cpu", "float32") == quiet
    assert measure.num_calls == 2


def test_best_figures_from_a_busy_moment_are_measured_again_even_when_the_newest_is_quiet(measure):
    write_measurements(peaks_cache_path("cpu", "float32"), [peaks(159.0, 12.0, BUSY), peaks(120.0, 10.0, QUIET)])
    measure.plan(peaks(130.0, 11.0, QUIET))
    result = machine_peaks("cpu", "float32")
    assert measure.num_calls == 1
    assert (result.num_measurements, result.matmul_gflops, result.busy) == (3, 159.0, True)


@pytest.mark.parametrize("age, measured_again", [(MAX_AGE - datetime.timedelta(hours=1), False),
                                                 (MAX_AGE + datetime.timedelta(hours=1), True)])
def test_an_old_cache_is_measured_again_and_a_fresh_quiet_one_is_not(measure, age, measured_again):
    write_measurements(peaks_cache_path("cpu", "float32"), [peaks(100.0, 10.0, QUIET, age=age)])
    measure.plan(peaks(90.0, 9.0, QUIET))
    result = machine_peaks("cpu", "float32")
    assert measure.num_calls == int(measured_again)
    assert result.num_measurements == 1 + int(measured_again)
    assert result.matmul_gflops == 100.0  # the older figure is still the best


def test_older_formats_are_ignored_and_measured_over(measure):
    path = peaks_cache_path("cpu", "float32")
    path.parent.mkdir(parents=True)
    flat = {key: value for key, value in vars(peaks(1e6, 1e6)).items()
            if key in ("device", "dtype", "matmul_gflops", "memory_gb_s", "measured_at", "machine", "num_threads")}
    path.write_text(json.dumps(flat))  # format 2: one flat measurement
    path.with_name(path.name.replace(f"_v{peaks_history.PEAKS_FORMAT}.json", "_v2.json")).write_text(json.dumps(flat))
    measure.plan(peaks(100.0, 10.0))
    result = machine_peaks("cpu", "float32")
    assert measure.num_calls == 1
    assert (result.matmul_gflops, result.memory_gb_s, result.num_measurements) == (100.0, 10.0, 1)
    assert json.loads(path.read_text())["format"] == peaks_history.PEAKS_FORMAT
    assert [record["matmul_gflops"] for record in cached_records()] == [100.0]


def test_the_history_keeps_the_most_recent_measurements_only(measure):
    num_calls = MAX_MEASUREMENTS + 3
    measure.plan(*(peaks(1000.0 - i, 10.0 + i) for i in range(num_calls)))  # the first is the fastest
    for _ in range(num_calls):
        result = machine_peaks("cpu", "float32", refresh=True)
    assert measure.num_calls == num_calls
    assert result.num_measurements == MAX_MEASUREMENTS == len(cached_records())
    dropped = num_calls - MAX_MEASUREMENTS
    assert result.matmul_gflops == 1000.0 - dropped  # the dropped ones no longer count
    assert result.memory_gb_s == 10.0 + num_calls - 1
    assert result.matmul_gflops_min == 1000.0 - (num_calls - 1)


def test_measure_peaks_records_the_other_processes_cpu_share(monkeypatch):
    class LoadOf42Percent:
        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.reading = type("Reading", (), {"other_cpu_percent": 42.0})()

    monkeypatch.setattr(peaks_module, "MachineLoad", LoadOf42Percent)
    monkeypatch.setattr(peaks_module, "measure_matmul_gflops", lambda device, dtype, runs: 150.0)
    monkeypatch.setattr(peaks_module, "measure_bandwidth_gb_s", lambda device, dtype, runs: (8.0, 11.0))
    measured = peaks_module.measure_peaks("cpu", "float32")
    assert (measured.matmul_gflops, measured.memory_gb_s, measured.gemv_gb_s,
            measured.copy_gb_s) == (150.0, 11.0, 8.0, 11.0)
    assert measured.other_cpu_percent == 42.0 and measured.busy
