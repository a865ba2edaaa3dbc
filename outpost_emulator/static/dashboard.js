// The emulator's dashboard: polls GET /__emulator/summary and drives the admin API with JSON
// posts from this same (loopback) origin. Every value from the server is hostile input (customer
// ids, meter names): it reaches the page only as text (textContent, Text nodes, Option), never
// as markup.
"use strict";

const API = "/__emulator/";
const POLL_MS = 1000;
// The summary is built on the emulator's own loop: when it takes long (many events), poll less
// often, so that the page takes at most about a tenth of the emulator's time.
const LOAD_SHARE = 10;
const $ = (id) => document.getElementById(id);

let latest = null; // the last summary shown
let polling = null; // the pending timer
let inFlight = false;
let pollDelay = POLL_MS;
let again = false; // a refresh asked for while one was in flight (it may predate an action)

// A DOM element with text children; attributes limited to class and title.
function el(tag, options, ...children) {
  const node = document.createElement(tag);
  if (options && options.class) node.className = options.class;
  if (options && options.title !== undefined) node.title = String(options.title);
  for (const child of children) {
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const number = (value) =>
  Number(value).toLocaleString("en-US", { maximumFractionDigits: 6 });
const hhmmss = (iso) => iso.slice(11, 19);
const hhmm = (iso) => iso.slice(11, 16);
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

// Server text, cut to a readable length (the whole of it in the tooltip).
const CLIP = 120;
function clipped(tag, cls, text) {
  const value = String(text);
  if (value.length <= CLIP) return el(tag, { class: cls }, value);
  return el(tag, { class: cls, title: value }, `${value.slice(0, CLIP)}…`);
}

function emptyRow(columns, text) {
  const cell = el("td", { class: "empty" }, text);
  cell.colSpan = columns;
  return el("tr", null, cell);
}

// Server calls -----------------------------------------------------------------------------

async function post(name, body) {
  const response = await fetch(API + name, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  let answer = null;
  try {
    answer = await response.json();
  } catch (_) {
    answer = null;
  }
  if (!response.ok) {
    throw new Error(`${response.status}: ${describeDetail(answer)}`);
  }
  return answer;
}

function describeDetail(answer) {
  const detail = answer && answer.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => (d && d.msg ? String(d.msg) : JSON.stringify(d))).join("; ");
  }
  return JSON.stringify(answer);
}

function say(text, isError) {
  const box = $("message");
  box.textContent = text;
  box.className = isError ? "message error" : "message";
  box.hidden = false;
}

async function act(name, body, describe) {
  try {
    const answer = await post(name, body);
    say(describe(answer), false);
  } catch (error) {
    say(`${name}: ${error.message}`, true);
  }
  await refresh();
}

async function refresh() {
  if (inFlight) {
    again = true;
    return;
  }
  inFlight = true;
  try {
    const started = performance.now();
    const response = await fetch(API + "summary", { cache: "no-store" });
    if (!response.ok) throw new Error(`summary answered ${response.status}`);
    latest = await response.json();
    pollDelay = Math.max(POLL_MS, LOAD_SHARE * (performance.now() - started));
    render(latest);
    setLive(true, `live · updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setLive(false, `disconnected (${error.message})`);
  } finally {
    inFlight = false;
  }
  if (again) {
    again = false;
    await refresh();
  }
}

function setLive(on, text) {
  const live = $("live");
  live.className = on ? "live on" : "live off";
  live.textContent = text;
}

function schedule() {
  clearTimeout(polling);
  polling = setTimeout(async () => {
    if (!document.hidden) await refresh();
    schedule();
  }, pollDelay);
}

// Rendering --------------------------------------------------------------------------------

function render(summary) {
  renderClock(summary);
  renderFaults(summary.faults);
  renderMeters(summary.meters);
  renderCustomers(summary);
  renderIngest(summary.ingest_per_minute);
  renderBuckets(summary);
  renderConnections(summary.connections);
}

function renderClock(summary) {
  $("clock-now").textContent = `${summary.now.slice(0, 10)} ${hhmmss(summary.now)} UTC`;
  const { speed, frozen } = summary.clock;
  $("clock-mode").textContent = frozen ? "frozen" : `×${number(speed)}`;
  $("freeze").textContent = frozen ? "Run clock" : "Freeze";
  $("fact-events").textContent =
    `${number(summary.events.count)} (${number(summary.events.current)} in Redis, ` +
    `${number(summary.events.waiting)} waiting, ${number(summary.events.counted)} counted)`;
  $("fact-syncs").textContent = number(summary.counters.close_syncs_run);
  $("fact-snapshots").textContent = number(summary.counters.snapshots_pushed);
  $("fact-cold").textContent = `${summary.cold_until.slice(0, 10)} ${hhmmss(summary.cold_until)}`;
}

function faultLines(faults) {
  const lines = [];
  for (const fault of faults.ingest) {
    const more = `${plural(fault.remaining, "more time")}`;
    if (fault.kind === "error") {
      const retry = fault.retry_after == null ? "" : `, Retry-After ${number(fault.retry_after)} s`;
      lines.push(`ingest answers ${fault.status}${retry}: ${more}`);
    } else if (fault.kind === "hang") {
      lines.push(`ingest hangs ${number(fault.seconds)} s: ${more}`);
    } else {
      lines.push(`ingest loses its response: ${more}`);
    }
  }
  if (faults.syncs_paused) lines.push("syncs paused");
  if (faults.snapshot_delay_s > 0) {
    lines.push(`snapshots delayed ${number(faults.snapshot_delay_s)} s`);
  }
  return lines;
}

function renderFaults(faults) {
  const lines = faultLines(faults);
  const items = lines.map((line) => el("li", { class: "fault" }, line));
  if (!items.length) items.push(el("li", { class: "none" }, "none"));
  $("fault-list").replaceChildren(...items);
}

function aggregationText(aggregation) {
  return aggregation.property == null
    ? aggregation.func
    : `${aggregation.func}(${aggregation.property})`;
}

function filterText(filter) {
  if (!filter.clauses.length) return "every event";
  const parts = filter.clauses.map((clause) =>
    clause.clauses ? `(${filterText(clause)})` :
      `${clause.property} ${clause.operator} ${JSON.stringify(clause.value)}`);
  return parts.join(` ${filter.conjunction} `);
}

function renderMeters(meters) {
  const rows = meters.map((meter) =>
    el("tr", null,
      clipped("td", null, meter.name),
      clipped("td", "mono", aggregationText(meter.aggregation)),
      clipped("td", "mono", filterText(meter.filter))));
  if (!rows.length) rows.push(emptyRow(3, "no meters yet (POST /v1/meters/)"));
  $("meter-rows").replaceChildren(...rows);

  // The grant form's meter choice, rebuilt only when the meters change (keeps the selection).
  const select = $("grant-meter");
  const ids = meters.map((m) => m.id).join(",");
  if (select.dataset.ids !== ids) {
    const chosen = select.value;
    const label = (name) => (name.length <= CLIP ? name : `${name.slice(0, CLIP)}…`);
    select.replaceChildren(...meters.map((m) => new Option(label(m.name), m.id)));
    if (meters.some((m) => m.id === chosen)) select.value = chosen;
    select.dataset.ids = ids;
  }
}

function balanceCell(value) {
  const cell = el("td", { class: "num" }, number(value));
  if (value < 0) cell.classList.add("neg");
  else if (value > 0) cell.classList.add("pos");
  return cell;
}

function renderCustomers(summary) {
  const names = new Map(summary.meters.map((m) => [m.id, m.name]));
  const rows = [];
  const known = [];
  for (const customer of summary.customers) {
    const shownId = customer.customer_id == null ? "(external only)" : customer.customer_id;
    const external = customer.external_id == null ? "—" : customer.external_id;
    if (customer.external_id != null) known.push(new Option("", customer.external_id));
    const meters = customer.meters.length ? customer.meters : [null];
    meters.forEach((m, i) => {
      const idClass = customer.customer_id == null ? "mono muted" : "mono";
      const row = el("tr", { class: "pick", title: "click: fill the grant form" },
        clipped("td", idClass, i === 0 ? shownId : ""),
        clipped("td", null, i === 0 ? external : ""));
      if (m === null) {
        row.append(el("td", { class: "empty" }, "no meters"), el("td"), el("td"), el("td"));
      } else {
        row.append(
          clipped("td", null, names.get(m.meter_id) || m.meter_id),
          el("td", { class: "num" }, number(m.consumed_units)),
          el("td", { class: "num" }, number(m.credited_units)),
          balanceCell(m.balance));
      }
      row.addEventListener("click", () => pick(customer, m));
      rows.push(row);
    });
  }
  if (!rows.length) rows.push(emptyRow(6, "no customers yet"));
  $("customer-rows").replaceChildren(...rows);
  $("known-customers").replaceChildren(...known);
  const hidden = summary.customers_total - summary.customers.length;
  $("customers-note").textContent = hidden > 0
    ? `(the ${summary.customers.length} most recently active of ${summary.customers_total})`
    : "";
}

// A click on a customer's row: the grant form names that customer (and meter).
function pick(customer, meter) {
  const byExternal = customer.external_id != null;
  $("grant-kind").value = byExternal ? "external_customer_id" : "customer_id";
  $("grant-customer").value = byExternal ? customer.external_id : customer.customer_id;
  if (meter !== null) $("grant-meter").value = meter.meter_id;
  $("grant-units").focus();
}

function renderIngest(minutes) {
  const top = Math.max(1, ...minutes.map((m) => m.events));
  const bars = minutes.map((m) => {
    const fill = el("div", { class: "fill" });
    fill.style.height = `${(100 * m.events) / top}%`;
    return el("div", { class: "bar", title: `${hhmm(m.minute)}: ${m.events} events` },
      el("span", { class: "value" }, m.events ? number(m.events) : ""),
      fill,
      el("span", { class: "label" }, hhmm(m.minute)));
  });
  $("ingest-chart").replaceChildren(...bars);
}

function nextStep(bucket, summary) {
  switch (bucket.state) {
    case "open": return `closes at ${hhmmss(bucket.end)}`;
    case "closed":
      return summary.faults.syncs_paused
        ? "close-sync held: syncs paused"
        : `close-sync at ${hhmmss(bucket.sync_at)}`;
    case "synced": return `seals at ${hhmmss(bucket.seal_at)}`;
    default: return "";
  }
}

function renderBuckets(summary) {
  const rows = summary.buckets.map((bucket) =>
    el("tr", null,
      el("td", { class: "mono" }, `${hhmm(bucket.start)}–${hhmm(bucket.end)}`),
      el("td", null, el("span", { class: `pill state-${bucket.state}` }, bucket.state)),
      el("td", { class: "num" }, number(bucket.events)),
      el("td", { class: "num" }, number(bucket.in_redis)),
      el("td", { class: "num" }, number(bucket.waiting)),
      el("td", { class: "num" }, number(bucket.generations)),
      el("td", null, nextStep(bucket, summary))));
  $("bucket-rows").replaceChildren(...rows);
  $("buckets-note").textContent =
    `(5 minutes each; close-sync ${number(summary.sync_delay_s)} s after the end, seal 11 min after)`;
}

function renderConnections(connections) {
  const rows = connections.map((c) => {
    const names = c.subscriptions.map((s) => Object.values(s)[0]);
    const shown = names.slice(0, 4).join(", ") + (names.length > 4 ? ` … +${names.length - 4}` : "");
    return el("tr", null,
      el("td", null, `#${c.id}`),
      el("td", { class: "mono" }, c.client == null ? "?" : c.client),
      el("td", { class: "num" }, number(names.length)),
      clipped("td", "clip", shown),
      el("td", { class: "num" }, number(c.frames_in)),
      el("td", { class: "num" }, number(c.frames_out)));
  });
  if (!rows.length) rows.push(emptyRow(6, "no Outpost instance connected"));
  $("connection-rows").replaceChildren(...rows);
}

