"""The socket ``loomflow ui`` listens on: what it accepts sends each write at once."""

from __future__ import annotations

import asyncio
import socket

from loomflow.cli import ui


async def test_an_accepted_connection_sends_without_waiting_for_an_ack() -> None:
    # headers and body are two writes: with Nagle's algorithm on, a kept-alive
    # connection's body waited for the browser's delayed ACK (~40 ms an answer)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    listening = ui._bound("127.0.0.1", 0)
    server = await asyncio.start_server(answer, sock=listening)
    async with server:
        _, writer = await asyncio.open_connection(*listening.getsockname())
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
