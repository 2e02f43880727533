// Where a large request's pick latency goes (`bun packages/epp/bench/large-body.ts`): an in-process EPP
// (two static workers) whose ext_proc handler is wrapped to timestamp "request body message received"
// and "routing answer written", and a client in another process (this file with --client) that sends
// ~70 KB bodies (12k token ids, the demo's size) the way the demo's client does (BUFFERED: headers,
// wait for CONTINUE, then the body) and the way Envoy's full duplex does, sequentially and 8 at a time.
// Times are wall-clock ms (performance.timeOrigin + now()) so both processes' marks line up.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import pino from "pino";
import { stringify } from "yaml";
import { parseConfig } from "../src/config.ts";
import { extProcChannel } from "../src/extproc/client.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import { startEpp } from "../src/main.ts";
import { mulberry32, tempDir } from "@kv-epp/testkit";

const HOST = "127.0.4.60";
const now = () => performance.timeOrigin + performance.now();
const enc = new TextEncoder();

type Mode = "buffered" | "full-duplex";
type Sample = { headersAt: number; bodyAt: number; answerAt: number; id: number };

function body(seed: number, tokens = 12_000): Uint8Array {
  const next = mulberry32(seed);
  return enc.encode(JSON.stringify({ model: "bench-model", prompt: Array.from({ length: tokens }, () => next() % 151_000), max_tokens: 1 }));
}

async function client(target: string, mode: Mode, n: number, rate: number, busyMs: number): Promise<Sample[]> {
  const { extProc } = loadProtos();
  const ch = extProcChannel(true); // the EPP's default: TLS, unverified as gateways connect
  const stub = new extProc(target, ch.credentials, ch.options) as unknown as grpc.Client & { Process(): grpc.ClientDuplexStream<unknown, any> };
  await new Promise<void>((res, rej) => stub.waitForReady(Date.now() + 5000, (e) => (e ? rej(e) : res())));
  const bodies = Array.from({ length: 16 }, (_, i) => body(1000 + i));
  const one = (id: number) =>
    new Promise<Sample>((resolve, reject) => {
      const call = stub.Process();
      const s: Sample = { id, headersAt: now(), bodyAt: 0, answerAt: 0 };
      const sendBody = () => {
        call.write({ request_body: { body: bodies[id % bodies.length], end_of_stream: true } });
        s.bodyAt = now();
      };
      call.on("data", (a: any) => {
        if (a.immediate_response) return reject(new Error(JSON.stringify(a.immediate_response)));
        if (mode === "buffered" && a.request_headers) return sendBody(); // CONTINUE
        if (s.answerAt === 0) {
          s.answerAt = now();
          call.end();
          resolve(s);
        }
      });
      call.on("error", (e: Error) => (s.answerAt ? undefined : reject(e)));
      call.write({
        request_headers: {
          headers: { headers: [{ key: ":method", raw_value: enc.encode("POST") }, { key: ":path", raw_value: enc.encode("/v1/completions") }, { key: "x-req-id", raw_value: enc.encode(String(id)) }] },
        },
        protocol_config:
          mode === "buffered"
            ? { request_body_mode: "BUFFERED", response_body_mode: "NONE" }
            : { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" },
      });
      if (mode === "full-duplex") sendBody();
    });
  const out: Sample[] = [];
  // Busy: the client's own event loop blocked busyMs out of every 10 ms (as a demo process building
  // other requests' 12k-token bodies and parsing workers' SSE streams in between would be).
  const busy = busyMs > 0 ? setInterval(() => { const end = performance.now() + busyMs; while (performance.now() < end); }, 10) : undefined;
  if (rate > 0) {
    // Open loop: one request every 1000/rate ms, whatever is still in flight.
    const t0 = performance.now();
    const running: Promise<void>[] = [];
    for (let i = 0; i < n; i++) {
      const wait = t0 + (i * 1000) / rate - performance.now();
      if (wait > 0) await Bun.sleep(wait);
      running.push(one(i).then((x) => void out.push(x)));
    }
    await Promise.all(running);
  } else {
    for (let i = 0; i < n; i++) out.push(await one(i));
  }
  clearInterval(busy);
  stub.close();
  return out;
}

if (Bun.argv[2] === "--client") {
  const [target, mode, n, rate, busy] = Bun.argv.slice(3);
  console.log(JSON.stringify(await client(target!, mode as Mode, Number(n), Number(rate), Number(busy))));
  process.exit(0);
}

// --- the EPP side, with its Process handler wrapped to timestamp body received / answer written ---
type ServerMark = { bodyReceivedAt: number; answerWrittenAt: number };
const marks = new Map<number, ServerMark>();
const addService = grpc.Server.prototype.addService;
grpc.Server.prototype.addService = function (service, impl) {
  const process = (impl as { Process?: (call: any) => void }).Process;
  if (!process) return addService.call(this, service, impl);
  const wrapped = (call: any) => {
    const m: ServerMark = { bodyReceivedAt: 0, answerWrittenAt: 0 };
    call.on("data", (msg: any) => {
      if (msg.request_body) m.bodyReceivedAt = now();
      const id = msg.request_headers?.headers?.headers?.find((h: any) => h.key === "x-req-id")?.raw_value;
      if (id) marks.set(Number(Buffer.from(id).toString()), m);
    });
    const write = call.write.bind(call);
    call.write = (msg: any, ...rest: unknown[]) => {
      if (m.answerWrittenAt === 0 && m.bodyReceivedAt > 0) {
        m.answerWrittenAt = now();
      }
      return write(msg, ...rest);
    };
    process(call);
  };
  return addService.call(this, service, { ...impl, Process: wrapped });
};

const dir = tempDir("epp-large-body-");
const config = join(dir, "epp.yaml");
writeFileSync(
  config,
  stringify({
    model: "bench-model",
    blockSize: 16,
    workers: [
      { id: "a", address: `${HOST}:18001`, kvEvents: `tcp://${HOST}:1` },
      { id: "b", address: `${HOST}:18002`, kvEvents: `tcp://${HOST}:2` },
    ],
  }),
);
const cfg = parseConfig(
  ["--config", config, "--listen", HOST, "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--selection-port", "0",
    "--replica-agg", "false", "--scrape-interval-ms", "0", "--subscribe-wait-ms", "0", ...Bun.argv.slice(2)],
  {},
);
const epp = await startEpp(cfg, { log: pino({ level: "warn" }) });
await epp.ready;

const pct = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))]! : NaN;
};
const f = (x: number) => x.toFixed(2);

