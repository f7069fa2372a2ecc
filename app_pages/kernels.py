import streamlit as st
st.title('kernels')
