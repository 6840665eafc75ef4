"""The Qwen3-Omni chat template (ChatML with audio/image/video placeholders and Qwen's tool calling).

Written for omnistage: a content part of type audio, image or video becomes the
start/pad/end triple the processor expands; text parts are copied; a system
turn is optional; ``add_generation_prompt`` opens the assistant turn.

Tools follow Qwen's layout: the function schemas go in the system turn between
``<tools>`` tags with the instruction to answer calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an assistant turn's
``tool_calls`` are rendered that way; consecutive ``tool`` messages become one
user turn of ``<tool_response>`` blocks.
"""

_CONTENT = (
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- elif message['content'] %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] in ['audio', 'input_audio', 'audio_url'] %}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] in ['image', 'image_url'] %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] in ['video', 'video_url'] %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
)

_TOOLS_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set message = messages[0] %}" + _CONTENT + "{{- '\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
)

_TOOL_CALLS = (
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if loop.first and message['content'] %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
)

QWEN3_OMNI_CHAT_TEMPLATE = (
    _TOOLS_SYSTEM
    + "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}" + _CONTENT + "{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}" + _CONTENT
    + "{%- if message['role'] == 'assistant' and message['tool_calls'] %}" + _TOOL_CALLS + "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
