"""The real-model runs behind each view: plain functions, no Streamlit, tested on their own."""
