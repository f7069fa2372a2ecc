"""Streamlit helpers shared by the pages: sidebar, model cache, progress, errors, downloads."""
