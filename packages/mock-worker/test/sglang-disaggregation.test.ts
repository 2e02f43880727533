import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { freePort, LOOPBACK, waitFor } from "@kv-epp/testkit";
import pino from "pino";
import { startMockWorker, ConfigError, type CacheTruth, type MockWorker } from "../src/index.ts";
import { MockSglangConnector } from "../src/kv-transfer/sglang-connector.ts";
import type { Generation } from "../src/engine/rank-engine.ts";
import { subscribe, syncSubscribers, residentFromEvents } from "./support.ts";

// SGLang's disaggregation between a prefill-mode and a decode-mode mock, driven as SGLang's router (and llm-d's
// sidecar with --kv-connector sglang) drives it: one body with bootstrap_host, bootstrap_port and bootstrap_room
// sent to both at once.

let prefill: MockWorker, decode: MockWorker;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const, eventEncoding: "sglang-map" as const };
const P = `${LOOPBACK}.2.110`, D = `${LOOPBACK}.2.111`;
beforeAll(async () => {
  prefill = await startMockWorker({
    ...common, listen: P, kvEvents: `tcp://${P}:0`, disaggregationMode: "prefill", disaggregationBootstrapPort: 0, disaggregationBootstrapTimeoutS: 0.5,
  });
  // The decode server's own --disaggregation-bootstrap-port is the prefill's: a request's null bootstrap_port means it.
  decode = await startMockWorker({
    ...common, listen: D, kvEvents: `tcp://${D}:0`, disaggregationMode: "decode", disaggregationWaitingTimeoutS: 0.3, disaggregationBootstrapPort: prefill.bootstrapPort!,
  });
});
afterAll(() => Promise.all([prefill?.close(), decode?.close()]));

