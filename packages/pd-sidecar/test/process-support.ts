import { expect } from "bun:test";
import type { CacheTruth, MockWorker } from "@kv-epp/mock-worker";
import { freePort, spawnBun, waitFor, type ProcessHandle } from "@kv-epp/testkit";

// What the process tests of the connectors share: a sidecar as a process, the requests they send, the metrics and
// ground truth they read.

const MAIN = `${import.meta.dir}/../src/main.ts`;

/** `bun run pd-sidecar` on `host` in front of `decoder` with `args`, once it answers; its handle goes into `into`. */
export async function startSidecarProcess(host: string, decoder: string, args: string[], into: ProcessHandle[]): Promise<string> {
  const port = await freePort(host);
  into.push(spawnBun([MAIN, "--listen", host, "--port", String(port), "--decoder", decoder, ...args], { PD_SIDECAR_LOG_LEVEL: "silent" }, { name: `pd-sidecar ${host}` }));
  const url = `http://${host}:${port}`;
  await waitFor(() => fetch(`${url}/sidecar/metrics`).then((r) => r.ok, () => false), { message: `${url} up` });
  return url;
}

/** A JSON POST naming the prefill worker. */
export const post = (url: string, path: string, body: object, prefiller: string, headers: Record<string, string> = {}) =>
  fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json", "x-prefiller-host-port": prefiller, ...headers }, body: JSON.stringify(body) });

/** The value of the Prometheus sample `line` (name and labels) at `base`, 0 when absent. */
export async function metric(base: string, line: string): Promise<number> {
  const text = await (await fetch(base)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? 0 : Number(found.slice(line.length + 1));
}

export const failures = (url: string, reason: string) => metric(`${url}/sidecar/metrics`, `pd_sidecar_failures_total{reason="${reason}"}`);

/** The block hashes rank 0 of a mock worker holds (its ground truth). */
export const hashes = async (w: MockWorker) => new Set(((await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth).ranks[0]!.blocks.map((b) => b.block_hash));

/**
 * A streamed chat of 4 tokens through the sidecar at `url`, `prefill` named as its prefill worker: the decode worker
 * answers having computed only the last prompt token, pulled the rest, and holds the blocks the prefill worker newly
 * cached (the workers' ground truth); the prefill leg answered.
 */
export async function expectStreamedChatPrefilledRemotely(url: string, prefill: MockWorker, decode: MockWorker, content: string): Promise<void> {
  const pulledLine = `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`;
  const before = await hashes(prefill);
  const pulled = await metric(`${decode.url}/metrics`, pulledLine);
  const messages = [{ role: "user", content }];
  const res = await post(url, "/v1/chat/completions", { model: "mock/model", messages, max_tokens: 4, stream: true, stream_options: { include_usage: true } }, new URL(prefill.url).host);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/event-stream");
  const data = (await res.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
  expect(data.at(-1)).toBe("[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  expect(chunks.filter((c) => c.choices[0]?.delta?.content).length).toBe(4);
  const usage = chunks.at(-1).usage;
  expect(usage.completion_tokens).toBe(4);
  // The decode worker computed the last prompt token alone: every block before it came from the prefill worker.
  expect(usage.prompt_tokens_details).toEqual({ cached_tokens: usage.prompt_tokens - 1 });
  expect(await metric(`${decode.url}/metrics`, pulledLine)).toBe(pulled + Math.ceil(usage.prompt_tokens / 16));
  // Ground truth: the prompt's blocks are new in the prefill worker's cache, and the decode worker's holds them all.
  const newOnPrefill = [...(await hashes(prefill))].filter((h) => !before.has(h));
  expect(newOnPrefill.length).toBe(Math.floor(usage.prompt_tokens / 16));
  const onDecode = await hashes(decode);
  for (const h of newOnPrefill) expect(onDecode.has(h)).toBe(true);
  await waitFor(async () => (await metric(`${url}/sidecar/metrics`, "pd_sidecar_prefill_duration_seconds_count")) >= 1, { message: "the prefill leg answered" });
}

/**
 * A completion through the sidecar at `url` whose prefill leg goes to `host` on a port nothing listens on, while
 * `host`'s bootstrap server is up, so the decode worker waits for KV that never comes: the client gets a 502
 * naming the refused prefill worker (not the decode worker's wait), counted once as `prefill_unreachable`.
 */
export async function expectRefusedPrefillAnswered502(url: string, host: string): Promise<void> {
  const counts = () => Promise.all(["prefill_unreachable", "decode_status", "decoder_unreachable"].map((r) => failures(url, r)));
  const [prefill, decode, decoder] = await counts();
  const refused = `${host}:${await freePort(host)}`;
  const res = await post(url, "/v1/completions", { model: "mock/model", prompt: "nobody prefills this", max_tokens: 2 }, refused);
  expect(res.status).toBe(502);
  expect(((await res.json()) as any).error.message).toContain(`the prefill leg failed (prefill worker ${refused} unreachable`);
  expect(await counts()).toEqual([prefill! + 1, decode!, decoder!]);
}
