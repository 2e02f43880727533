// The demo gateway's response path against an ext_proc processor that rewrites what it is handed: the
// client must get the processor's headers and body, not the worker's, in both modes.
import * as grpc from "@grpc/grpc-js";
import { loadProtos } from "@kv-epp/epp";
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startGateway } from "./gateway.ts";

const dir = mkdtempSync(join(tmpdir(), "exchange-"));
// A throwaway self-signed pair (the gateway opens TLS without verifying, as against the EPP).
Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=dynamo-epp",
  "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem")]);

const dec = new TextDecoder();
type Msg = Record<string, any>;
const seen: Msg[] = [];
const setHeader = (key: string, value: string) => ({ header: { key, raw_value: Buffer.from(value) } });
const upper = (b: Uint8Array | undefined) => Buffer.from(dec.decode(b ?? new Uint8Array()).toUpperCase());

// The worker: an SSE stream of three events.
const worker = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  fetch: () =>
    new Response(
      new ReadableStream({
        async start(c) {
          for (const e of ["one", "two", "three"]) {
            c.enqueue(new TextEncoder().encode(`data: ${e}\n\n`));
            await Bun.sleep(20);
          }
          c.close();
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    ),
});
const endpoint = `127.0.0.1:${worker.port}`;

// The processor: routes to the worker, hands the request body back, marks the response headers and
// upper-cases the response body (streamed back in full duplex, replaced whole in buffered).
const server = new grpc.Server();
server.addService((loadProtos().extProc as unknown as { service: grpc.ServiceDefinition }).service, {
  Process(call: grpc.ServerDuplexStream<Msg, Msg>) {
    let fullDuplex = true;
    call.on("data", (m: Msg) => {
      seen.push(m);
      if (m.protocol_config) fullDuplex = m.protocol_config.request_body_mode === "FULL_DUPLEX_STREAMED";
      const route = { header_mutation: { set_headers: [setHeader("x-gateway-destination-endpoint", endpoint)] } };
      if (m.request_headers) return fullDuplex ? undefined : call.write({ request_headers: { response: {} } });
      if (m.request_body) {
        if (!fullDuplex) return call.write({ request_body: { response: route } });
        call.write({ request_headers: { response: route } });
        return call.write({ request_body: { response: { body_mutation: { streamed_response: { body: m.request_body.body, end_of_stream: true } } } } });
      }
      if (m.response_headers) return call.write({ response_headers: { response: { header_mutation: { set_headers: [setHeader("x-processed", "yes")] } } } });
      if (m.response_body) {
        const body = upper(m.response_body.body);
        if (fullDuplex) call.write({ response_body: { response: { body_mutation: { streamed_response: { body, end_of_stream: m.response_body.end_of_stream === true } } } } });
        else call.write({ response_body: { response: { body_mutation: { body } } } });
      }
    });
    call.on("end", () => call.end());
  },
});
const port = await new Promise<number>((resolve, reject) =>
  server.bindAsync(
    "127.0.0.1:0",
    grpc.ServerCredentials.createSsl(null, [{ cert_chain: readFileSync(join(dir, "cert.pem")), private_key: readFileSync(join(dir, "key.pem")) }]),
    (e, p) => (e ? reject(e) : resolve(p)),
  ),
);
const gateways = (["full-duplex", "buffered"] as const).map((bodyMode) =>
  startGateway({ listen: "127.0.0.1", port: 0, bodyMode, replicas: [{ name: "p", address: `127.0.0.1:${port}` }] }),
);

afterAll(async () => {
  for (const g of gateways) await g.stop();
  server.forceShutdown();
  await worker.stop(true);
  rmSync(dir, { recursive: true, force: true });
});

const ask = (g: (typeof gateways)[number]) => fetch(`${g.url}/v1/completions`, { method: "POST", body: JSON.stringify({ model: "m", prompt: "hi", stream: true }) });

describe("demo gateway response path", () => {
  test("full duplex: response headers, then each chunk with end_of_stream on the last; the client gets the processor's headers and chunks", async () => {
    seen.length = 0;
    const res = await ask(gateways[0]!);
    expect(res.headers.get("x-processed")).toBe("yes");
    expect(await res.text()).toBe("DATA: ONE\n\nDATA: TWO\n\nDATA: THREE\n\n");
    const kinds = seen.map((m) => m.request);
    expect(kinds[0]).toBe("request_headers");
    expect(seen[0]!.protocol_config).toEqual({ request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" });
    const bodies = seen.filter((m) => m.response_body);
    expect(kinds.indexOf("response_headers")).toBeLessThan(kinds.indexOf("response_body"));
    expect(bodies.length).toBeGreaterThanOrEqual(2); // the events came 20 ms apart, then the end
    expect(bodies.at(-1)!.response_body.end_of_stream).toBe(true);
    expect(bodies.slice(0, -1).every((m) => m.response_body.end_of_stream !== true)).toBe(true);
    // The served endpoint goes back in the envoy.lb metadata.
    const served = seen.find((m) => m.response_headers)!.metadata_context.filter_metadata["envoy.lb"].fields["x-gateway-destination-endpoint-served"];
    expect(served.stringValue).toBe(endpoint);
  }, 30_000);

  test("buffered: the whole response goes to the processor in one message, and the client gets the body it answered", async () => {
    seen.length = 0;
    const res = await ask(gateways[1]!);
    expect(res.headers.get("x-processed")).toBe("yes");
    expect(await res.text()).toBe("DATA: ONE\n\nDATA: TWO\n\nDATA: THREE\n\n");
    expect(seen[0]!.protocol_config).toEqual({ request_body_mode: "BUFFERED", response_body_mode: "BUFFERED" });
    const bodies = seen.filter((m) => m.response_body);
    expect(bodies).toHaveLength(1);
    expect(bodies[0]!.response_body.end_of_stream).toBe(true);
    expect(dec.decode(bodies[0]!.response_body.body)).toBe("data: one\n\ndata: two\n\ndata: three\n\n");
  }, 30_000);
});
