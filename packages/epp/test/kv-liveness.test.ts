// A worker's KV publisher that goes silent without closing its connection (a host gone without a FIN):
// with --kv-heartbeat-ms the listener PINGs it, drops it after 3x the interval, redials, and the EPP
// counts it in dynamo_epp_kv_listener_heartbeat_timeouts. (Heartbeats off, a silent peer is kept:
// packages/kv-events/test/zmtp.test.ts.)
import { afterEach, test } from "bun:test";
import { createServer, type Server } from "node:net";
import { HOST, startTestEpp } from "./helpers.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c().catch(() => {});
});

/** ZMTP 3.1 greeting (as server, NULL mechanism) and READY for a PUB socket (RFC 23 / RFC 37). */
function pubHandshake(): Buffer {
  const greeting = Buffer.alloc(64);
  greeting[0] = 0xff;
  greeting[9] = 0x7f;
  greeting[10] = 3;
  greeting[11] = 1;
  greeting.write("NULL", 12, "latin1");
  greeting[32] = 1;
  const prop = Buffer.concat([Buffer.from([11]), Buffer.from("Socket-Type"), Buffer.from([0, 0, 0, 3]), Buffer.from("PUB")]);
  const body = Buffer.concat([Buffer.from([5]), Buffer.from("READY"), prop]);
  return Buffer.concat([greeting, Buffer.from([0x04, body.length]), body]);
}

/** Completes the handshake on every connection, then never sends another byte (it reads what comes). */
async function silentPublisher(): Promise<{ endpoint: string; accepted: () => number; server: Server }> {
  let accepted = 0;
  const server = createServer((s) => {
    accepted++;
    s.write(pubHandshake());
    s.resume(); // drained, so a closing peer's FIN is seen and server.close() can finish
    s.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(0, HOST, () => r()));
  cleanup.push(() => new Promise<void>((r) => server.close(() => r())));
  return { endpoint: `tcp://${HOST}:${(server.address() as { port: number }).port}`, accepted: () => accepted, server };
}

async function metric(port: number, name: string): Promise<number> {
  const text = await (await fetch(`http://${HOST}:${port}/metrics`)).text();
  return Number(new RegExp(`^${name} (\\S+)`, "m").exec(text)?.[1] ?? NaN);
}

test("a silent KV publisher is dropped after the heartbeat timeout, redialed and counted", async () => {
  const pub = await silentPublisher();
  const epp = await startTestEpp([{ id: "quiet", address: `${HOST}:18200`, kvEvents: pub.endpoint }], { flags: ["--kv-heartbeat-ms", "50"] });
  cleanup.push(() => epp.stop({ graceMs: 0 }));
  const deadline = Date.now() + 10_000;
  while ((await metric(epp.ports.metrics, "dynamo_epp_kv_listener_heartbeat_timeouts")) < 1 || pub.accepted() < 2) {
    if (Date.now() > deadline) throw new Error(`no heartbeat timeout counted (accepted ${pub.accepted()})`);
    await Bun.sleep(25);
  }
}, 20_000);
