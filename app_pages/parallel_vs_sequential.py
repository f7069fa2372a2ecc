import streamlit as st
st.title('parallel_vs_sequential')
