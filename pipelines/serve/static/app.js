// The page of `hermes-video serve`: streams with their latest frame, an ask box with the streamed
// answer, memory gauges per level, watches and an event timeline. Plain JS, no build step.
// The API key is entered once and kept in this browser's localStorage; every request carries it.
"use strict";

const keyInput = document.getElementById("key");
keyInput.value = localStorage.getItem("hermes-api-key") || "";
keyInput.addEventListener("change", () => { localStorage.setItem("hermes-api-key", keyInput.value); refresh(); });

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (keyInput.value) h["Authorization"] = "Bearer " + keyInput.value;
  return h;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  const data = (r.headers.get("content-type") || "").includes("json") ? await r.json() : null;
  if (!r.ok) throw new Error((data && data.error) || r.statusText);
  return data;
}

// Server-sent events over fetch (EventSource cannot send an Authorization header).
async function readSSE(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = null, data = null;
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data = JSON.parse(line.slice(6));
      }
      if (kind) onEvent(kind, data);
    }
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => (k === "class" ? (node.className = v) : node.setAttribute(k, v)));
  children.forEach((c) => node.append(c));
  return node;
}

function mib(bytes) { return (bytes / 1048576).toFixed(1) + " MiB"; }

const cards = new Map();  // stream id -> {card, parts}

function makeCard(stream) {
  const img = el("img", { class: "frame", alt: "latest frame of " + stream.id });
  const info = el("div", { class: "muted" });
  const gauges = el("div");
  const answer = el("div", { class: "answer", "data-role": "answer" });
  const question = el("input", { type: "text", placeholder: "Ask about what this stream has shown so far" });
  const ask = el("form", {}, question, el("button", {}, "Ask"));
  const watchQ = el("input", { type: "text", placeholder: "Watch: a standing question" });
  const watchEvery = el("input", { type: "number", value: "5", min: "0.5", step: "0.5", style: "width:4em" });
  const watchForm = el("form", {}, watchQ, watchEvery, el("button", {}, "Watch"));
  const watches = el("div", { class: "muted" });
  const events = el("div", { class: "events" });
  const close = el("button", {}, "Close");
  const card = el("section", { class: "card", "data-stream": stream.id },
    el("h2", {}, stream.name + " "), info, img, gauges, ask, answer, watchForm, watches, events, close);
  card.querySelector("h2").append(el("span", { class: "muted" }, stream.source ?? ""));

  ask.addEventListener("submit", async (e) => {
    e.preventDefault();
    answer.textContent = "";
    const r = await fetch(`/v1/streams/${stream.id}/questions`, {
      method: "POST", body: JSON.stringify({ question: question.value }),
      headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }) });
    if (!r.ok) { answer.textContent = "error: " + (await r.json()).error; return; }
    await readSSE(r, (kind, data) => {
      if (kind === "token") answer.textContent += data.text;
      else if (kind === "answer") {
        answer.textContent = data.answer;
        answer.title = `${data.frames_seen} frames seen, ttft ${data.ttft_ms.toFixed(0)} ms`;
        answer.dataset.done = "1";
      } else if (kind === "error") answer.textContent = "error: " + data.error;
    });
  });
  watchForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    await api("POST", `/v1/streams/${stream.id}/watches`, { question: watchQ.value, every_s: Number(watchEvery.value) });
  });
  close.addEventListener("click", async () => { await api("DELETE", `/v1/streams/${stream.id}`); refresh(); });

  const entry = { card, img, info, gauges, watches, events, frameUrl: null, saved: stream.open === false };
  if (!entry.saved) followEvents(stream.id, entry);
  return entry;
}

async function followEvents(id, entry) {
  try {
    const r = await fetch(`/v1/streams/${id}/events`, { headers: headers() });
    if (!r.ok) return;
    await readSSE(r, (kind, data) => {
      const when = new Date(data.time * 1000).toLocaleTimeString();
      let text = kind;
      if (kind === "watch") text = `watch "${data.question}": ${data.answer} (was ${data.previous ?? "—"})`;
      else if (kind === "gap") text = `gap of ${data.duration_s.toFixed(1)} s`;
      else if (kind === "drop") text = `${data.frames_dropped} frames dropped so far`;
      else if (kind === "error") text = "error: " + data.message;
      entry.events.prepend(el("div", {}, `${when}  ${text}`));
    });
  } catch (err) { /* the stream closed */ }
}

function gauge(label, value, max, text) {
  const fill = el("div", { style: `width:${max ? Math.min(100, (100 * value) / max) : 0}%` });
  return el("div", { class: "gauge" }, el("span", { style: "width:7em" }, label), el("div", { class: "bar" }, fill),
            el("span", {}, text));
}

async function update(stream, entry) {
  if (stream.open === false) {  // saved but not opened again after a restart: only why
    entry.info.textContent = `${stream.status}: ${stream.error}`;
    return;
  }
  entry.info.textContent = `${stream.status} · ${stream.frames_encoded} frames in memory · ` +
    `${stream.frames_dropped} dropped · ${stream.questions} questions · memory ${stream.memory_policy}`;
  const m = await api("GET", `/v1/streams/${stream.id}/memory`);
  entry.gauges.replaceChildren(
    gauge("L1 device", m.levels.hbm.tokens, m.budget_tokens, `${m.levels.hbm.tokens} tokens, ${mib(m.levels.hbm.bytes)}`),
    gauge("L2 host", m.levels.dram.bytes, Math.max(m.levels.dram.bytes, 1), mib(m.levels.dram.bytes)),
    gauge("L3 disk", m.levels.disk.records, Math.max(m.levels.disk.records, 1),
          `${m.levels.disk.records} records, ${mib(m.levels.disk.bytes)}`));
  entry.watches.replaceChildren(...stream.watches.map((w) =>
    el("div", {}, `watch every ${w.every_s} s: "${w.question}" → ${w.last_answer ?? "…"}`)));
  const r = await fetch(`/v1/streams/${stream.id}/frame.jpg`, { headers: headers() });
  if (r.ok) {
    const url = URL.createObjectURL(await r.blob());
    if (entry.frameUrl) URL.revokeObjectURL(entry.frameUrl);
    entry.frameUrl = url;
    entry.img.src = url;
  }
}

const statusLine = document.getElementById("status");

async function refresh() {
  try {
    const { streams } = await api("GET", "/v1/streams");
    statusLine.textContent = `${streams.length} stream(s)`;
    const main = document.getElementById("streams");
    const seen = new Set();
    for (const stream of streams) {
      seen.add(stream.id);
      if (cards.has(stream.id) && cards.get(stream.id).saved && stream.open !== false) {
        cards.get(stream.id).card.remove();  // opened again since: a card that follows its events
        cards.delete(stream.id);
      }
      if (!cards.has(stream.id)) {
        const entry = makeCard(stream);
        cards.set(stream.id, entry);
        main.append(entry.card);
      }
      await update(stream, cards.get(stream.id));
    }
    for (const [id, entry] of cards) {
      if (!seen.has(id)) { entry.card.remove(); cards.delete(id); }
    }
  } catch (err) {
    statusLine.textContent = String(err.message || err);
  }
}

document.getElementById("create").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = { source: document.getElementById("source").value };
  const name = document.getElementById("name").value;
  const fps = document.getElementById("fps").value;
  if (name) body.name = name;
  if (fps) body.fps = Number(fps);
  try {
    await api("POST", "/v1/streams", body);
    document.getElementById("create-error").textContent = "";
    refresh();
  } catch (err) {
    document.getElementById("create-error").textContent = err.message;
  }
});

refresh();
setInterval(refresh, 1500);
