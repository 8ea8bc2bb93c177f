// The dashboard's job forms: a new job (its fields and YAML box) and a running job's live settings.
// An ES module that dashboard.js loads; what it needs of the page's state comes in ``ctx``.

const $ = (id) => document.getElementById(id);

export function installForms(ctx) {
  // ---- job forms: a new job, a running job's live settings ----

  // A POST or PATCH whose refusal a form shows: {ok, status, body}; a 401 goes to the login.
  async function send(path, method, body, type) {
    const response = await fetch(path, {
      method, body, cache: "no-store", credentials: "omit",
      headers: { Authorization: "Bearer " + ctx.token(), Accept: "application/json", "Content-Type": type },
    });
    if (response.status === 401) throw new ctx.AuthError("token rejected");
    let answer = null;
    try { answer = await response.json(); } catch (e) { answer = null; }
    return { ok: response.ok, status: response.status, body: answer || {} };
  }

  const lines = (text) => text.split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
  const words = (text) => text.split(/[\s,]+/).filter(Boolean);
  // A number when the text is one, else the text as typed: the API names the field and says what it wants.
  const numberOr = (text) => (text.trim() !== "" && isFinite(Number(text)) ? Number(text) : text.trim());

  function clearErrors(form) {
    for (const slot of form.querySelectorAll(".field-error")) slot.textContent = "";
    for (const label of form.querySelectorAll(".invalid")) label.classList.remove("invalid");
  }

  // Show "path: problem" at the input for the field (the longest data-for that is the path or a parent
  // of it, e.g. scope.allow for scope.allow[1]), else in `fallback`.
  function showFieldError(form, field, problem, fallback) {
    let best = null;
    for (const slot of form.querySelectorAll(".field-error[data-for]")) {
      const path = slot.getAttribute("data-for");
      if (!path || !(field === path || field.startsWith(path + ".") || field.startsWith(path + "["))) continue;
      if (!best || path.length > best.getAttribute("data-for").length) best = slot;
    }
    const slot = best || fallback;
    slot.textContent = field ? `${field}: ${problem}` : problem;
    const label = slot.closest("label");
    if (label) label.classList.add("invalid");
  }

  // The form as one job file: the YAML box first (so a YAML error's line is the box's own), then one line
  // per filled field, its value as JSON (which is YAML). A key in both is refused by the API.
  function newJobDocument() {
    const job = {}, scope = {}, politeness = {};
    const value = (id) => $(id).value.trim();
    const seeds = lines($("nj-seeds").value);
    if (seeds.length) job.seeds = seeds;
    for (const [key, list] of [["hosts", words(value("nj-hosts"))], ["domains", words(value("nj-domains"))],
                               ["allow", lines($("nj-allow").value)], ["deny", lines($("nj-deny").value)]]) {
      if (list.length) scope[key] = list;
    }
    if (Object.keys(scope).length) job.scope = scope;
    if (value("nj-interval")) politeness.min_interval_s = numberOr(value("nj-interval"));
    if (value("nj-per-host")) politeness.per_host = numberOr(value("nj-per-host"));
    if (Object.keys(politeness).length) job.politeness = politeness;
    if (value("nj-max-pages")) job.max_pages = numberOr(value("nj-max-pages"));
    if (value("nj-max-depth")) job.max_depth = numberOr(value("nj-max-depth"));
    const yaml = $("nj-yaml").value.replace(/\s+$/, "");
    const fieldLines = Object.entries(job).map(([key, v]) => `${key}: ${JSON.stringify(v)}\n`).join("");
    return { text: (yaml ? yaml + "\n" : "") + fieldLines, fromFields: new Set(Object.keys(job)) };
  }

  async function startJob(event) {
    event.preventDefault();
    const form = $("new-job"), message = $("new-job-msg"), button = $("btn-start-job");
    clearErrors(form);
    const { text, fromFields } = newJobDocument();
    message.className = "form-msg";
    message.textContent = "starting…";
    button.disabled = true;
    try {
      const answer = await send(ctx.base() + "jobs", "POST", text, "application/yaml");
      const field = answer.body.field || "";
      let problem = answer.body.error || `HTTP ${answer.status}`;
      if (answer.ok) {
        message.textContent = `job ${answer.body.id} started` + (ctx.cluster() ? ` on cluster ${ctx.cluster()}` : "");
        form.setAttribute("data-started", answer.body.id);
        ctx.select(answer.body.id);
      } else if (answer.status === 422) {
        // A key the fields did not send came from the YAML box: the error goes under the box, with its path.
        const top = field.split(/[.[]/)[0];
        if (problem.startsWith("given twice") && fromFields.has(top)) {
          problem = "given twice: in this field and in the YAML box; keep one";  // its lines are of the sent file
        }
        if (fromFields.has(top)) showFieldError(form, field, problem, $("nj-yaml-error"));
        else showFieldError(form, "", field ? `${field}: ${problem}` : problem, $("nj-yaml-error"));
        message.className = "form-msg error";
        message.textContent = "not started: see the marked field";
      } else {
        message.className = "form-msg error";
        message.textContent = `not started: ${problem}`;
      }
    } catch (error) {
      if (error instanceof ctx.AuthError) { ctx.showLogin("The token was rejected (401). Enter it again."); return; }
      message.className = "form-msg error";
      message.textContent = "not started: " + error.message;
    } finally {
      button.disabled = false;
    }
  }

  let liveJob = null;   // the job the live form shows
  let liveShown = {};   // the values it was filled with: only what the user changed is sent

  function showLiveSettings(status) {
    const open = status !== null && (status.state === "running" || status.state === "paused");
    $("live-section").hidden = !open;
    if (!open) { liveJob = null; return; }
    if (liveJob !== status.job) { liveJob = status.job; loadLive(status.job); }
  }

  async function loadLive(job) {
    clearErrors($("live"));
    $("live-msg").textContent = "";
    try {
      fillLive(job, await ctx.api(ctx.jobPath(job, "/config")));
    } catch (error) {
      if (error instanceof ctx.AuthError) return;  // the refresh loop asks for the token
      $("live-msg").className = "form-msg error";
      $("live-msg").textContent = "cannot read the settings: " + error.message;
    }
  }

  function fillLive(job, config) {
    if (job !== liveJob) return;  // another job was selected meanwhile
    const politeness = config.politeness || {};
    liveShown = { "live-interval": String(politeness.min_interval_s), "live-jitter": String(politeness.jitter),
                  "live-per-host": String(politeness.per_host), "live-user-agents": (config.user_agents || []).join("\n"),
                  "live-referers": (config.referers || []).join("\n") };
    for (const [id, text] of Object.entries(liveShown)) $(id).value = text;
    $("live").setAttribute("data-job", job);
    $("live").setAttribute("data-rev", String(config.spec_rev));
    $("live-caption").textContent = `(${job}, revision ${config.spec_rev}; workers apply a change within 2 s)`;
  }

  function liveChanges() {
    const changes = {}, politeness = {};
    const changed = (id) => lines($(id).value).join("\n") !== liveShown[id];
    for (const [id, key] of [["live-interval", "min_interval_s"], ["live-jitter", "jitter"], ["live-per-host", "per_host"]]) {
      if (changed(id)) politeness[key] = numberOr($(id).value);
    }
    if (Object.keys(politeness).length) changes.politeness = politeness;
    for (const [id, key] of [["live-user-agents", "user_agents"], ["live-referers", "referers"]]) {
      if (changed(id)) changes[key] = lines($(id).value).length ? lines($(id).value) : null;
    }
    return changes;
  }

  async function applyLive(event) {
    event.preventDefault();
    const job = liveJob, form = $("live"), message = $("live-msg"), button = $("btn-live-apply");
    if (job === null) return;
    clearErrors(form);
    const changes = liveChanges();
    message.className = "form-msg";
    if (!Object.keys(changes).length) { message.textContent = "nothing changed"; return; }
    message.textContent = "applying…";
    button.disabled = true;
    try {
      const answer = await send(ctx.jobPath(job, "/config"), "PATCH", JSON.stringify(changes), "application/json");
      if (answer.ok) {
        fillLive(job, answer.body);
        message.textContent = `applied: revision ${answer.body.spec_rev}`;
      } else {
        const problem = answer.body.error || `HTTP ${answer.status}`;
        if (answer.status === 422) showFieldError(form, answer.body.field || "", problem, $("live-error"));
        message.className = "form-msg error";
        message.textContent = answer.status === 422 ? "not applied: see the marked field" : `not applied: ${problem}`;
      }
    } catch (error) {
      if (error instanceof ctx.AuthError) { ctx.showLogin("The token was rejected (401). Enter it again."); return; }
      message.className = "form-msg error";
      message.textContent = "not applied: " + error.message;
    } finally {
      button.disabled = false;
    }
  }

  $("new-job").addEventListener("submit", startJob);
  $("live").addEventListener("submit", applyLive);
  return { showLiveSettings };
}
