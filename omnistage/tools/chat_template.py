"""The Qwen3-Omni chat template (ChatML with audio/image/video placeholders).

Written for omnistage: a content part of type audio, image or video becomes the
start/pad/end triple the processor expands; text parts are copied; a system
turn is optional; ``add_generation_prompt`` opens the assistant turn.
"""

QWEN3_OMNI_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
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
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
