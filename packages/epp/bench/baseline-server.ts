// The bench's baseline ext_proc server (its own process, like the EPP under test): JSON.parse of the
// body and a round-robin pick, same wire answers, no tokens, no hashing, no index. It separates what
// KV-aware picking costs from the gRPC + JSON floor. Prints {"port": N} once listening.
import * as grpc from "@grpc/grpc-js";
import { routedHeaders, streamedBody, type ProcessingRequest } from "../src/extproc/messages.ts";
import { EXT_PROC_WINDOW_BYTES } from "../src/extproc/http2-windows.ts";
import { loadProtos } from "../src/extproc/protos.ts";

const host = Bun.argv[Bun.argv.indexOf("--listen") + 1] ?? "127.0.0.1";
const workers = Bun.argv.includes("--workers") ? Number(Bun.argv[Bun.argv.indexOf("--workers") + 1]) : 16;

// The EPP's HTTP/2 windows, so both servers receive bodies alike. @grpc/grpc-js has no server option
// for them: they are set through its internals (commonServerOptions before binding, the session
// event of its http2 servers after).
type Internals = {
  commonServerOptions: { settings?: Record<string, unknown> };
  http2Servers: Map<{ on(ev: "session", f: (s: { setLocalWindowSize(n: number): void }) => void): void }, unknown>;
};
const { extProc } = loadProtos();
const server = new grpc.Server();
const internals = server as unknown as Internals;
internals.commonServerOptions.settings = { ...internals.commonServerOptions.settings, initialWindowSize: EXT_PROC_WINDOW_BYTES };
let rr = 0;
const dec = new TextDecoder();
server.addService(extProc.service, {
  Process(call: grpc.ServerDuplexStream<ProcessingRequest, unknown>) {
    const chunks: Uint8Array[] = [];
    call.on("data", (m: ProcessingRequest) => {
      if (!m.request_body) return;
      chunks.push(m.request_body.body ?? new Uint8Array());
      if (!m.request_body.end_of_stream) return;
      const body = Buffer.concat(chunks);
      JSON.parse(dec.decode(body));
      call.write(routedHeaders({ endpoint: `10.0.0.${1 + (rr++ % workers)}:8000`, contentLength: body.length }));
      call.write(streamedBody("request_body", body, true));
    });
    call.on("end", () => call.end());
    call.on("error", () => {});
  },
});
const port = await new Promise<number>((res, rej) =>
  server.bindAsync(`${host}:0`, grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
);
for (const h2 of internals.http2Servers.keys()) h2.on("session", (s) => s.setLocalWindowSize(EXT_PROC_WINDOW_BYTES));
console.log(JSON.stringify({ port }));
process.on("SIGTERM", () => server.tryShutdown(() => process.exit(0)));
