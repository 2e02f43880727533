// Preload for any process that drives ext_proc with @grpc/grpc-js (e.g. the demo):
//   bun --preload ./packages/epp/bench/ext-proc-timeline.ts packages/trace-replay/src/demo.ts ...
// Per client stream it marks request_headers written, first answer (CONTINUE in BUFFERED mode) received,
// request_body written, second answer (the route) received, and prints percentiles at exit. The client
// side of "where does pick latency go" (the server side: bench/large-body.ts and the EPP's
// dynamo_epp_pick_duration_seconds). Hooks grpc-js's ClientDuplexStreamImpl (its makeClientConstructor
// captures the request functions at load time, so a Client.prototype patch would not be seen).
import { createRequire } from "node:module";

const callModule = createRequire(import.meta.path)("@grpc/grpc-js/build/src/call.js") as {
  ClientDuplexStreamImpl: { prototype: { _write(msg: unknown, enc: unknown, cb: unknown): unknown; on(ev: string, f: () => void): void } };
};
type Row = { headers: number; first: number; body: number; second: number; bytes: number };
const rows: Row[] = [];
const proto = callModule.ClientDuplexStreamImpl.prototype;
const write = proto._write;
proto._write = function (this: typeof proto & { __row?: Row }, msg: any, enc: unknown, cb: unknown) {
  let r = this.__row;
  if (!r) {
    const row: Row = (r = this.__row = { headers: 0, first: 0, body: 0, second: 0, bytes: 0 });
    let answers = 0;
    this.on("data", () => {
      const t = performance.now();
      if (++answers === 1) row.first = t;
      else if (answers === 2) {
        row.second = t;
        rows.push(row);
      }
    });
  }
  const t = performance.now();
  if (msg?.request_headers && !r.headers) r.headers = t;
  if (msg?.request_body && !r.body) {
    r.body = t;
    r.bytes = msg.request_body.body?.length ?? 0;
  }
  return write.call(this, msg, enc, cb);
};

process.on("exit", () => {
  const done = rows.filter((r) => r.headers && r.body);
  if (done.length === 0) return console.error("ext-proc-timeline: no complete streams");
  const col = (f: (r: Row) => number, unit = "ms") => {
    const s = done.map(f).sort((a, b) => a - b);
    const p = (q: number) => s[Math.floor(q * (s.length - 1))]!.toFixed(1);
    return `p50 ${p(0.5)} p90 ${p(0.9)} p99 ${p(0.99)} ${unit}`;
  };
  console.error(`ext-proc-timeline: ${done.length} streams, body ${col((r) => r.bytes / 1000, "KB")}`);
  console.error(`  headers written -> first answer   ${col((r) => r.first - r.headers)}`);
  console.error(`  first answer -> body written      ${col((r) => r.body - r.first)}`);
  console.error(`  body written -> second answer     ${col((r) => r.second - r.body)}`);
  console.error(`  headers written -> second answer  ${col((r) => r.second - r.headers)}`);
});
