import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startMockWorker, type CacheTruth, type MockWorker } from "@kv-epp/mock-worker";
import { freePort, spawnBun, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";

// `bun run pd-sidecar` as a process in front of a decode-role mock worker, given the header an EPP
// would set: the prefill leg goes to a prefill-role mock, the decode leg to the local one, and the
// workers' ground truth and metrics show where the prompt was computed.

const ROOT = `${import.meta.dir}/../../..`;
let prefill: MockWorker, decode: MockWorker, sidecar: ProcessHandle, url: string;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const };

function startSidecar(host: string, port: number, extra: string[] = [], decoder?: string): ProcessHandle {
  return spawnBun([`${ROOT}/packages/pd-sidecar/src/main.ts`, "--listen", host, "--port", String(port), "--decoder", decoder ?? decode.url, ...extra], { PD_SIDECAR_LOG_LEVEL: "warn" }, { name: `pd-sidecar ${host}` });
}
const healthy = (base: string) => waitFor(() => fetch(`${base}/health`).then((r) => r.ok, () => false), { message: `${base}/health through the sidecar` });

beforeAll(async () => {
  prefill = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.70`, kvEvents: `tcp://${LOOPBACK}.2.70:0`, role: "prefill" });
  decode = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.71`, kvEvents: `tcp://${LOOPBACK}.2.71:0`, role: "decode" });
  const port = await freePort(`${LOOPBACK}.2.72`);
  sidecar = startSidecar(`${LOOPBACK}.2.72`, port);
  url = `http://${LOOPBACK}.2.72:${port}`;
  await healthy(url);
});
afterAll(async () => {
  await sidecar?.kill();
  await Promise.all([prefill?.close(), decode?.close()]);
});

const prefiller = () => new URL(prefill.url).host;
const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
const post = (path: string, body: object, headers: Record<string, string> = {}) =>
  fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
