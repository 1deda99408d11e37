"""Test-wide settings: keep rigllm's per-user data (demo model cache) inside a temporary folder."""

import os
import tempfile

import pytest

import llama_sdist

# Hypothesis (schemathesis) writes its example cache into the working directory during collection,
# before any fixture runs: keep it out of the checkout.
# LiteLLM (tests/router, the client matrix) reads its bundled model-price map instead of fetching it
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", tempfile.mkdtemp(prefix="rigllm-hypothesis-"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_user_data_dir():
    """Never touch the real ~/.local/share/rigllm from tests."""
    with tempfile.TemporaryDirectory(prefix="rigllm-test-data-") as tmp:
        old = os.environ.get("RIGLLM_DATA_DIR")
        os.environ["RIGLLM_DATA_DIR"] = tmp
        yield
        if old is None:
            os.environ.pop("RIGLLM_DATA_DIR", None)
        else:
            os.environ["RIGLLM_DATA_DIR"] = old


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Only tests marked `peer` may download the llama-cpp-python sdist (set before any fixture runs)."""
    llama_sdist.downloads_allowed = item.get_closest_marker("peer") is not None
