// The P/D chain end to end, every piece a process on the run's loopback range (127.S.62.x) as `bun run demo --pd` starts them:
// client -> gateway (ext_proc to the EPP) -> the EPP's answer (destination: a decode worker's sidecar;
// x-prefiller-host-port: the prefill worker it chose) -> the sidecar's prefill leg to that prefill
// mock worker -> its decode leg, with the prefill's kv_transfer_params, to the decode mock worker. The
// workers' own figures (prompt_tokens_by_source, /admin/cache) say where each prompt was computed.
import { LOOPBACK, tempDir } from "@kv-epp/testkit";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join, resolve } from "node:path";
import { Children } from "../src/demo/children.ts";
import { eppReady, gatewayHealthy, gatewayUrl, layout, startEppReplica, startGateway, startWorker, waitUntil, workerHealthy, type ClusterLayout } from "../src/demo/cluster.ts";
import { GATEWAY_HEADERS } from "../src/demo/gateway.ts";
import { samples } from "../src/demo/epp-metrics.ts";

const REPO_ROOT = resolve(import.meta.dir, "../../..");
const dir = tempDir("pd-chain-");
const children = new Children(REPO_ROOT);
let l: ClusterLayout;

beforeAll(async () => {
  l = layout({ subnet: `${LOOPBACK}.62`, workers: 4, pd: true, capacityBlocks: 4096, blockSize: 16, speed: 0, workerPort: 8000, kvPort: 5557, gatewayPort: 8080, bodyMode: "full-duplex" });
  l.workers.forEach((_, i) => startWorker(children, l, i, dir));
  await Promise.all(l.workers.map((w) => waitUntil(`${w.id}`, () => workerHealthy(w.ip, w.httpPort).catch(() => false), 60_000)));
  startEppReplica(children, l, "epp-a", [], dir);
  await waitUntil("epp-a readiness", () => eppReady(l.epps[0]!.ip), 60_000);
  startGateway(children, l, ["epp-a"], dir);
  await waitUntil("gateway", () => gatewayHealthy(l).catch(() => false), 60_000);
}, 120_000);
afterAll(() => children.stopAll());

const worker = (id: string) => l.workers.find((w) => w.id === id)!;
const engineUrl = (id: string) => `http://${worker(id).ip}:${worker(id).enginePort ?? worker(id).httpPort}`;
const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

async function complete(prompt: number[]): Promise<{ endpoint: string; cached: number; body: any }> {
  const res = await fetch(`${gatewayUrl(l)}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: l.model, prompt, max_tokens: 3 }),
  });
  const body = (await res.json()) as any;
  expect(res.status).toBe(200);
  return { endpoint: res.headers.get(GATEWAY_HEADERS.endpoint)!, cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0, body };
}

async function bySource(id: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${engineUrl(id)}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const s of samples(text, "vllm:prompt_tokens_by_source_total")) out[s.labels.source!] = (out[s.labels.source!] ?? 0) + s.value;
  return out;
}
async function sidecarModes(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const w of l.workers.filter((x) => x.role === "decode"))
    for (const s of samples(await (await fetch(`http://${w.ip}:${w.httpPort}/sidecar/metrics`)).text(), "pd_sidecar_requests_total"))
      out[s.labels.mode!] = (out[s.labels.mode!] ?? 0) + s.value;
  return out;
}
/** Blocks of `prompt` the EPP's index credits to worker `id`. */
async function indexed(id: string, prompt: number[]): Promise<number> {
  const res = await fetch(`http://${l.epps[0]!.ip}:9093/score`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: l.model, token_ids: prompt }) });
  return (((await res.json()) as { scores: Record<string, Record<string, number>> }).scores[id]?.["0"]) ?? 0;
}

describe("EPP -> ext_proc -> P/D sidecar -> prefill mock -> decode mock", () => {
  const long = ids(2000, 10); // 125 blocks: over the EPP's default threshold of 512 uncached tokens
  let first: { endpoint: string; prefill: string; decode: string };

  test("a long prompt goes to a decode worker, which reads what a prefill worker computed", async () => {
    const r = await complete(long);
    const decode = l.workers.find((w) => w.role === "decode" && `${w.ip}:${w.httpPort}` === r.endpoint);
    expect(decode).toBeDefined(); // the destination is always a decode worker (its sidecar)
    expect(r.body.usage.prompt_tokens).toBe(2000);
    expect(r.cached).toBe(0); // the prefill's own hit, as the sidecar reports it
    // The prefill worker computed the prompt; the decode worker read all but its last token.
    const prefills = await Promise.all(["prefill-0", "prefill-1"].map(async (id) => ({ id, s: await bySource(id) })));
    const computedOn = prefills.filter((p) => (p.s.local_compute ?? 0) >= 2000);
    expect(computedOn).toHaveLength(1);
    const d = await bySource(decode!.id);
    expect(d.external_kv_transfer).toBe(1999);
    expect(d.local_compute).toBe(1);
    expect((await sidecarModes()).disaggregated).toBe(1);
    first = { endpoint: r.endpoint, prefill: computedOn[0]!.id, decode: decode!.id };
    // Both workers' KV events reach the EPP's index: it now credits the prompt to both.
    await waitUntil("the index", async () => (await indexed(first.prefill, long)) === 125 && (await indexed(first.decode, long)) === 125);
  });

  test("the same prompt again is mostly cached on its decode worker: not disaggregated", async () => {
    const r = await complete(long);
    expect(r.endpoint).toBe(first.endpoint);
    expect(r.cached).toBe(1984);
    expect(await sidecarModes()).toMatchObject({ disaggregated: 1, local: 1 });
  });

  test("a short prompt stays on its decode worker", async () => {
    await complete(ids(100, 900_000));
    expect((await sidecarModes()).local).toBe(2);
  });

  test("a next turn is prefilled on the prefill worker that holds its prefix", async () => {
    const turn = [...long, ...ids(1200, 50_000)];
    const before = await bySource(first.prefill);
    const r = await complete(turn);
    // The first prompt's 125 blocks were on that prefill worker already: the client is told its hit.
    expect(r.cached).toBe(2000);
    const after = await bySource(first.prefill);
    expect(after.local_cache_hit! - (before.local_cache_hit ?? 0)).toBe(2000);
    expect((await sidecarModes()).disaggregated).toBe(2);
    // Ground truth: that prefill worker holds every full block of the turn.
    const truth = (await (await fetch(`${engineUrl(first.prefill)}/admin/cache`)).json()) as { role: string; ranks: { blocks: unknown[] }[] };
    expect(truth.role).toBe("prefill");
    expect(truth.ranks[0]!.blocks.length).toBeGreaterThanOrEqual(Math.floor(3200 / 16));
  });
});
