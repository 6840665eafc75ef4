"""OpenAI's documented GA Realtime event order for the flows a voice agent drives (server events only, in order;
``*`` marks a delta event that may repeat or be absent). Written from the Realtime API reference's lifecycle:
a committed audio turn, a spoken answer, a function call answered by the client, a text-only answer."""

COMMIT_AUDIO = ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
CREATE_ITEM = ["conversation.item.added", "conversation.item.done"]
SPOKEN_RESPONSE = [
    "response.created",
    "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_audio_transcript.delta*", "response.output_audio.delta*",
    "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
    "response.output_item.done", "conversation.item.done",
    "response.done",
]
TEXT_RESPONSE = [
    "response.created",
    "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_text.delta*",
    "response.output_text.done", "response.content_part.done",
    "response.output_item.done", "conversation.item.done",
    "response.done",
]
FUNCTION_CALL_RESPONSE = [
    "response.created",
    "response.output_item.added", "conversation.item.added",
    "response.function_call_arguments.delta*", "response.function_call_arguments.done",
    "response.output_item.done", "conversation.item.done",
    "response.done",
]
