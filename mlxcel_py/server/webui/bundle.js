// mlxcel-py's chat page (index.html); served at /bundle.js.
"use strict";
const $ = (id) => document.getElementById(id);
const store = {
  get(key, fallback) { try { const v = localStorage.getItem("mlxcel." + key); return v === null ? fallback : JSON.parse(v); } catch (e) { return fallback; } },
  set(key, value) { try { localStorage.setItem("mlxcel." + key, JSON.stringify(value)); } catch (e) { showError("This browser's storage is full: older conversations (images take room) were not saved."); } },
};
let conversations = store.get("conversations", []);
let current = store.get("current", null);
let settings = Object.assign({ temperature: null, top_p: null, max_tokens: 512, system: "" }, store.get("settings", {}));
let props = null;
let routed = null;  // a router's model this page talks to (mlxcel serve --models-dir): the request's "model"
let controller = null;
let streaming = null;  // the reply being read (its stream id lets Stop end the server's generation too)
let attached = [];  // data: URLs of the images for the next message

// ---- markdown: escape everything, then code fences, inline code, emphasis, headings, lists, links ----
function escapeHtml(s) { return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c])); }
function inline(s) {
  return s
    .replace(/`([^`]+)`/g, (_, c) => "<code>" + c + "</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^)\s]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
}
function markdown(src) {
  const out = [];
  const parts = escapeHtml(src).split(/^```/m);
  parts.forEach((part, i) => {
    if (i % 2 === 1) {  // inside a fence: first line is the language
      const nl = part.indexOf("\n");
      const lang = nl < 0 ? "" : part.slice(0, nl).trim();
      const code = nl < 0 ? "" : part.slice(nl + 1).replace(/\n$/, "");
      out.push('<pre><code class="lang-' + lang.replace(/[^\w-]/g, "") + '">' + code + "</code></pre>");
      return;
    }
    let list = null;
    for (const block of part.split(/\n{2,}/)) {
      const lines = block.split("\n").filter((l) => l.trim() !== "");
      if (!lines.length) continue;
      if (lines.every((l) => /^\s*([-*]|\d+\.)\s+/.test(l))) {
        const tag = /^\s*\d+\./.test(lines[0]) ? "ol" : "ul";
        out.push("<" + tag + ">" + lines.map((l) => "<li>" + inline(l.replace(/^\s*([-*]|\d+\.)\s+/, "")) + "</li>").join("") + "</" + tag + ">");
        continue;
      }
      const h = /^(#{1,6})\s+(.*)$/.exec(lines[0]);
      if (h && lines.length === 1) { out.push("<h" + (h[1].length + 2 > 6 ? 6 : h[1].length + 2) + ">" + inline(h[2]) + "</h" + (h[1].length + 2 > 6 ? 6 : h[1].length + 2) + ">"); continue; }
      out.push("<p>" + lines.map(inline).join("<br>") + "</p>");
    }
  });
  return out.join("");
}

// ---- conversations ----
function conversation() { return conversations.find((c) => c.id === current); }
function save() { store.set("conversations", conversations); store.set("current", current); }
function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  conversations.unshift(c);
  current = c.id;
  save();
  render();
}
function renderList() {
  const ul = $("conversations");
  ul.innerHTML = "";
  for (const c of conversations) {
    const li = document.createElement("li");
    li.className = c.id === current ? "active" : "";
    const span = document.createElement("span");
    span.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "×";
    del.title = "Delete";
    del.onclick = (e) => { e.stopPropagation(); conversations = conversations.filter((x) => x.id !== c.id); if (current === c.id) current = conversations.length ? conversations[0].id : null; save(); render(); };
    li.append(span, del);
    li.onclick = () => { if (controller) return; current = c.id; save(); render(); resume(); };
    ul.append(li);
  }
}
function statsText(m) {
  const t = m.timings;
  if (!t) {  // a stopped reply has no server timings: the page's own count of what arrived
    if (!m.stopped) return "";
    const secs = (m.ms || 0) / 1000;
    return "stopped · " + (m.pieces || 0) + " pieces in " + secs.toFixed(1) + " s";
  }
  const parts = [(t.predicted_per_second || 0).toFixed(1) + " tok/s", (t.predicted_n || 0) + " tokens"];
  if (t.draft_rounds) parts.push("drafted " + t.draft_n + ", accepted " + t.draft_n_accepted + " (" + t.draft_kind + ")");
  else if (m.plain) parts.push("plain decoding (speculation off for this reply)");
  else parts.push("no drafts this reply");
  if (m.stopped) parts.push("stopped");
  return parts.join(" · ");
}
function messageNode(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role;
  const content = document.createElement("div");
  content.className = "content";
  if (m.role === "assistant") content.innerHTML = markdown(m.content); else content.textContent = m.content;
  div.append(role);
  for (const url of m.images || []) {
    const img = document.createElement("img");
    img.className = "thumb";
    img.src = url;
    img.alt = "attached image";
    div.append(img);
  }
  div.append(content);
  if (m.role === "assistant") {
    const st = document.createElement("div");
    st.className = "stats" + (m.plain ? " plain" : "");
    st.textContent = statsText(m);
    div.append(st);
  }
  return div;
}
function render() {
  renderList();
  const box = $("messages");
  const err = $("error");
  box.innerHTML = "";
  box.append(err);
  const c = conversation();
  if (c) for (const m of c.messages) box.append(messageNode(m));
  box.scrollTop = box.scrollHeight;
}
function showError(text) { const e = $("error"); e.textContent = text; e.style.display = text ? "block" : "none"; }

