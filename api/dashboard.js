// The dashboard's script (dashboard.html): an ES module (strict), served as a file so the page's CSP
// allows no inline script. The job forms are in dashboard-forms.js.
import { installClusters } from "./dashboard-clusters.js";
import { installForms } from "./dashboard-forms.js";

(function () {
  const REFRESH_MS = 2000;
  const CHART_MINUTES = 30;
  const CHART_DAYS = 14;
  const QUEUES = ["download", "download.dynamic", "analysis"];
  const TOKEN_KEY = "vcrawl-token";
  const SVG = "http://www.w3.org/2000/svg";

  let token = null;
  let selected = null;      // the job the user clicked; null: follow the newest
  let shown = null;         // the job the detail panels show
  let timer = null;
  let busy = false;
  let again = false;

  class AuthError extends Error {}

  const $ = (id) => document.getElementById(id);

  // Build DOM nodes; strings become text nodes, so nothing from the API is parsed as HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(child === null || child === undefined ? "" : String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const num = (n) => (typeof n === "number" && isFinite(n) ? n.toLocaleString("en-US") : "–");
  const clock = (epochS) => (epochS ? new Date(epochS * 1000).toLocaleTimeString([], { hour12: false }) : "–");
  const hhmm = (epochS) => new Date(epochS * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });

  function duration(seconds) {
    if (typeof seconds !== "number" || !isFinite(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? `${h}h ${m}m` : m ? `${m}m ${r}s` : `${r}s`;
  }

  function stateClass(state) {
    return "state state-" + String(state || "unknown").replace(/[^a-z]/g, "");
  }

  // ---- token ----

  function takeTokenFromUrl() {
    const params = new URLSearchParams(location.search);
    if (!params.has("token")) return;
    const given = params.get("token");
    if (given) sessionStorage.setItem(TOKEN_KEY, given);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }

  function showLogin(message) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(timer);
    $("app").hidden = true;
    $("btn-logout").hidden = true;
    $("login").hidden = false;
    $("login-msg").textContent = message || "";
    $("token-input").value = "";
    $("token-input").focus();
  }

  function showApp() {
    $("login").hidden = true;
    $("app").hidden = false;
    $("btn-logout").hidden = false;
  }

  // ---- API ----

  async function api(path, method) {
    const response = await fetch(path, {
      method: method || "GET",
      headers: { Authorization: "Bearer " + token, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
    if (response.status === 401) throw new AuthError("token rejected");
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      const error = new Error((body && body.error) || `HTTP ${response.status}`);
      error.status = response.status;
      throw error;
    }
    return body;
  }

  // Every call of the page goes to the cluster picked (dashboard-clusters.js): /api/clusters/NAME/...
  const clusters = installClusters({
    api, el, num,
    forget: () => { selected = null; shown = null; $("action-msg").textContent = ""; },
    refresh: () => refresh(),
  });
  const base = clusters.base;
  const jobPath = (job, rest) => base() + "jobs/" + encodeURIComponent(job) + (rest || "");

  // ---- refresh loop ----

  async function refresh() {
    if (!token) return;
    if (busy) { again = true; return; }
    busy = true;
    clearTimeout(timer);
    try {
      await load();
      $("error").textContent = "";
      $("updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
    } catch (error) {
      if (error instanceof AuthError) {
        busy = false;
        again = false;
        showLogin("The token was rejected (401). Enter it again.");
        return;
      }
      $("error").textContent = "Cannot reach the API: " + error.message + " (retrying every 2 s)";
    }
    busy = false;
    if (again) { again = false; refresh(); return; }
    if (token) timer = setTimeout(refresh, REFRESH_MS);
  }

  async function load() {
    const wanted = selected;
    const picked = await clusters.load();
    const where = clusters.name();
    $("jobs").setAttribute("data-cluster", where || "");
    $("jobs-caption").textContent = `(${picked ? `on cluster ${where}, ` : ""}newest first; click a row to select)`;
    if (picked && !picked.up) { renderDown(picked); return; }
    const [list, queues, nodes] = await Promise.all([api(base() + "jobs?limit=50"), api(base() + "queues"),
      api(base() + "nodes")]);
    if (clusters.name() !== where) return;  // the user picked another cluster meanwhile; `again` reloads
    const jobs = list.jobs || [];
    let job = wanted;
    if (job === null || !jobs.some((row) => row.job === job)) job = jobs.length ? jobs[0].job : null;
    renderJobs(jobs, job);
    renderQueues(queues.queues || {});
    renderNodes(nodes);
    if (job === null) { renderNoJob(); return; }
    const [status, stats, hosts, failures, daily, analyses] = await Promise.all([
      api(jobPath(job)),
      api(jobPath(job, "/stats?minutes=" + CHART_MINUTES)),
      api(jobPath(job, "/hosts?limit=10")),
      api(jobPath(job, "/failures?limit=20")),
      api(jobPath(job, "/daily?limit=1&days=" + CHART_DAYS)),
      api(jobPath(job, "/analyses?limit=10")),
    ]);
    if (selected !== wanted || clusters.name() !== where) return;  // another job or cluster picked; `again` reloads
    shown = job;
    renderJob(status);
    renderChart(stats.minutes || []);
    renderDaily(daily.days || []);
    renderStatuses(status.statuses || {});
    renderHosts(hosts);
    renderFailures(failures.failures || []);
    renderAnalyses(analyses.runs || []);
  }

  // ---- rendering ----

  // The picked cluster does not answer: say so, show none of its (stale) data; the others can be picked.
  function renderDown(row) {
    $("jobs-body").replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "empty cluster-down" },
      `Cluster ${row.name} is down: ${row.error || "no answer"}. Its jobs show again when it answers.`)));
    renderQueues({});
    renderNodes({ nodes: [] });
    renderNoJob();
  }

  function renderJobs(jobs, current) {
    const body = $("jobs-body");
    if (!jobs.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No jobs yet.")));
      return;
    }
    body.replaceChildren(...jobs.map((row) => el("tr",
      { "data-job": row.job, "data-state": row.state, class: row.job === current ? "selected" : null, title: "show this job" },
      el("td", {}, row.job),
      el("td", { class: stateClass(row.state) }, row.state),
      el("td", { class: "num" }, num(row.pages_fetched)),
      el("td", { class: "num" }, num(row.pages_stored)),
      el("td", { class: "num" }, num(row.failed)),
      el("td", { class: "num" }, num(row.queued)),
      el("td", { class: "num" }, num(row.pending)),
      el("td", { class: "num" }, duration(row.elapsed_s)),
      el("td", {}, clock(row.created_at)),
    )));
  }

  function renderQueues(depths) {
    for (const name of QUEUES) {
      const row = document.querySelector(`#queues tr[data-queue="${name}"]`);
      const cell = row.cells[1];
      cell.textContent = num(depths[name]);
      row.setAttribute("data-depth", String(depths[name] ?? ""));
    }
  }

  function renderNodes(listing) {
    const rows = listing.nodes || [];
    $("nodes-section").hidden = rows.length === 0;  // no ring: batches go to the shared download queue
    $("nodes-caption").textContent = rows.length
      ? `(${listing.alive} of ${rows.length} alive, ${num(listing.hosts)} hosts, timeout ${listing.node_timeout_s} s)` : "";
    $("nodes").tBodies[0].replaceChildren(...rows.map((node) => el("tr",
      { "data-node": node.name, "data-state": node.state },
      el("td", {}, node.name),
      el("td", { class: "num" }, num(node.weight)),
      el("td", { class: node.alive ? "state state-completed" : "state state-cancelled" }, node.state),
      el("td", { class: "num" }, (100 * (node.share || 0)).toFixed(1) + "%"),
      el("td", { class: "num" }, num(node.hosts_owned)),
      el("td", { class: "num" }, (node.pages_per_s || 0).toFixed(1)),
      el("td", { class: "num" }, node.heartbeat_age_s == null ? "–" : node.heartbeat_age_s + " s ago"),
      ...nodeStatsCells(node),
    )));
  }

  // SI units, as `vcrawl nodes` prints them.
  const size = (n) => {
    for (const [unit, scale] of [["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) {
      if (n >= scale) return (n / scale < 100 ? (n / scale).toPrecision(3).replace(/\.?0+$/, "") : Math.round(n / scale)) + " " + unit;
    }
    return Math.round(n || 0) + " B";
  };

  function nodeStatsCells(node) {
    const stats = node.stats || {};
    const recent = stats.recent || {};
    return [
      el("td", { class: "num" }, node.concurrency ? num(node.concurrency) : "–"),
      el("td", { class: "num", "data-stat": "requests" }, num(stats.requests || 0)),
      el("td", { class: "num", "data-stat": "successes" }, num(stats.successes || 0)),
      el("td", { class: "num", "data-stat": "failures" }, num(stats.failures || 0)),
      el("td", { class: "num", "data-stat": "hosts_visited" }, num(stats.hosts_visited || 0)),
      el("td", { class: "num", "data-stat": "bytes" }, size(stats.bytes || 0)),
      el("td", { class: "num", "data-stat": "bandwidth" }, stats.bandwidth_bps ? size(stats.bandwidth_bps) + "/s" : "–"),
      el("td", { class: "num", "data-stat": "recent" }, recent.minutes ? (recent.pages_per_s || 0).toFixed(2) : "–"),
    ];
  }

  function renderAnalyses(runs) {
    $("analyses-section").hidden = runs.length === 0;
    $("analyses").tBodies[0].replaceChildren(...runs.map((run) => el("tr",
      { "data-run": run.run, "data-state": run.state },
      el("td", {}, run.run),
      el("td", {}, run.kind === "replay" ? run.analyzer + " (replay)" : run.analyzer),
      el("td", { class: run.state === "failed" ? "state state-cancelled" : run.state === "done" ? "state state-completed" : "state state-running" }, run.state),
      el("td", { class: "num" }, `${num(run.chunks_done)}/${num(run.chunks)}`),
      el("td", { class: "num" }, num(run.urls)),
      el("td", {}, clock(run.started_at)),
      el("td", { title: run.error || run.result || "" }, run.state === "failed" ? (run.error || "") : (run.result || "")),
    )));
  }

  function renderNoJob() {
    shown = null;
    forms.showLiveSettings(null);
    $("analyses-section").hidden = true;
    for (const id of ["job", "rate", "daily-section", "statuses-section", "hosts-section", "failures-section"]) $(id).hidden = true;
  }

  function renderJob(status) {
    for (const id of ["job", "rate", "daily-section", "statuses-section", "hosts-section", "failures-section"]) $(id).hidden = false;
    const failed = Object.values(status.failed || {}).reduce((a, b) => a + b, 0);
    $("job-id").textContent = status.job;
    $("job-state").textContent = status.state;
    $("job-state").className = stateClass(status.state);
    $("job-fetched").textContent = num(status.pages_fetched);
    $("job-stored").textContent = num(status.pages_stored);
    $("job-failed").textContent = num(failed);
    $("job-queued").textContent = num(status.queued);
    $("job-pending").textContent = num(status.pending);
    $("job-hosts").textContent = num(status.hosts);
    $("job-retries").textContent = num(status.retries);
    $("job-elapsed").textContent = duration(status.elapsed_s);
    // The API answers 409 to anything else; these mirror its rules.
    $("btn-pause").disabled = status.state !== "running";
    $("btn-resume").disabled = status.state !== "paused";
    $("btn-cancel").disabled = !(status.state === "running" || status.state === "paused");
    forms.showLiveSettings(status);
  }

  function renderChart(minutes) {
    const chart = $("chart");
    const width = 720, height = 180, left = 40, right = 8, top = 10, bottom = 22;
    const plotW = width - left - right, plotH = height - top - bottom;
    const rates = minutes.map((m) => Number(m.pages_per_s) || 0);
    const total = minutes.reduce((sum, m) => sum + (Number(m.fetched) || 0), 0);
    const peak = Math.max(0, ...rates);
    const yMax = niceCeil(peak || 1);
    const nodes = [
      svg("line", { class: "axis", x1: left, y1: top + plotH, x2: width - right, y2: top + plotH }),
      svg("line", { class: "axis", x1: left, y1: top, x2: width - right, y2: top, "stroke-dasharray": "3 3" }),
      svg("text", { x: left - 4, y: top + 4, "text-anchor": "end" }, trimNum(yMax)),
      svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"),
    ];
    const slot = minutes.length ? plotW / minutes.length : plotW;
    minutes.forEach((m, i) => {
      const h = (rates[i] / yMax) * plotH;
      const running = i === minutes.length - 1;
      const bar = svg("rect", {
        class: running ? "bar now" : "bar", x: left + i * slot + 1, y: top + plotH - h,
        width: Math.max(1, slot - 2), height: h, "data-minute": m.minute, "data-rate": rates[i],
      });
      bar.append(svg("title", {}, `${hhmm(m.minute)}${running ? " (running minute)" : ""}: ` +
        `${rates[i]} pages/s, ${num(m.fetched)} fetched, ${num(m.failed)} failed`));
      nodes.push(bar);
    });
    if (minutes.length) {
      nodes.push(svg("text", { x: left, y: height - 6 }, hhmm(minutes[0].minute)));
      nodes.push(svg("text", { x: width - right, y: height - 6, "text-anchor": "end" }, "now"));
    }
    chart.replaceChildren(...nodes);
    chart.setAttribute("data-points", String(minutes.length));
    chart.setAttribute("data-total", String(total));
    const current = rates.length ? rates[rates.length - 1] : 0;
    $("chart-caption").textContent =
      `(last ${minutes.length} min; now ${trimNum(current)}/s, peak ${trimNum(peak)}/s, ${num(total)} fetched)`;
  }

  // Pages fetched per UTC day, oldest first; the last bar is today (still counting).
  function renderDaily(days) {
    const chart = $("daily-chart");
    const width = 720, height = 180, left = 40, right = 8, top = 10, bottom = 22;
    const plotW = width - left - right, plotH = height - top - bottom;
    const fetched = days.map((d) => Number(d.pages_fetched) || 0);
    const failures = days.map((d) => Object.values(d.failed || {}).reduce((a, b) => a + b, 0));
    const total = fetched.reduce((a, b) => a + b, 0);
    const yMax = niceCeil(Math.max(1, ...fetched));
    const nodes = [
      svg("line", { class: "axis", x1: left, y1: top + plotH, x2: width - right, y2: top + plotH }),
      svg("line", { class: "axis", x1: left, y1: top, x2: width - right, y2: top, "stroke-dasharray": "3 3" }),
      svg("text", { x: left - 4, y: top + 4, "text-anchor": "end" }, trimNum(yMax)),
      svg("text", { x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"),
    ];
    const slot = days.length ? plotW / days.length : plotW;
    days.forEach((d, i) => {
      const h = (fetched[i] / yMax) * plotH;
      const today = i === days.length - 1;
      const bar = svg("rect", {
        class: today ? "bar now" : "bar", x: left + i * slot + 1, y: top + plotH - h,
        width: Math.max(1, slot - 2), height: h, "data-day": d.day, "data-fetched": fetched[i],
        "data-failed": failures[i],
      });
      bar.append(svg("title", {}, `${d.day}${today ? " (today, UTC)" : ""}: ${num(fetched[i])} fetched, ` +
        `${num(d.pages_stored)} stored, ${num(d.bytes)} bytes, ${num(failures[i])} failed`));
      nodes.push(bar);
    });
    if (days.length) {
      nodes.push(svg("text", { x: left, y: height - 6 }, days[0].day));
      nodes.push(svg("text", { x: width - right, y: height - 6, "text-anchor": "end" }, "today"));
    }
    chart.replaceChildren(...nodes);
    chart.setAttribute("data-points", String(days.length));
    chart.setAttribute("data-total", String(total));
    $("daily-caption").textContent = `(UTC, last ${days.length} days; ${num(total)} fetched, ` +
      `${num(failures.reduce((a, b) => a + b, 0))} failed)`;
  }

  function niceCeil(value) {
    const step = Math.pow(10, Math.floor(Math.log10(value)));
    for (const f of [1, 2, 2.5, 5, 10]) if (f * step >= value) return f * step;
    return 10 * step;
  }

  const trimNum = (n) => String(Math.round(n * 100) / 100);

  function renderStatuses(statuses) {
    const codes = Object.keys(statuses).sort();
    const body = $("statuses").tBodies[0];
    if (!codes.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 2, class: "empty" }, "No responses yet.")));
      return;
    }
    body.replaceChildren(...codes.map((code) => el("tr", { "data-status": code },
      el("td", { class: "code-" + String(code).charAt(0).replace(/[^0-9]/g, "") }, code),
      el("td", { class: "num" }, num(statuses[code])),
    )));
  }

  function renderHosts(answer) {
    const rows = answer.hosts || [];
    const body = $("hosts").tBodies[0];
    $("hosts-caption").textContent = rows.length ? `(${rows.length} of ${num(answer.total_hosts)})` : "";
    if (!rows.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 3, class: "empty" }, "No hosts yet.")));
      return;
    }
    body.replaceChildren(...rows.map((row) => el("tr", { "data-host": row.host },
      el("td", {}, row.host),
      el("td", { class: "num" }, num(row.fetched)),
      el("td", { class: "num" }, num(row.failed)),
    )));
  }

  function renderFailures(failures) {
    const body = $("failures").tBodies[0];
    if (!failures.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 3, class: "empty" }, "No failures.")));
      return;
    }
    body.replaceChildren(...failures.map((row) => el("tr", { class: "failure" },
      el("td", {}, clock(row.at)),
      el("td", {}, row.reason),
      el("td", { class: "url", title: row.url }, row.url),
    )));
  }

  // ---- log panel: polls the shown job's lines on its own timer ----

  async function refreshLogs() {
    const job = shown;
    $("logs-section").hidden = job === null || !token;
    if (job === null || !token) return;
    let lines = [];
    try { lines = (await api(jobPath(job, "/logs?limit=50"))).lines || []; } catch (error) { return; }
    if (job !== shown) return;
    const body = $("logs").tBodies[0];
    if (!lines.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "empty" },
        "No lines of this job in the stream (WARNING and above; `vcrawl log-level` ships more).")));
      return;
    }
    body.replaceChildren(...lines.map((line) => el("tr", { "data-level": line.level },
      el("td", {}, clock(Number(line.t))),
      el("td", {}, line.level),
      el("td", {}, line.node || ""),
      el("td", {}, line.logger),
      el("td", { class: "url", title: line.url || "" }, line.url || ""),
      el("td", { title: line.msg }, line.msg),
    )));
  }
  setInterval(refreshLogs, REFRESH_MS);

  // ---- actions ----

  async function act(action) {
    const job = shown;
    if (job === null) return;
    const message = $("action-msg");
    message.className = "";
    message.textContent = `${action}…`;
    for (const id of ["btn-pause", "btn-resume", "btn-cancel"]) $(id).disabled = true;
    try {
      const answer = await api(jobPath(job, "/" + action), "POST");
      message.textContent = `${action}: job is ${answer.state}`;
    } catch (error) {
      if (error instanceof AuthError) { showLogin("The token was rejected (401). Enter it again."); return; }
      message.className = "error";
      message.textContent = `${action} failed: ${error.message}`;
    }
    refresh();
  }

  // ---- wiring ----

  const forms = installForms({
    api, jobPath, base, AuthError, showLogin,
    cluster: clusters.current,
    token: () => token,
    select: (job) => { selected = job; refresh(); },
    refresh: () => refresh(),
  });

  $("jobs-body").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-job]");
    if (!row) return;
    selected = row.getAttribute("data-job");
    $("action-msg").textContent = "";
    refresh();
  });
  for (const id of ["btn-pause", "btn-resume", "btn-cancel"]) {
    $(id).addEventListener("click", (event) => act(event.currentTarget.getAttribute("data-action")));
  }
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("token-input").value.trim();
    if (!given) return;
    token = given;
    sessionStorage.setItem(TOKEN_KEY, given);
    showApp();
    refresh();
  });
  $("btn-logout").addEventListener("click", () => showLogin(""));

  takeTokenFromUrl();
  token = sessionStorage.getItem(TOKEN_KEY);
  if (token) { showApp(); refresh(); } else { showLogin(""); }
})();
