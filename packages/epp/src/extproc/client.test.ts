// The gateway-side client against a real EPP: the route in both body modes, the load it holds until
// finish(), and an immediate response turned into a RoutingError.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { EppHandle } from "../main.ts";
import { FakeWorkerEvents, HOST, MODEL, startTestEpp, tokens } from "../../test/helpers.ts";
import { ExtProcClient, RoutingError } from "./client.ts";
import { waitFor } from "@kv-epp/testkit";

const enc = new TextEncoder();
const body = (seed: number) => enc.encode(JSON.stringify({ model: MODEL, prompt: tokens(64, seed), max_tokens: 1 }));

let kv: FakeWorkerEvents;
let epp: EppHandle;
beforeAll(async () => {
  kv = await FakeWorkerEvents.start();
  epp = await startTestEpp([{ id: "w1", address: `${HOST}:18100`, kvEvents: kv.endpoint }]);
});
afterAll(async () => {
  await epp.stop({ graceMs: 0 });
  await kv.close();
});

describe("ExtProcClient", () => {
  test.each(["full-duplex", "buffered"] as const)("%s: routes, holds the request's load until finish()", async (mode) => {
    const client = new ExtProcClient(`${HOST}:${epp.ports.grpc}`, mode);
    try {
      const routed = await client.route("/v1/completions", body(1));
      expect(routed.endpoint).toBe(`${HOST}:18100`);
      expect(routed.pickMs).toBeGreaterThanOrEqual(0);
      expect(epp.load.inflight).toBe(1);
      await routed.finish(200);
      await waitFor(() => epp.load.inflight === 0, { message: "the request's load released" });
    } finally {
      client.close();
    }
  });

  test("an immediate response (400 for a body that is not JSON) is a RoutingError", async () => {
    const client = new ExtProcClient(`${HOST}:${epp.ports.grpc}`);
    try {
      const err = await client.route("/v1/completions", enc.encode("{not json")).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RoutingError);
      expect(String(err)).toContain("BadRequest"); // envoy.type.v3.StatusCode 400, as its enum name
    } finally {
      client.close();
    }
  });
});
