"""Hosted mode: the settings for a public demo that strangers use at once.

On by itself where the environment says it runs on a Hugging Face Space (Spaces set
``SPACE_ID``); ``PREFILLVIZ_HOSTED`` overrides that either way (``1`` turns it on anywhere, ``0``
turns it off, e.g. on a private Space). Then:

* only allow-listed model ids load (no local paths, no other hub downloads);
* prompts, requests per workload, new tokens and sweep sizes have upper limits (the engine
  applies its two through ``EngineConfig``, which the app's engine builders fill from
  ``engine_limits``);
* the server probe ("Your server") reaches only the URLs whoever runs the demo lists in
  ``PREFILLVIZ_PROBE_URLS`` (comma-separated), and is off when that is empty: a public page
  that fetches any URL it is given would let strangers reach the host's private network;
* device and dtype are fixed (``auto``): the model is shared by every session, and one
  visitor's switch would reload it for everyone;
* loading a saved run bundle is off: Streamlit's uploader fails its XSRF check inside the
  Space's iframe (the browser drops the cookie), and the XSRF check stays on.

Off (the default), a user on their own machine may load any causal LM by id or folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from prefillviz.engine.errors import ConfigError, ModelLoadError, ProbeError
from prefillviz.loading.model_registry import BUNDLED_HUB_ID, BUNDLED_MODEL_ID

HOSTED_ENV = "PREFILLVIZ_HOSTED"
PROBE_URLS_ENV = "PREFILLVIZ_PROBE_URLS"
SPACE_ENV = "SPACE_ID"  # set by Hugging Face Spaces in every Space's environment
_ON, _OFF = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


@dataclass(frozen=True)
class HostedPolicy:
    enabled: bool
    why: str = ""  # what turned it on or off, for the sidebar
    allowed_model_ids: tuple[str, ...] = (BUNDLED_MODEL_ID, BUNDLED_HUB_ID)
    max_prompt_tokens: int = 2048
    max_requests_per_workload: int = 8
    max_new_tokens: int = 64
    max_sweep_points: int = 8
    allowed_probe_urls: tuple[str, ...] = ()
    max_probe_requests: int = 60
    max_probe_prompt_tokens: int = 40_000
    device: str = "auto"  # fixed in hosted mode: the sidebar shows it and offers no other
    dtype: str = "auto"

    def check_model(self, model_id: str) -> None:
        """Raise ``ModelLoadError`` if hosted mode may not load ``model_id``."""
        if not self.enabled or model_id in self.allowed_model_ids:
            return
        looks_like_path = (
            model_id.startswith(("/", ".", "~")) or "\\" in model_id or ".." in model_id or os.path.exists(model_id)
        )
        kind = "Local paths are" if looks_like_path else f"{model_id!r} is"
        raise ModelLoadError(
            f"{kind} not available in this hosted demo; it serves only {', '.join(self.allowed_model_ids)}. "
            "Run prefillviz on your own machine to load other models."
        )

    def check_probe_url(self, url: str) -> None:
        """Raise ``ConfigError`` if hosted mode may not probe ``url`` (only the allow-listed URLs)."""
        if not self.enabled:
            return
        if not self.allowed_probe_urls:
            raise ConfigError(
                "Probing a server is off in this hosted demo "
                "(a public page that fetches any URL is a request-forgery hole). "
                f"Whoever runs the demo can allow URLs in {PROBE_URLS_ENV}; or run prefillviz on your own machine."
            )
        if normalized_url(url) not in {normalized_url(u) for u in self.allowed_probe_urls}:
            raise ConfigError(
                f"This hosted demo probes only {', '.join(self.allowed_probe_urls)}; {url!r} is not one of them."
            )

    def engine_limits(self) -> dict[str, int]:
        """The ``EngineConfig`` fields that bound each request: ``EngineConfig(..., **policy.engine_limits())``."""
        limits = {"max_prompt_tokens": self.max_prompt_tokens, "max_new_tokens": self.max_new_tokens}
        return limits if self.enabled else {}

    def limit(self, name: str, value: int) -> int:
        """``value`` capped by the hosted limit ``max_<name>`` (unchanged when hosting is off)."""
        return min(value, getattr(self, f"max_{name}")) if self.enabled else value


def hosted_policy() -> HostedPolicy:
    """The policy in force now (read from the environment on each call). A ``PREFILLVIZ_HOSTED``
    that is neither on nor off counts as on: a typo must not leave a public demo open."""
    urls = tuple(u.strip() for u in os.environ.get(PROBE_URLS_ENV, "").split(",") if u.strip())
    setting = os.environ.get(HOSTED_ENV, "").strip().lower()
    space = os.environ.get(SPACE_ENV, "").strip()
    if setting in _ON:
        enabled, why = True, f"{HOSTED_ENV}={setting}"
    elif setting in _OFF:
        override = f" overrides the Space ({SPACE_ENV}={space})" if space else ""
        enabled, why = False, f"{HOSTED_ENV}={setting}" + override
    elif setting:
        enabled, why = True, f"{HOSTED_ENV}={setting!r} is neither on nor off (0, false, no, off), so it counts as on"
    elif space:
        enabled, why = True, f"running on the Hugging Face Space {space} ({SPACE_ENV} is set)"
    else:
        enabled, why = False, f"neither {HOSTED_ENV} nor {SPACE_ENV} is set"
    return HostedPolicy(enabled=enabled, why=why, allowed_probe_urls=urls)


def normalized_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing ``/v1`` or slash; raises on anything else."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProbeError(
            f"{url!r} is not a server URL: give one like http://127.0.0.1:8000 (http or https, with a host)."
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"
