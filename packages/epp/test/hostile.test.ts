// Hostile and broken input against a real EPP process (bun src/main.ts, static mode, replica-agg on):
// each attack of test/hostile-peers.ts runs for a while beside good requests; then the process must
// still be up, answer a good request, have counted what it refused, and hold no more memory (RSS of
// the child, from /proc) than a bound far below what the unbounded cases reached.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { killAll, spawnBun, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { FakeWorkerEvents, body, checkHealth, extProcClient, headers, healthClient, postJson, scrapeMetric, setHeader, tokens, writeStaticConfig } from "./helpers.ts";
import { ATTACKS, rssMiB, type Target } from "./hostile-peers.ts";
import { eppRuntimeEnv } from "../src/runtime-env.ts";

const IP = `${LOOPBACK}.4.70`;
const A = `${LOOPBACK}.4.71:8000`;
const B = `${LOOPBACK}.4.72:8000`;
/**
 * Far below the 854 MB one SUBSCRIBE flood added, above what serving these requests and the attacks' garbage take:
 * the runtime environment leaves nursery collections to the heap's growth, so an attack's garbage lives longer
 * (after all nine attacks the EPP measured +236 MiB, against +179 with JavaScriptCore's eden timer at its default).
 */
const RSS_GROWTH_MIB = 400;
const ATTACK_MS = 1500;
/** Longer than a KV listener's redial at its backoff's cap (5 s, +20% jitter: kv-events' zmtp/base.ts). */
const REDIAL_WAIT_MS = 15_000;

let epp: ProcessHandle;
let ev: FakeWorkerEvents;
let client: ReturnType<typeof extProcClient>;
let startRss: number;
const target: Target = { host: IP, grpc: 9002, grpcHealth: 9003, metrics: 9090, selection: 9093, replicaAgg: 9092, kvEvents: `tcp://${LOOPBACK}.4.72:15557` };
const held = tokens(64, 5); // 4 blocks on worker A
const metric = (series: string) => scrapeMetric(`http://${IP}:${target.metrics}`, series).then((v) => v ?? 0);

async function routed(prompt: number[]): Promise<string | undefined> {
  const s = client.open();
  s.send(headers());
  s.send(body({ prompt }));
  const r = await s.next(10_000);
  s.end();
  return setHeader(r.request_headers?.response, "x-gateway-destination-endpoint");
}

beforeAll(async () => {
  ev = await FakeWorkerEvents.start(`${LOOPBACK}.4.71`, 15557);
  const config = writeStaticConfig([
    { id: "worker-a", address: A, kvEvents: ev.endpoint },
    // Its KV endpoint is where the malformed-KV attack publishes.
    { id: "worker-b", address: B, kvEvents: target.kvEvents! },
  ]);
  epp = spawnBun([`${import.meta.dir}/../src/main.ts`, "--config", config, "--listen", IP, "--scrape-interval-ms", "0", "--subscribe-wait-ms", "500", "--log-level", "warn"], eppRuntimeEnv(), { name: "epp" });
  const h = healthClient(target.grpcHealth, IP);
  await waitFor(() => checkHealth(h, "readiness").then((s) => s === "SERVING", () => false), { message: "EPP ready", timeoutMs: 20_000 });
  h.close();
  await waitFor(() => ev.pub.subscriberCount > 0, { message: "listener connected" });
  await ev.storeUntil(held, async () => (await postJson(`http://${IP}:${target.selection}/score`, { token_ids: held })).body.scores["worker-a"]?.["0"] === 4);
  client = extProcClient(target.grpc, IP);
  expect(await routed(held)).toBe(A);
  startRss = rssMiB(epp.pid).rss;
}, 60_000);

afterAll(async () => {
  client?.close();
  await killAll();
  await ev?.close();
});

/** What each attack must have left counted, beyond surviving it. */
const COUNTED: Record<string, string[]> = {
  "empty ProcessingRequest": ['dynamo_epp_ext_proc_rejected_messages_total{reason="no_request"}'],
  "garbage and truncated protobuf": ['dynamo_epp_ext_proc_rejected_messages_total{reason="unparsable"}'],
  "headers of millions of tiny entries": ['dynamo_epp_ext_proc_rejected_messages_total{reason="too_large_field"}'],
  "deep JSON on ext_proc": ['dynamo_epp_json_depth_refusals_total{where="ext_proc"}'],
  "deep JSON on /score and /select": ['dynamo_epp_json_depth_refusals_total{where="score"}', 'dynamo_epp_json_depth_refusals_total{where="select"}'],
  "SUBSCRIBE flood on replica-agg": ["dynamo_epp_replica_agg_refused_subscribers"],
  "malformed KV messages": ['dynamo_epp_kv_malformed_messages_total{kind="frames"}', 'dynamo_epp_kv_malformed_messages_total{kind="payload"}'],
};

describe("the EPP process under each attack", () => {
  for (const attack of ATTACKS) {
    test(`${attack.name}: still up, serving good requests beside it, counted, RSS bounded`, async () => {
      const before = await Promise.all((COUNTED[attack.name] ?? []).map(metric));
      const counted = async () => (await Promise.all((COUNTED[attack.name] ?? []).map(metric))).every((v, i) => v > before[i]!);
      const running = attack.start(target);
      // Good requests keep being routed while the attack runs (each must be answered), for a while
      // and until the attack has been counted. A KV listener may first have to redial: by now its backoff
      // toward an endpoint nobody served is at its cap (5 s, +20% jitter), so the wait is bounded in time,
      // not in requests (a fast EPP routed 20000 of them before the redial).
      const until = Date.now() + ATTACK_MS;
      const givenUp = until + REDIAL_WAIT_MS;
      let good = 0;
      for (let i = 0; Date.now() < until || !(i % 20 === 0 && (await counted())); i++) {
        expect(await routed(held)).toBe(A);
        good++;
        if (Date.now() > givenUp) throw new Error(`attack not counted ${REDIAL_WAIT_MS} ms after it ran`);
      }
      const sent = await running.stop();
      expect(sent).toBeGreaterThan(0);
      expect(good).toBeGreaterThan(0);
      expect(epp.running).toBe(true);
      expect(await routed([...held, ...tokens(20, 9)])).toBe(A);
      const h = healthClient(target.grpcHealth, IP);
      expect(await checkHealth(h, "readiness")).toBe("SERVING");
      h.close();
      expect(await counted()).toBe(true);
      expect(rssMiB(epp.pid).rss).toBeLessThan(startRss + RSS_GROWTH_MIB);
    }, 30_000);
  }
});
