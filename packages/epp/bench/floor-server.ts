// The bench's transport floor (its own process): an ext_proc answerer on node:http2 that does not read
// the body (no JSON, no tokens, no index): per stream it decodes the request messages (proto-loader),
// answers the body with a round-robin route and hands the body back, encoded as the EPP encodes it
// (responseEncoder, no copy). What it measures is Bun's HTTP/2 plus the load generator: the EPP's
// gRPC server (src/extproc/grpc-h2.ts) does this and the picking. h2c, or with --tls TLS (ALPN h2, a
// self-signed certificate) as the EPP serves by default. Prints {"port": N} once listening.
import http2 from "node:http2";
import { responseEncoder, routedHeaders, streamedBody, type ProcessingRequest, type ProcessingResponse } from "../src/extproc/messages.ts";
import { EXT_PROC_WINDOW_BYTES } from "../src/extproc/http2-windows.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import { selfSignedCertificate } from "../src/extproc/tls.ts";
import { framed, messageReader } from "../src/extproc/grpc-frames.ts";

const host = Bun.argv[Bun.argv.indexOf("--listen") + 1] ?? "127.0.0.1";
const workers = Bun.argv.includes("--workers") ? Number(Bun.argv[Bun.argv.indexOf("--workers") + 1]) : 16;
const method = loadProtos().extProc.service.Process!;
const decode = method.requestDeserialize as (b: Buffer) => ProcessingRequest;
const encode = responseEncoder(method.responseSerialize as (m: ProcessingResponse) => Buffer);
const send = (stream: http2.ServerHttp2Stream, m: ProcessingResponse) => {
  const out = encode(m);
  if (!Array.isArray(out)) return stream.write(framed(out));
  const header = Buffer.alloc(5);
  header.writeUInt32BE(out.reduce((n, p) => n + p.length, 0), 1);
  stream.write(header);
  for (const p of out) stream.write(p);
};

let rr = 0;
// Session memory unbounded, as @grpc/grpc-js sets it for the other two servers (http2's default refuses
// new streams past 10 MB buffered).
const options = { settings: { initialWindowSize: EXT_PROC_WINDOW_BYTES }, maxSessionMemory: Number.MAX_SAFE_INTEGER };
const server = Bun.argv.includes("--tls")
  ? http2.createSecureServer({ ...options, ...(await selfSignedCertificate()), allowHTTP1: false })
  : http2.createServer(options);
server.on("session", (s) => s.setLocalWindowSize(EXT_PROC_WINDOW_BYTES));
server.on("stream", (stream: http2.ServerHttp2Stream) => {
  stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
  stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  stream.on(
    "data",
    messageReader((bytes) => {
      const body = decode(bytes).request_body?.body;
      if (body) {
        send(stream, routedHeaders({ endpoint: `10.0.0.${1 + (rr++ % workers)}:8000`, contentLength: body.length }));
        send(stream, streamedBody("request_body", body, true));
      }
      return true;
    }),
  );
  stream.on("end", () => stream.end());
  stream.on("error", () => {});
});
server.listen(0, host, () => console.log(JSON.stringify({ port: (server.address() as { port: number }).port })));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