// The room goes into the JSON text as digits: a double would round 2^63 - 1 and 2^63 - 2 to the same value.
function post(w: MockWorker, path: string, body: object, room: bigint | null, port: number | null = prefill.bootstrapPort!): Promise<Response> {
  const fields = room === null ? "" : `,"bootstrap_host":"${P}","bootstrap_port":${port},"bootstrap_room":${room}`;
  return fetch(`${w.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body).slice(0, -1) + fields + "}" });
}
const truth = async (w: MockWorker) => (await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth;
const blocksFrom = (t: CacheTruth, firstToken: number) => t.ranks[0]!.blocks.filter((b) => b.token_ids[0]! >= firstToken && b.token_ids[0]! < firstToken + 1000).map((b) => b.block_hash).sort();
const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
async function metric(w: MockWorker, line: string): Promise<number> {
  const text = await (await fetch(`${w.url}/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? Number.NaN : Number(found.slice(line.length + 1));
}

describe("SGLang disaggregation (--disaggregation-mode)", () => {
  test("a decode server takes the room's blocks from the prefill server and computes only the last prompt token", async () => {
    const sub = subscribe(decode.ranks[0]!.kvEvents);
    await syncSubscribers(decode.url, [sub]);
    const room = 2n ** 63n - 1n;
    const prompt = ids(100, 1000); // 6 full blocks and 4 tokens
    const [p, d] = await Promise.all([
      post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 5 }, room),
      post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 5 }, room),
    ]);
    expect(p.status).toBe(200);
    expect(d.status).toBe(200);
    const pb = (await p.json()) as any, db = (await d.json()) as any;
    // SGLang's prefill server ends after the first token (FINISH_LENGTH(length=0)); the decode server generates the answer.
    expect(pb.usage).toMatchObject({ prompt_tokens: 100, completion_tokens: 1 });
    expect(pb.choices[0].finish_reason).toBe("length");
    expect(db.usage).toMatchObject({ prompt_tokens: 100, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 99 } });
    // Both caches hold the prompt's blocks under the same hashes, and the decode server published its own.
    const onPrefill = blocksFrom(await truth(prefill), 1000), onDecode = blocksFrom(await truth(decode), 1000);
    expect(onPrefill).toHaveLength(6);
    expect(onDecode).toEqual(onPrefill);
    await waitFor(() => onDecode.every((h) => residentFromEvents(sub.messages).has(BigInt(h))), { message: "the decode's BlockStored events" });
    sub.close();
    expect(await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`)).toBe(7);
    expect(await metric(prefill, `mock_worker_sglang_held_rooms{model_name="mock/model"}`)).toBe(0);
    expect((await truth(decode)).role).toBe("decode");
  });

  test("a streamed chat, its decode sent first: the room is handed over once the prefill computed it", async () => {
    const room = 12345678901234567891n % 2n ** 63n;
    const body = { model: "mock/model", messages: [{ role: "user", content: "where is the prefill? ".repeat(10) }], max_tokens: 3, stream: true };
    const d = post(decode, "/v1/chat/completions", body, room);
    const p = await post(prefill, "/v1/chat/completions", body, room);
    const [pt, dt] = await Promise.all([p.text(), (await d).text()]);
    expect(pt.trim().endsWith("data: [DONE]")).toBe(true);
    const chunks = dt.split("\n").filter((l) => l.startsWith("data: ") && !l.includes("[DONE]")).map((l) => JSON.parse(l.slice(6)));
    expect(chunks.filter((c) => c.choices[0]?.delta?.content).length).toBe(3);
    expect(dt.trim().endsWith("data: [DONE]")).toBe(true);
  });

  test("rooms are exact integers: one that differs past a double's precision never meets its prefill, and both sides fail as SGLang's", async () => {
    const room = 2n ** 63n - 2n; // room - 1 is the same double (2^63)
    const prompt = ids(40, 5000);
    const failures = await metric(decode, `mock_worker_sglang_transfer_failures_total{model_name="mock/model"}`);
    const [p, d] = await Promise.all([
      post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 2 }, room),
      post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 2 }, room - 1n),
    ]);
    expect(d.status).toBe(500);
    const de = ((await d.json()) as any).error.message as string;
    // SGLang's texts: the decode's transfer times out waiting for the KV, the prefill's bootstrap for the decode.
    expect(de).toMatch(new RegExp(`^Decode transfer failed for request rank=0 decode_req\\.req\\.rid='[^']+' decode_req\\.req\\.bootstrap_room=${room - 1n} with exception KVTransferError\\(bootstrap_room=${room - 1n}\\): Request ${room - 1n} timed out after \\d+\\.\\ds in KVPoll\\.WaitingForInput$`));
    expect(p.status).toBe(500);
    expect(((await p.json()) as any).error.message).toMatch(new RegExp(`^Prefill bootstrap failed for request rank=0 req\\.rid='[^']+' req\\.bootstrap_room=${room} with exception KVTransferError\\(bootstrap_room=${room}\\): Request ${room} timed out after \\d+\\.\\ds in KVPoll\\.Bootstrapping$`));
    expect(await metric(decode, `mock_worker_sglang_transfer_failures_total{model_name="mock/model"}`)).toBe(failures + 1);
    // The prefill's blocks were freed (still cached, evictable), the decode computed nothing.
    expect(await metric(prefill, `mock_worker_sglang_held_rooms{model_name="mock/model"}`)).toBe(0);
    expect(blocksFrom(await truth(prefill), 5000)).toHaveLength(2);
    expect(blocksFrom(await truth(decode), 5000)).toHaveLength(0);
  });

  test("a prefill server that cannot be reached fails the decode at once with SGLang's 500 (older SGLang's: newer asks 15 times)", async () => {
    const closed = await freePort(P);
    const d = await post(decode, "/v1/completions", { model: "mock/model", prompt: ids(20, 7000), max_tokens: 1 }, 7n, closed);
    expect(d.status).toBe(500);
    expect(((await d.json()) as any).error.message).toMatch(new RegExp(
      `^Decode handshake failed for request rank=0 decode_req\\.req\\.rid='[^']+' decode_req\\.req\\.bootstrap_room=7 with exception KVTransferError\\(bootstrap_room=7\\): Could not fetch prefill parallel info from bootstrap_addr: ${P.replaceAll(".", "\\.")}:${closed}$`,
    ));
  });

  test("a null bootstrap_port is the receiving server's own --disaggregation-bootstrap-port", async () => {
    const prompt = ids(30, 9000);
    const [p, d] = await Promise.all([
      post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 2 }, 99n, null),
      post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 2 }, 99n, null),
    ]);
    expect(d.status).toBe(200);
    expect(p.status).toBe(200);
    expect(((await d.json()) as any).usage).toMatchObject({ prompt_tokens: 30, prompt_tokens_details: { cached_tokens: 29 } });
  });

  test("a room at or past 2^63 is refused with a 400 (SGLang keeps rooms as signed 64-bit integers)", async () => {
    for (const w of [prefill, decode]) {
      const r = await post(w, "/v1/completions", { model: "mock/model", prompt: "hi", max_tokens: 1 }, 2n ** 63n);
      expect(r.status).toBe(400);
      expect(((await r.json()) as any).error.param).toBe("bootstrap_room");
    }
    expect((await fetch(`http://${P}:${prefill.bootstrapPort}/kv/${2n ** 63n}`)).status).toBe(400);
  });

  test("a streamed prefill sends nothing before a decode server took its room", async () => {
    const room = 4242n;
    const body = { model: "mock/model", messages: [{ role: "user", content: "who goes first? ".repeat(6) }], max_tokens: 3, stream: true };
    let decodeSent = false;
    let firstBeforeDecode: boolean | undefined;
    const p = post(prefill, "/v1/chat/completions", body, room);
    const first = p.then(async (r) => {
      const reader = r.body!.getReader();
      let text = "";
      // The first bytes that carry an event (a chunk, or the error).
      while (!text.includes("data:")) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
      firstBeforeDecode = !decodeSent;
      while (!(await reader.read()).done);
    });
    // The prefill computed its token and holds the room: an old order would have written the token by now.
    await waitFor(async () => (await metric(prefill, `mock_worker_sglang_held_rooms{model_name="mock/model"}`)) === 1, { message: "the room held" });
    for (let i = 0; i < 5; i++) await (await fetch(`${prefill.url}/metrics`)).text();
    decodeSent = true;
    const d = await post(decode, "/v1/chat/completions", body, room);
    expect(d.status).toBe(200);
    await d.text();
    await first;
    expect(firstBeforeDecode).toBe(false);
  });

  test("a prefill whose client left before the offer holds nothing", async () => {
    const connector = new MockSglangConnector({
      mode: "prefill", msPerBlock: 0, blockSize: 16, waitingTimeoutMs: 60_000, bootstrapTimeoutMs: 60_000, log: pino({ level: "silent" }), bootstrapPort: 1,
    });
    let released = 0;
    const gen = { promptTokens: 20, held: { release: () => void released++ } } as unknown as Generation;
    const left = new AbortController();
    left.abort(new Error("client gone"));
    const offered = connector.offer(5n, gen, "rid", left.signal);
    expect(connector.heldRooms).toBe(0);
    await expect(offered).rejects.toThrow("client gone");
    expect(released).toBe(1);
    await expect(connector.take("5", left.signal)).rejects.toThrow("client gone");
  });

  test("a request without a room is SGLang's 400 on either side; a Responses request has none (its model drops the fields)", async () => {
    for (const w of [prefill, decode]) {
      const r = await post(w, "/v1/completions", { model: "mock/model", prompt: "hi", max_tokens: 1 }, null);
      expect(r.status).toBe(400);
      expect(((await r.json()) as any).error.message).toBe("Disaggregated request received without bootstrap room id");
      const resp = await post(w, "/v1/responses", { model: "mock/model", input: "hi" }, 3n);
      expect(resp.status).toBe(400);
    }
    const bad = await fetch(`${decode.url}/v1/completions`, { method: "POST", body: `{"prompt":"hi","bootstrap_host":"${P}","bootstrap_port":1,"bootstrap_room":1.5}` });
    expect(bad.status).toBe(400);
  });

  test("/server_info names the mode; the mode is SGLang's alone", async () => {
    expect(((await (await fetch(`${prefill.url}/server_info`)).json()) as any).disaggregation_mode).toBe("prefill");
    expect(await (await fetch(`http://${P}:${prefill.bootstrapPort}/health`)).text()).toBe("OK");
    expect(decode.bootstrapPort).toBeNull();
    await expect(startMockWorker({ ...common, eventEncoding: "vllm", listen: `${LOOPBACK}.2.112`, kvEvents: `tcp://${LOOPBACK}.2.112:0`, disaggregationMode: "decode" })).rejects.toBeInstanceOf(ConfigError);
  });
});
