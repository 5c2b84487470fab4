// dlm playground: chat with a served model and watch each block denoise. It speaks the server's own
// OpenAI API (streamed chat completions with stream_options.include_canvas), so it needs nothing the
// API does not serve; the browser sends the API key it was asked for on every same-origin request.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];
// Every canvas frame received, in order (window.dlmFrames: what the browser test reads), and the
// pass that committed each output slot (its colour).
window.dlmFrames = [];
window.dlmDone = false;
const committedAt = new Map();

function hue(pass) { return (pass * 47) % 360; }

function knobs() {
  const body = {};
  for (const [id, kind] of [["sampler", "s"], ["max_tokens", "i"], ["block_length", "i"], ["threshold", "f"],
                            ["temperature", "f"]]) {
    const v = $(id).value.trim();
    if (v === "") continue;
    body[id] = kind === "s" ? v : kind === "i" ? parseInt(v, 10) : parseFloat(v);
  }
  return body;
}

function turn(role, text) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  div.textContent = text;
  $("transcript").appendChild(div);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return div;
}

function render(frame) {
  const box = $("canvas");
  box.replaceChildren();
  for (const i of frame.committed) committedAt.set(i, frame.pass);
  frame.tokens.forEach((text, j) => {
    const index = frame.start + j;
    const span = document.createElement("span");
    span.className = "slot";
    if (text === null) {
      span.classList.add("masked");
      span.textContent = frame.draft[j] === null ? "▒" : frame.draft[j];
    } else {
      span.textContent = text;
      const pass = committedAt.get(index);
      if (pass !== undefined) span.style.background = `hsl(${hue(pass)} 70% 82%)`;
      if (frame.committed.includes(index)) span.classList.add("fresh");
    }
    span.title = `slot ${index}` + (committedAt.has(index) ? `, pass ${committedAt.get(index)}` : ", masked");
    box.appendChild(span);
  });
}

function showStats(tokens, passes, seconds) {
  const rate = seconds > 0 ? (tokens / seconds).toFixed(1) : "–";
  const perPass = passes > 0 ? (tokens / passes).toFixed(2) : "–";
  $("stats").textContent = `${tokens} tokens · ${passes} passes · ${perPass} tokens/pass ` +
    `(${perPass}× one token per pass) · ${rate} tokens/s`;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text) return;
  $("prompt").value = "";
  $("send").disabled = true;
  window.dlmDone = false;
  history.push({ role: "user", content: text });
  turn("user", text);
  const answer = turn("assistant", "");
  committedAt.clear();
  const started = performance.now();
  let content = "", passes = 0, tokens = 0;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: $("model").value, messages: history, stream: true,
                             stream_options: { include_usage: true, include_canvas: true }, ...knobs() }),
    });
    if (!response.ok) throw new Error((await response.json()).error?.message || response.statusText);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const line = buffered.slice(0, cut).trim();
        buffered = buffered.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.dlm_canvas) {
          window.dlmFrames.push(chunk.dlm_canvas);
          passes = Math.max(passes, chunk.dlm_canvas.pass);
          render(chunk.dlm_canvas);
        }
        const delta = chunk.choices?.[0]?.delta;
        if (delta?.content) { content += delta.content; answer.textContent = content; }
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        showStats(tokens || content.length, passes, (performance.now() - started) / 1000);
      }
    }
    history.push({ role: "assistant", content });
  } catch (err) {
    answer.classList.add("error");
    answer.textContent = String(err.message || err);
    history.pop();
  } finally {
    $("send").disabled = false;
    window.dlmDone = true;
  }
}

async function start() {
  try {
    const models = await (await fetch("/v1/models")).json();
    for (const m of models.data) $("model").add(new Option(m.id, m.id));
    $("status").textContent = `${models.data.length} model(s) loaded`;
  } catch (err) {
    $("status").textContent = "could not list the models: " + err;
  }
  $("ask").addEventListener("submit", send);
}

start();
