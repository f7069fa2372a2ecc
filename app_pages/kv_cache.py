import streamlit as st
st.title('kv_cache')