// Controls ---------------------------------------------------------------------------------

const FAULTS = {
  ingest_error: { param: "status", value: 503, count: true },
  ingest_hang: { param: "seconds", value: 5, count: true },
  ingest_lose_response: { param: null, count: true },
  syncs: { param: null, count: false },
  snapshot_delay: { param: "seconds", value: 2, count: false },
  drop_websockets: { param: null, count: false },
};

function showFaultInputs() {
  const spec = FAULTS[$("fault-kind").value];
  const label = $("fault-param-label");
  label.hidden = spec.param === null;
  if (spec.param !== null) {
    label.firstChild.textContent = `${spec.param} `;
    $("fault-param").value = String(spec.value);
  }
  $("fault-count-label").hidden = !spec.count;
}

function faultBody() {
  const kind = $("fault-kind").value;
  const param = Number($("fault-param").value);
  const count = Number($("fault-count").value);
  switch (kind) {
    case "ingest_error": return { ingest_error: { status: param, count } };
    case "ingest_hang": return { ingest_hang: { seconds: param, count } };
    case "ingest_lose_response": return { ingest_lose_response: { count } };
    case "syncs": return { syncs: "pause" };
    case "snapshot_delay": return { snapshot_delay: param };
    default: return { drop_websockets: "close" };
  }
}

