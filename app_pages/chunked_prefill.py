import streamlit as st
st.title('chunked_prefill')
