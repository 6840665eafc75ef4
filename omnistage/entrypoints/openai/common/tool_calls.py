"""Qwen's tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the answer's text.

``ToolCallParser`` reads the streamed text and splits it into the content a
client shows and the calls it runs; a call is emitted whole once its closing
tag arrives (OpenAI's clients accumulate argument deltas, so one delta holding
all of them is valid). Text between calls that is only whitespace is dropped.
A closed call whose body is not JSON with a string ``name`` stays content, as
written; an unclosed one (the answer cut inside it, e.g. at ``max_tokens``) is
dropped: a half-written call is never shown, nor spoken (the talker skips it too).

``ToolSetup`` is what a request's ``tools``/``tool_choice`` ask of the prompt and
the answer: ``auto`` shows the tools to the model; ``required`` opens the answer
with ``<tool_call>`` so it must call one; a named choice also writes the name;
``none`` hides the tools. With ``parallel_tool_calls: false`` only the first
call is kept. The talker never speaks what lies between the tags
(``OmniRequest.unspoken``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from omnistage.core import UnspokenSpan
from omnistage.entrypoints.openai.common.errors import quoted

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    index: int
    id: str
    name: str
    arguments: str  # a JSON object, as a string


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse_call(body: str) -> tuple[str, str] | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call["name"], arguments


@dataclass
class ToolCallParser:
    """Feeds on text deltas; ``prefix``: text the answer was made to start with (a forced call's opening)."""

    prefix: str = ""
    parallel: bool = True
    calls: list[ParsedCall] = field(default_factory=list)
    _buf: str = ""
    _inside: bool = False
    _space: str = ""  # whitespace held back until real content follows it

    def __post_init__(self) -> None:
        if self.prefix:
            self._inside, self._buf = True, self.prefix.removeprefix(OPEN)

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """The content to show now and the calls completed by ``text``."""
        self._buf += text
        content: list[str] = []
        made: list[ParsedCall] = []
        while self._buf:
            if self._inside:
                end = self._buf.find(CLOSE)
                if end < 0:
                    break
                body, self._buf, self._inside = self._buf[:end], self._buf[end + len(CLOSE):], False
                self._close(body, content, made)
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                content.append(self._shown(self._buf[:start]))
                self._buf, self._inside = self._buf[start + len(OPEN):], True
                continue
            keep = _partial_tag(self._buf)
            content.append(self._shown(self._buf[:len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
            break
        return "".join(content), made

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """At the end of the answer: an unclosed call whose body parses still counts, one that does not is dropped;
        text held back (a possible tag's start) is content."""
        content: list[str] = []
        made: list[ParsedCall] = []
        if self._inside:
            self._close(self._buf, content, made, closed=False)
        else:
            content.append(self._shown(self._buf))
        self._buf, self._inside = "", False
        if not self.calls:
            content.append(self._space)
        self._space = ""
        return "".join(content), made

    def _close(self, body: str, content: list[str], made: list[ParsedCall], closed: bool = True) -> None:
        parsed = _parse_call(body.strip())
        if parsed is None:
            if closed:
                content.append(self._shown(OPEN + body + CLOSE))
            else:
                self._space = ""  # the space before the call goes with it, as before a call that completes
            return
        self._space = ""
        if self.calls and not self.parallel:
            return
        call = ParsedCall(len(self.calls), new_call_id(), *parsed)
        self.calls.append(call)
        made.append(call)

    def _shown(self, text: str) -> str:
        if not text:
            return ""
        text, self._space = self._space + text, ""
        stripped = text.rstrip()
        self._space = text[len(stripped):]
        return stripped


def _partial_tag(text: str) -> int:
    """Length of the longest end of ``text`` that could begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


@dataclass(frozen=True)
class ToolSetup:
    """tools: the schemas the template renders (None: not shown); prefix: what the answer is made to start with;
    parse: whether the answer is read for calls."""

    tools: list[dict[str, Any]] | None
    prefix: str = ""
    parse: bool = False
    parallel: bool = True

    def parser(self) -> ToolCallParser | None:
        return ToolCallParser(self.prefix, self.parallel) if self.parse else None

    def unspoken(self, tokenizer: Any) -> UnspokenSpan | None:  # noqa: ANN401 - a transformers tokenizer
        """The talker skips the calls' text: their tag ids, when the tokenizer has the tags as single tokens."""
        if not self.parse or tokenizer is None:
            return None
        ids = [tokenizer.convert_tokens_to_ids(tag) for tag in (OPEN, CLOSE)]
        if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
            return None
        return UnspokenSpan(ids[0], ids[1], open_at_start=bool(self.prefix))


NO_TOOLS = ToolSetup(tools=None)


def tool_setup(tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None,
               parallel: bool | None) -> ToolSetup:
    """From a request's ``tools`` (as dicts), ``tool_choice`` (a string or ``{"type": "function", "function":
    {"name": ...}}``) and ``parallel_tool_calls``. ``ValueError`` names a choice that is not among the tools."""
    if not tools or choice == "none":
        if isinstance(choice, dict) or choice == "required":
            raise ValueError("tool_choice asks for a tool call but no tools are given")
        return NO_TOOLS
    keep_all = parallel is not False
    if choice is None or choice == "auto":
        return ToolSetup(tools, parse=True, parallel=keep_all)
    if choice == "required":
        return ToolSetup(tools, prefix=OPEN + "\n", parse=True, parallel=keep_all)
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    if name not in {t["function"]["name"] for t in tools}:
        raise ValueError(f"tool_choice names {quoted(name)}, which is not among the tools")
    return ToolSetup(tools, prefix=OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments": ', parse=True,
                     parallel=False)
