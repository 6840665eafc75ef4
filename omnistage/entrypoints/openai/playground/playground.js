// The omnistage playground: talk to the model over WebRTC (as OpenAI's browser apps do), or hear its TTS voices.
// No build step and no external URL. The API key, when the server has one, stays in this page's memory; the
// call itself uses an ephemeral key minted from it (POST /v1/realtime/client_secrets), as an app's backend would.
// window.omnistage.stats holds the counters the browser tests read.
"use strict";

const $ = (id) => document.getElementById(id);
const OPENAI_VOICES = ["alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"];
const LOUD_RMS = 0.01;  // a reply frame louder than this counts as heard audio

const stats = {
  connected: false, callId: null, eventsReceived: 0, speechStarted: 0, turnsCommitted: 0, responses: 0,
  responsesDone: 0, audioStarted: 0, bargeIns: 0, loudReplyFrames: 0, replyAudioMs: 0,
  firstAudioMs: null, lastFirstAudioMs: null, transcriptChars: 0, userTranscriptChars: 0,
  packetsReceived: 0, packetsLost: 0, jitterMs: 0, concealedPct: 0, packetsSent: 0,
  ttsRequests: 0, ttsPlays: 0, ttsBytes: 0, ttsFirstByteMs: null, errors: [],
};
const call = { pc: null, channel: null, mic: null, audioContext: null, timers: [], turnEndedAt: null, lines: {} };
window.omnistage = { stats, call };

// -- the API, with the key asked for once when the server wants one -------------------------------------------
let apiKey = null;
let keyWaiters = [];

function askKey() {
  $("key-form").hidden = false;
  $("api-key").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  apiKey = $("api-key").value.trim() || null;
  $("api-key").value = "";
  $("key-form").hidden = true;
  keyWaiters.forEach((resolve) => resolve());
  keyWaiters = [];
});

async function api(path, options = {}) {
  for (;;) {
    const headers = Object.assign({}, options.headers || {});
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    const response = await fetch(path, Object.assign({}, options, { headers }));
    if (response.status !== 401) return response;
    await askKey();  // a wrong key asks again
  }
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

function fail(message) {
  stats.errors.push(String(message));
  addLine("error", "error", String(message));
}

// -- models and voices --------------------------------------------------------------------------------------
async function loadServer() {
  const facts = await (await fetch("/", { headers: { Accept: "application/json" }, cache: "no-store" })).json();
  $("version").textContent = facts.version || "";
  const models = await api("/v1/models");
  if (models.ok) {
    for (const card of (await models.json()).data) $("model").add(new Option(card.id, card.id));
  }
  const voices = new Set(facts.voices || []);
  const listed = await api("/v1/audio/voices");
  if (listed.ok) {
    const body = await listed.json();
    (body.voices || []).forEach((v) => voices.add(v));
    renderCloned(body.data || []);
    (body.data || []).forEach((v) => voices.add(v.id));
  }
  OPENAI_VOICES.forEach((v) => voices.add(v));
  $("voices").replaceChildren(...[...voices].map((v) => new Option(v)));
}

function renderCloned(data) {
  $("cloned").replaceChildren(...data.map((v) => {
    const li = document.createElement("li");
    li.textContent = v.id + " (" + v.mode + ")";
    return li;
  }));
  if (!data.length) $("cloned").innerHTML = "<li><small>none (or this checkpoint does not clone voices)</small></li>";
}

function sessionSettings() {
  const session = { type: "realtime", audio: { input: { transcription: { model: $("model").value } }, output: {} } };
  if ($("model").value) session.model = $("model").value;
  if ($("voice").value.trim()) session.audio.output.voice = $("voice").value.trim();
  if ($("instructions").value.trim()) session.instructions = $("instructions").value.trim();
  return session;
}

// -- the call: an ephemeral key, an SDP offer, the oai-events channel and the two audio tracks ----------------
async function connect() {
  $("connect").disabled = true;
  $("protocol").disabled = true;
  setStatus("connecting…");
  try {
    const minted = await api("/v1/realtime/client_secrets", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ session: sessionSettings() }),
    });
    if (!minted.ok) throw new Error(await errorText(minted));
    const ephemeral = (await minted.json()).value;
    call.mic = await navigator.mediaDevices.getUserMedia(
      { audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
    const pc = new RTCPeerConnection();
    call.pc = pc;
    call.mic.getTracks().forEach((track) => pc.addTrack(track, call.mic));
    pc.ontrack = (e) => playReply(e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => {
      if (["failed", "closed", "disconnected"].includes(pc.connectionState)) hangUp(pc.connectionState);
    };
    call.channel = pc.createDataChannel("oai-events");
    call.channel.onmessage = (m) => onEvent(JSON.parse(m.data));
    call.channel.onopen = () => { $("text").disabled = false; $("send").disabled = false; };
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc, 3000);  // the server answers once: the offer carries every candidate
    const live = $("protocol").value === "live";  // duplex mode: GPT-Live (playground_live.js)
    const sdp = live ? await window.omnistage.live.open(pc, ephemeral) : await openRealtimeCall(pc, ephemeral);
    await pc.setRemoteDescription({ type: "answer", sdp });
    $("hangup").disabled = false;
    call.timers.push(setInterval(readRtpStats, 1000));
  } catch (err) {
    fail(err.message || err);
    hangUp("failed");
  }
}

