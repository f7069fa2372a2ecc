"""The exceptions a user of prefillviz can see.

Every failure the app or the command line reports to a person is a ``PrefillVizError``
whose message says what went wrong and what to do about it. Code that catches errors to
show them (the Streamlit pages, the CLI) catches this one type.
"""


class PrefillVizError(Exception):
    """Base class: a problem the user can understand and act on."""


class ModelLoadError(PrefillVizError):
    """The model could not be loaded (unknown id, no network, not a causal LM, unsupported architecture)."""


class ConfigError(PrefillVizError):
    """An engine setting is impossible (block_size <= 0, token_budget <= 0, ...)."""


class RequestError(PrefillVizError):
    """A request can't be served (empty prompt, longer than the context or the KV capacity)."""
