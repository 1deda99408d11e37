"""Images through the API on the CUDA backend (run with RIGLLM_TEST_BACKEND=cuda on a GPU machine; skipped
elsewhere): a random text model with a random mmproj beside it, served as `rigllm serve` serves it. The
tower runs on the card, on the worker's thread; the replies are answered with every image's tokens
counted. Numbers are checked against the reference in tests/gpu/test_vision_backend_gpu.py; this is the
wiring: pairing, the tower on the card, the job's image rows, no 400 for the CUDA backend."""

from __future__ import annotations

import dataclasses

import pytest
from test_api_images import NO_THINK, data_url, image_part

from api_fixtures import TEST_BACKEND, live_server
from engine.backends import open_backend
from engine.gguf.loader import load_model
from engine.vision.mmproj import load_mmproj
from engine.fixtures.synthetic import write_random_model
from engine.vision.config import VisionConfig
from engine.vision.random_mmproj import write_random_mmproj

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cuda", reason="runs with RIGLLM_TEST_BACKEND=cuda on a GPU machine")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.gpu.test_cuda_backend import tiny_config

    folder = tmp_path_factory.mktemp("cuda-vlm")
    cfg = dataclasses.replace(tiny_config("gqa4-hv3-l6"), context_length=1024)
    loaded = load_model(write_random_model(folder / "model.gguf", cfg, seed=6))
    vision = VisionConfig(n_embd=32, n_ff=48, n_layers=2, n_head=2, patch_size=16, merge_size=2, image_size=64,
                          eps=1e-6, projection_dim=cfg.d_model, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    mmproj = load_mmproj(write_random_mmproj(folder / "mmproj-model.gguf", vision, seed=7))  # found beside the model
    with live_server(loaded, lambda: open_backend("cuda", loaded, context=1024, slots=2, mmproj=mmproj)) as live:
        yield live


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_image_requests_are_answered_on_the_card(server, stream):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image_part(data_url(96, 128, 1)),
                                             image_part(data_url(64, 64, 2))]}]
    args = dict(model=server.model_id, messages=messages, max_tokens=4, temperature=0, extra_body=NO_THINK)
    client = server.client()
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(**args).usage
    assert usage.prompt_tokens_details.image_tokens == 3 * 4 + 3 * 3  # 96×128 px; 64×64 px grows to the minimum 96×96
    assert usage.completion_tokens >= 1


def test_text_after_an_image_request_is_answered(server):
    client = server.client()
    client.chat.completions.create(model=server.model_id, max_tokens=2, extra_body=NO_THINK,
                                   messages=[{"role": "user", "content": [image_part(data_url(32, 32, 3))]}])
    r = client.chat.completions.create(model=server.model_id, max_tokens=2, extra_body=NO_THINK,
                                       messages=[{"role": "user", "content": "and now text"}])
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens_details.image_tokens == 0
