"""The wall on the bundled model: each size's time split into attention, linears and the rest, the fits,
and the crossovers; a size past the context is refused before anything runs."""

import pytest

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.long_prompt_wall import flop_crossover, run_wall


@pytest.mark.parametrize("backend", ["measured", "torch"])
def test_a_small_wall_splits_each_prefill(bundled, backend):
    messages = []
    result = run_wall(bundled, [128, 256, 384], progress=lambda fraction, text: messages.append((fraction, text)),
                      backend=backend)
    assert result.backend.startswith(backend)
    assert [p.num_tokens for p in result.points] == [128, 256, 384] and not result.stopped
    for point in result.points:
        assert 0 < point.attention_s and 0 < point.linears_s and point.attention_s + point.linears_s <= point.ttft_s
        assert len(point.attention_per_layer_s) == 30 and all(t > 0 for t in point.attention_per_layer_s)
    assert result.ttft_fit is not None and result.attention_fit is not None
    assert messages[-1] == (1.0, "fitting") and all(a[0] <= b[0] for a, b in zip(messages, messages[1:]))
    assert set(result.as_json()) >= {"points", "fits", "measured_crossover_tokens", "flop_crossover_tokens"}


def test_the_flop_crossover_is_where_attention_flops_pass_the_linears(bundled):
    n = flop_crossover(bundled.model)
    before, at = engine_step_costs(bundled.model, n - 1, n - 1), engine_step_costs(bundled.model, n, n)
    assert before.attention_flops < before.linear_flops and at.attention_flops >= at.linear_flops
    assert 4000 < n < 16000  # SmolLM2-135M: attention FLOPs catch up in the thousands of tokens


def test_sizes_past_the_context_are_refused_before_any_run(bundled):
    with pytest.raises(ConfigError, match="8,191"):
        run_wall(bundled, [512, 1024, 8192], progress=lambda *_: pytest.fail("nothing may run"))