// ---- the server ----
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}
async function explain(resp) {
  let message = "HTTP " + resp.status;
  try { const body = await resp.json(); if (body && body.error && body.error.message) message = body.error.message; } catch (e) {}
  if (resp.status === 401) return "Wrong or missing API key: enter the server's key (mlxcel serve --api-key) in the API key field. (" + message + ")";
  if (resp.status === 503) return "The server is not ready: " + message;
  return message;
}
async function loadModels() {  // a router: its models in the picker, the last one chosen kept
  const resp = await fetch("/models", { headers: headers() });
  if (!resp.ok) { showError(await explain(resp)); return false; }
  const ids = ((await resp.json()).data || []).map((m) => m.id);
  const pick = $("model-pick");
  pick.innerHTML = "";
  for (const id of ids) { const o = document.createElement("option"); o.value = id; o.textContent = id; pick.appendChild(o); }
  pick.style.display = "";
  $("model").style.display = "none";
  routed = ids.includes(store.get("model", null)) ? store.get("model", null) : ids[0] || null;
  if (routed) pick.value = routed;
  return routed !== null;
}
async function loadProps() {
  try {
    let resp = await fetch("/props", { headers: headers() });
    if (!resp.ok) { showError(await explain(resp)); return; }
    props = await resp.json();
    if (props.role === "router") {
      if (!(await loadModels())) { showError("This router serves no models (mlxcel serve --models-dir)."); return; }
      // the chosen model's own settings, without loading it just to show them
      resp = await fetch("/props?autoload=false&model=" + encodeURIComponent(routed), { headers: headers() });
      if (!resp.ok) {
        showError("");
        $("drafter").textContent = routed + " is not loaded: it loads with the first message";
        $("plain-next").disabled = true;
        return;
      }
      props = await resp.json();
    }
    showError("");
    $("model").textContent = props.model_alias || "model";
    const s = props.speculative || {};
    $("drafter").textContent = s.enabled ? "drafter: " + s.kind : "no drafter (plain decoding)";
    $("plain-next").disabled = !s.enabled;
    $("attach-label").style.display = (props.modalities || {}).vision ? "" : "none";
    const d = (props.default_generation_settings || {}).params || {};
    if (settings.temperature === null && d.temperature !== undefined) settings.temperature = d.temperature;
    if (settings.top_p === null && d.top_p !== undefined) settings.top_p = d.top_p;
    fillSettings();
  } catch (e) { showError("Cannot reach the server: " + e); }
}
function fillSettings() {
  $("temperature").value = settings.temperature === null ? "" : settings.temperature;
  $("top-p").value = settings.top_p === null ? "" : settings.top_p;
  $("max-tokens").value = settings.max_tokens;
  $("system").value = settings.system;
}
function readSettings() {
  const num = (id) => { const v = $(id).value; return v === "" ? null : Number(v); };
  settings = { temperature: num("temperature"), top_p: num("top-p"), max_tokens: num("max-tokens") || 512, system: $("system").value };
  store.set("settings", settings);
}
function busy(on) { $("send").style.display = on ? "none" : ""; $("stop").style.display = on ? "" : "none"; $("input").disabled = on; }

function contentOf(m) {  // OpenAI's parts: the images first, then the text
  if (!m.images || !m.images.length) return m.content;
  return m.images.map((url) => ({ type: "image_url", image_url: { url } })).concat([{ type: "text", text: m.content }]);
}
function showAttached() { $("attached").textContent = attached.length ? attached.length + " image" + (attached.length > 1 ? "s" : "") + " attached" : ""; }
function readImage(file) {
  return new Promise((resolve, reject) => { const r = new FileReader(); r.onload = () => resolve(r.result); r.onerror = () => reject(r.error); r.readAsDataURL(file); });
}

