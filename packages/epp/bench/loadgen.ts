// Load generator in JS (its own process), for machines where bench/loadgen.c cannot be built: open-loop
// ext_proc requests at a fixed rate, one gRPC stream per request as Envoy does. Decision latency =
// request body message written -> routing answer decoded (the request_headers response in full
// duplex, the request_body response in BUFFERED mode). Prints one JSON line per run, as loadgen.c.
//
// Whatever it spends in JS (its own work, its GC pauses) lands in the measured latency: against the
// same EPP it reports p99 ~0.5-1 ms above the C generator. With @grpc/grpc-js as the client it added
// another ~0.7 ms, so it speaks gRPC's framing over node:http2 itself: request messages are
// serialized once at start (bench/requests.ts), and only the answers it waits for are decoded
// (proto-loader's deserializer). The EPP's own tests drive it with @grpc/grpc-js.
import http2 from "node:http2";
import { loadProtos } from "../src/extproc/protos.ts";
import { messageReader } from "../src/extproc/grpc-frames.ts";
import { extProcRequests, type Mode } from "./requests.ts";

type Args = { target: string; rate: number; durationMs: number; warmupMs: number; seed: number; mode: Mode; tls: boolean };

function args(): Args {
  const a = new Map<string, string>();
  const argv = Bun.argv.slice(2);
  // --tls stands alone (as loadgen.c takes it); every other flag has a value.
  for (let i = 0; i < argv.length; i += argv[i] === "--tls" ? 1 : 2) a.set(argv[i]!.replace(/^--/, ""), argv[i] === "--tls" ? "true" : argv[i + 1]!);
  return {
    target: a.get("target")!,
    rate: Number(a.get("rate")),
    durationMs: Number(a.get("duration-ms") ?? 3000),
    warmupMs: Number(a.get("warmup-ms") ?? 500),
    seed: Number(a.get("seed") ?? 7),
    mode: a.get("mode") === "buffered" ? "buffered" : "full-duplex",
    tls: a.get("tls") === "true",
  };
}

type Route = { header_mutation?: { set_headers?: { header?: { raw_value?: Uint8Array } }[] } };
type Answer = { response?: string; request_headers?: { response?: Route }; request_body?: { response?: Route } };

const WINDOW = 16 << 20;
const SESSION_MEMORY_MB = 1 << 20;

async function main() {
  const o = args();
  const method = loadProtos().extProc.service.Process!;
  const decode = method.responseDeserialize as (b: Buffer) => Answer;
  const { headers: HEADERS, bodies } = extProcRequests(o.mode, o.seed);
  // Envoy runs with large HTTP/2 windows; 64 KiB ones would make the generator the bottleneck. And an
  // HTTP/2 session refuses new streams (ENHANCE_YOUR_CALM) past maxSessionMemory, 10 MB by default:
  // ~200 bodies of 50 KiB waiting on a server that fell behind, after which the generator failed every
  // request instead of showing the server's latency.
  // TLS as the gateways open it to an EPP: ALPN h2, the certificate not verified.
  const session = http2.connect(`${o.tls ? "https" : "http"}://${o.target}`, {
    settings: { initialWindowSize: WINDOW },
    maxSessionMemory: SESSION_MEMORY_MB,
    ...(o.tls ? { rejectUnauthorized: false, servername: "dynamo-epp" } : {}),
  });
  await new Promise<void>((res, rej) => {
    session.once("connect", () => res());
    session.once("error", rej);
  });
  session.setLocalWindowSize(WINDOW);
  const requestHeaders = { ":method": "POST", ":path": method.path, "content-type": "application/grpc", te: "trailers" };

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

  const record = (t0: number, counted: boolean, route: Route | undefined) => {
    if (!counted) return;
    latencies.push(performance.now() - t0);
    if (windowOpen) answeredInWindow++;
    const h = route?.header_mutation?.set_headers?.[0]?.header?.raw_value;
    const ep = h ? Buffer.from(h).toString() : "?";
    endpoints.set(ep, (endpoints.get(ep) ?? 0) + 1);
  };

  // Full duplex: headers and body go out at once; the route comes on the headers response (the body
  // handed back after it is read and dropped). Buffered: the body goes out after the headers'
  // CONTINUE; the route comes on the body response. The stream is half-closed once the route is in.
  const one = (i: number) =>
    new Promise<void>((resolve) => {
      const s = session.request(requestHeaders);
      const counted = measuring;
      if (counted) measuredSent++;
      let t0 = 0;
      const sendBody = () => {
        s.write(bodies[i % bodies.length]!);
        t0 = performance.now();
      };
      let answers = 0;
      s.on(
        "data",
        messageReader((msg) => {
          const r = decode(msg);
          answers++;
          if (o.mode === "buffered" && answers === 1 && r.response === "request_headers") {
            sendBody();
            return true;
          }
          const expected = o.mode === "buffered" ? "request_body" : "request_headers";
          if (r.response === expected) record(t0, counted, r[expected]?.response);
          else errors++;
          s.end();
          return false;
        }),
      );
      s.on("error", () => {
        errors++;
        resolve();
      });
      s.on("close", () => {
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
  session.close();
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