function clockSaid(answer) {
  return `clock now ${answer.now.slice(0, 10)} ${hhmmss(answer.now)} UTC`;
}

function wire() {
  for (const button of document.querySelectorAll("[data-advance]")) {
    button.addEventListener("click", () =>
      act("clock", { advance: Number(button.dataset.advance) }, clockSaid));
  }
  $("advance-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act("clock", { advance: Number($("advance-seconds").value) }, clockSaid);
  });
  $("freeze").addEventListener("click", () => {
    const frozen = latest !== null && latest.clock.frozen;
    act("clock", { freeze: !frozen }, (a) => (a.frozen ? "clock frozen" : "clock running"));
  });
  $("fault-kind").addEventListener("change", showFaultInputs);
  $("fault-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = $("fault-kind");
    const what = chosen.options[chosen.selectedIndex].text;
    act("faults", faultBody(), () => `done: ${what}`);
  });
  $("clear-faults").addEventListener("click", () =>
    act("faults", { clear: true }, () => "faults cleared, syncs resumed"));
  $("grant-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const body = {
      meter_id: $("grant-meter").value,
      units: Number($("grant-units").value),
      [$("grant-kind").value]: $("grant-customer").value,
    };
    act("credits", body, (a) =>
      `granted ${number(a.units)} units: ${number(a.credited_units)} credited now`);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  wire();
  showFaultInputs();
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  refresh();
  schedule();
});
