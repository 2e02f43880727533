// The stream state machine on a call made here (no transport): a tokenization that never settles keeps
// the route pending, so what a stream may send meanwhile is bounded deterministically.
import { EventEmitter } from "node:events";
import { expect, test } from "bun:test";
import type { RoutingContext } from "@kv-epp/routing";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { BodyBudget } from "./body-budget.ts";
import { GrpcStatus } from "./grpc-h2.ts";
import type { ProcessingRequest } from "./messages.ts";
import { createProcessHandler } from "./server.ts";

class FakeCall extends EventEmitter {
  failed: { code: number; message: string } | undefined;
  write(): void {}
  end(): void {}
  fail(code: number, message: string): void {
    this.failed = { code, message };
    this.emit("cancelled");
  }
}

/** A full-duplex stream whose body (15 bytes) is in, its route pending for good, against a 1 MiB body budget. */
function pendingRoute() {
  const bodyBudget = new BodyBudget(1 << 20);
  const handle = createProcessHandler({
    routing: { load: { inflight: 0 } } as unknown as RoutingContext,
    tokenizeBody: () => new Promise(() => {}), // the route stays pending
    metrics: createMetrics(),
    log: pino({ level: "silent" }),
    bodyMode: "auto",
    maxInflight: 0,
    bodyBudget,
  });
  const call = new FakeCall();
  handle(call as never);
  const data = (m: ProcessingRequest) => call.emit("data", m);
  data({ request: "request_headers", request_headers: { headers: { headers: [] } }, protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED" } });
  data({ request: "request_body", request_body: { body: new TextEncoder().encode('{"prompt":"hi"}'), end_of_stream: true } });
  return { bodyBudget, call, data };
}

test("a stream that sends more than 256 messages while its route is pending fails with RESOURCE_EXHAUSTED, its body's bytes given back", () => {
  const { bodyBudget, call, data } = pendingRoute();
  expect(bodyBudget.usedBytes).toBe(15);
  const trailers: ProcessingRequest = { request: "request_trailers", request_trailers: { trailers: { headers: [] } } };
  for (let i = 0; i < 256; i++) data(trailers);
  expect(call.failed).toBeUndefined();
  data(trailers);
  expect(call.failed?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  expect(bodyBudget.usedBytes).toBe(0);
});

test("a body sent while the route is pending is held within the body budget: past it the stream fails with RESOURCE_EXHAUSTED, every byte given back", () => {
  const { bodyBudget, call, data } = pendingRoute();
  // Envoy sends nothing more of the request after its end: a client that does is held to the budget.
  data({ request: "request_body", request_body: { body: new Uint8Array(100_000), end_of_stream: false } });
  expect(bodyBudget.usedBytes).toBe(15 + 100_000);
  expect(call.failed).toBeUndefined();
  data({ request: "request_body", request_body: { body: new Uint8Array(2 << 20), end_of_stream: false } });
  expect(call.failed?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  expect(bodyBudget.usedBytes).toBe(0);
});
