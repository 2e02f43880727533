// What the KV listeners drop reaches the EPP's metrics with its reason: events the decoder dropped
// (unknown tag, malformed), fields of a newer producer read past, and messages over
// --kv-max-message-bytes, from a real publisher over ZMTP.
import { afterEach, expect, test } from "bun:test";
import { KvEventPublisher } from "@kv-epp/kv-events";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { Packr } from "msgpackr";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { WorkerSet } from "./worker-set.ts";

const HOST = `${LOOPBACK}.4.141`;
const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

test("dropped events, unknown fields and oversize messages are counted by reason", async () => {
  const pub = await KvEventPublisher.bind({ endpoint: `tcp://${HOST}:0` });
  cleanup.push(() => pub.close());
  const scrape = Bun.serve({ hostname: HOST, port: 0, fetch: () => new Response("") });
  cleanup.push(() => scrape.stop(true));
  const metrics = createMetrics();
  const set = new WorkerSet({
    config: {
      workers: { mode: "static", list: [{ id: "w", address: `${HOST}:8000`, kvEvents: pub.endpoint, dpSize: 1, dpStartRank: 0, kvEventsBind: false, metrics: `http://${HOST}:${scrape.port}/metrics` }] },
      intents: undefined, kvTopic: "", kvHeartbeatMs: 0, scrapeIntervalMs: 60_000, kvMaxMessageBytes: 4096,
    },
    kube: () => {
      throw new Error("no Kubernetes in static mode");
    },
    metrics,
    log: pino({ level: "silent" }),
  });
  const stop = new AbortController();
  cleanup.push(() => set.stop());
  cleanup.push(() => stop.abort());
  await set.start(stop.signal);
  let batches = 0;
  set.attach(() => void batches++);
  const packr = new Packr({ useRecords: false, variableMapSize: true });
  const payload = packr.pack([
    1.5,
    [
      { type: "BlockMigrated", block_hashes: [1] },
      { type: "BlockStored", block_hashes: [2], parent_block_hash: null, token_ids: [[1, 2], [3, 4]], block_size: 2, lora_id: null },
      { type: "BlockRemoved", block_hashes: [3], medium: "GPU", next_year: true },
    ],
    0,
  ]);
  await waitFor(() => batches > 0 || (pub.publishPayload(payload), false), { message: "a batch through the listener" });
  const text = async () => {
    set.updateGauges();
    return metrics.registry.metrics();
  };
  const value = (t: string, series: string) => Number(t.split("\n").find((l) => l.startsWith(`${series} `))?.split(" ")[1] ?? 0);
  let t = await text();
  expect(value(t, 'dynamo_epp_kv_events_dropped_total{reason="unknown_type"}')).toBe(batches);
  expect(value(t, 'dynamo_epp_kv_events_dropped_total{reason="malformed"}')).toBe(batches);
  expect(value(t, "dynamo_epp_kv_unknown_fields_total")).toBe(batches);
  pub.publishPayload(new Uint8Array(8192)); // over --kv-max-message-bytes 4096
  await waitFor(async () => value(await text(), "dynamo_epp_kv_listener_oversize_messages") === 1, { message: "the oversize message refused" });
  t = await text();
  expect(value(t, "dynamo_epp_kv_listener_protocol_errors")).toBe(1);
});
