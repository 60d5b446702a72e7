// Browser test of the admin UI: /ui/simulator and /ui/state in headless
// Debian chromium, driven by playwright-core (scripts/test-deps.sh installs
// both; no browser is ever downloaded).
//
// The simulator's decisions must be exactly those of `charon simulate` for
// the same rate and pattern: totals, and every tick both have; its capacity
// leases, those of `charon simulate --capacity` for the same clients.
//
// Environment:
//   CHARON_ADMIN        admin server, e.g. http://127.0.0.1:9999 (required)
//   CHARON_BIN          the charon binary, for `charon simulate` (required)
//   CHARON_ARTIFACTS    folder for screenshots (default: a temporary folder)
//   CHARON_PLAYWRIGHT   playwright-core's package folder
//                       (default: <repo>/target/browser-tests/node_modules/playwright-core)
//   CHARON_CHROMIUM     the browser (default: /usr/bin/chromium)
//   CHARON_STATE_QUERY  e.g. namespace=ui-test&resource=api&domain=acme; without it
//                       the state page is not checked
//   CHARON_STATE_EXPECT e.g. {"tier": 2, "hits": [5, 3]}; optional: "phases":
//                       ["active", …], "recent": least number of rows in #recent
//
// Prints what it checked; exits 1 with the reasons on any mismatch.
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const env = process.env;
const ADMIN = (env.CHARON_ADMIN || "").replace(/\/+$/, "");
const BIN = env.CHARON_BIN;
const ARTIFACTS = env.CHARON_ARTIFACTS || fs.mkdtempSync(path.join(os.tmpdir(), "charon-browser-"));
const PLAYWRIGHT = env.CHARON_PLAYWRIGHT || path.join(repo, "target", "browser-tests", "node_modules", "playwright-core");
const CHROMIUM = env.CHARON_CHROMIUM || "/usr/bin/chromium";

const failures = [];
const fail = (message) => { failures.push(message); console.log(`FAIL: ${message}`); };
const ok = (message) => console.log(`ok: ${message}`);
function check(condition, message, detail) {
  if (condition) ok(message); else fail(detail ? `${message}: ${detail}` : message);
}
function abort(message) {
  console.error(`simulator.mjs: ${message}`);
  process.exit(1);
}

if (!ADMIN) abort("set CHARON_ADMIN to the admin server's address, e.g. http://127.0.0.1:9999");
if (!BIN || !fs.existsSync(BIN)) abort(`set CHARON_BIN to the charon binary (got ${BIN})`);
if (!fs.existsSync(path.join(PLAYWRIGHT, "package.json"))) abort(`no playwright-core at ${PLAYWRIGHT}: run scripts/test-deps.sh`);
if (!fs.existsSync(CHROMIUM)) abort(`no chromium at ${CHROMIUM}: run scripts/test-deps.sh`);
fs.mkdirSync(ARTIFACTS, { recursive: true });

const { chromium } = createRequire(import.meta.url)(PLAYWRIGHT);
const adminHost = new URL(ADMIN).hostname;

// A hard stop, whatever hangs.
const watchdog = setTimeout(() => abort("timed out after 180 s"), 180_000);

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  await run();
} catch (error) {
  fail(`unexpected error: ${error && error.stack || error}`);
} finally {
  await browser.close().catch(() => {});
  clearTimeout(watchdog);
}
if (failures.length) {
  console.error(`\n${failures.length} check(s) failed:\n- ${failures.join("\n- ")}`);
  process.exit(1);
}
console.log(`\nall checks passed; screenshots in ${ARTIFACTS}`);

