import streamlit as st
st.title('attention')