async function openRealtimeCall(pc, ephemeral) {
  const answer = await fetch("/v1/realtime/calls", {
    method: "POST", body: pc.localDescription.sdp,
    headers: { "Content-Type": "application/sdp", Authorization: "Bearer " + ephemeral },
  });
  if (answer.status !== 201) throw new Error(await errorText(answer));
  stats.callId = (answer.headers.get("Location") || "").split("/").pop();
  return answer.text();
}

function iceGathered(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") resolve(); };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, timeoutMs);
  });
}

function hangUp(reason) {
  // Closing the peer connection is the hang-up the server hears (a DELETE with the ephemeral key would do too).
  call.timers.forEach(clearInterval);
  call.timers = [];
  if (call.channel) call.channel.close();
  if (call.pc) call.pc.close();
  if (call.mic) call.mic.getTracks().forEach((t) => t.stop());
  if (call.audioContext) call.audioContext.close();
  Object.assign(call, { pc: null, channel: null, mic: null, audioContext: null });
  stats.connected = false;
  $("connect").disabled = false;
  $("protocol").disabled = false;
  $("hangup").disabled = true;
  $("text").disabled = true;
  $("send").disabled = true;
  setStatus(typeof reason === "string" ? "ended (" + reason + ")" : "ended");
}

// The reply plays in the <audio> element; an analyser beside it counts what is heard (time to first audio).
function playReply(stream) {
  $("reply").srcObject = stream;
  const context = new AudioContext();
  call.audioContext = context;
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  call.timers.push(setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const s of samples) sum += s * s;
    if (Math.sqrt(sum / samples.length) < LOUD_RMS) return;
    stats.loudReplyFrames += 1;
    stats.replyAudioMs += 20;
    if (call.turnEndedAt !== null) {
      stats.lastFirstAudioMs = Math.round(performance.now() - call.turnEndedAt);
      if (stats.firstAudioMs === null) stats.firstAudioMs = stats.lastFirstAudioMs;
      call.turnEndedAt = null;
    }
  }, 20));
}

async function readRtpStats() {
  if (!call.pc) return;
  (await call.pc.getStats()).forEach((r) => {
    if (r.type === "inbound-rtp" && r.kind === "audio") {
      stats.packetsReceived = r.packetsReceived || 0;
      stats.packetsLost = r.packetsLost || 0;
      stats.jitterMs = Math.round((r.jitter || 0) * 1000);
      const total = r.totalSamplesReceived || 0;
      stats.concealedPct = total ? Math.round((100 * (r.concealedSamples || 0)) / total) : 0;
    } else if (r.type === "outbound-rtp" && r.kind === "audio") {
      stats.packetsSent = r.packetsSent || 0;
    }
  });
}

function send(event) {
  if (call.channel && call.channel.readyState === "open") call.channel.send(JSON.stringify(event));
}

// -- server events: the transcript and the counters ---------------------------------------------------------
const handlers = {
  "session.created": () => { stats.connected = true; setStatus("live: speak, or type below", true); },
  "input_audio_buffer.speech_started": () => { stats.speechStarted += 1; setStatus("listening…", true); },
  "input_audio_buffer.speech_stopped": () => { call.turnEndedAt = performance.now(); },
  "input_audio_buffer.committed": (e) => { stats.turnsCommitted += 1; addLine(e.item_id, "user", "", true); },
  "conversation.item.input_audio_transcription.delta": (e) => appendText(e.item_id, e.delta, "user"),
  "conversation.item.input_audio_transcription.completed": (e) => setText(e.item_id, e.transcript, "user"),
  "response.created": () => { stats.responses += 1; setStatus("answering…", true); },
  "response.output_audio_transcript.delta": (e) => appendText(e.item_id, e.delta, "assistant"),
  "response.output_text.delta": (e) => appendText(e.item_id, e.delta, "assistant"),
  "output_audio_buffer.started": () => { stats.audioStarted += 1; },
  "output_audio_buffer.cleared": () => { stats.bargeIns += 1; },
  "response.done": (e) => {
    stats.responsesDone += 1;
    setStatus("live: speak, or type below", true);
    Object.values(call.lines).forEach((line) => line.classList.remove("pending"));
    if (e.response.status === "failed") fail(JSON.stringify(e.response.status_details));
  },
  "error": (e) => fail(e.error.message),
};

function onEvent(event) {
  stats.eventsReceived += 1;
  const live = $("protocol").value === "live" ? window.omnistage.live.handlers : {};
  const handle = live[event.type] || handlers[event.type];
  if (handle) handle(event);
  renderFigures();
}

