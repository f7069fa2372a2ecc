"""Pure figure builders: data from a Trace in, ``plotly.graph_objects.Figure`` out (no Streamlit)."""
