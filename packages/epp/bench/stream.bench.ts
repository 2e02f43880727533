// bun run bench:stream — what a streamed response costs the decision thread. In full duplex every chunk of the
// response (an SSE event per token from vLLM) passes through the EPP's ext_proc stream and is answered there,
// on the thread that makes every decision: the EPP reads the reply from it (reply warming), times the first
// token and reads the usage (routing quality). The EPP runs in its own process (TLS ext_proc); a gRPC client
// (@grpc/grpc-js, in this process) plays the gateway: per request the headers and a chat body (answered by the
// route), then the response headers and CHUNKS response chunks, each awaited as the gateway awaits them, then the
// usage chunk. Baseline in the same run: the same requests with response_body_mode NONE (the route only).
// Prints the EPP's CPU per request and per chunk, by thread (10 ms ticks of /proc/<pid>/task/<tid>/stat).
// Flags: --requests N (default 200), --chunks N (default 300), --concurrency N (default 4).
import * as grpc from "@grpc/grpc-js";
import { killAll, tempDir } from "@kv-epp/testkit";
import { extProcChannel } from "../src/extproc/client.ts";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import { cpuByThreadUs, spawnBenchEpp, threadsText } from "./generator.ts";
import { WORKLOAD, workerId } from "./workload.ts";

const HOST = "127.0.4.212";
const flag = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const REQUESTS = flag("requests", 200);
const CHUNKS = flag("chunks", 300);
const CONCURRENCY = flag("concurrency", 4);
const enc = new TextEncoder();

type Call = grpc.ClientDuplexStream<ProcessingRequest, unknown>;

/** One ext_proc stream: send messages, await the EPP's answers to them (one each, in order). */
function exchange(call: Call): (...msgs: ProcessingRequest[]) => Promise<void> {
  const waiting: (() => void)[] = [];
  call.on("data", () => waiting.shift()?.());
  call.on("error", () => {});
  return (...msgs) => {
    const answered = msgs.map(() => new Promise<void>((resolve) => waiting.push(resolve)));
    for (const m of msgs) call.write(m);
    return Promise.all(answered).then(() => {});
  };
}

const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });

async function request(client: grpc.Client & { Process(): Call }, i: number, streamed: boolean): Promise<void> {
  const call = client.Process();
  const send = exchange(call);
  const mode = { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: streamed ? "FULL_DUPLEX_STREAMED" : "NONE" } as const;
  const chat = { model: WORKLOAD.model, messages: [{ role: "user", content: `request ${i}: ${"a few words of a question ".repeat(40)}` }], stream: true };
  // In full duplex the headers are answered with the route, once the body is in.
  await send(
    {
      request_headers: { headers: { headers: [header(":method", "POST"), header(":path", "/v1/chat/completions"), header("content-type", "application/json")] } },
      protocol_config: mode,
    },
    { request_body: { body: enc.encode(JSON.stringify(chat)), end_of_stream: true } },
  );
  if (streamed) {
    await send({ response_headers: { headers: { headers: [header(":status", "200"), header("content-type", "text/event-stream")] } } });
    for (let k = 0; k < CHUNKS; k++) {
      const delta = { id: `chatcmpl-${i}`, object: "chat.completion.chunk", created: 1, model: WORKLOAD.model, choices: [{ index: 0, delta: { content: ` word${k}` }, logprobs: null, finish_reason: null }] };
      await send({ response_body: { body: enc.encode(`data: ${JSON.stringify(delta)}\n\n`), end_of_stream: false } });
    }
    const usage = { id: `chatcmpl-${i}`, object: "chat.completion.chunk", choices: [], usage: { prompt_tokens: 210, completion_tokens: CHUNKS, prompt_tokens_details: { cached_tokens: 0 } } };
    await send({ response_body: { body: enc.encode(`data: ${JSON.stringify(usage)}\n\ndata: [DONE]\n\n`), end_of_stream: true } });
  }
  call.end();
}

async function main() {
  const dir = tempDir("stream-bench-");
  const config = `${dir}/epp.json`;
  await Bun.write(config, JSON.stringify({
    model: WORKLOAD.model, blockSize: WORKLOAD.blockSize,
    workers: Array.from({ length: 4 }, (_, w) => ({ id: workerId(w), address: `127.0.4.${100 + w}:8000`, kvEvents: `tcp://127.0.4.${100 + w}:5557` })),
  }));
  const { proc: epp, ports } = await spawnBenchEpp("epp", HOST, config);
  await epp.waitForLog(/"msg":"ready with an EMPTY KV index"/, { timeoutMs: 60_000 });
  const ch = extProcChannel(true);
  const client = new (loadProtos().extProc)(`${HOST}:${ports.grpc}`, ch.credentials, ch.options) as unknown as grpc.Client & { Process(): Call };
  console.log(`bench:stream — ${navigator.hardwareConcurrency} cores, EPP in its own process (TLS ext_proc, byte-fallback tokenizer), ` +
    `${REQUESTS} chat requests ${CONCURRENCY} at a time, ${CHUNKS} response chunks each (an SSE event per token)`);

  const run = async (streamed: boolean) => {
    for (let i = 0; i < REQUESTS; i += CONCURRENCY) {
      await Promise.all(Array.from({ length: Math.min(CONCURRENCY, REQUESTS - i) }, (_, k) => request(client, i + k, streamed)));
    }
  };
  // Warm-up (JIT, connections) of both kinds, unmeasured.
  await run(true);
  await run(false);
  const rows: { label: string; perRequest: Map<string, number>; total: number }[] = [];
  for (const [label, streamed] of [["route only (response_body_mode NONE)", false], [`route + ${CHUNKS} response chunks`, true]] as const) {
    const before = cpuByThreadUs(epp.pid);
    await run(streamed);
    const after = cpuByThreadUs(epp.pid);
    const perRequest = new Map([...after].map(([name, us]) => [name, (us - (before.get(name) ?? 0)) / 1000 / REQUESTS] as [string, number]).filter(([, ms]) => ms > 0));
    rows.push({ label, perRequest, total: [...perRequest.values()].reduce((a, b) => a + b, 0) });
  }
  client.close();
  await killAll();

  const [route, streamedRow] = rows as [(typeof rows)[0], (typeof rows)[0]];
  for (const r of rows) console.log(`${r.label.padEnd(40)} EPP CPU ${r.total.toFixed(2)} ms/request (${threadsText(r.perRequest)})`);
  const mainPerChunkUs = (((streamedRow.perRequest.get("main") ?? 0) - (route.perRequest.get("main") ?? 0)) * 1000) / (CHUNKS + 2);
  const allPerChunkUs = ((streamedRow.total - route.total) * 1000) / (CHUNKS + 2);
  console.log(`per response chunk: decision thread ${mainPerChunkUs.toFixed(1)} µs, whole process ${allPerChunkUs.toFixed(1)} µs ` +
    `(the response's ${CHUNKS + 2} messages against the route-only baseline)`);
  process.exit(0);
}

await main();
