"""Routing through the HTTP router: agreement between replicas, affinity, spill under load."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.testing import wait_for_async
from router_support import completion, fake_engines, metric_value, running_router

GROUPS = [f"Group {g}: " + f"shared document number {g} with many words. " * 6 for g in range(12)]


def request(group: int, i: int) -> dict:
    return completion(GROUPS[group] + f"question {i}?")


@pytest.mark.parametrize("policy", ["prefix-affinity", "two-choice"])
async def test_two_router_replicas_send_each_prefix_to_the_same_engine(policy: str) -> None:
    async with fake_engines(3) as engines:
        urls = [u for _, u in engines]
        async with (
            running_router(urls, policy=make_policy(policy)) as a,
            running_router(list(reversed(urls)), policy=make_policy(policy)) as b,
        ):
            chosen: dict[int, set[str]] = {}
            for i in range(3):
                for group in range(len(GROUPS)):
                    answers = [
                        (await router.client.post("/v1/completions", json=request(group, i))).json()
                        for router in (a, b)
                    ]
                    assert answers[0]["backend"] == answers[1]["backend"], (group, i)
                    chosen.setdefault(group, set()).add(answers[0]["backend"])
        # Affinity: every group stays on one engine, and the groups are spread (12 groups all
        # on one of 3 engines has probability 3 / 3**12 with random ports).
        assert all(len(backends) == 1 for backends in chosen.values())
        assert len(set().union(*chosen.values())) >= 2


async def test_a_queue_on_the_preferred_engine_spills_its_prefix() -> None:
    async with fake_engines(3) as engines:
        by_name = {e.name: e for e, _ in engines}
        async with running_router(
            [u for _, u in engines], policy=make_policy("prefix-affinity")
        ) as r:
            home = (await r.client.post("/v1/completions", json=request(0, 0))).json()["backend"]
            by_name[home].waiting = 40  # scraped as vllm:num_requests_waiting
            home_url = next(u for e, u in engines if e.name == home)
            await wait_for_async(
                lambda: r.router.pool.state(home_url).waiting == 40,
                what="40 waiting scraped from the home engine",
            )
            moved = {
                (await r.client.post("/v1/completions", json=request(0, i))).json()["backend"]
                for i in range(1, 6)
            }
            assert home not in moved and len(moved) == 1  # spilled, and consistently so
            text = (await r.client.get("/metrics")).text
            spilled = metric_value(
                text,
                "prefixserving_router_decisions_total",
                policy="prefix_affinity",
                decision="spilled",
            )
            assert spilled == 5
            by_name[home].waiting = 0
            await wait_for_async(
                lambda: r.router.pool.state(home_url).waiting == 0,
                what="0 waiting scraped from the home engine",
            )
            back = (await r.client.post("/v1/completions", json=request(0, 9))).json()["backend"]
            assert back == home


async def test_concurrent_requests_for_one_prefix_stay_within_the_load_bound() -> None:
    # No absolute slack, so that the relative bound alone decides on these small counts.
    policy = make_policy("prefix-affinity", load_slack=0.0)
    async with (
        fake_engines(2, first_delay_s=1.0) as engines,
        running_router([u for _, u in engines], policy=policy) as r,
    ):
        answers = await asyncio.gather(
            *(r.client.post("/v1/completions", json=request(1, i)) for i in range(8))
        )
        per_backend = Counter(a.json()["backend"] for a in answers)
        # Bounded load (1.25 x mean): the preferred engine takes at most ceil(1.25*8/2) = 5.
        assert sorted(per_backend.values()) in ([3, 5], [4, 4])
        text = (await r.client.get("/metrics")).text
        name = "prefixserving_router_decisions_total"
        spilled = metric_value(text, name, policy="prefix_affinity", decision="spilled")
        assert spilled == min(per_backend.values())


async def test_both_router_replicas_see_the_engines_running_requests() -> None:
    """Requests another router sent show up in the engine's ``vllm:num_requests_running``;
    both routers scrape it, count it in the load and move the prefix off the busy engine to
    the same next engine, though neither has a request in flight there itself."""
    async with fake_engines(3) as engines:
        urls = [u for _, u in engines]
        by_name = {e.name: e for e, _ in engines}
        async with (
            running_router(urls, policy=make_policy("prefix-affinity")) as a,
            running_router(list(reversed(urls)), policy=make_policy("prefix-affinity")) as b,
        ):
            home = (await a.client.post("/v1/completions", json=request(2, 0))).json()["backend"]
            assert (await b.client.post("/v1/completions", json=request(2, 0))).json()[
                "backend"
            ] == home
            by_name[home].running = 30
            home_url = next(u for e, u in engines if e.name == home)
            for r in (a, b):
                await wait_for_async(
                    lambda r=r: r.router.pool.state(home_url).running == 30,
                    what="30 running scraped from the home engine",
                )
            moved = [
                (await r.client.post("/v1/completions", json=request(2, i))).json()["backend"]
                for i in range(1, 4)
                for r in (a, b)
            ]
            assert home not in moved and len(set(moved)) == 1
