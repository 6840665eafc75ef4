"""WebRTC realtime calls (``POST /v1/realtime/calls``): aiortc peers running the realtime session loop."""
