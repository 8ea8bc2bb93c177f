// The dashboard's cluster picker (dashboard.js loads it): the clusters this server watches (GET /api/clusters),
// the one picked (kept in sessionStorage), and the base of every other call: /api/clusters/NAME/...
// What it needs of the page comes in ``ctx``: api, el, num, and forget() (drop the job selection on a switch).

const $ = (id) => document.getElementById(id);
const CLUSTER_KEY = "vcrawl-cluster";

export function installClusters(ctx) {
  let cluster = sessionStorage.getItem(CLUSTER_KEY);  // the cluster shown; null: the server's default
  let scoped = false;  // false: a server without /api/clusters, whose calls are today's /api/...

  const base = () => (scoped && cluster ? "api/clusters/" + encodeURIComponent(cluster) + "/" : "api/");

  // Pick ``name``; true if that is a change (the page then shows none of the last cluster's job).
  function pick(name) {
    if (name === cluster) return false;
    cluster = name;
    if (name) sessionStorage.setItem(CLUSTER_KEY, name); else sessionStorage.removeItem(CLUSTER_KEY);
    ctx.forget();
    return true;
  }

  // The clusters, listed and rendered; the picked one's entry (the default when none, or one gone, is picked).
  async function load() {
    let listing;
    try {
      listing = await ctx.api("api/clusters");
    } catch (error) {
      if (error.status !== 404) throw error;
      scoped = false;
      return null;
    }
    const clusters = listing.clusters || [];
    if (!clusters.some((row) => row.name === cluster)) pick(listing.default);
    scoped = true;
    render(clusters);
    return clusters.find((row) => row.name === cluster) || null;
  }

  function render(clusters) {
    const { el, num } = ctx;
    const select = $("cluster-select");
    $("cluster-picker").hidden = clusters.length < 2;
    $("clusters-section").hidden = clusters.length < 2;
    select.replaceChildren(...clusters.map((row) => el("option",
      { value: row.name, "data-up": row.up ? "1" : "0" }, row.name + (row.up ? "" : " (down)"))));
    select.value = cluster || "";
    $("clusters").tBodies[0].replaceChildren(...clusters.map((row) => {
      const states = (row.jobs && row.jobs.states) || {};
      const queued = Object.values(row.queues || {}).reduce((a, b) => a + b, 0);
      return el("tr",
        { "data-cluster": row.name, "data-up": row.up ? "1" : "0", class: row.name === cluster ? "selected" : null,
          title: "show this cluster's jobs" },
        el("td", {}, row.name + (row.default ? " (default)" : "")),
        el("td", { class: row.up ? "state state-completed" : "state state-cancelled" }, row.up ? "up" : "down"),
        el("td", { class: "url", title: row.url }, row.url),
        el("td", {}, row.up ? `${num(states.running || 0)} running, ${num(row.jobs.listed)} listed` : "–"),
        el("td", { class: "num" }, row.up ? num(queued) : "–"),
        el("td", { class: "num" }, row.up ? `${num(row.nodes.alive)}/${num(row.nodes.total)}` : "–"),
        el("td", { class: "num" }, row.up ? Number(row.pages_per_s || 0).toFixed(1) : "–"),
        el("td", { class: "cluster-error", title: row.error || "" }, row.error || ""),
      );
    }));
  }

  $("cluster-select").addEventListener("change", (event) => { if (pick(event.target.value)) ctx.refresh(); });
  $("clusters").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-cluster]");
    if (row && pick(row.getAttribute("data-cluster"))) ctx.refresh();
  });

  return { base, load, current: () => (scoped ? cluster : null), name: () => cluster };
}
