// A worker's KV publisher that goes silent without closing its connection (a host gone without a FIN):
// with --kv-heartbeat-ms the listener PINGs it, drops it after 3x the interval, redials, and the EPP
// counts it in dynamo_epp_kv_listener_heartbeat_timeouts. (Heartbeats off, a silent peer is kept:
// packages/kv-events/test/zmtp.test.ts.)
import { afterEach, test } from "bun:test";
import { PubSocket } from "@kv-epp/kv-events";
import { HOST, scrapeMetric, startTestEpp } from "./helpers.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c().catch(() => {});
});

/** A PUB that completes each handshake and then reads nothing: our PINGs go unanswered, as from a lost host. */
async function silentPublisher(): Promise<{ endpoint: string; accepted: () => number }> {
  const pub = new PubSocket();
  const endpoint = await pub.bind(`tcp://${HOST}:0`);
  pub.pause(); // each peer's reading stops once its handshake is done
  cleanup.push(() => pub.close());
  return { endpoint, accepted: () => pub.counters.accepted };
}

test("a silent KV publisher is dropped after the heartbeat timeout, redialed and counted", async () => {
  const pub = await silentPublisher();
  const epp = await startTestEpp([{ id: "quiet", address: `${HOST}:18200`, kvEvents: pub.endpoint }], { flags: ["--kv-heartbeat-ms", "50"] });
  cleanup.push(() => epp.stop({ graceMs: 0 }));
  const deadline = Date.now() + 10_000;
  while (((await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, "dynamo_epp_kv_listener_heartbeat_timeouts")) ?? 0) < 1 || pub.accepted() < 2) {
    if (Date.now() > deadline) throw new Error(`no heartbeat timeout counted (accepted ${pub.accepted()})`);
    await Bun.sleep(25);
  }
}, 20_000);
