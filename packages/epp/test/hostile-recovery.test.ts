// Hostile and broken recovery peers against a real EPP process (`bun src/main.ts`, as deployed): the
// process stays up (or exits cleanly on SIGTERM), becomes ready the right way, and its memory, read from
// /proc/<pid>/status by this test, stays under a bound set by the recovery budget, not by the peer.
// Also a worker rank announcing more blocks than its vLLM /metrics says it can hold.
import { afterEach, expect, test } from "bun:test";
import { hostileDumpPeer, processMemory, spawnBun, waitFor, type HostileDump, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { FakeWorkerEvents, postJson, scrapeMetric, tokens, writeStaticConfig, type TestWorker } from "./helpers.ts";
import { eppRuntimeEnv } from "../src/runtime-env.ts";

const MAIN = `${import.meta.dir}/../src/main.ts`;
const MOCK_WORKER = `${import.meta.dir}/../../mock-worker/src/main.ts`;
const MiB = 1024 * 1024;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function peer(d: HostileDump, host: string) {
  const p = hostileDumpPeer(d, { hostname: host });
  cleanups.push(p.stop);
  return p;
}

function epp(ip: string, peers: string[], flags: string[], workers: TestWorker[] = []): ProcessHandle {
  const p = spawnBun(
    [MAIN, "--config", writeStaticConfig(workers, peers), "--listen", ip, "--replica-agg", "false", "--scrape-interval-ms", "0", "--recovery-timeout-ms", "3000", ...flags],
    eppRuntimeEnv(), // memory is measured as shipped
    { name: `epp ${ip}` },
  );
  cleanups.push(() => p.kill("SIGKILL", 0));
  return p;
}

/** The EPP's peak resident set so far (the kernel's high-water mark), in MiB. */
function peakMiB(p: ProcessHandle): number {
  const m = processMemory(p.pid);
  if (!m) throw new Error(`${p.name} is gone`);
  return m.peak / MiB;
}

/** After a hostile recovery: up, ready, answering a good request, with the outcome's metric set. */
async function expectReadyAndServing(ip: string, p: ProcessHandle, reason: string): Promise<void> {
  const line = await p.waitForLog(/ready with an EMPTY KV index/, { timeoutMs: 60_000 });
  expect(JSON.parse(line)).toMatchObject({ state: "empty_bootstrap", reason });
  expect(await scrapeMetric(`http://${ip}:9090`, 'dynamo_epp_kv_recovery_state{state="empty_bootstrap"}')).toBe(1);
  const res = await postJson(`http://${ip}:9093/score`, { token_ids: tokens(64, 1) });
  expect(res.status).toBe(200);
  expect(p.running).toBe(true);
}

test("an endless valid dump: the attempt fails at the budget, the peer is set aside, ready empty; memory bounded by the budget", async () => {
  const ip = `${LOOPBACK}.6.10`;
  const bad = peer({ kind: "endless-events", model: "test-model:default", blockSize: 16 }, `${LOOPBACK}.6.11`);
  const p = epp(ip, [bad.url], ["--recovery-budget-mib", "128"]);
  await expectReadyAndServing(ip, p, "peers_failing");
  expect(p.output()).toContain("recovery budget of 134217728 bytes");
  expect(await scrapeMetric(`http://${ip}:9090`, "dynamo_epp_kv_recovery_budget_failures_total")).toBe(1);
  expect(await scrapeMetric(`http://${ip}:9090`, `dynamo_epp_kv_recovery_failing_peers{peer="${bad.url}",reason="budget"}`)).toBe(1);
  // The budget, one doubling of the staged index's linear memory, and the process itself (~150 MiB).
  expect(peakMiB(p)).toBeLessThan(128 * 2 + 250);
  expect(bad.requests()).toBe(1);
}, 90_000);

test("an endless stream of model keys: nothing staged, the body limit ends the attempt, ready empty; memory flat", async () => {
  const ip = `${LOOPBACK}.6.20`;
  const bad = peer({ kind: "endless-models", blockSize: 16 }, `${LOOPBACK}.6.21`);
  // Budget 16 MiB: the body limit is then 64 MiB, reached in seconds.
  const p = epp(ip, [bad.url], ["--recovery-budget-mib", "16"]);
  await expectReadyAndServing(ip, p, "peers_failing");
  expect(p.output()).toContain("dump larger than the limit of 67108864 bytes");
  expect(await scrapeMetric(`http://${ip}:9090`, "dynamo_epp_kv_recovery_budget_failures_total")).toBe(1);
  // Before, each model key cost ~0.9 MiB of staged index: 64 MiB of keys would have been gigabytes.
  expect(peakMiB(p)).toBeLessThan(300);
}, 90_000);

test("a trickling peer fails on the rate floor, three times, and is set aside: ready empty", async () => {
  const ip = `${LOOPBACK}.6.30`;
  const bad = peer({ kind: "trickle", intervalMs: 200 }, `${LOOPBACK}.6.31`);
  const p = epp(ip, [bad.url], ["--recovery-min-rate-bytes", "1000", "--recovery-rate-window-ms", "1000"]);
  await expectReadyAndServing(ip, p, "peers_failing");
  expect(await scrapeMetric(`http://${ip}:9090`, "dynamo_epp_kv_recovery_trickle_failures_total")).toBe(3);
  expect(await scrapeMetric(`http://${ip}:9090`, `dynamo_epp_kv_recovery_failing_peers{peer="${bad.url}",reason="trickle"}`)).toBe(1);
}, 90_000);

test("a peer answering HEAD /dump 200 and then broken dumps is set aside with its reason, logged: ready empty", async () => {
  const ip = `${LOOPBACK}.6.40`;
  const bad = peer({ kind: "broken" }, `${LOOPBACK}.6.41`);
  const p = epp(ip, [bad.url], []);
  await expectReadyAndServing(ip, p, "peers_failing");
  expect(bad.requests()).toBe(3);
  const aside = p.lines.find((l) => l.includes("peer set aside"));
  expect(JSON.parse(aside!)).toMatchObject({ peer: bad.url, reason: "malformed", failures: 3 });
  expect(await scrapeMetric(`http://${ip}:9090`, 'dynamo_epp_kv_recovery_attempt_failures_total{reason="malformed"}')).toBe(3);
  expect(await scrapeMetric(`http://${ip}:9090`, `dynamo_epp_kv_recovery_failing_peers{peer="${bad.url}",reason="malformed"}`)).toBe(1);
}, 90_000);

test("a broken peer beside a serving EPP does not keep recovery from the serving one", async () => {
  const good = epp(`${LOOPBACK}.6.50`, [], []);
  await good.waitForLog(/ready with an EMPTY KV index/, { timeoutMs: 30_000 });
  const bad = peer({ kind: "broken" }, `${LOOPBACK}.6.51`);
  const p = epp(`${LOOPBACK}.6.52`, [bad.url, `http://${LOOPBACK}.6.50:9093`], []);
  const line = await p.waitForLog(/"msg":"recovered KV index from peer"/, { timeoutMs: 60_000 });
  expect(JSON.parse(line)).toMatchObject({ peer: `http://${LOOPBACK}.6.50:9093` });
}, 90_000);

test("the readiness deadline: a peer that never finishes, an operator who chose to start empty after 2 s", async () => {
  const ip = `${LOOPBACK}.6.60`;
  const bad = peer({ kind: "trickle", intervalMs: 100 }, `${LOOPBACK}.6.61`);
  const p = epp(ip, [bad.url], ["--recovery-deadline-ms", "2000", "--recovery-min-rate-bytes", "0", "--recovery-timeout-ms", "60000"]);
  await expectReadyAndServing(ip, p, "deadline");
  expect(p.output()).toContain("the recovery deadline of 2000 ms passed: starting with an EMPTY KV index");
}, 90_000);

for (const [name, d] of [
  ["an endless valid dump", { kind: "endless-events", model: "test-model:default", blockSize: 16 }],
  ["an endless stream of model keys", { kind: "endless-models", blockSize: 16 }],
] as [string, HostileDump][]) {
  test(`SIGTERM while staging ${name}: the process exits 0`, async () => {
    const ip = d.kind === "endless-events" ? `${LOOPBACK}.6.70` : `${LOOPBACK}.6.72`;
    const bad = peer(d, d.kind === "endless-events" ? `${LOOPBACK}.6.71` : `${LOOPBACK}.6.73`);
    const p = epp(ip, [bad.url], ["--recovery-budget-mib", "4096"]);
    await p.waitForLog(/fetching dump from peer/, { timeoutMs: 30_000 });
    // Well into the body: 8 MiB read and staged (or skipped).
    await waitFor(() => bad.bytes() > 8 * MiB, { timeoutMs: 120_000, message: "8 MiB of body read" });
    process.kill(p.pid, "SIGTERM");
    expect(await p.exited).toBe(0);
    expect(p.output()).toContain("shutdown requested");
  }, 180_000);
}

test("a worker rank announcing more blocks than its vLLM's num_gpu_blocks is reset and counted; one within keeps its blocks", async () => {
  const ip = `${LOOPBACK}.6.80`;
  const mockIp = `${LOOPBACK}.6.81`;
  // A real mock worker for /metrics (vllm:cache_config_info num_gpu_blocks=64); the KV events come from
  // publishers in this test, one of which announces more than the worker can hold.
  const mock = spawnBun([MOCK_WORKER, "--listen", mockIp, "--port", "8000", "--kv-events", `tcp://${mockIp}:15557`, "--block-size", "16", "--capacity-blocks", "64", "--speed", "0", "--model", "test-model"], { MOCK_WORKER_LOG_LEVEL: "warn" }, { name: "mock" });
  cleanups.push(() => mock.kill("SIGKILL", 0));
  await waitFor(() => fetch(`http://${mockIp}:8000/metrics`).then((r) => r.ok, () => false), { timeoutMs: 20_000, message: "mock /metrics" });
  expect(await (await fetch(`http://${mockIp}:8000/metrics`)).text()).toContain('num_gpu_blocks="64"');
  const over = await FakeWorkerEvents.start(`${LOOPBACK}.6.82`);
  const within = await FakeWorkerEvents.start(`${LOOPBACK}.6.83`);
  cleanups.push(() => over.close(), () => within.close());
  const metrics = `http://${mockIp}:8000/metrics`;
  const p = epp(ip, [], ["--scrape-interval-ms", "200", "--max-blocks-per-rank", "100000"], [
    { id: "over", address: `${mockIp}:8000`, kvEvents: over.endpoint, metrics } as TestWorker,
    { id: "within", address: `${mockIp}:8001`, kvEvents: within.endpoint, metrics } as TestWorker,
  ]);
  await p.waitForLog(/ready with an EMPTY KV index/, { timeoutMs: 30_000 });
  const blocksOf = async (id: string) =>
    ((await (await fetch(`http://${ip}:9093/workers`)).json()) as { worker_id: string; blocks: number }[]).find((w) => w.worker_id === id)?.blocks;
  await within.storeUntil(tokens(32 * 16, 5), async () => (await blocksOf("within")) === 32, { timeoutMs: 20_000 });
  // 80 blocks in one event: above 64 (learned from /metrics), far below the flag's 100000.
  await waitFor(
    async () => {
      over.storePrompt(tokens(80 * 16, 6));
      return ((await scrapeMetric(`http://${ip}:9090`, "dynamo_epp_kv_rank_capacity_resets_total")) ?? 0) >= 1;
    },
    { timeoutMs: 20_000, intervalMs: 100, message: "rank reset" },
  );
  expect(await blocksOf("over")).toBe(0);
  expect(await blocksOf("within")).toBe(32);
  const warn = JSON.parse(p.lines.find((l) => l.includes("above its KV capacity"))!);
  expect(warn).toMatchObject({ worker: "over", rank: 0, blocks: 80, capacity: 64 });
  // the ranks' scraped capacities together (64 + 64) size the index's tables
  expect(await scrapeMetric(`http://${ip}:9090`, "dynamo_epp_kv_index_reserved_residencies")).toBe(128);
  expect(p.lines.some((l) => l.includes("KV index tables reserved for the ranks' KV capacity") && l.includes('"residencies":128'))).toBe(true);
  expect(p.running).toBe(true);
}, 90_000);
