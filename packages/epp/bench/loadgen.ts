// Load generator (its own process): open-loop ext_proc requests at a fixed rate, one gRPC stream per
// request as Envoy does, full-duplex mode. Decision latency = last body byte written -> routing answer
// (request_headers response) received. Prints one JSON line per run.
import * as grpc from "@grpc/grpc-js";
import { loadProtos } from "../src/extproc/protos.ts";
import { requestBodies } from "./workload.ts";

type Args = { target: string; rate: number; durationMs: number; warmupMs: number; seed: number; mode: "full-duplex" | "buffered" };

function args(): Args {
  const a = new Map<string, string>();
  const argv = Bun.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) a.set(argv[i]!.replace(/^--/, ""), argv[i + 1]!);
  return {
    target: a.get("target")!,
    rate: Number(a.get("rate")),
    durationMs: Number(a.get("duration-ms") ?? 3000),
    warmupMs: Number(a.get("warmup-ms") ?? 500),
    seed: Number(a.get("seed") ?? 7),
    mode: a.get("mode") === "buffered" ? "buffered" : "full-duplex",
  };
}

const enc = new TextEncoder();
const headersMsg = (mode: Args["mode"]) => ({
  request_headers: {
    headers: { headers: [{ key: ":method", raw_value: enc.encode("POST") }, { key: ":path", raw_value: enc.encode("/v1/completions") }] },
  },
  protocol_config:
    mode === "buffered"
      ? { request_body_mode: "BUFFERED", response_body_mode: "NONE" }
      : { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" },
});

async function main() {
  const o = args();
  const bodies = requestBodies(512, o.seed);
  const { extProc } = loadProtos();
  const client = new extProc(o.target, grpc.credentials.createInsecure(), {
    "grpc.max_receive_message_length": 64 << 20,
    // Envoy runs with large HTTP/2 windows; a 64 KiB one here would make the generator the bottleneck
    // for ~50 KiB bodies coming back on every stream.
    "grpc-node.flow_control_window": 16 << 20,
  }) as unknown as grpc.Client & {
    Process(): grpc.ClientDuplexStream<unknown, { response?: string; immediate_response?: unknown; request_body?: any }>;
  };
  await new Promise<void>((res, rej) => client.waitForReady(Date.now() + 5000, (e) => (e ? rej(e) : res())));

  const latencies: number[] = [];
  let answeredInWindow = 0;
  let windowOpen = false;
  const endpoints = new Map<string, number>();
  let sent = 0;
  let done = 0;
  let errors = 0;
  let measuring = false;
  let measuredSent = 0;
  let measuredDone = 0;

  const HEADERS = headersMsg(o.mode);
  const record = (r: any, t0: number, counted: boolean, route: any) => {
    if (!counted) return;
    latencies.push(performance.now() - t0);
    if (windowOpen) answeredInWindow++;
    const h = route?.header_mutation?.set_headers?.[0]?.header?.raw_value;
    const ep = h ? Buffer.from(h).toString() : "?";
    endpoints.set(ep, (endpoints.get(ep) ?? 0) + 1);
  };

  // Full duplex: headers and body go out at once; the route comes on the headers response, then the
  // body is handed back. Buffered: the body goes out after the headers' CONTINUE; the route comes on
  // the body response.
  const one = (i: number) =>
    new Promise<void>((resolve) => {
      const s = client.Process();
      const counted = measuring;
      if (counted) measuredSent++;
      let t0 = 0;
      let gotRoute = false;
      const sendBody = () => {
        s.write({ request_body: { body: bodies[i % bodies.length], end_of_stream: true } });
        t0 = performance.now();
      };
      s.on("data", (r: any) => {
        if (o.mode === "buffered") {
          if (r.response === "request_headers") return sendBody();
          if (r.response === "request_body") record(r, t0, counted, r.request_body?.response);
          else errors++;
          s.end();
          return;
        }
        if (!gotRoute) {
          gotRoute = true;
          if (r.response !== "request_headers") {
            errors++;
            s.end();
          } else record(r, t0, counted, r.request_headers?.response);
          return;
        }
        if (r.request_body?.response?.body_mutation?.streamed_response?.end_of_stream) s.end();
      });
      s.on("error", () => {
        errors++;
        resolve();
      });
      s.on("end", () => {
        done++;
        if (counted) measuredDone++;
        resolve();
      });
      s.write(HEADERS);
      if (o.mode !== "buffered") sendBody();
    });

  const inflight: Promise<void>[] = [];
  const start = performance.now();
  const total = o.warmupMs + o.durationMs;
  let measureStart = 0;
  // Open loop: requests go out on schedule whatever the latency, so a slow server shows as latency.
  while (performance.now() - start < total) {
    const now = performance.now() - start;
    if (!measuring && now >= o.warmupMs) {
      measuring = true;
      windowOpen = true;
      measureStart = performance.now();
    }
    const due = Math.floor((now / 1000) * o.rate);
    while (sent < due) inflight.push(one(sent++));
    await Bun.sleep(1);
  }
  measuring = false;
  windowOpen = false;
  const measuredMs = performance.now() - measureStart;
  await Promise.race([Promise.all(inflight), Bun.sleep(10_000)]);
  client.close();
  latencies.sort((a, b) => a - b);
  const q = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? NaN;
  console.log(
    JSON.stringify({
      rate: o.rate,
      sent: measuredSent,
      completed: measuredDone,
      // Answers that arrived inside the window: a server falling behind answers fewer than offered.
      achieved: (answeredInWindow / measuredMs) * 1000,
      p50: q(0.5),
      p90: q(0.9),
      p99: q(0.99),
      max: latencies.at(-1) ?? NaN,
      errors,
      endpoints: endpoints.size,
      unfinished: sent - done,
    }),
  );
  process.exit(0);
}

await main();