async function metric(base: string, line: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? 0 : Number(found.slice(line.length + 1));
}
const source = (s: string) => `vllm:prompt_tokens_by_source_total{model_name="mock/model",engine="0",source="${s}"}`;
const holds = async (w: MockWorker, firstToken: number) =>
  ((await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth).ranks[0]!.blocks.filter((b) => b.token_ids[0] === firstToken).length;

describe("the P/D sidecar as a process", () => {
  test("with x-prefiller-host-port the prompt is computed on the prefill worker and only read by the decode worker", async () => {
    const prompt = ids(80, 100); // 5 full blocks
    const before = { external: await metric(decode.url, source("external_kv_transfer")), compute: await metric(decode.url, source("local_compute")) };
    const res = await post("/v1/completions", { model: "mock/model", prompt, max_tokens: 4 }, { "x-prefiller-host-port": prefiller() });
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body.usage).toMatchObject({ prompt_tokens: 80, completion_tokens: 4, prompt_tokens_details: { cached_tokens: 0 } });
    expect(body.choices[0].text.length).toBeGreaterThan(0);
    expect((await metric(decode.url, source("external_kv_transfer"))) - before.external).toBe(79);
    expect((await metric(decode.url, source("local_compute"))) - before.compute).toBe(1);
    expect(await metric(prefill.url, source("local_compute"))).toBeGreaterThanOrEqual(80);
    // Both workers hold the prompt's blocks now (ground truth), and the prefill's were released.
    expect(await holds(prefill, 100)).toBe(1);
    expect(await holds(decode, 100)).toBe(1);
    await waitFor(async () => (await metric(prefill.url, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks released" });
    // Sent again, the prefill worker finds its cache: the client is told what the prefill saved.
    const again = (await (await post("/v1/completions", { model: "mock/model", prompt, max_tokens: 1 }, { "x-prefiller-host-port": prefiller() })).json()) as any;
    expect(again.usage.prompt_tokens_details.cached_tokens).toBe(64);
  });

  test("without the header the request passes through and the decode worker prefills it itself", async () => {
    const compute = await metric(decode.url, source("local_compute"));
    const res = await post("/v1/completions", { model: "mock/model", prompt: ids(48, 7000), max_tokens: 2 });
    expect(res.status).toBe(200);
    expect((await metric(decode.url, source("local_compute"))) - compute).toBe(48);
    expect(await holds(prefill, 7000)).toBe(0);
  });

  test("a streamed chat streams from the decode worker with the prefill's cached tokens in its usage", async () => {
    const messages = [{ role: "user", content: "tell me about prefix caches ".repeat(8) }];
    const res = await post("/v1/chat/completions", { model: "mock/model", messages, max_completion_tokens: 3, stream: true, stream_options: { include_usage: true } }, { "x-prefiller-host-port": prefiller() });
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    const data = (await res.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
    expect(data.at(-1)).toBe("[DONE]");
    const usage = JSON.parse(data.at(-2)!).usage;
    expect(usage.completion_tokens).toBe(3);
    expect(usage.prompt_tokens_details).toEqual({ cached_tokens: 0 });
  });

  test("an Anthropic /v1/messages request (Claude Code's ?beta=true) is split too: the decode worker reads the prefill's blocks", async () => {
    const request = { model: "mock/model", system: "You are terse.", messages: [{ role: "user", content: "how does a prefix cache save prefill work? ".repeat(10) }] };
    // count_tokens goes through whole (nothing to prefill); it says how long the prompt is.
    const counted = await post("/v1/messages/count_tokens?beta=true", request, { "x-prefiller-host-port": prefiller() });
    const n = ((await counted.json()) as { input_tokens: number }).input_tokens;
    expect(n).toBeGreaterThan(64);
    const before = { external: await metric(decode.url, source("external_kv_transfer")), compute: await metric(decode.url, source("local_compute")) };
    const res = await post("/v1/messages?beta=true", { ...request, max_tokens: 3 }, { "x-prefiller-host-port": prefiller() });
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ type: "message", role: "assistant", stop_reason: "max_tokens", usage: { output_tokens: 3 } });
    // The decode worker read n - 1 tokens; told the prefill's cache reads instead, the client still counts the whole prompt.
    expect(body.usage.input_tokens + (body.usage.cache_read_input_tokens ?? 0)).toBe(n);
    expect(body).not.toHaveProperty("kv_transfer_params"); // the decode leg's are null, which vLLM leaves out
    expect((await metric(decode.url, source("external_kv_transfer"))) - before.external).toBe(n - 1);
    expect((await metric(decode.url, source("local_compute"))) - before.compute).toBe(1);
    await waitFor(async () => (await metric(prefill.url, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks released" });
  });

  test("an OpenAI /v1/responses request is split too: the decode worker reads the prefill's blocks", async () => {
    const request = { model: "mock/model", instructions: "Answer in a word.", input: "why split prefill from decode? ".repeat(12), max_output_tokens: 3 };
    const sources = ["external_kv_transfer", "local_cache_hit", "local_compute"] as const;
    const read = async () => Object.fromEntries(await Promise.all(sources.map(async (s) => [s, await metric(decode.url, source(s))] as const)));
    const before = await read();
    const res = await post("/v1/responses", request, { "x-prefiller-host-port": prefiller() });
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body).toMatchObject({ object: "response", status: "completed", usage: { output_tokens: 3 }, kv_transfer_params: null });
    const n = body.usage.input_tokens as number;
    expect(n).toBeGreaterThan(64);
    // The decode worker computes the last token alone: the rest it read from the prefill, past the template's opening
    // block it already held from the requests before.
    const after = await read();
    expect(after.local_compute! - before.local_compute!).toBe(1);
    expect(after.external_kv_transfer! + after.local_cache_hit! - before.external_kv_transfer! - before.local_cache_hit!).toBe(n - 1);
    await waitFor(async () => (await metric(prefill.url, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks released" });
  });

  test("a prefill worker's error is the client's answer, an unreachable one a 502, a malformed header a 400", async () => {
    const bad = await post("/v1/completions", { model: "mock/model" }, { "x-prefiller-host-port": prefiller() });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error.param).toBe("prompt");
    const dead = await freePort(`${LOOPBACK}.2.73`);
    expect((await post("/v1/completions", { prompt: "x" }, { "x-prefiller-host-port": `${LOOPBACK}.2.73:${dead}` })).status).toBe(502);
    expect((await post("/v1/completions", { prompt: "x" }, { "x-prefiller-host-port": "http://evil/" })).status).toBe(400);
    expect((await post("/v1/completions", [1, 2] as never, { "x-prefiller-host-port": prefiller() })).status).toBe(400);
    const own = await (await fetch(`${url}/sidecar/metrics`)).text();
    expect(own).toContain('pd_sidecar_failures_total{reason="prefill_status"} 1');
    expect(own).toContain('pd_sidecar_failures_total{reason="prefill_unreachable"} 1');
  });

  test("every other route is the decode worker's: /metrics, /v1/models, /admin/cache", async () => {
    expect(await (await fetch(`${url}/metrics`)).text()).toContain("vllm:num_requests_running");
    expect(((await (await fetch(`${url}/v1/models`)).json()) as any).data[0].id).toBe("mock/model");
    expect(((await (await fetch(`${url}/admin/cache`)).json()) as CacheTruth).role).toBe("decode");
  });

  test("with --allowed-prefillers a prefill target not listed is refused", async () => {
    const port = await freePort(`${LOOPBACK}.2.74`);
    const guarded = startSidecar(`${LOOPBACK}.2.74`, port, ["--allowed-prefillers", prefiller()]);
    try {
      const base = `http://${LOOPBACK}.2.74:${port}`;
      await healthy(base);
      const call = (target: string) => fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-prefiller-host-port": target }, body: JSON.stringify({ prompt: ids(20, 1), max_tokens: 1 }) });
      expect((await call(`${LOOPBACK}.2.75:8000`)).status).toBe(403);
      expect((await call(prefiller())).status).toBe(200);
    } finally {
      await guarded.kill();
    }
  });
});

test("a bad flag stops the sidecar with exit code 2, naming it", async () => {
  const child = spawnBun([`${ROOT}/packages/pd-sidecar/src/main.ts`, "--decoder", "ftp://x"], {}, { name: "pd-sidecar bad" });
  expect(await child.exited).toBe(2);
  expect(child.output()).toContain('invalid value for --decoder: "ftp://x"');
});

test("both legs carry one request id and neither carries the routing headers; each leg has its own rank", async () => {
  type Seen = { headers: Headers; body: any };
  const seen: { prefill?: Seen; decode?: Seen } = {};
  const kv = { do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [[7, 8]], remote_engine_id: "e0", remote_request_id: "cmpl-1-0", remote_host: `${LOOPBACK}.2.76`, remote_port: 1, tp_size: 1 };
  const fakePrefill = Bun.serve({ hostname: `${LOOPBACK}.2.76`, port: 0, fetch: async (req) => {
    seen.prefill = { headers: req.headers, body: await req.json() };
    return Response.json({ id: "cmpl-1", choices: [{ index: 0, text: " the" }], usage: { prompt_tokens: 20, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 16 } }, kv_transfer_params: kv });
  } });
  const fakeDecode = Bun.serve({ hostname: `${LOOPBACK}.2.77`, port: 0, fetch: async (req) => {
    seen.decode = { headers: req.headers, body: await req.json() };
    return Response.json({ id: "cmpl-2", choices: [{ index: 0, text: " the cache" }], usage: { prompt_tokens: 20, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 19 } } });
  } });
  const port = await freePort(`${LOOPBACK}.2.78`);
  const proc = startSidecar(`${LOOPBACK}.2.78`, port, [], `http://${LOOPBACK}.2.77:${fakeDecode.port}`);
  try {
    await waitFor(() => fetch(`http://${LOOPBACK}.2.78:${port}/sidecar/metrics`).then((r) => r.ok, () => false), { message: "the sidecar" });
    const client = { model: "m", prompt: "hello", max_tokens: 2, min_tokens: 2, user: "u" };
    const res = await fetch(`http://${LOOPBACK}.2.78:${port}/v1/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json", "x-prefiller-host-port": `${LOOPBACK}.2.76:${fakePrefill.port}`, authorization: "Bearer t",
        "x-data-parallel-rank": "1", "x-kv-epp-prefill-data-parallel-rank": "3",
      },
      body: JSON.stringify(client),
    });
    expect(((await res.json()) as any).usage.prompt_tokens_details).toEqual({ cached_tokens: 16 });
    expect(seen.prefill!.body).toEqual({ ...client, min_tokens: undefined, max_tokens: 1, stream: false, kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null } });
    expect(seen.decode!.body).toEqual({ ...client, kv_transfer_params: kv });
    const id = seen.prefill!.headers.get("x-request-id");
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(seen.decode!.headers.get("x-request-id")).toBe(id);
    // The EPP's prefill rank is the prefill leg's rank header; the decode leg keeps the destination's.
    expect(seen.prefill!.headers.get("x-data-parallel-rank")).toBe("3");
    expect(seen.decode!.headers.get("x-data-parallel-rank")).toBe("1");
    for (const leg of [seen.prefill!, seen.decode!]) {
      expect(leg.headers.get("x-kv-epp-prefill-data-parallel-rank")).toBeNull();
      expect(leg.headers.get("x-prefiller-host-port")).toBeNull();
      expect(leg.headers.get("authorization")).toBe("Bearer t");
    }
  } finally {
    await proc.kill();
    await fakePrefill.stop(true);
    await fakeDecode.stop(true);
  }
});
