// The demo gateway's own edges: no replica answering, a bad replica list, the --replicas format.
import { afterAll, describe, expect, test } from "bun:test";
import { GATEWAY_HEADERS, formatReplicas, parseReplicas, startGateway } from "./gateway.ts";
import { LOOPBACK } from "@kv-epp/testkit";

// Nothing listens on port 1: every ext_proc attempt fails to connect.
const gateway = startGateway({ listen: "127.0.0.1", port: 0, bodyMode: "full-duplex", replicas: [{ name: "epp-x", address: "127.0.0.1:1" }] });
afterAll(() => gateway.stop());

describe("demo gateway", () => {
  test("a request no replica routes is a 503 naming each failed attempt, and nothing is proxied", async () => {
    const res = await fetch(`${gateway.url}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ model: "m", messages: [] }) });
    expect(res.status).toBe(503);
    expect(res.headers.get(GATEWAY_HEADERS.epp)).toBeNull();
    const failures = JSON.parse(decodeURIComponent(res.headers.get(GATEWAY_HEADERS.failures)!)) as string[];
    expect(failures).toHaveLength(1);
    expect(failures[0]).toStartWith("epp-x: ");
  }, 30_000);

  test("a replica list that is not [{name, address}] is refused and the old one kept", async () => {
    const bad = await fetch(`${gateway.url}/replicas`, { method: "PUT", body: JSON.stringify([{ name: "a" }]) });
    expect(bad.status).toBe(400);
    const res = await fetch(`${gateway.url}/v1/completions`, { method: "POST", body: "{}" });
    expect(JSON.parse(decodeURIComponent(res.headers.get(GATEWAY_HEADERS.failures)!))[0]).toStartWith("epp-x: ");
  }, 30_000);

  test("--replicas reads back what it writes, and says what a bad entry should look like", () => {
    const list = [{ name: "epp-a", address: `${LOOPBACK}.6.2:9002` }, { name: "epp-b", address: `${LOOPBACK}.6.3:9002` }];
    expect(parseReplicas(formatReplicas(list))).toEqual(list);
    expect(() => parseReplicas("epp-a")).toThrow("expected name=ip:port");
  });
});
