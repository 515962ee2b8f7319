// The bertforge page: a tab per served model and per thing it does. Every result comes from the same HTTP
// routes any client calls (/models/<name>/v1/<task>); a refusal is shown as the server words it.
// Texts from the server or the user only ever reach the page through textContent (never as HTML).
"use strict";

const KEY_STORE = "bertforge.apiKey";
const state = { models: {}, indexes: {}, model: null, task: null, keysRequired: false, maxItems: 64 };

// --- small DOM helpers -------------------------------------------------------------------------------------

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else if (name === "style") Object.assign(node.style, value); // CSSOM: the page's policy refuses style="..."
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

function svg(tag, attributes = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

const $ = (id) => document.getElementById(id);
const fixed = (x, digits = 3) => Number(x).toFixed(digits);

function field(label, control) {
  return el("label", { class: "field" }, el("span", { text: label }), control);
}

// A bar of width proportional to a value in [0, 1], with the value written beside it.
function bar(label, value, chosen = false) {
  const width = Math.max(0, Math.min(1, value)) * 100;
  return el("div", { class: chosen ? "bar-row chosen" : "bar-row", "data-label": label, "data-value": String(value) },
    el("span", { class: "bar-label", text: label }),
    el("span", { class: "bar" }, el("span", { class: "bar-fill", style: { width: `${width.toFixed(1)}%` } })),
    el("span", { class: "bar-value", text: fixed(value) }));
}

// The server measures text offsets in Unicode code points; JavaScript strings count UTF-16 units.
function highlight(text, spans) {
  const chars = Array.from(text);
  const out = el("p", { class: "marked" });
  let at = 0;
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    if (span.start < at) continue; // overlapping spans: the first one wins
    out.append(chars.slice(at, span.start).join(""));
    out.append(el("mark", { "data-type": span.type || "", title: span.title || "" },
      chars.slice(span.start, span.end).join(""), span.type ? el("small", { text: span.type }) : ""));
    at = span.end;
  }
  out.append(chars.slice(at).join(""));
  return out;
}

// --- talking to the server ---------------------------------------------------------------------------------

function errorText(status, payload) {
  const error = payload && payload.error;
  const message = typeof error === "string" ? error : error && error.message ? error.message : JSON.stringify(payload);
  return `${status}: ${message}`;
}

async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  let response;
  try {
    response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  } catch (failure) {
    throw new Error(`cannot reach the server (${failure.message})`);
  }
  const payload = await response.json().catch(() => null);
  if (!response.ok) throw new Error(payload ? errorText(response.status, payload) : `${response.status}: ${response.statusText}`);
  return payload;
}

async function call(task, body) {
  return (await post(`models/${encodeURIComponent(state.model)}/v1/${task}`, body)).outputs;
}

const one = async (task, body) => (await call(task, body))[0];

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

// --- one view per task: its form, the request it sends, how its answer is drawn ----------------------------

const lines = (text) => text.split("\n").map((line) => line.trim()).filter(Boolean);