async function send(text) {
  readSettings();
  if (!conversation()) newConversation();
  const c = conversation();
  const plain = $("plain-next").checked && !$("plain-next").disabled;
  $("plain-next").checked = false;
  const user = { role: "user", content: text };
  if (attached.length) { user.images = attached; attached = []; showAttached(); }
  c.messages.push(user);
  if (c.title === "New chat") c.title = text.slice(0, 40);
  const reply = { role: "assistant", content: "", plain };
  c.messages.push(reply);
  save();
  render();
  const history = c.messages.slice(0, -1).filter((m) => m.content !== "" || m.role === "user").map((m) => ({ role: m.role, content: contentOf(m) }));
  if (settings.system) history.unshift({ role: "system", content: settings.system });
  const body = { messages: history, stream: true, max_tokens: settings.max_tokens };
  if (settings.temperature !== null) body.temperature = settings.temperature;
  if (settings.top_p !== null) body.top_p = settings.top_p;
  if (plain) body["speculative.n_max"] = 0;
  if (routed) body.model = routed;
  reply.stream = c.id + "." + (c.messages.length - 1);  // llama-server's resumable stream id (a reload reads it again)
  save();
  await run(reply, () => fetch("/v1/chat/completions", { method: "POST", headers: { ...headers(), "X-Conversation-Id": reply.stream }, body: JSON.stringify(body), signal: controller.signal }));
}

// a reply streaming when the page went away (a reload, a closed tab): the server went on
// generating it, so read it again from its first byte; a server that no longer has it (restarted,
// expired) leaves what was saved, marked stopped
async function resume() {
  const c = conversation();
  const reply = c && c.messages[c.messages.length - 1];
  if (!reply || reply.role !== "assistant" || !reply.stream || controller) return;
  await run(reply, async () => {
    const resp = await fetch("/v1/stream?conv_id=" + encodeURIComponent(reply.stream) + "&from=0", { headers: headers(), signal: controller.signal });
    if (resp.ok) { reply.content = ""; reply.pieces = 0; }
    return resp;
  }, true);
}

function nodesOf(reply) {  // the reply's content and stats, while it is the last one shown
  const c = conversation();
  if (!c || c.messages[c.messages.length - 1] !== reply) return null;
  const node = $("messages").lastChild;
  return { content: node.querySelector(".content"), stats: node.querySelector(".stats") };
}

async function run(reply, request, resuming = false) {
  controller = new AbortController();
  streaming = reply;
  const started = performance.now();
  if (!resuming) reply.pieces = 0;
  let saved = started;
  busy(true);
  showError("");
  try {
    const resp = await request();
    if (!resp.ok) {
      if (resuming) { reply.stopped = true; return; }
      throw new Error(await explain(resp));
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the server stopped this reply");
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          const nodes = nodesOf(reply);
          if (delta && delta.content) {
            reply.content += delta.content;
            reply.pieces += 1;
            reply.ms = performance.now() - started;
            if (nodes) nodes.content.innerHTML = markdown(reply.content);
          }
          if (chunk.timings) { reply.timings = chunk.timings; if (nodes) nodes.stats.textContent = statsText(reply); }
          $("messages").scrollTop = $("messages").scrollHeight;
        }
      }
      if (performance.now() - saved > 2000) { saved = performance.now(); save(); }  // what arrived survives a reload
    }
  } catch (e) {
    const c = conversation();
    if (e.name === "AbortError") { reply.stopped = true; }
    else { showError(e.message || String(e)); if (!reply.content && c && c.messages[c.messages.length - 1] === reply) c.messages.pop(); }
  } finally {
    delete reply.stream;
    controller = null;
    streaming = null;
    busy(false);
    save();
    render();
    $("input").focus();
    if (routed) loadProps();  // the router's model is loaded now: its drafter and settings
  }
}

$("composer").addEventListener("submit", (e) => { e.preventDefault(); const text = $("input").value.trim(); if (!text || controller) return; $("input").value = ""; send(text); });
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); } });
$("stop").addEventListener("click", () => {
  if (!controller) return;
  if (streaming && streaming.stream) fetch("/v1/stream?conv_id=" + encodeURIComponent(streaming.stream), { method: "DELETE", headers: headers() });  // the server stops generating it
  controller.abort();
});
$("attach").addEventListener("change", async () => {
  for (const f of $("attach").files) attached.push(await readImage(f));
  $("attach").value = "";
  showAttached();
});
$("new-chat").addEventListener("click", newConversation);
$("model-pick").addEventListener("change", () => { routed = $("model-pick").value; store.set("model", routed); loadProps(); });
$("api-key").value = store.get("apiKey", "");
$("api-key").addEventListener("change", () => { store.set("apiKey", $("api-key").value.trim()); loadProps(); });
for (const id of ["temperature", "top-p", "max-tokens", "system"]) $(id).addEventListener("change", readSettings);
fillSettings();
render();
loadProps();
resume();
