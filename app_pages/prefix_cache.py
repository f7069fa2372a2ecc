import streamlit as st
st.title('prefix_cache')