const VIEWS = {
  embed: {
    title: "Embed",
    help: "One text per line: the cosine similarity of every pair of their vectors.",
    fields: () => [field("Texts", el("textarea", { id: "texts", rows: 5 },
      "A man is playing a guitar.\nSomeone plays an instrument.\nThe stock market fell today.\nShares dropped sharply."))],
    async run() {
      const texts = lines($("texts").value);
      if (!texts.length) throw new Error("type at least one text");
      const vectors = [];
      for (let i = 0; i < texts.length; i += state.maxItems) { // requests of at most the server's max_items
        vectors.push(...await call("embed", { inputs: texts.slice(i, i + state.maxItems) }));
      }
      return similarityTable(texts, vectors.map((o) => o.embedding));
    },
  },
  rerank: {
    title: "Rerank",
    help: "The texts ordered by the cross-encoder's relevance to the query.",
    fields: () => [field("Query", el("input", { id: "query", value: "What is the capital of France?" })),
      field("Texts (one per line)", el("textarea", { id: "texts", rows: 4 },
        "Paris is the capital of France.\nBerlin is in Germany.\nFrance is in Europe."))],
    async run() {
      const texts = lines($("texts").value);
      const out = await one("rerank", { inputs: [{ query: $("query").value, texts }] });
      return el("div", { class: "bars" }, ...out.results.map((r, rank) =>
        bar(`${rank + 1}. ${texts[r.index]}`, r.score, rank === 0)));
    },
  },
  classify: {
    title: "Classify",
    help: "The probability of each label (a second text makes a pair, as for entailment).",
    fields: () => [field("Text", el("textarea", { id: "text", rows: 3 }, "This movie was wonderful, I loved it.")),
      field("Second text (optional)", el("input", { id: "pair" }))],
    async run() {
      const pair = $("pair").value.trim();
      const out = await one("classify", { inputs: [pair ? [$("text").value, pair] : $("text").value] });
      if (out.value !== undefined && out.value !== null) return el("p", { class: "big", text: `value ${fixed(out.value, 4)}` });
      const scores = Array.isArray(out.scores) ? Object.fromEntries(out.scores.map((s, i) => [String(i), s])) : out.scores;
      const chosen = new Set(out.labels || [out.label]);
      return el("div", { class: "bars" }, ...Object.entries(scores).sort((a, b) => b[1] - a[1])
        .map(([label, score]) => bar(label, score, chosen.has(label))));
    },
  },
  tag: {
    title: "Tag",
    help: "The entities the model finds, marked in the text.",
    fields: () => [field("Text", el("textarea", { id: "text", rows: 3 }, "Angela Merkel visited Paris with Emmanuel Macron."))],
    async run() {
      const text = $("text").value;
      const out = await one("tag", { inputs: [text] });
      const list = el("ul", { class: "entities" }, ...out.entities.map((e) =>
        el("li", { text: `${e.type}: ${e.text} (${fixed(e.score)})` })));
      const spans = out.entities.map((e) => ({ ...e, title: `${e.type} ${fixed(e.score)}` }));
      return el("div", {}, highlight(text, spans), out.entities.length ? list : el("p", { class: "note", text: "no entities" }));
    },
  },
  answer: {
    title: "Answer",
    help: "The span of the context that answers the question.",
    fields: () => [field("Question", el("input", { id: "question", value: "Where is the Eiffel Tower?" })),
      field("Context", el("textarea", { id: "context", rows: 4 },
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889."))],
    async run() {
      const context = $("context").value;
      const out = await one("answer", { inputs: [{ question: $("question").value, context }] });
      if (out.start === null || out.start === undefined || !out.answer) {
        return el("p", { class: "big", text: `no answer in the context (p=${fixed(out.probability)})` });
      }
      return el("div", {}, el("p", { class: "big", id: "answer-text", text: out.answer }),
        highlight(context, [{ start: out.start, end: out.end, type: "answer", title: fixed(out.probability) }]),
        el("p", { class: "note", text: `probability ${fixed(out.probability)}` }));
    },
  },
  "fill-mask": {
    title: "Fill mask",
    help: "The model's guesses for each [MASK] in the text.",
    fields: () => [field("Text", el("input", { id: "text", value: "Paris is the [MASK] of France." })),
      field("Guesses per mask", el("input", { id: "top-k", type: "number", min: 1, max: 100, value: 5 }))],
    async run() {
      const out = await one("fill-mask", { inputs: [$("text").value], parameters: { top_k: Number($("top-k").value) } });
      const filled = Array.isArray(out.filled) ? out.filled[0] : out.filled;
      return el("div", {}, filled ? el("p", { class: "big", text: filled }) : "",
        ...out.masks.map((mask, i) => el("div", { class: "mask" }, el("h3", { text: `mask ${i + 1}` }),
          el("div", { class: "bars" }, ...mask.predictions.map((p, rank) => bar(p.token, p.score, rank === 0))))));
    },
  },
  choose: {
    title: "Choose",
    help: "Which ending continues the context best.",
    fields: () => [field("Context", el("input", { id: "context", value: "She opened the fridge and" })),
      field("Endings (one per line)", el("textarea", { id: "endings", rows: 3 },
        "took out the milk.\nflew to the moon.\nsang the fridge to sleep."))],
    async run() {
      const endings = lines($("endings").value);
      const out = await one("choose", { inputs: [{ context: $("context").value, endings }] });
      return el("div", { class: "bars" }, ...endings.map((e, i) => bar(e, out.scores[i], i === out.choice)));
    },
  },
  search: {
    title: "Search",
    help: "The records of a served index nearest to the query (POST /search), best first, with their text.",
    fields: () => [
      field("Index", el("select", { id: "index" }, ...indexesOf(state.model).map((name) => el("option", { value: name, text: name })))),
      field("Query", el("input", { id: "query", value: "Who wrote the book?" })),
      field("Hits", el("input", { id: "top-k", type: "number", min: 1, max: 100, value: 5 })),
      field("Show the texts", el("input", { id: "show-text", type: "checkbox", checked: true }))],
    async run() {
      const answer = await post("search", { index: $("index").value, query: $("query").value,
        top_k: Number($("top-k").value), show_text: $("show-text").checked });
      const hits = answer.results[0];
      if (!hits.length) return el("p", { class: "note", text: "no hits" });
      return el("ol", { class: "hits" }, ...hits.map((hit) => el("li", {},
        el("span", { class: "hit-id", text: `${hit.id}${hit.span ? ` [${hit.span[0]}, ${hit.span[1]})` : ""}` }),
        el("span", { class: "note", text: ` score ${fixed(hit.score, 4)}` }),
        hit.text !== undefined ? el("p", { class: "hit-text", text: hit.text }) : "")));
    },
  },
  attention: {
    title: "Attention",
    help: "Where each token looks: pick a layer and a head; hover a token to see only its lines.",
    fields: () => [field("Text", el("input", { id: "text", value: "The cat sat on the mat because it was tired." }))],
    async run() {
      const out = await one("attention", { inputs: [$("text").value] });
      return attentionView(out.tokens, out.attentions);
    },
  },
};

// --- embed: the similarity matrix as a heat map -------------------------------------------------------------

function similarityTable(texts, vectors) {
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0)) || 1;
  const unit = vectors.map((v) => v.map((x) => x / norm(v)));
  const short = (t) => (t.length > 32 ? `${t.slice(0, 30)}…` : t);
  const table = el("table", { class: "heat", id: "similarity" });
  table.append(el("tr", {}, el("th"), ...texts.map((t, j) => el("th", { class: "col", title: t, text: String(j + 1) }))));
  unit.forEach((a, i) => {
    const row = el("tr", {}, el("th", { class: "row", title: texts[i], text: `${i + 1}. ${short(texts[i])}` }));
    unit.forEach((b, j) => {
      const cosine = a.reduce((s, x, k) => s + x * b[k], 0);
      const shade = Math.max(0, cosine); // negative similarities stay white
      row.append(el("td", { "data-value": fixed(cosine, 4), title: `${texts[i]} ↔ ${texts[j]}: ${fixed(cosine, 4)}`,
        style: { background: `rgba(37,99,235,${fixed(shade, 3)})`, color: shade > 0.55 ? "#fff" : "#111" },
        text: fixed(cosine, 2) }));
    });
    table.append(row);
  });
  return el("div", {}, table, el("p", { class: "note", text: `${vectors[0].length} dimensions; cosine of each pair` }));
}

// --- attention: lines between the tokens of one layer and head ----------------------------------------------

function attentionView(tokens, maps) {
  const layer = el("select", { id: "layer" }, ...maps.map((_, i) => el("option", { value: i, text: `layer ${i}` })));
  const head = el("select", { id: "head" }, el("option", { value: "mean", text: "mean of heads" }),
    ...maps[0].map((_, i) => el("option", { value: i, text: `head ${i}` })));
  const drawing = el("div", { class: "attention" });
  const weights = () => {
    const heads = maps[Number(layer.value)];
    if (head.value !== "mean") return heads[Number(head.value)];
    return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
  };
  const draw = () => drawing.replaceChildren(attentionLines(tokens, weights()));
  layer.addEventListener("change", draw);
  head.addEventListener("change", draw);
  draw();
  return el("div", {}, el("div", { class: "controls" }, layer, head), drawing);
}

function attentionLines(tokens, weights) {
  const step = 22, width = 620, left = 170, right = width - 170;
  const picture = svg("svg", { width, height: tokens.length * step + 10, id: "attention-lines", role: "img" });
  const y = (i) => i * step + 16;
  const lines = [];
  weights.forEach((row, i) => row.forEach((w, j) => {
    if (w < 0.02) return; // hairlines only clutter the picture
    const line = svg("line", { x1: left + 6, y1: y(i) - 4, x2: right - 6, y2: y(j) - 4, "stroke-width": 1 + 3 * w,
      "stroke-opacity": w.toFixed(3), "data-from": i, "data-to": j, class: "link" });
    lines.push(line);
    picture.append(line);
  }));
  const focus = (i) => lines.forEach((l) => l.classList.toggle("faded", i !== null && Number(l.dataset.from) !== i));
  tokens.forEach((token, i) => {
    const from = svg("text", { x: left, y: y(i), "text-anchor": "end", class: "token" });
    from.textContent = token;
    from.addEventListener("mouseenter", () => focus(i));
    from.addEventListener("mouseleave", () => focus(null));
    const to = svg("text", { x: right, y: y(i), class: "token" });
    to.textContent = token;
    picture.append(from, to);
  });
  return picture;
}

// --- tabs -------------------------------------------------------------------------------------------------

function tabs(container, names, current, label, choose) {
  container.replaceChildren(...names.map((name) => el("button", {
    type: "button", role: "tab", "data-name": name, "aria-selected": String(name === current),
    class: name === current ? "tab active" : "tab", text: label(name), onclick: () => choose(name),
  })));
}

function indexesOf(model) {
  return Object.entries(state.indexes).filter(([, index]) => Object.values(index.models).includes(model))
    .map(([name]) => name);
}

function viewsOf(model) {
  const search = indexesOf(model).length ? ["search"] : [];
  return [...state.models[model].filter((task) => VIEWS[task]), ...search, "attention"];
}

function chooseModel(model) {
  state.model = model;
  tabs($("models"), Object.keys(state.models), model, (name) => name, chooseModel);
  const views = viewsOf(model);
  chooseTask(views.includes(state.task) ? state.task : views[0]);
}

function chooseTask(task) {
  state.task = task;
  tabs($("tasks"), viewsOf(state.model), task, (name) => VIEWS[name].title, chooseTask);
  const view = VIEWS[task];
  const run = el("button", { id: "run", type: "submit", text: "Run" });
  const form = el("form", { id: "form" }, el("p", { class: "note", text: view.help }), ...view.fields(), run);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError("");
    run.disabled = true;
    $("result").replaceChildren(el("p", { class: "note", text: "running…" }));
    try {
      $("result").replaceChildren(await view.run());
    } catch (failure) {
      $("result").replaceChildren();
      showError(failure.message);
    } finally {
      run.disabled = false;
    }
  });
  $("panel").replaceChildren(form);
  $("result").replaceChildren();
  showError("");
}

// --- start: the key, then the served models (/health needs no key) -----------------------------------------

function setUpKey() {
  $("key").value = localStorage.getItem(KEY_STORE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
    showError("");
    $("key-save").textContent = key ? "Saved" : "Save";
  });
  $("key-forget").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORE);
    $("key").value = "";
    $("key-save").textContent = "Save";
  });
}

async function start() {
  setUpKey();
  try {
    const response = await fetch("health");
    const health = await response.json();
    if (!response.ok) throw new Error(errorText(response.status, health));
    state.indexes = health.indexes || {};
    for (const [name, report] of Object.entries(health.models)) {
      state.models[name] = report.tasks;
      const settings = report.settings || {};
      state.keysRequired = state.keysRequired || Boolean(settings.api_keys);
      state.maxItems = Math.min(state.maxItems, settings.max_items || 64);
    }
  } catch (failure) {
    $("served").textContent = "";
    showError(`cannot list the served models: ${failure.message}`);
    return;
  }
  const names = Object.keys(state.models);
  $("served").textContent = `${names.length} model${names.length === 1 ? "" : "s"} served` +
    (state.keysRequired ? " · this server needs an API key" : "");
  chooseModel(names[0]);
}

document.addEventListener("DOMContentLoaded", start);
