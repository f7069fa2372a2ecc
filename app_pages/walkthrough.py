import streamlit as st
st.title("Guided lessons")