async function run() {
  const context = await browser.newContext({ viewport: { width: 1300, height: 1000 } });
  // Nothing may leave the machine: any other host is aborted and recorded.
  const outside = [];
  await context.route("**/*", (route) => {
    const url = route.request().url();
    let host = "";
    try { host = new URL(url).hostname; } catch (_) { /* not a URL */ }
    if (host === "127.0.0.1" || host === adminHost) return route.continue();
    outside.push(url);
    return route.abort();
  });
  const consoleErrors = [];
  let allowHttp400 = false;
  const watch = (page) => {
    page.on("console", (message) => {
      if (message.type() !== "error") return;
      const text = message.text();
      if (allowHttp400 && /status of 400/.test(text)) return; // the invalid configuration, on purpose
      consoleErrors.push(text);
    });
    page.on("pageerror", (error) => consoleErrors.push(`uncaught: ${error.message}`));
  };

  // ---- the simulator -----------------------------------------------------
  const page = await context.newPage();
  watch(page);
  await page.goto(`${ADMIN}/ui/simulator`);
  await page.waitForSelector("body[data-ready='1']", { timeout: 15_000 });
  ok("/ui/simulator loaded and created a session");
  const quiet = () => page.waitForFunction(() => !document.body.dataset.busy, null, { timeout: 20_000 });
  const sim = () => page.evaluate(() => JSON.parse(JSON.stringify(window.charonSim)));

  // An invalid limit: the server's message is shown, not swallowed.
  allowHttp400 = true;
  await page.fill("#tiers-editor tbody tr:first-child [data-field=limit]", "-1");
  await page.click("#apply");
  await page.waitForSelector("#error.shown", { timeout: 10_000 });
  const shown = (await page.textContent("#error")).trim();
  check(shown.length > 0 && !/HTTP 400/.test(shown), "a negative limit shows the server's error in #error", JSON.stringify(shown));
  await quiet();
  allowHttp400 = false;

  // The penalty preset: a new session.
  const before = (await sim()).sessionId;
  await page.selectOption("#preset", "penalty");
  await page.waitForFunction((id) => window.charonSim.sessionId && window.charonSim.sessionId !== id, before, { timeout: 10_000 });
  await quiet();
  check(!(await page.isVisible("#error")), "the penalty preset applies cleanly (no error shown)");
  const yaml = await page.textContent("#yaml");
  check(/rate:\n\s+tiers:\n\s+- \{limit: 5, window: 1s/.test(yaml) && /limit: 20/.test(yaml), "#yaml shows the penalty tiers", JSON.stringify(yaml));

  // Pause, then requests at virtual instants of our choosing.
  await page.click("#pause");
  check((await page.textContent("#pause")).trim() === "Resume", "the clock pauses");
  await quiet();
  for (let i = 0; i < 30; i++) await page.click("#send");
  await quiet();
  for (let i = 0; i < 3; i++) await page.click("#step-1s");
  for (let i = 0; i < 4; i++) await page.click("#step-100ms");
  for (let i = 0; i < 12; i++) await page.click("#send");
  await page.fill("#send-count", "15");
  await page.click("#send-n");
  await page.click("#step-1s");
  await quiet();
  // A little real time with the rate mode on.
  await page.fill("#rate", "25");
  await page.click("#rate-toggle");
  await page.click("#pause");
  await page.waitForTimeout(1500);
  await page.click("#pause");
  await page.click("#rate-toggle");
  await quiet();
  for (let i = 0; i < 8; i++) await page.click("#step-1s");
  await quiet();
  // Let the page draw the last ticks.
  await page.waitForTimeout(300);

  const state = await sim();
  console.log(`page: ${state.requestCount} requests, clock ${state.clockMs} ms, ${state.ticks.length} ticks, totals ${JSON.stringify(state.totals)}`);
  check(state.error === null, "no error on the page", state.error);
  check(typeof state.pattern === "string" && state.pattern.startsWith("at "), "window.charonSim.pattern is an `at` pattern", String(state.pattern).slice(0, 80));
  const offsets = state.pattern.slice(3).split(" ").map((o) => Number(o.replace(/ms$/, "")));
  check(offsets.length === state.requestCount, "the pattern has one offset per request", `${offsets.length} offsets, ${state.requestCount} requests`);
  check(offsets.every((o, i) => Number.isInteger(o) && (i === 0 || o >= offsets[i - 1])), "the offsets are whole and in order");
  const command = await page.textContent("#command");
  check(command.includes(`--pattern '${state.pattern}'`) && command.includes("--tick 100ms --json"), "#command shows the pattern and the tick");

  // The same through the command line.
  const cli = JSON.parse(execFileSync(BIN, ["simulate", "--rate", state.rate, "--domain", state.domain,
    "--pattern", state.pattern, "--tick", `${state.tickMs}ms`, "--json"], { encoding: "utf8", maxBuffer: 1 << 28 }));
  for (const key of ["granted", "rejected", "warned"]) {
    check(state.totals[key] === cli[key], `total ${key}: page ${state.totals[key]}, charon simulate ${cli[key]}`);
  }
  const domText = async (id) => (await page.textContent(id)).trim();
  check(await domText("#granted") === String(state.totals.granted), "#granted shows the total", await domText("#granted"));
  check(await domText("#rejected") === String(state.totals.rejected), "#rejected shows the total", await domText("#rejected"));

  // Tick by tick, on the ticks both have (by their start).
  const lastRequest = offsets[offsets.length - 1];
  const needed = Math.floor(lastRequest / state.tickMs) + 1;
  const byStart = new Map(cli.ticks.map((tick) => [tick.at_ms, tick]));
  let compared = 0;
  const mismatches = [];
  for (const tick of state.ticks) {
    const theirs = byStart.get(tick.at_ms);
    if (!theirs) continue;
    compared++;
    const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
    const fields = ["granted", "rejected", "warned", "tier", "retry_after_ms", "domain_hits_last_second"]
      .filter((key) => !same(tick[key], theirs[key]));
    const views = (tick.tiers || []).map(({ phase, hits, limit }) => ({ phase, hits, limit }));
    const cliViews = theirs.tiers.map(({ phase, hits, limit }) => ({ phase, hits, limit }));
    if (!same(views, cliViews)) fields.push("tiers");
    if (fields.length) mismatches.push(`tick at ${tick.at_ms} ms differs in ${fields.join(", ")}: page ${JSON.stringify(tick)}, charon simulate ${JSON.stringify(theirs)}`);
  }
  check(mismatches.length === 0, `${compared} ticks equal to charon simulate's`, mismatches.slice(0, 5).join("\n  "));
  const pageStarts = new Set(state.ticks.map((tick) => tick.at_ms));
  const missing = [];
  for (let k = 0; k < needed; k++) if (!pageStarts.has(k * state.tickMs) || !byStart.has(k * state.tickMs)) missing.push(k * state.tickMs);
  check(missing.length === 0, `every tick up to the last request (${needed} ticks) was compared`, `missing ${missing.slice(0, 10).join(", ")}`);
  check(state.ticks.every((tick, i) => tick.at_ms === state.ticks[0].at_ms + i * state.tickMs), "the page's ticks are contiguous and in order");
  check(state.ticks.some((tick) => tick.tier === 2 && tick.tiers[1].phase === "active"), "tier 2 became active");
  check(state.totals.rejected > 0 && state.ticks.some((tick) => tick.rejected > 0), "requests were rejected");
  check(state.ticks.some((tick) => tick.tiers[1] && tick.tiers[1].phase === "cooldown"), "tier 2 cooled down");

  // The chart drew the phases and the decisions.
  const pixels = await page.evaluate(() => {
    const canvas = document.getElementById("chart");
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    const colors = window.charonSim.colors;
    const counts = {};
    for (const name of ["active", "cooldown", "granted", "rejected"]) {
      const hex = colors[name];
      const rgb = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
      let n = 0;
      for (let i = 0; i < data.length; i += 4) {
        if (Math.abs(data[i] - rgb[0]) <= 3 && Math.abs(data[i + 1] - rgb[1]) <= 3 && Math.abs(data[i + 2] - rgb[2]) <= 3 && data[i + 3] > 250) n++;
      }
      counts[name] = n;
    }
    return counts;
  });
  check(pixels.active > 100 && pixels.cooldown > 100 && pixels.granted > 10 && pixels.rejected > 0,
    "the chart shows active and cooldown bands, grants and rejections", JSON.stringify(pixels));
  // ---- capacity leases on the same page ----------------------------------
  // Its own scenario (not the default), typed in as a user would.
  const leaseArgs = {
    capacity: "{capacity: 90, algorithm: fair_share, lease: 6s, refresh_interval: 1s, learning: 0s}",
    clients: "a: 80; b: 20 from 3s then 60 from 8s; c: 50 from 5s until 15s",
    duration: "20s", tick: "500ms",
  };
  for (const [name, value] of Object.entries(leaseArgs)) await page.fill(`#lease-${name}`, value);
  await page.click("#lease-run");
  await page.waitForSelector('body[data-leases="1"]', { timeout: 15_000 });
  const leases = await page.evaluate(() => ({ timeline: window.charonLeases.timeline, command: window.charonLeases.command }));
  const leaseCli = JSON.parse(execFileSync(BIN, ["simulate", "--capacity", leaseArgs.capacity, "--clients", leaseArgs.clients,
    "--duration", leaseArgs.duration, "--tick", leaseArgs.tick, "--json"], { encoding: "utf8" }));
  check(JSON.stringify(leases.timeline) === JSON.stringify(leaseCli),
    `the lease timeline (${leaseCli.ticks.length} ticks, ${leaseCli.clients.length} clients) equals charon simulate --capacity's`,
    `page ${JSON.stringify(leases.timeline).slice(0, 300)}…, charon simulate ${JSON.stringify(leaseCli).slice(0, 300)}…`);
  check(leaseCli.ticks.every((tick) => tick.total <= leaseCli.capacity + 1e-9), "the leases never sum past the capacity");
  check(leases.command.startsWith("charon simulate --capacity '{capacity: 90"), "the page shows the command", leases.command);
  const linePixels = await page.evaluate(() => {
    const canvas = document.getElementById("lease-chart");
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    return window.charonLeases.palette.slice(0, 3).map((hex) => {
      const rgb = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
      let n = 0;
      for (let i = 0; i < data.length; i += 4) {
        if (Math.abs(data[i] - rgb[0]) <= 8 && Math.abs(data[i + 1] - rgb[1]) <= 8 && Math.abs(data[i + 2] - rgb[2]) <= 8 && data[i + 3] > 200) n++;
      }
      return n;
    });
  });
  check(linePixels.every((n) => n > 50), "the lease chart draws a line per client", JSON.stringify(linePixels));
  // A refused run: Chromium logs the 400 itself; that one line is expected.
  const errorsBefore = consoleErrors.length;
  await page.fill("#lease-clients", "a: lots");
  await page.click("#lease-run");
  await page.waitForSelector('body[data-leases="error"]', { timeout: 15_000 });
  const leaseError = await page.evaluate(() => window.charonLeases.error);
  check(/start with what the client wants/.test(leaseError || ""), "a bad client list is refused with the reason", leaseError);
  const logged = consoleErrors.splice(errorsBefore);
  check(logged.every((text) => /status of 400/.test(text)), "the refused run logged only its 400", logged.join(" | "));
  await page.evaluate(() => document.getElementById("error").click());
  for (const [name, value] of Object.entries(leaseArgs)) await page.fill(`#lease-${name}`, value);
  await page.click("#lease-run");
  await page.waitForSelector('body[data-leases="1"]', { timeout: 15_000 });
  await page.locator("#leases").screenshot({ path: path.join(ARTIFACTS, "leases.png") });
  ok(`screenshot ${path.join(ARTIFACTS, "leases.png")}`);

  await page.screenshot({ path: path.join(ARTIFACTS, "simulator.png"), fullPage: true });
  ok(`screenshot ${path.join(ARTIFACTS, "simulator.png")}`);
  await page.close({ runBeforeUnload: true });

  // ---- the state page ----------------------------------------------------
  if (env.CHARON_STATE_QUERY) {
    const expect = JSON.parse(env.CHARON_STATE_EXPECT || "{}");
    const statePage = await context.newPage();
    watch(statePage);
    await statePage.goto(`${ADMIN}/ui/state?${env.CHARON_STATE_QUERY}`);
    await statePage.waitForSelector("#tiers tbody tr[data-hits]", { timeout: 15_000 });
    const read = () => statePage.evaluate(() => ({
      tier: document.getElementById("current-tier").dataset.tier,
      rows: [...document.querySelectorAll("#tiers tbody tr[data-hits]")].map((tr) => ({ hits: Number(tr.dataset.hits), phase: tr.dataset.phase })),
      error: document.getElementById("error").classList.contains("shown") ? document.getElementById("error").textContent : null,
      recent: document.querySelectorAll("#recent tbody tr[data-granted]").length,
    }));
    const matches = (seen) => (expect.tier === undefined || seen.tier === String(expect.tier))
      && (!expect.hits || JSON.stringify(seen.rows.map((r) => r.hits)) === JSON.stringify(expect.hits))
      && (!expect.phases || JSON.stringify(seen.rows.map((r) => r.phase)) === JSON.stringify(expect.phases));
    // The page refreshes every second: give it a few to show the expected state.
    let seen = await read();
    for (let i = 0; i < 10 && !matches(seen); i++) { await statePage.waitForTimeout(500); seen = await read(); }
    check(seen.error === null, "the state page shows no error", seen.error);
    check(matches(seen), `the state page shows ${JSON.stringify(expect)}`,
      `#current-tier ${seen.tier}, rows ${JSON.stringify(seen.rows)}`);
    if (expect.recent !== undefined) check(seen.recent >= expect.recent, `the state page lists at least ${expect.recent} recent decisions`, `${seen.recent} rows`);
    await statePage.screenshot({ path: path.join(ARTIFACTS, "state.png"), fullPage: true });
    ok(`screenshot ${path.join(ARTIFACTS, "state.png")}`);
    await statePage.close();
  } else {
    console.log("skipped: the state page (CHARON_STATE_QUERY is not set)");
  }

  check(outside.length === 0, "no request left 127.0.0.1", outside.join(", "));
  check(consoleErrors.length === 0, "no console error", consoleErrors.join(" | "));
}
