"""How rigllm reaches the Hub: the endpoint, the token, a proxy, and the Hub's failures as one-line errors.

Everything goes through `huggingface_hub` (no HTTP of our own). The endpoint is read when a call is made,
not at import (HF_ENDPOINT, which the tests point at a loopback server); the token is the given one, else
huggingface_hub's own (HF_TOKEN, then `hf auth login`'s file), which gated repositories need. A proxy is
honoured the way httpx honours one, from HTTPS_PROXY / HTTP_PROXY; `use_proxy` sets those for the process
(the app's proxy setting) and drops huggingface_hub's shared client so the next call builds a new one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx2
from huggingface_hub import constants
from huggingface_hub.hf_api import HfApi
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.utils import close_session, get_session, get_token

from engine.errors import RigllmError

OFFLINE_NOTE = "models already in the library still open and load"
PROBE_TIMEOUT_S = 10.0


class HubUnreachable(RigllmError):
    """The Hub could not be reached at all (no network, offline mode, a proxy that refuses)."""


@dataclass(frozen=True)
class HubAccess:
    endpoint: str | None = None  # None: HF_ENDPOINT, else huggingface_hub's default
    token: str | None = None  # None: huggingface_hub's own (HF_TOKEN, then the login file)

    @property
    def url(self) -> str:
        return (self.endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")

    @property
    def bearer(self) -> str | None:
        return self.token or get_token()

    def api(self) -> HfApi:
        return HfApi(endpoint=self.url, token=self.bearer)


def check_reachable(access: HubAccess) -> None:
    """Fail fast with HubUnreachable when nothing answers at the endpoint: the Hub's search (paginated) retries
    connection errors with back-off for about 23 s before it gives up, too long for "the Hub is unreachable".
    One HEAD of the endpoint through huggingface_hub's own client; any HTTP answer counts as reachable."""
    with hub_errors(access):
        get_session().head(access.url, timeout=PROBE_TIMEOUT_S)


def use_proxy(url: str) -> None:
    """Send the Hub's traffic through `url` (http://host:port); "" keeps the environment's own setting."""
    if url:
        os.environ["HTTPS_PROXY"] = os.environ["HTTP_PROXY"] = url
    close_session()


@contextmanager
def hub_errors(access: HubAccess, repo: str | None = None, filename: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's and httpx's exceptions into one RigllmError line a user can act on."""
    what = repo or "the Hub"
    try:
        yield
    except GatedRepoError:
        raise RigllmError(f"{repo} is gated: accept its terms on the Hub's page, then set HF_TOKEN "
                          "(or run `hf auth login`) with a token of that account") from None
    except RepositoryNotFoundError:
        raise RigllmError(f"no repository {repo} on the Hub (a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise RigllmError(f"{what}: no such revision") from None
    except EntryNotFoundError:
        raise RigllmError(f"{what} has no file {filename}") from None
    except OfflineModeIsEnabled:
        raise HubUnreachable(f"offline mode is on (HF_HUB_OFFLINE): the Hub is not asked; {OFFLINE_NOTE}") from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        raise RigllmError(f"{what}: the Hub answered {status}: {str(err).splitlines()[0]}") from None
    except (httpx2.TransportError, ConnectionError) as err:
        raise HubUnreachable(f"the Hugging Face Hub is unreachable at {access.url} "
                             f"({type(err).__name__}: {err}); {OFFLINE_NOTE}") from None
