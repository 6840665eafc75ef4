"""Caps the request body before FastAPI reads it all into memory.

Uvicorn reads bodies of any size; the per-field limits only apply after the
whole JSON is parsed. A declared Content-Length over the cap is refused with a
413 at once; a chunked body is counted as it arrives and cut off at the cap.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.entrypoints.openai.common.errors import BodyTooLarge


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI wraps this in its own 400; the error handler unwraps it into a 413.
                    raise BodyTooLarge(self.max_bytes)
            return message

        return counted

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await BodyTooLarge(self.max_bytes).response()(scope, receive, send)
