"""``input_image`` parts in realtime conversation items (a model with vision: the fake engine's Qwen3-Omni
processor): the image reaches the prompt beside the text, and a bad one is an error naming it."""

from __future__ import annotations

import asyncio
import base64
import io

from PIL import Image

from tests.entrypoints.conftest import TEST_LIMITS, LiveServer
from tests.entrypoints.test_realtime import open_session, send, until
from tests.entrypoints.test_realtime_ga import MANUAL


def data_url(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def image_item(*parts: dict) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": list(parts)}}


def test_an_image_item_reaches_the_prompt_with_its_text(server: LiveServer, processor) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], **MANUAL) as ws:
            await send(ws, image_item({"type": "input_text", "text": "What colour is this?"},
                                      {"type": "input_image", "image_url": data_url(64, 48)}))
            added, _ = await until(ws, "conversation.item.added")
            assert [p["type"] for p in added["item"]["content"]] == ["input_image", "input_text"]
            await send(ws, {"type": "response.create"})
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    (image,) = processor.seen_images[-1:]
    assert image.size == (64, 48) and image.getpixel((0, 0)) == (200, 30, 30)
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert "<|vision_start|>" in rendered and rendered.index("<|vision_start|>") < rendered.index("What colour")


def test_bad_images_are_errors_and_the_session_goes_on(server: LiveServer) -> None:
    side = int(TEST_LIMITS.max_image_pixels ** 0.5) + 1
    bad = [({"type": "input_image", "image_url": "https://example.com/cat.png"}, "invalid_value"),
           ({"type": "input_image", "image_url": "data:image/png;base64,@@@@"}, "invalid_base64"),
           ({"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(b"nope").decode()},
            "invalid_image"),
           ({"type": "input_image", "image_url": data_url(side, side)}, "image_too_large")]

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], **MANUAL) as ws:
            for part, code in bad:
                await send(ws, image_item(part))
                error, _ = await until(ws, "error")
                assert error["error"]["code"] == code and error["error"]["param"] == "item.content", error
            await send(ws, image_item(*[{"type": "input_image", "image_url": data_url(8, 8)}] * 5))
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "too_many_media_items"  # the test server's --max-media-items is 4
            await send(ws, {"type": "conversation.item.create", "item": {"type": "message", "role": "assistant",
                            "content": [{"type": "input_image", "image_url": data_url(8, 8)}]}})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "invalid_value"  # only a user's message holds images
            await send(ws, image_item({"type": "input_image", "image_url": data_url(8, 8)}))
            added, _ = await until(ws, "conversation.item.added")
            assert added["item"]["content"] == [{"type": "input_image", "detail": "auto"}]
    asyncio.run(scenario())
