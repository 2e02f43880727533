// End to end against vLLM's block identity: mock workers serving LoRA adapters, salted tenants and
// prompts sent again (vLLM's duplicate copies), a small cache so blocks are evicted, each rank with a
// NONE_HASH of its own (the same prefix under other block hashes on every rank); after every step
// the EPP's /score for a random request equals each worker rank's true hit for it (the leading blocks
// its cache really holds in that request's identity), and the same on a replica that recovered from it.
import { afterAll, expect, test } from "bun:test";
import { chainBlockIds, startMockWorker, type MockWorker, type RequestIdentity } from "@kv-epp/mock-worker";
import { encodeBatch, encodeSeq, PubSocket } from "@kv-epp/kv-events";
import { seededRandom, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { BLOCK, postJson, startTestEpp, tokens } from "./helpers.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const IPS = [`${LOOPBACK}.4.41`, `${LOOPBACK}.4.42`];
const ADAPTERS = ["sql-lora", "chat-lora"];

type Req = { prompt: number[]; model?: string; salt?: string };
const identityOf = (r: Req): RequestIdentity => ({ loraName: r.model && ADAPTERS.includes(r.model) ? r.model : null, cacheSalt: r.salt ?? null });

test("the EPP's overlap equals every rank's true hit, with adapters, salts, duplicate copies and evictions", async () => {
  const workers: MockWorker[] = [];
  for (const [i, ip] of IPS.entries()) {
    const w = await startMockWorker({
      listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 24, dpSize: i === 0 ? 2 : 1,
      // vLLM without PYTHONHASHSEED: every rank names the same prefix with block hashes of its own.
      loraModules: ADAPTERS, logLevel: "silent", hashSeed: "random",
    });
    cleanups.push(() => w.close());
    workers.push(w);
  }
  // sql-lora is configured; chat-lora is learned from the events' lora_name.
  const epp = await startTestEpp(
    workers.map((w, i) => ({ id: `w${i}`, address: `${IPS[i]}:8000`, kvEvents: `tcp://${IPS[i]}:5557`, dpSize: w.ranks.length })),
    { flags: ["--lora-adapters", "sql-lora"] },
  );
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  const send = (w: MockWorker, rank: number, r: Req) =>
    fetch(`${w.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) },
      body: JSON.stringify({ prompt: r.prompt, max_tokens: 1, model: r.model, cache_salt: r.salt }),
    });
  const score = async (r: Req) => (await postJson(`${selection}/score`, { token_ids: r.prompt, model: r.model, cache_salt: r.salt })).body.scores as Record<string, Record<string, number>>;

  // Subscriptions first (a PUB drops what it sends before one arrives), then empty caches.
  for (const [i, w] of workers.entries())
    for (const r of w.ranks)
      await waitFor(async () => {
        const p = tokens(BLOCK, 1000 + Math.floor(Math.random() * 1e6));
        await send(w, r.rank, { prompt: p });
        await Bun.sleep(20);
        return (await score({ prompt: p }))[`w${i}`]?.[String(r.rank)] === 1;
      }, { message: `the EPP subscribed to w${i} rank ${r.rank}` });
  for (const w of workers) await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });

  const rnd = seededRandom(16);
  const pick = <T,>(xs: readonly T[]) => xs[Math.floor(rnd() * xs.length)]!;
  const request = (): Req => {
    // Few stems (shared prefixes), whole-block prompts half the time (a repeat stores a second copy of
    // its last block), every identity.
    const stem = tokens(BLOCK * (1 + Math.floor(rnd() * 3)), Math.floor(rnd() * 4));
    const tail = tokens(rnd() < 0.5 ? BLOCK * Math.floor(rnd() * 3) : 1 + Math.floor(rnd() * (BLOCK * 2)), 50 + Math.floor(rnd() * 6));
    return { prompt: [...stem, ...tail], model: pick([undefined, "test-model", ...ADAPTERS]), salt: pick([undefined, undefined, "tenant-a", "tenant-b"]) };
  };
  const truth = (r: Req) => {
    const out: Record<string, Record<string, number>> = {};
    for (const [i, w] of workers.entries())
      for (const rank of w.ranks) {
        const hit = rank.cache.peekHitBlocks(Uint32Array.from(r.prompt), identityOf(r));
        if (hit > 0) (out[`w${i}`] ??= {})[String(rank.rank)] = hit;
      }
    return out;
  };

  let checked = 0;
  let last: Req | undefined;
  for (let step = 0; step < 120; step++) {
    const w = pick(workers);
    // Often the previous prompt again, on any rank: hits, and second copies of whole-block prompts.
    const r = last !== undefined && rnd() < 0.3 ? last : request();
    last = r;
    expect((await send(w, pick(w.ranks).rank, r)).status).toBe(200);
    for (const q of [r, request()]) {
      const want = truth(q);
      let got: Record<string, Record<string, number>> = {};
      await waitFor(async () => Bun.deepEquals((got = await score(q)), want), { timeoutMs: 5000 }).catch(() => {});
      expect({ step, q, got }).toEqual({ step, q, got: want });
      checked++;
    }
  }
  expect(checked).toBe(240);
  // The workload did what it is for: copies, evictions, and adapters learned.
  expect(workers.some((w) => w.ranks.some((r) => [...r.cache.copies().values()].some((n) => n > 1)))).toBe(true);
  expect(epp.indexers.models.adapters().has("chat-lora")).toBe(true);

  // The same across a recovery: a replica recovering from this one scores every identity like the
  // workers' caches, before and after more traffic. It is configured like the first (sql-lora only):
  // chat-lora, learned from the events, comes with the dump.
  const b = await startTestEpp(
    workers.map((w, i) => ({ id: `w${i}`, address: `${IPS[i]}:8000`, kvEvents: `tcp://${IPS[i]}:5557`, dpSize: w.ranks.length })),
    { peers: [selection], flags: ["--lora-adapters", "sql-lora"] },
  );
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  expect(b.indexers.models.adapters().has("chat-lora")).toBe(true);
  const scoreB = async (r: Req) => (await postJson(`http://${LOOPBACK}.4.1:${b.ports.selection}/score`, { token_ids: r.prompt, model: r.model, cache_salt: r.salt })).body.scores as Record<string, Record<string, number>>;
  for (let step = 0; step < 60; step++) {
    if (step >= 30) {
      const w = pick(workers);
      const r = last !== undefined && rnd() < 0.3 ? last : request();
      last = r;
      expect((await send(w, pick(w.ranks).rank, r)).status).toBe(200);
    }
    const q = rnd() < 0.5 && last !== undefined ? last : request();
    const want = truth(q);
    let got: Record<string, Record<string, number>> = {};
    await waitFor(async () => Bun.deepEquals((got = await scoreB(q)), want), { timeoutMs: 5000 }).catch(() => {});
    expect({ recovered: true, step, q, got }).toEqual({ recovered: true, step, q, got: want });
  }
});

test("the second node of a multi-node DP group: ranks from its start rank, KV ports offset by the global rank", async () => {
  const ip = `${LOOPBACK}.4.43`;
  const w = await startMockWorker({ listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, dpSize: 2, dataParallelStartRank: 2, logLevel: "silent" });
  cleanups.push(() => w.close());
  expect(w.ranks.map((r) => r.kvEvents)).toEqual([`tcp://${ip}:5559`, `tcp://${ip}:5560`]);
  const epp = await startTestEpp([{ id: "node-b", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557`, dpSize: 2, dpStartRank: 2 }]);
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  for (const rank of [2, 3])
    await waitFor(async () => {
      const p = tokens(BLOCK * 2, 7000 + Math.floor(Math.random() * 1e6));
      await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) }, body: JSON.stringify({ prompt: p, max_tokens: 1 }) });
      await Bun.sleep(20);
      return (await postJson(`${selection}/score`, { token_ids: p })).body.scores["node-b"]?.[String(rank)] === 2;
    }, { message: `rank ${rank}'s blocks under rank ${rank}` });
  const metrics = await (await fetch(`http://${LOOPBACK}.4.1:${epp.ports.metrics}/metrics`)).text();
  expect(metrics).toMatch(/^dynamo_epp_kv_rank_mismatch_total 0$/m);
});

test("a hybrid model (full attention + sliding window groups): the index follows full attention only, equal to the true hit through evictions", async () => {
  const ip = `${LOOPBACK}.4.44`;
  const w = await startMockWorker({
    listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 12, logLevel: "silent",
    kvGroups: `full_attention:${BLOCK},sliding_window:${BLOCK}:${BLOCK * 2}` as never,
  });
  cleanups.push(() => w.close());
  const epp = await startTestEpp([{ id: "hybrid", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` }]);
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  const send = (p: number[]) => fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: p, max_tokens: 1 }) });
  const score = async (p: number[]) => (await postJson(`${selection}/score`, { token_ids: p })).body.scores.hybrid?.["0"] ?? 0;
  await waitFor(async () => {
    const p = tokens(BLOCK, 9000 + Math.floor(Math.random() * 1e6));
    await send(p);
    await Bun.sleep(20);
    return (await score(p)) === 1;
  }, { message: "the EPP subscribed" });
  await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });
  const rnd = seededRandom(5);
  for (let step = 0; step < 30; step++) {
    const p = [...tokens(BLOCK * (1 + Math.floor(rnd() * 2)), Math.floor(rnd() * 3)), ...tokens(BLOCK * Math.floor(rnd() * 4) + 3, 40 + step)];
    expect((await send(p)).status).toBe(200);
    for (const q of [p, p.slice(0, BLOCK * 2)]) {
      const want = w.ranks[0]!.cache.peekHitBlocks(Uint32Array.from(q));
      let got = -1;
      await waitFor(async () => (got = await score(q)) === want, { timeoutMs: 5000 }).catch(() => {});
      expect({ step, got }).toEqual({ step, got: want });
    }
  }
  const metrics = await (await fetch(`http://${LOOPBACK}.4.1:${epp.ports.metrics}/metrics`)).text();
  expect(Number(/^dynamo_epp_kv_events_ignored_total\{reason="non_main_group"\} (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
});

test("groups of different block sizes (a sliding window of 16, full attention of 32): the EPP learns 32 from the main group, and its overlap is the main group's true hit", async () => {
  const ip = `${LOOPBACK}.4.47`;
  const MAIN = BLOCK * 2;
  const w = await startMockWorker({
    listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 16, logLevel: "silent",
    kvGroups: `sliding_window:${BLOCK}:${BLOCK * 2},full_attention:${MAIN}` as never,
  });
  cleanups.push(() => w.close());
  // Configured with the hash block size: the first indexed (main-group) store says 32, and the index follows it.
  const epp = await startTestEpp([{ id: "sizes", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` }], { flags: ["--block-size", String(BLOCK)] });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  const send = (p: number[]) => fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: p, max_tokens: 1 }) });
  const score = async (p: number[]) => (await postJson(`${selection}/score`, { token_ids: p })).body.scores.sizes?.["0"] ?? 0;
  await waitFor(async () => {
    const p = tokens(MAIN + 1, 9000 + Math.floor(Math.random() * 1e6));
    await send(p);
    await Bun.sleep(20);
    return (await score(p)) === 1;
  }, { message: "the EPP subscribed and indexing by the main group's 32-token blocks" });
  const rows = (await (await fetch(`${selection}/workers`)).json()) as { block_size: number | null; index_block_size: number | null; block_size_mismatch: boolean; kv_groups: { main: number; groups: { block_size: number }[] } }[];
  expect(rows[0]).toMatchObject({ block_size: MAIN, index_block_size: MAIN, block_size_mismatch: false, kv_groups: { main: 1, groups: [{ block_size: BLOCK }, { block_size: MAIN }] } });
  // The main group holds block m while its last hash block (2m + 1) is cached (vLLM's hash at the boundary).
  const truth = (p: number[]) => {
    const resident = w.ranks[0]!.cache.residentHashes();
    const chain = chainBlockIds(Uint32Array.from(p), BLOCK);
    let m = 0;
    while (2 * m + 1 < chain.length && resident.has(chain[2 * m + 1]!.hash)) m++;
    return m;
  };
  const rnd = seededRandom(9);
  for (let step = 0; step < 20; step++) {
    const p = [...tokens(MAIN * (1 + Math.floor(rnd() * 2)), Math.floor(rnd() * 3)), ...tokens(BLOCK * Math.floor(rnd() * 5) + 3, 60 + step)];
    expect((await send(p)).status).toBe(200);
    for (const q of [p, p.slice(0, MAIN * 2)]) {
      const want = truth(q);
      let got = -1;
      await waitFor(async () => (got = await score(q)) === want, { timeoutMs: 5000 }).catch(() => {});
      expect({ step, got }).toEqual({ step, got: want });
    }
  }
});

test("a worker whose PUBs connect to the EPP (kvEventsBind): the EPP binds port + rank and indexes what arrives", async () => {
  const bindAt = `${LOOPBACK}.4.1`;
  const epp = await startTestEpp([{ id: "dialer", address: `${LOOPBACK}.4.45:8000`, kvEvents: `tcp://${bindAt}:25800`, dpSize: 2, kvEventsBind: true }]);
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  // What vLLM does with endpoint tcp://<epp>:25800 on rank 1: connect its PUB to port 25801.
  const pub = new PubSocket({ reconnectMinMs: 10, reconnectMaxMs: 50 });
  cleanups.push(() => pub.close());
  pub.connect(`tcp://${bindAt}:25801`);
  const p = tokens(BLOCK * 2, 4242);
  const hashes = [11n, 12n];
  let seq = 0n;
  await waitFor(async () => {
    const batch = { ts: 1, dataParallelRank: 1, events: [{ type: "BlockStored" as const, blockHashes: hashes, parentBlockHash: null, tokenIds: p, blockSize: BLOCK, loraId: null, medium: "GPU" }] };
    pub.send([Buffer.alloc(0), encodeSeq(seq++), Buffer.from(encodeBatch(batch))]);
    await Bun.sleep(20);
    return (await postJson(`${selection}/score`, { token_ids: p })).body.scores.dialer?.["1"] === 2;
  }, { message: "the connecting publisher's blocks indexed under rank 1" });
});

test("vLLM's second copy: a whole-block prompt sent again stores its last block twice; evicting one copy leaves the hit whole", async () => {
  const ip = `${LOOPBACK}.4.46`;
  const w = await startMockWorker({ listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 4, logLevel: "silent" });
  cleanups.push(() => w.close());
  const epp = await startTestEpp([{ id: "copies", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` }]);
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  const send = (p: number[]) => fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: p, max_tokens: 1 }) });
  const score = async (p: number[]) => (await postJson(`${selection}/score`, { token_ids: p })).body.scores.copies?.["0"] ?? 0;
  await waitFor(async () => {
    const p = tokens(BLOCK, 3000 + Math.floor(Math.random() * 1e6));
    await send(p);
    await Bun.sleep(20);
    return (await score(p)) === 1;
  }, { message: "the EPP subscribed" });
  await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });
  const cache = w.ranks[0]!.cache;
  const p = tokens(BLOCK * 2, 1);
  await send(p);
  await send(p); // the last block is recomputed and cached again: a second copy
  expect([...cache.copies().values()].sort()).toEqual([1, 2]);
  await send(tokens(BLOCK * 2, 2)); // needs two slots, one is free: the older copy of p's last block goes
  expect([...cache.copies().values()].sort()).toEqual([1, 1, 1, 1]);
  expect(cache.peekHitBlocks(Uint32Array.from(p))).toBe(2);
  await waitFor(async () => (await score(tokens(BLOCK * 2, 2))) === 2, { message: "the evicting batch applied" });
  expect(await score(p)).toBe(2);
});

test("a worker publishing domain-tagged extra keys (open vLLM PRs) is matched in the same identities as requests state them", async () => {
  const ip = `${LOOPBACK}.4.43`;
  const w = await startMockWorker({
    listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 64, loraModules: ADAPTERS, logLevel: "silent",
    taggedExtraKeys: true,
  });
  cleanups.push(() => w.close());
  const epp = await startTestEpp([{ id: "t", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` }], { flags: ["--lora-adapters", ADAPTERS.join(",")], host: `${LOOPBACK}.4.44` });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.44:${epp.ports.selection}`;
  const send = (r: Req) =>
    fetch(`${w.url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: r.prompt, max_tokens: 1, model: r.model, cache_salt: r.salt }),
    });
  const overlap = async (r: Req) =>
    ((await postJson(`${selection}/score`, { token_ids: r.prompt, model: r.model, cache_salt: r.salt })).body.scores as Record<string, Record<string, number>>).t?.["0"] ?? 0;
  const req: Req = { prompt: tokens(BLOCK * 3, 77), model: "sql-lora", salt: "tenant-a" };
  await waitFor(async () => {
    await send(req);
    await Bun.sleep(20);
    return (await overlap(req)) === 3;
  }, { message: "the tagged blocks matched in the request's identity" });
  // The same tokens in any other identity hold nothing there.
  for (const other of [{ prompt: req.prompt }, { prompt: req.prompt, model: "sql-lora" }, { prompt: req.prompt, salt: "tenant-a" }, { prompt: req.prompt, model: "chat-lora", salt: "tenant-a" }])
    expect(await overlap(other)).toBe(0);
  expect(w.ranks[0]!.cache.peekHitBlocks(Uint32Array.from(req.prompt), identityOf(req))).toBe(3);
});
