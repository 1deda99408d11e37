"""Two `rigllm serve` rigs behind LiteLLM's Router, configured by packaging/router/litellm-config.yaml (issue 32).

The rigs are real `rigllm serve` processes on loopback ports (the trained fixture on the reference
backend); the router is LiteLLM's `Router` in this process, built from the recipe's `model_list` (each
rig's address put in) and `router_settings` as written. Checked: requests spread over both rigs, a
conversation's follow-up turn reaches the rig that holds its prefix (cached_tokens > 0), and once a rig
is killed every request is answered by the other. Nothing leaves loopback: LiteLLM is told to use its
bundled model-cost map instead of fetching one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # read before litellm is imported: no download at import
from litellm import Router  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "trained" / "fixture-q8_0.gguf"
RECIPE = ROOT / "packaging" / "router" / "litellm-config.yaml"
MODEL_ID = FIXTURE.stem
CONFIG = yaml.safe_load(RECIPE.read_text())
GROUP = CONFIG["model_list"][0]["model_name"]  # the name clients ask for
START_SECONDS = 60  # both rigs start in parallel; measured ~5 s here
ATTEMPT_SECONDS = 30  # one attempt on one rig (the router's timeout)
REQUEST_SECONDS = 60  # one request through the router, retries and time queued on a rig included
BURST = 16  # concurrent requests: all of them on one rig by chance has odds 2 in 2^16
CONVERSATIONS = 4

pytestmark = [pytest.mark.timeout(240),  # the module's bound: each test is ~5-15 s on an idle 2-core machine
              pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]  # pydantic, on LiteLLM's types


@dataclass
class Rig:
    name: str
    port: int
    process: subprocess.Popen

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chat_requests(self) -> float:
        """Chat completions this rig answered with 200, from its own /metrics."""
        text = httpx.get(f"{self.root}/metrics", timeout=5).text
        line = 'rigllm_requests_total{endpoint="/chat/completions",status="200"} '
        return sum(float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rig(name: str) -> Rig:
    port = free_port()
    command = [sys.executable, "-m", "engine.cli", "serve", str(FIXTURE), "--backend", "reference", "--port", str(port),
               "--context", "1024", "--no-snapshots", "--shutdown-timeout", "2"]
    return Rig(name, port, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))


def wait_serving(rig: Rig, deadline: float) -> None:
    while True:
        assert rig.process.poll() is None, f"{rig.name} exited: {rig.process.communicate(timeout=5)[1][-2000:]}"
        try:
            if httpx.get(f"{rig.root}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{rig.name} did not start serving in {START_SECONDS} s"
        time.sleep(0.1)


def stop(rig: Rig) -> None:
    if rig.process.poll() is None:
        rig.process.kill()
    rig.process.communicate(timeout=10)


@pytest.fixture(scope="module")
def rigs() -> Iterator[dict[str, Rig]]:
    started = [start_rig(name) for name in ("rig-a", "rig-b")]
    try:
        deadline = time.monotonic() + START_SECONDS
        for rig in started:
            wait_serving(rig, deadline)
        yield {rig.name: rig for rig in started}
    finally:
        for rig in started:
            stop(rig)


@pytest.fixture(scope="module")
def router(rigs: dict[str, Rig]) -> Router:
    """The recipe's router, each deployment pointed at the test rig of the same id."""
    model_list = []
    for deployment in CONFIG["model_list"]:
        rig = rigs[deployment["model_info"]["id"]]
        params = {**deployment["litellm_params"], "model": f"openai/{MODEL_ID}", "api_base": f"{rig.root}/v1",
                  "api_key": "unused-on-loopback", "timeout": ATTEMPT_SECONDS}
        model_list.append({**deployment, "litellm_params": params})
    assert sorted(d["model_info"]["id"] for d in model_list) == sorted(rigs)
    return Router(model_list=model_list, **CONFIG["router_settings"])


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for the module: the router keeps its HTTP clients between requests."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def ask(router: Router, messages: list[dict], session: str | None = None):
    metadata = {"session_id": session} if session else {}
    return await asyncio.wait_for(router.acompletion(model=GROUP, messages=messages, max_tokens=4,
                                                     temperature=0, metadata=metadata), REQUEST_SECONDS)


def served_by(response) -> str:
    return response._hidden_params["model_id"]


def opening(i: int) -> list[dict]:
    """A first turn no other conversation shares (so no rig holds a prefix of it before it is sent)."""
    return [{"role": "user", "content": f"[K{i}={1000 + 37 * i}] note {i}. ?K{i}="}]


def follow_up(first: list[dict], reply) -> list[dict]:
    return first + [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                    {"role": "user", "content": "once more ?K="}]


def test_requests_spread_over_both_rigs(rigs, router, loop):
    before = {name: rig.chat_requests() for name, rig in rigs.items()}

    async def burst():
        return await asyncio.gather(*(ask(router, opening(100 + i)) for i in range(BURST)))

    served = Counter(served_by(r) for r in loop.run_until_complete(burst()))
    assert set(served) == set(rigs), served
    for name, rig in rigs.items():  # the rigs' own metrics agree with the router
        assert rig.chat_requests() - before[name] == served[name]


def test_a_follow_up_turn_reaches_the_rig_with_its_prefix(router, loop):
    async def conversations():
        turns = []
        for i in range(CONVERSATIONS):
            first = opening(i)
            one = await ask(router, first, session=f"conversation-{i}")
            two = await ask(router, follow_up(first, one), session=f"conversation-{i}")
            turns.append((one, two))
        return turns

    for one, two in loop.run_until_complete(conversations()):
        assert one.usage.prompt_tokens_details.cached_tokens == 0
        assert served_by(two) == served_by(one)
        assert two.usage.prompt_tokens_details.cached_tokens > 0  # it prefilled only the new turn


def test_when_a_rig_drops_out_the_other_answers_everything(rigs, router, loop):
    async def pin_one_to_each():
        """Conversations pinned to each rig (new sessions until both have one)."""
        pins: dict[str, tuple[str, list[dict]]] = {}
        for i in range(20, 40):
            first = opening(i)
            reply = await ask(router, first, session=f"drop-{i}")
            pins.setdefault(served_by(reply), (f"drop-{i}", follow_up(first, reply)))
            if len(pins) == len(rigs):
                return pins
        raise AssertionError(f"20 new conversations all went to {set(pins)}")

    pins = loop.run_until_complete(pin_one_to_each())
    victim, survivor = rigs["rig-a"], rigs["rig-b"]
    stop(victim)
    session, turn = pins[victim.name]

    async def after_the_drop():
        pinned = await ask(router, turn, session=session)  # its rig is gone: retried on the survivor
        others = [await ask(router, opening(200 + i)) for i in range(6)]
        return pinned, others

    started = time.monotonic()
    pinned, others = loop.run_until_complete(after_the_drop())
    assert served_by(pinned) == survivor.name
    assert pinned.usage.prompt_tokens_details.cached_tokens == 0  # the survivor prefills the whole conversation
    assert [served_by(r) for r in others] == [survivor.name] * len(others)
    assert time.monotonic() - started < REQUEST_SECONDS
    session_b, turn_b = pins[survivor.name]  # the survivor's own conversations keep their prefix
    kept = loop.run_until_complete(ask(router, turn_b, session=session_b))
    assert served_by(kept) == survivor.name and kept.usage.prompt_tokens_details.cached_tokens > 0