console.log(`body ${body(1).length} bytes; ms p50/p99 (client headers sent -> answer | client body written -> server body received | server received -> answer written | server written -> client answer)`);
for (const [mode, rate, busy] of [
  ["buffered", 0, 0],
  ["full-duplex", 0, 0],
  ["buffered", 100, 0],
  ["full-duplex", 100, 0],
  ["buffered", 100, 5],
] as [Mode, number, number][]) {
  marks.clear();
  const p = Bun.spawn(["bun", import.meta.path, "--client", `${HOST}:${epp.ports.grpc}`, mode, "300", String(rate), String(busy)], { stdout: "pipe", stderr: "inherit" });
  const samples = JSON.parse(await new Response(p.stdout).text()) as Sample[];
  await p.exited;
  const split = samples.flatMap((s) => {
    const m = marks.get(s.id);
    return m ? [{ up: m.bodyReceivedAt - s.bodyAt, server: m.answerWrittenAt - m.bodyReceivedAt, down: s.answerAt - m.answerWrittenAt }] : [];
  });
  const col = (name: string, xs: number[]) => `${name} ${f(pct(xs, 0.5))}/${f(pct(xs, 0.99))}`;
  console.log(
    [
      `${mode.padEnd(11)} ${rate ? `${rate}/s open loop` : "sequential"}${busy ? `, client busy ${busy}/10 ms` : ""}:`,
      col("total", samples.map((s) => s.answerAt - s.headersAt)),
      col("headers->body sent", samples.map((s) => s.bodyAt - s.headersAt)),
      col("body sent->received", split.map((x) => x.up)),
      col("server", split.map((x) => x.server)),
      col("answer written->received", split.map((x) => x.down)),
    ].join(" | "),
  );
}
await epp.stop({ graceMs: 0 });
process.exit(0);
