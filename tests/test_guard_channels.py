"""coursekit.guard.poll_in_slices: the grader's kernel-channel waits survive a wait that misses its wake-up
(nbclient issue #312: after an ipywidgets cell, one long get_msg can sleep through the reply until its timeout)."""

from __future__ import annotations

import asyncio
import time
from queue import Empty

from coursekit import guard


class MissesItsWakeup:
    """A channel whose ``get_msg`` sees only a message that is already there when it is called; one that arrives
    during the wait goes unnoticed until the wait times out (the reported bug: one wait of the whole limit, as
    nbclient makes, returns nothing)."""

    def __init__(self, arrives_after: float):
        self.t0, self.arrives_after, self.calls = time.monotonic(), arrives_after, 0

    async def get_msg(self, timeout=None):
        self.calls += 1
        if time.monotonic() - self.t0 >= self.arrives_after:
            return {"msg_type": "execute_reply"}
        await asyncio.sleep(timeout if timeout is not None else 3600)
        raise Empty


def test_sliced_waits_find_the_reply_soon_after_it_arrives():
    ch = MissesItsWakeup(arrives_after=0.2)
    t0 = time.monotonic()
    msg = asyncio.run(guard.poll_in_slices(ch.get_msg, slice_s=0.05)(timeout=30.0))
    assert msg["msg_type"] == "execute_reply" and time.monotonic() - t0 < 1.0 and ch.calls >= 3


def test_sliced_waits_still_time_out_at_the_limit_and_wait_forever_without_one():
    ch = MissesItsWakeup(arrives_after=3600)
    t0 = time.monotonic()
    try:
        asyncio.run(guard.poll_in_slices(ch.get_msg, slice_s=0.05)(timeout=0.3))
        raise AssertionError("no message came, yet the wait returned one")
    except Empty:
        assert 0.3 <= time.monotonic() - t0 < 1.0
    late = MissesItsWakeup(arrives_after=0.3)
    assert asyncio.run(guard.poll_in_slices(late.get_msg, slice_s=0.05)(timeout=None))["msg_type"] == "execute_reply"


def test_the_graders_kernel_client_waits_in_slices_caps_messages_and_opens_no_stdin():
    import zmq

    class Channel:
        async def get_msg(self, timeout=None):
            raise Empty

    class Context:
        opts: dict = {}

        def setsockopt(self, opt, value):
            self.opts[opt] = value

    class Client:
        shell_channel, iopub_channel, context = Channel(), Channel(), Context()
        started: dict = {}

        def start_channels(self, **kw):
            self.started.update(kw)

        async def wait_for_ready(self, timeout=None):
            return None

    class Manager:
        def client(self):
            return Client()

    ex = guard.GuardedExecute(message_bytes=1234)
    ex.km = Manager()
    kc = asyncio.run(ex.async_start_new_kernel_client())
    for ch in (kc.shell_channel, kc.iopub_channel):
        assert ch.get_msg.__qualname__.startswith("poll_in_slices")
    assert kc.started == {"stdin": False, "hb": False} and kc.context.opts == {zmq.MAXMSGSIZE: 1234}
