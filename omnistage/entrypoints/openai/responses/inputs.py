"""A responses request's conversation → a ``PromptPlan`` for the shared ``PromptBuilder``.

The conversation is the stored history of ``previous_response_id`` (if any) followed by the request's ``input``;
``instructions`` lead it as a system turn (a later response does not inherit them, as OpenAI specifies). Items map
onto the chat template's turns: messages keep their role (``developer`` is Qwen's ``system``), ``function_call``
items join the assistant turn before them as its ``tool_calls``, and each ``function_call_output`` is a ``tool``
turn. Media parts are fetched (``input_image``) or read inline (``input_audio``) here and checked against the
request's budget before anything is decoded; all of it once the request is admitted.
"""

from __future__ import annotations

import json

from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.common.tool_calls import ToolSetup, tool_setup
from omnistage.entrypoints.openai.media.prompt_builder import (
    MediaItem,
    PromptBuilder,
    PromptPlan,
    TemplateMessage,
    TemplateOptions,
    TemplatePart,
)
from omnistage.entrypoints.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    InputAudio,
    InputImage,
    InputItem,
    InputPart,
    InputText,
    MessageItem,
    OutputTextIn,
    RefusalIn,
    ResponsesRequest,
)

_ROLE = {"developer": "system"}  # Qwen's template knows system/user/assistant/tool


def tools_of(body: ResponsesRequest) -> ToolSetup:
    """The request's function tools and ``tool_choice`` in the chat endpoint's terms (the same prompt and
    parsing as ``/v1/chat/completions``)."""
    tools = [{"type": "function", "function": t.model_dump(include={"name", "description", "parameters"},
                                                               exclude_none=True)} for t in body.tools or ()]
    choice = body.tool_choice
    named = {"type": "function", "function": {"name": choice.name}} if isinstance(choice, FunctionChoice) else choice
    try:
        return tool_setup(tools or None, named, body.parallel_tool_calls)
    except ValueError as exc:
        raise bad_request(str(exc), param="tool_choice") from exc


def input_items(body: ResponsesRequest) -> list[InputItem]:
    if isinstance(body.input, str):
        return [MessageItem(role="user", content=body.input)]
    return list(body.input)


async def plan_prompt(builder: PromptBuilder, instructions: str | None, history: list[InputItem],
                      items: list[InputItem], tools: ToolSetup) -> PromptPlan:
    """History then the new items, with the tools shown to the template; media headers checked."""
    plan = PromptPlan([], options=TemplateOptions(tools=tools.tools, assistant_prefix=tools.prefix))
    if instructions:
        plan.messages.append({"role": "system", "content": instructions})
    for i, item in enumerate(history):
        await _add(builder, item, f"previous_response_id[{i}]", plan)
    for i, item in enumerate(items):
        await _add(builder, item, f"input[{i}]", plan)
    return await builder.check(plan)


async def _add(builder: PromptBuilder, item: InputItem, param: str, plan: PromptPlan) -> None:
    messages = plan.messages
    if isinstance(item, FunctionCallItem):
        call = _template_call(item)
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", [])
            last["tool_calls"].append(call)  # type: ignore[union-attr]
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        return
    if isinstance(item, FunctionCallOutputItem):
        output = item.output if isinstance(item.output, str) else _text_only(item.output, f"{param}.output")
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        return
    messages.append(await _message(builder, item, param, plan.items))


def _template_call(item: FunctionCallItem) -> dict[str, object]:
    """An earlier call as the template writes it back: arguments as an object when they parse."""
    try:
        arguments: object = json.loads(item.arguments)
    except json.JSONDecodeError:
        arguments = item.arguments
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}


def _text_only(parts: list[InputPart], param: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, (InputText, OutputTextIn)):
            raise bad_request(f"a function_call_output carries text only, not {part.type}", param=f"{param}[{j}]")
        texts.append(part.text)
    return "".join(texts)


async def _message(builder: PromptBuilder, item: MessageItem, param: str, media: list[MediaItem]) -> TemplateMessage:
    role = _ROLE.get(item.role, item.role)
    if isinstance(item.content, str):
        return {"role": role, "content": item.content}
    parts = [await _part(builder, part, f"{param}.content[{j}]", media) for j, part in enumerate(item.content)]
    if all(p["type"] == "text" for p in parts):  # plain text reads the same in every role of the template
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


async def _part(builder: PromptBuilder, part: InputPart, param: str, media: list[MediaItem]) -> TemplatePart:
    if isinstance(part, (InputText, OutputTextIn)):
        return {"type": "text", "text": part.text}
    if isinstance(part, RefusalIn):
        return {"type": "text", "text": part.refusal}
    if isinstance(part, InputAudio):
        param += ".input_audio.data"
        data = await builder.inline(part.input_audio.data, param)
        media.append(MediaItem("audio", data, param, part.input_audio.format))
        return {"type": "audio"}
    if isinstance(part, InputImage):
        if part.image_url is None:
            raise bad_request("input_image needs image_url (this server has no Files API for file_id)",
                              param=f"{param}.file_id", code="unsupported_input")
        param += ".image_url"
        media.append(MediaItem("image", (await builder.fetch(part.image_url, param)).data, param))
        return {"type": "image"}
    raise bad_request(f"{part.type} parts are not supported by this server (no Files API); send input_text, "
                      "input_image or input_audio", param=f"{param}.type", code="unsupported_input")