function addLine(id, who, text, pending = false) {
  const line = document.createElement("div");
  line.className = "line " + who + (pending ? " pending" : "");
  line.innerHTML = '<span class="who"></span><span class="text"></span>';
  line.querySelector(".who").textContent = who === "user" ? "You" : who === "assistant" ? "Model" : "!";
  line.querySelector(".text").textContent = text;
  call.lines[id] = line;
  $("transcript").append(line);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return line;
}

function appendText(id, delta, who) {
  const line = call.lines[id] || addLine(id, who, "", true);
  line.querySelector(".text").textContent += delta;
  if (who === "assistant") stats.transcriptChars += delta.length;
  else stats.userTranscriptChars += delta.length;
  $("transcript").scrollTop = $("transcript").scrollHeight;
}

function setText(id, text, who) {
  const line = call.lines[id] || addLine(id, who, "");
  line.classList.remove("pending");
  line.querySelector(".text").textContent = text;
  if (who === "user") stats.userTranscriptChars = Math.max(stats.userTranscriptChars, text.length);
}

$("text-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  $("text").value = "";
  addLine("typed-" + Date.now(), "user", text);
  call.turnEndedAt = performance.now();
  if ($("protocol").value === "live") {
    send(window.omnistage.live.typed(text));
    return;
  }
  send({ type: "conversation.item.create", item: { type: "message", role: "user",
    content: [{ type: "input_text", text }] } });
  send({ type: "response.create" });
});

// -- text to speech -----------------------------------------------------------------------------------------
async function speak() {
  $("speak").disabled = true;
  $("tts-status").textContent = "generating…";
  const started = performance.now();
  try {
    stats.ttsRequests += 1;
    const body = { model: $("model").value, input: $("tts-text").value, response_format: "wav" };
    if ($("voice").value.trim()) body.voice = $("voice").value.trim();
    const response = await api("/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (!response.ok) throw new Error(await errorText(response));
    const audio = await response.blob();
    stats.ttsFirstByteMs = Math.round(performance.now() - started);
    stats.ttsBytes += audio.size;
    const player = $("tts-audio");
    player.src = URL.createObjectURL(audio);
    await player.play();
    $("tts-status").textContent = (audio.size / 1024).toFixed(0) + " KiB in " + stats.ttsFirstByteMs + " ms";
  } catch (err) {
    $("tts-status").textContent = "";
    fail(err.message || err);
  } finally {
    $("speak").disabled = false;
  }
}

$("tts-audio").addEventListener("playing", () => { stats.ttsPlays += 1; });

$("clone-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const file = $("clone-file").files[0];
  const data = await new Promise((resolve) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",")[1]);
    reader.readAsDataURL(file);
  });
  const body = { name: $("clone-name").value, audio: { data } };
  if ($("clone-transcript").value.trim()) body.transcript = $("clone-transcript").value.trim();
  const response = await api("/v1/audio/voices", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (!response.ok) return fail(await errorText(response));
  const listed = await api("/v1/audio/voices");
  if (listed.ok) renderCloned((await listed.json()).data || []);
});

// -- the page -----------------------------------------------------------------------------------------------
function setStatus(text, live = false) {
  $("status").textContent = text;
  $("status").classList.toggle("live", live);
}

const FIGURES = [
  ["time to first audio", () => (stats.lastFirstAudioMs === null ? "–" : stats.lastFirstAudioMs + " ms")],
  ["reply audio heard", () => (stats.replyAudioMs / 1000).toFixed(1) + " s"],
  ["turns heard", () => stats.turnsCommitted],
  ["responses", () => stats.responsesDone + " / " + stats.responses],
  ["barge-ins", () => stats.bargeIns],
  ["packets in / lost", () => stats.packetsReceived + " / " + stats.packetsLost],
  ["jitter", () => stats.jitterMs + " ms"],
  ["concealed audio", () => stats.concealedPct + " %"],
  ["packets sent", () => stats.packetsSent],
  ["TTS", () => (stats.ttsFirstByteMs === null ? "–" : stats.ttsFirstByteMs + " ms, " + stats.ttsPlays + " played")],
];

function renderFigures() {
  $("figures").replaceChildren(...FIGURES.map(([name, value]) => {
    const row = document.createElement("div");
    row.innerHTML = "<dt></dt><dd></dd>";
    row.firstChild.textContent = name;
    row.lastChild.textContent = String(value());
    return row;
  }));
}

document.querySelectorAll(".tab").forEach((tab) => tab.addEventListener("click", () => {
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
  document.querySelectorAll(".panel").forEach((p) => { p.hidden = p.id !== tab.dataset.panel; });
}));
$("connect").addEventListener("click", connect);
$("hangup").addEventListener("click", () => hangUp("hung up"));
$("speak").addEventListener("click", speak);
setInterval(renderFigures, 250);
renderFigures();
window.omnistage.ready = loadServer().catch((err) => fail(err.message || err));
