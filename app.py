"""prefillviz: one prefill of a real model, measured.

A first page until the full app arrives: pick a model, type a prompt, run one parallel
prefill on the engine, and see the first token, its distribution and the time to it.
"""

import streamlit as st

from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.errors import PrefillVizError
from prefillviz.models import BUNDLED_MODEL_ID, RECOMMENDED_MODELS, load_model

st.set_page_config(page_title="prefillviz", layout="wide")


@st.cache_resource(show_spinner=False)
def cached_model(model_id: str, device: str, dtype: str):
    return load_model(model_id, device=device, dtype=dtype)


with st.sidebar:
    st.header("Model")
    choices = [spec.model_id for spec in RECOMMENDED_MODELS]
    model_id = st.selectbox("Model", choices, index=0, key="model_id",
                            format_func=lambda m: f"{m}  ({next(s.needs for s in RECOMMENDED_MODELS if s.model_id == m)})")
    custom = st.text_input("…or another Hugging Face id or local folder", key="custom_model").strip()
    device = st.selectbox("Device", ["auto", "cpu", "cuda", "mps"], key="device")
    dtype = st.selectbox("dtype", ["auto", "float32", "bfloat16", "float16"], key="dtype")

st.title("Prefill: the whole prompt in one pass")
prompt = st.text_area("Prompt", "The capital of France is", key="prompt")

if st.button("Run prefill", type="primary", key="run"):
    try:
        with st.spinner("Loading the model (the first load of the bundled model takes ~20 s)…"):
            loaded = cached_model(custom or model_id or BUNDLED_MODEL_ID, device, dtype)
        engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(), model_id=loaded.model_id)
        request = engine.add_request(prompt)
        trace = engine.run()
        record = trace.requests[request.request_id]
        st.session_state["result"] = {
            "model": loaded.model_id,
            "device": trace.device,
            "dtype": trace.dtype,
            "num_prompt_tokens": record.num_prompt_tokens,
            "first_token": loaded.tokenizer.decode(record.output_token_ids[:1]),
            "ttft_ms": record.time_to_first_token_s * 1000,
            "num_steps": trace.num_steps,
            "top": [(loaded.tokenizer.decode([t]), p) for t, p in zip(record.first_token_top_ids, record.first_token_top_probs)],
        }
    except PrefillVizError as error:
        st.error(str(error))

result = st.session_state.get("result")
if result:
    st.caption(f"{result['model']} on {result['device']} ({result['dtype']}), timing pass, wall clock")
    cols = st.columns(3)
    cols[0].metric("First token", repr(result["first_token"]))
    cols[1].metric("Time to first token", f"{result['ttft_ms']:.1f} ms")
    cols[2].metric("Prompt tokens / steps", f"{result['num_prompt_tokens']} / {result['num_steps']}")
    st.subheader("First-token distribution (top 10)")
    st.dataframe({"token": [repr(t) for t, _ in result["top"]], "probability": [p for _, p in result["top"]]}, key="top")
