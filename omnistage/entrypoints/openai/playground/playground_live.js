// The playground's duplex mode: the same WebRTC call, opened through OpenAI's GPT-Live API (POST
// /v1/live/sessions with the minted ephemeral key) instead of the Realtime API. The microphone and the reply
// travel on the call's tracks; the oai-events channel carries Live events: transcript fragments of both speakers
// (grouped into lines as the speaker changes), usage after each reply, session.closed. Typed text goes in as
// commentary (the Live API has no user text message). Loaded after playground.js, whose helpers it uses.
"use strict";

(() => {
  let speaking = null;  // the transcript line being written: { who, id }

  function liveSession() {
    const session = { model: $("model").value };
    if ($("voice").value.trim()) session.audio = { output: { voice: $("voice").value.trim() } };
    if ($("instructions").value.trim()) session.instructions = $("instructions").value.trim();
    return session;
  }

  // The SDP offer out, the answer back: { session: { id }, transport: { type: "webrtc", sdp } }.
  async function open(pc, ephemeral) {
    const response = await fetch("/v1/live/sessions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: "Bearer " + ephemeral },
      body: JSON.stringify({ session: liveSession(), transport: { type: "webrtc", sdp: pc.localDescription.sdp } }),
    });
    if (response.status !== 201) throw new Error(await errorText(response));
    const created = await response.json();
    stats.callId = created.session.id;
    speaking = null;
    return created.transport.sdp;
  }

  function fragment(who, delta) {
    if (!speaking || speaking.who !== who) {
      speaking = { who, id: "live-" + who + "-" + Date.now() };
      if (who === "user") stats.turnsCommitted += 1;
      else stats.responses += 1;
    }
    if (who === "user") call.turnEndedAt = performance.now();  // written down once the turn has ended
    appendText(speaking.id, delta, who);
  }

  const handlers = {
    "session.started": () => { stats.connected = true; setStatus("live (duplex): speak, or type below", true); },
    "session.input_transcript.delta": (e) => fragment("user", e.delta),
    "session.output_transcript.delta": (e) => fragment("assistant", e.delta),
    "session.usage.updated": () => {
      stats.responsesDone += 1;
      Object.values(call.lines).forEach((line) => line.classList.remove("pending"));
    },
    "session.closed": (e) => setStatus("ended (" + e.reason + ")"),
    "info": (e) => addLine("info-" + Date.now(), "note", e.message),
    "error": (e) => fail(e.error.message),
  };

  // Typed text: the Live API takes it as commentary, something for the model to act on now.
  function typed(text) {
    return { type: "session.commentary.append", delegation_id: null,
      content: "The user typed this message; answer it: " + text };
  }

  window.omnistage.live = { open, handlers, typed };
})();
