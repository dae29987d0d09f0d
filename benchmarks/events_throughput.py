"""How many KV-cache events per second the ZeroMQ publisher sustains, and what publishing
costs the engine thread per step.

    python benchmarks/events_throughput.py [--batches 20000] [--events-per-batch 16]
                                           [--form map|array] [--steps 5000]

Reports, on 127.0.0.1:
  1. encode only: events/s of the wire encoder alone (one thread);
  2. sustained: events/s from the first publish() until the sender thread has put the last
     batch on the PUB socket, without a subscriber and with one (in a separate process,
     which also reports how many batches it received);
  3. engine-side cost: publish() latency per step (median / p99 / max) at a steady step
     rate, without a subscriber, with a live one, and with a stalled one (connected, never
     reading).

A workload event is a BlockStored of one or two 16-token blocks (3 in 4) or a BlockRemoved
of one block (1 in 4), as a busy engine emits them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import time
from typing import Any

from pagedkv.events import MEDIUM_GPU, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.events.config import KVEventsConfig, WireForm
from pagedkv.events.publisher import ZmqEventPublisher
from pagedkv.events.wire import BatchEncoder

BLOCK_SIZE = 16
LOCAL = "tcp://127.0.0.1:*"


def make_batches(num_batches: int, events_per_batch: int, seed: int = 0) -> list[list[Any]]:
    rng = random.Random(seed)
    batches: list[list[Any]] = []
    for _ in range(num_batches):
        events: list[KVCacheEvent] = []
        for _ in range(events_per_batch):
            if rng.random() < 0.75:
                num_blocks = rng.randint(1, 2)
                events.append(
                    BlockStored(
                        [rng.randbytes(32) for _ in range(num_blocks)],
                        rng.randbytes(32),
                        [rng.randrange(150_000) for _ in range(num_blocks * BLOCK_SIZE)],
                        BLOCK_SIZE,
                        None,
                        MEDIUM_GPU,
                        None,
                        [None] * num_blocks,
                        0,
                        "full_attention",
                    )
                )
            else:
                events.append(BlockRemoved([rng.randbytes(32)], MEDIUM_GPU, 0))
        batches.append(events)
    return batches


def bench_encode(batches: list[list[Any]], form: WireForm) -> float:
    encoder = BatchEncoder(form)
    start = time.perf_counter()
    for events in batches:
        encoder.encode(events, timestamp_s=1.0, data_parallel_rank=0)
    elapsed_s = time.perf_counter() - start
    return sum(len(b) for b in batches) / elapsed_s


def _count_messages(endpoint: str, expected: int, ready: Any, result: Any) -> None:
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    ready.set()
    if expected == 0:  # a stalled subscriber: connected, never reads, until terminated
        time.sleep(120)
    received = 0
    while received < expected and sub.poll(2000):
        sub.recv_multipart()
        received += 1
    result.value = received
    sub.close(linger=0)
    context.term()


def _start_subscriber(endpoint: str, expected: int) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    ready, result = ctx.Event(), ctx.Value("q", -1)
    process = ctx.Process(target=_count_messages, args=(endpoint, expected, ready, result))
    process.start()
    ready.wait(10)
    time.sleep(0.5)  # let the subscription reach the publisher
    return process, result


def bench_sustained(batches: list[list[Any]], form: WireForm, with_subscriber: bool) -> str:
    config = KVEventsConfig(
        endpoint=LOCAL, wire_form=form, max_queue_size=len(batches) + 1, hwm=len(batches) + 1
    )
    with ZmqEventPublisher(config) as publisher:
        process = result = None
        if with_subscriber:
            process, result = _start_subscriber(publisher.last_endpoint, len(batches))
        start = time.perf_counter()
        for events in batches:
            publisher.publish(events)
        while publisher.stats.num_sent_batches < len(batches):
            time.sleep(0.0005)
        elapsed_s = time.perf_counter() - start
        num_events = sum(len(b) for b in batches)
        rate = f"{num_events / elapsed_s:12,.0f} events/s"
        line = f"{rate}  ({len(batches) / elapsed_s:9,.0f} batches/s)"
        if process is not None:
            process.join(15)
            line += f"  subscriber received {result.value}/{len(batches)} batches"
        return line


def bench_step_cost(
    batches: list[list[Any]], form: WireForm, mode: str, step_interval_s: float
) -> str:
    config = KVEventsConfig(endpoint=LOCAL, wire_form=form, hwm=1000)
    with ZmqEventPublisher(config) as publisher:
        process = None
        if mode != "none":
            # "stalled": connected but never reading, so its PUB pipe fills up to the HWM.
            process, _ = _start_subscriber(publisher.last_endpoint, 10**9 if mode == "live" else 0)
        costs_s = []
        next_step = time.perf_counter()
        for events in batches:
            next_step += step_interval_s
            start = time.perf_counter()
            publisher.publish(events)
            costs_s.append(time.perf_counter() - start)
            while time.perf_counter() < next_step:
                pass
        if process is not None:
            process.terminate()
            process.join(5)
    costs_s.sort()
    median_us = statistics.median(costs_s) * 1e6
    p99_us = costs_s[int(len(costs_s) * 0.99)] * 1e6
    return f"median {median_us:6.1f} us   p99 {p99_us:6.1f} us   max {costs_s[-1] * 1e6:8.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--events-per-batch", type=int, default=16)
    parser.add_argument("--form", choices=["map", "array"], default="map")
    parser.add_argument("--steps", type=int, default=5_000, help="steps for the cost test")
    parser.add_argument("--step-interval-ms", type=float, default=0.5)
    args = parser.parse_args()
    form: WireForm = args.form

    batches = make_batches(args.batches, args.events_per_batch)
    print(f"workload: {args.batches} batches x {args.events_per_batch} events, form {form}")
    print(f"encode only              {bench_encode(batches, form):12,.0f} events/s")
    print(f"sustained, no subscriber {bench_sustained(batches, form, False)}")
    print(f"sustained, subscriber    {bench_sustained(batches, form, True)}")
    steps = batches[: args.steps]
    interval_s = args.step_interval_ms / 1000
    every = f"one every {args.step_interval_ms} ms"
    print(f"engine-side publish() per step ({len(steps)} steps, {every}):")
    for mode in ("none", "live", "stalled"):
        print(f"  subscriber {mode:8s} {bench_step_cost(steps, form, mode, interval_s)}")


if __name__ == "__main__":
    main()
