"""The Live engine page's *Send*: a prompt into the served engine the page reads, tagged with who sent it (a class
room's "student 7", else "you"), answered in the background (``probe/send.py``) while the page keeps drawing the
engine's steps; the session's sends are listed with their answers so far.
"""

from __future__ import annotations

import streamlit as st

from prefillviz.engine.errors import ProbeError
from prefillviz.probe.send import MAX_IN_FLIGHT, MAX_PROMPT_CHARS, Sends

SENDS_STATE = "live_sends"
DEFAULT_PROMPT = "Why does a language model answer faster after it has read my question once?"


def session_sends() -> Sends:
    """This session's sends (made on its first use)."""
    if SENDS_STATE not in st.session_state:
        st.session_state[SENDS_STATE] = Sends()
    return st.session_state[SENDS_STATE]


def send_form(url: str, tag: str) -> None:
    """The prompt box and its Send button; a refusal or an unreachable server is one error line."""
    st.subheader("Send a prompt")
    st.caption(f"Your prompt goes into the engine at {url}, tagged **{tag}** (OpenAI's `user` field): the charts "
               f"below name every request by its tag and star yours. At most {MAX_IN_FLIGHT} of yours at a time.")
    prompt = st.text_area("Prompt", value=DEFAULT_PROMPT, key="live_send_prompt", max_chars=MAX_PROMPT_CHARS,
                          height=80)
    if not st.button("Send", key="live_send", type="primary"):
        return
    try:
        sent = session_sends().send(url, prompt, tag)
    except ProbeError as error:
        st.error(str(error))
        return
    if sent.error:
        st.error(sent.error)
    elif sent.done or sent.settled.is_set():
        st.success(f"Sent as **{tag}**: the server took it. Refresh (or follow live) to see it scheduled.")
    else:
        st.info("Sent; the server has not answered yet. Refresh (or follow live) to see it.")


def sends_list() -> None:
    """The session's recent sends: the answer so far, or why it stopped."""
    sends = session_sends().recent()
    if not sends:
        return
    st.markdown("**Your prompts**")
    for sent in sends:
        head = f"**{sent.user}** · “{sent.prompt[:60]}{'…' if len(sent.prompt) > 60 else ''}”"
        if sent.error:
            st.error(f"{head}: {sent.error}")
        elif sent.waiting:
            st.caption(f"{head} → waiting for its first token…")
        else:
            timing = f" (first token after {sent.first_token_s:.2f} s)" if sent.first_token_s is not None else ""
            state = "" if sent.done else " …"
            st.caption(f"{head}{timing} → {sent.text.strip()}{state}")
