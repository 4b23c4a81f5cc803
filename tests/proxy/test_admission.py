"""ModelAdmission on its own: gates, FIFO hand-off, timeouts, health, Retry-After."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import pytest

from mtpstack.proxy.admission import ModelAdmission, Rejected, Upstream


def admission(gates=(1,), max_waiting=8, timeout=5.0) -> ModelAdmission:
    ups = [Upstream(name=f"w{i}", model="m", url="http://x", gate=g, order=i, healthy=True) for i, g in enumerate(gates)]
    return ModelAdmission(model="m", upstreams=ups, max_waiting=max_waiting, timeout_seconds=timeout)


async def test_waiters_get_slots_in_arrival_order():
    a = admission(gates=(1,), max_waiting=10)
    held = await a.acquire()
    order: list[int] = []

    async def client(i: int):
        u = await a.acquire()
        order.append(i)
        await asyncio.sleep(0)
        a.release(u)

    tasks = [asyncio.create_task(client(i)) for i in range(10)]
    await asyncio.sleep(0)
    assert a.waiting == 10
    a.release(held)
    await asyncio.gather(*tasks)
    assert order == list(range(10))


async def test_a_newcomer_does_not_overtake_a_waiter_even_when_a_slot_is_free():
    a = admission(gates=(1,))
    held = await a.acquire()
    first = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    a.release(held)  # the slot goes to `first` at once, not to whoever asks next
    second = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    assert first.done() and not second.done()
    a.release(await first)
    a.release(await second)


async def test_least_loaded_worker_is_chosen():
    a = admission(gates=(2, 2))
    u1, u2 = await a.acquire(), await a.acquire()
    assert {u1.name, u2.name} == {"w0", "w1"}


async def test_least_loaded_counts_share_of_the_gate():
    a = admission(gates=(1, 4))
    picks = [(await a.acquire()).name for _ in range(5)]
    assert sorted(picks) == ["w0", "w1", "w1", "w1", "w1"]
    assert [u.inflight for u in a.upstreams] == [1, 4]


async def test_queue_full_is_rejected_with_429_and_retry_after():
    a = admission(gates=(1,), max_waiting=1)
    await a.acquire()
    waiter = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    with pytest.raises(Rejected) as e:
        await a.acquire()
    assert (e.value.status, e.value.code) == (HTTPStatus.TOO_MANY_REQUESTS, "queue_full")
    assert e.value.retry_after >= 1
    waiter.cancel()


async def test_queue_timeout_is_rejected_and_leaves_the_queue():
    a = admission(gates=(1,), timeout=0.05)
    await a.acquire()
    with pytest.raises(Rejected) as e:
        await a.acquire()
    assert e.value.code == "queue_timeout" and e.value.status == HTTPStatus.TOO_MANY_REQUESTS
    assert a.waiting == 0


async def test_retry_after_follows_observed_service_time():
    a = admission(gates=(2,))
    u = await a.acquire()
    a.release(u, service_seconds=3.0)
    # nobody waiting: one request ahead at most -> 3 s spread over 2 slots
    assert a.retry_after() == 2
    held = [await a.acquire(), await a.acquire()]
    waiters = [asyncio.create_task(a.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    assert a.retry_after() == 6  # 3 s * (3 waiting + 1) / 2 slots
    for t in waiters:
        t.cancel()
    for h in held:
        a.release(h)


async def test_cancelled_waiter_passes_a_just_granted_slot_on():
    a = admission(gates=(1,))
    held = await a.acquire()
    first = asyncio.create_task(a.acquire())
    second = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    a.release(held)  # granted to `first` ...
    first.cancel()  # ... which is cancelled before it runs
    got = await second
    assert got.inflight == 1
    a.release(got)
    assert a.upstreams[0].inflight == 0


async def test_no_healthy_worker_is_503_and_fails_waiters_at_once():
    a = admission(gates=(1,))
    u = await a.acquire()
    waiter = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    a.set_healthy(u, False, "gone")
    with pytest.raises(Rejected) as e:
        await waiter
    assert (e.value.status, e.value.code) == (HTTPStatus.SERVICE_UNAVAILABLE, "no_healthy_worker")
    with pytest.raises(Rejected):
        await a.acquire()


async def test_recovered_worker_serves_the_queue():
    a = admission(gates=(1, 1))
    w0, w1 = a.upstreams
    a.set_healthy(w1, False, "down")
    held = await a.acquire()
    assert held is w0
    waiter = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    a.set_healthy(w1, True, "ok")
    assert await waiter is w1


# -- a preferred worker (cache-aware routing) -----------------------------------------------
async def test_a_preferred_worker_with_a_free_slot_gets_the_request_over_a_less_loaded_one():
    a = admission(gates=(2, 2))
    w0, w1 = a.upstreams
    assert await a.acquire(prefer=w1) is w1
    assert await a.acquire(prefer=w1) is w1  # w0 is idle, but w1 still has a slot
    assert (w0.inflight, w1.inflight) == (0, 2)


async def test_a_full_preferred_worker_sends_the_request_to_a_free_one_at_once():
    a = admission(gates=(1, 1))
    w0, w1 = a.upstreams
    await a.acquire(prefer=w1)
    got = await asyncio.wait_for(a.acquire(prefer=w1), 1)
    assert got is w0 and a.waiting == 0


async def test_an_unhealthy_preferred_worker_is_passed_over():
    a = admission(gates=(1, 1))
    w0, w1 = a.upstreams
    a.set_healthy(w1, False, "down")
    assert await a.acquire(prefer=w1) is w0


async def test_a_preference_waits_only_when_every_worker_is_full_and_keeps_the_line_in_order():
    a = admission(gates=(1, 1))
    w0, w1 = a.upstreams
    h0, h1 = await a.acquire(), await a.acquire()
    first = asyncio.create_task(a.acquire(prefer=w1))
    await asyncio.sleep(0)
    second = asyncio.create_task(a.acquire(prefer=w0))
    await asyncio.sleep(0)
    assert a.waiting == 2
    a.release(h0)  # w0 frees: the oldest waiter gets it though it prefers w1, and the second does not overtake
    await asyncio.sleep(0)
    assert first.done() and await first is w0 and not second.done()
    a.release(h1)
    assert await second is w1



# -- waiting briefly for the preferred worker (`proxy.affinityWaitSeconds`) ------------------
def waiting_admission(wait: float, gates=(1, 1), timeout=5.0) -> ModelAdmission:
    a = admission(gates=gates, timeout=timeout)
    a.prefer_wait_seconds = wait
    return a


async def test_a_full_preferred_worker_gets_the_request_when_it_frees_within_the_wait():
    a = waiting_admission(5.0)
    w0, w1 = a.upstreams
    held = await a.acquire(prefer=w1)
    waiter = asyncio.create_task(a.acquire(prefer=w1))
    await asyncio.sleep(0.05)
    assert not waiter.done() and w0.inflight == 0  # w0 is free, but the request holds out for w1
    a.release(held)
    assert await asyncio.wait_for(waiter, 1) is w1 and w0.inflight == 0


async def test_after_the_wait_any_free_worker_will_do():
    a = waiting_admission(0.2)
    w0, w1 = a.upstreams
    await a.acquire(prefer=w1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    got = await asyncio.wait_for(a.acquire(prefer=w1), 2)
    assert got is w0 and 0.15 <= loop.time() - start < 1.5 and a.waiting == 0


async def test_one_holding_out_for_its_worker_does_not_hold_up_the_requests_behind_it():
    a = waiting_admission(5.0, gates=(1, 1))
    w0, w1 = a.upstreams
    held = await a.acquire(prefer=w1)
    holding = asyncio.create_task(a.acquire(prefer=w1))
    await asyncio.sleep(0)
    # Behind it: a request with no preference and one preferring the free worker get w0 in turn.
    plain = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    assert plain.done() and await plain is w0 and not holding.done()
    behind = asyncio.create_task(a.acquire(prefer=w1))  # also holds out for w1, behind the first
    await asyncio.sleep(0)
    a.release(held)  # w1's slot goes to the first in line for it
    assert await asyncio.wait_for(holding, 1) is w1 and not behind.done()
    a.release(w1)
    assert await asyncio.wait_for(behind, 1) is w1
    assert all(u.inflight <= u.gate for u in a.upstreams)


async def test_a_queue_full_of_requests_holding_out_does_not_refuse_a_newcomer_a_free_worker():
    a = waiting_admission(5.0)
    a.max_waiting = 2
    w0, w1 = a.upstreams
    await a.acquire(prefer=w1)
    holding = [asyncio.create_task(a.acquire(prefer=w1)) for _ in range(2)]
    await asyncio.sleep(0)
    assert a.waiting == 2  # the queue is full, of requests that want only w1
    assert await asyncio.wait_for(a.acquire(), 0.1) is w0
    for t in holding:
        t.cancel()


async def test_no_wait_when_the_preferred_worker_is_free_unhealthy_or_waiting_is_off():
    a = waiting_admission(5.0)
    w0, w1 = a.upstreams
    assert await a.acquire(prefer=w1) is w1  # free: at once
    a.set_healthy(w1, False, "down")
    assert await asyncio.wait_for(a.acquire(prefer=w1), 0.1) is w0  # unhealthy: at once elsewhere
    off = waiting_admission(0.0)
    v0, v1 = off.upstreams
    await off.acquire(prefer=v1)
    assert await asyncio.wait_for(off.acquire(prefer=v1), 0.1) is v0


async def test_a_cancelled_request_holding_out_leaves_the_line_and_a_long_wait_never_ends_in_a_429():
    a = waiting_admission(5.0, timeout=0.2)
    w0, w1 = a.upstreams
    await a.acquire(prefer=w1)
    gone = asyncio.create_task(a.acquire(prefer=w1))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert a.waiting == 0 and w0.inflight == 0
    # A wait as long as the queue's timeout is cut to half of it: never a 429 while w0 is free.
    assert await asyncio.wait_for(a.acquire(prefer=w1), 1) is w0 and a.waiting == 0


async def test_a_request_with_n_choices_takes_n_slots_on_one_worker_and_waits_its_turn():
    a = admission(gates=(2, 3))
    one = await a.acquire()  # w0 (least loaded by share): 1 of 2
    two = await a.acquire(weight=2)  # only w1 has 2 free
    assert (one.name, two.name) == ("w0", "w1") and [u.inflight for u in a.upstreams] == [1, 2]
    three = asyncio.create_task(a.acquire(weight=3))  # no worker has 3 free: it waits
    later = asyncio.create_task(a.acquire())  # a slot is free on w0, but first come, first served
    await asyncio.sleep(0)
    assert not three.done() and not later.done() and a.waiting == 2
    a.release(two, weight=2)  # w1 is empty: the 3-choice request gets it, then the next one its w0 slot
    await asyncio.sleep(0)
    assert (await three).name == "w1" and (await later).name == "w0"
    assert [u.inflight for u in a.upstreams] == [2, 3]
    assert all(u.inflight <= u.gate for u in a.upstreams)


async def test_a_cancelled_weighted_waiter_gives_back_every_slot_it_was_granted():
    a = admission(gates=(2,))
    held = await a.acquire(weight=2)
    waiter = asyncio.create_task(a.acquire(weight=2))
    await asyncio.sleep(0)
    a.release(held, weight=2)  # granted in this turn of the loop...
    waiter.cancel()  # ...and cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert a.upstreams[0].inflight == 0
