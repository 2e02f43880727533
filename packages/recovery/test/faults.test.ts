import { afterEach, describe, expect, test } from "bun:test";
import { dumpHandler, dumpStream, fetchDump, type RecoveryState, runRecovery } from "../src/index.ts";
import { capturingLogger, ManualDiscovery, MapIndex, peer, quietLogger, readAll, sampleIndex, scripted, startPeer } from "./helpers.ts";
import { LOOPBACK } from "@kv-epp/testkit";

// Faulty peers are raw TCP servers so the test controls every byte: status lines, framing, stalls, closes.

type Sock = Parameters<NonNullable<Parameters<typeof Bun.listen>[0]["socket"]["open"]>>[0];
const servers: { stop(force?: boolean): void }[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.stop(true);
});

function rawPeer(onRequest: (s: Sock) => void) {
  const server = Bun.listen({
    hostname: `${LOOPBACK}.3.1`,
    port: 0,
    socket: {
      data(s, d) {
        if (new TextDecoder().decode(d).includes("\r\n\r\n")) onRequest(s);
      },
    },
  });
  servers.push(server);
  return peer(`http://${LOOPBACK}.3.1:${server.port}`);
}

function servingPeer(index: MapIndex) {
  const p = startPeer(dumpHandler({ source: index, ready: () => true, logger: quietLogger() }));
  servers.push({ stop: p.stop });
  return p.peer;
}

const good = async () => (await readAll(dumpStream(sampleIndex()))).slice();
const head = (extra = "") => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n${extra}`;

const faults: [string, (body: Uint8Array) => (s: Sock) => void][] = [
  ["answers 503", () => (s) => void (s.write("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"), s.end())],
  ["answers 500", () => (s) => void (s.write('HTTP/1.1 500 Internal Server Error\r\ncontent-length: 15\r\n\r\n{"error":"boom"}'), s.end())],
  ["sends a body shorter than its content-length", (b) => (s) => void (s.write(head(`content-length: ${b.length}\r\n\r\n`)), s.write(b.subarray(0, b.length >> 1)), s.end())],
  ["ends a close-delimited body early (truncated JSON)", (b) => (s) => void (s.write(head("connection: close\r\n\r\n")), s.write(b.subarray(0, b.length - 3)), s.end())],
  ["sends invalid JSON", () => (s) => void (s.write(head("content-length: 12\r\n\r\n")), s.write('{"m":{"bloc'), s.write("}"), s.end())],
  ["closes mid-body (chunked, no last chunk)", (b) => (s) => void (s.write(head("transfer-encoding: chunked\r\n\r\n")), s.write(`${(100).toString(16)}\r\n`), s.write(b.subarray(0, 100)), s.write("\r\n"), s.end())],
  ["stalls before the headers", () => () => {}],
  ["stalls mid-body past the timeout", (b) => (s) => void (s.write(head(`content-length: ${b.length}\r\n\r\n`)), s.write(b.subarray(0, 40)))],
];

describe("a faulty peer fails its attempt and the next peer is tried", () => {
  for (const [name, behave] of faults) {
    test(`a peer that ${name}`, async () => {
      const body = await good();
      const bad = rawPeer(behave(body));
      const ok = servingPeer(sampleIndex());
      const target = new MapIndex();
      const states: RecoveryState[] = [];
      const out = await runRecovery({
        discovery: new ManualDiscovery([bad, ok]),
        target,
        timeoutMs: 300,
        logger: quietLogger(),
        // Priorities are drawn in the order peers are listed: the bad peer is tried first.
        random: scripted([0.1, 0.9]),
        onState: (s) => states.push(s),
      });
      const order = states.filter((s) => s.kind === "attempting").map((s) => (s as { peer: { id: string } }).peer.id);
      expect(order).toEqual([bad.id, ok.id]);
      expect(out).toMatchObject({ kind: "recovered", peer: ok.id, events: 6 });
      // Nothing of the failed attempt is visible: exactly the good peer's dump was committed.
      expect(target.commits).toBe(1);
      expect(target.snapshot()).toEqual(sampleIndex().snapshot());
    });
  }
});

describe("dump client", () => {
  test("a failed attempt aborts its staging and commits nothing", async () => {
    const body = await good();
    const bad = rawPeer((s) => void (s.write(head(`content-length: ${body.length}\r\n\r\n`)), s.write(body.subarray(0, body.length - 10)), s.end()));
    const target = new MapIndex();
    await expect(fetchDump({ peer: bad, target, timeoutMs: 1000 })).rejects.toMatchObject({ name: "DumpFetchError" });
    expect([target.commits, target.aborts, target.eventCount]).toEqual([0, 1, 0]);
  });

  test("a stall is a timeout failure, not a hang", async () => {
    const bad = rawPeer(() => {});
    await expect(fetchDump({ peer: bad, target: new MapIndex(), timeoutMs: 100 })).rejects.toMatchObject({ reason: "timeout" });
  });

  test("an empty dump from a serving peer is a successful recovery", async () => {
    const ok = servingPeer(new MapIndex());
    const { logger, lines } = capturingLogger();
    const out = await runRecovery({ discovery: new ManualDiscovery([ok]), target: new MapIndex(), timeoutMs: 1000, logger, format: "json" });
    expect(out).toMatchObject({ kind: "recovered", peer: ok.id, events: 0, bytes: 2 });
    expect(lines.some((l) => l.msg === "dump fetched from peer" && l.peer === ok.id && l.events === 0 && l.bytes === 2 && typeof l.ms === "number")).toBe(true);
    expect(lines.some((l) => l.msg === "recovered KV index from peer")).toBe(true);
  });

  test("the bearer token is sent, and a peer that wants one refuses requests without it", async () => {
    const src = sampleIndex();
    const p = startPeer(dumpHandler({ source: src, ready: () => true, token: "s3cret", logger: quietLogger() }));
    servers.push({ stop: p.stop });
    const res = await fetch(`${p.peer.url}/dump`);
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ error: "unauthorized" });
    await expect(fetchDump({ peer: p.peer, target: new MapIndex(), timeoutMs: 1000, token: "wrong" })).rejects.toMatchObject({ reason: "status", status: 401 });
    const target = new MapIndex();
    expect(await fetchDump({ peer: p.peer, target, timeoutMs: 1000, token: "s3cret" })).toMatchObject({ events: 6 });
    expect(target.snapshot()).toEqual(src.snapshot());
  });
});

describe("dump handler", () => {
  test("503 until recovered, then the streamed dump; HEAD answers without a body", async () => {
    let ready = false;
    const p = startPeer(dumpHandler({ source: sampleIndex(), ready: () => ready, logger: quietLogger() }));
    servers.push({ stop: p.stop });
    expect((await fetch(`${p.peer.url}/dump`)).status).toBe(503);
    expect((await fetch(`${p.peer.url}/dump`, { method: "HEAD" })).status).toBe(503);
    ready = true;
    const head = await fetch(`${p.peer.url}/dump`, { method: "HEAD" });
    expect(head.status).toBe(200);
    const res = await fetch(`${p.peer.url}/dump`);
    expect(res.headers.get("content-type")).toBe("application/json");
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(await good());
  });

  test("500 with a JSON error when the dump cannot start", async () => {
    const broken = { models: () => { throw new Error("index unavailable"); } };
    const p = startPeer(dumpHandler({ source: broken, ready: () => true, logger: quietLogger() }));
    servers.push({ stop: p.stop });
    // The static-peer probe (HEAD) never walks the index: it still says "serving".
    expect((await fetch(`${p.peer.url}/dump`, { method: "HEAD" })).status).toBe(200);
    const res = await fetch(`${p.peer.url}/dump`);
    expect(res.status).toBe(500);
    expect(await res.json()).toEqual({ error: "dump failed: index unavailable" });
  });

  test("a dump failing mid-body aborts the response, and the reader fails its attempt", async () => {
    function* events() {
      for (let i = 0; i < 5000; i++) yield { workerId: "w", dpRank: 0, eventId: i, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] };
      throw new Error("index changed under the iterator");
    }
    const p = startPeer(dumpHandler({ source: { models: () => [{ key: "m", blockSize: 16, events: events() }] }, ready: () => true, logger: quietLogger(), chunkBytes: 1024 }));
    servers.push({ stop: p.stop });
    const target = new MapIndex();
    await expect(fetchDump({ peer: p.peer, target, timeoutMs: 2000, format: "json" })).rejects.toMatchObject({ name: "DumpFetchError" });
    expect([target.commits, target.aborts]).toEqual([0, 1]);
    // the binary body (a quarter of the bytes) may fail before the reader even saw the headers: nothing committed either way
    const binary = new MapIndex();
    await expect(fetchDump({ peer: p.peer, target: binary, timeoutMs: 2000 })).rejects.toMatchObject({ name: "DumpFetchError" });
    expect(binary.commits).toBe(0);
  });

  test("a reader that goes away mid-body closes the source (what it holds is released)", async () => {
    let closed = false;
    function* events() {
      try {
        for (let i = 0; i < 1_000_000; i++) yield { workerId: "w", dpRank: 0, eventId: i, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] };
      } finally {
        closed = true; // where the index module's dump frees its linear memory
      }
    }
    const p = startPeer(dumpHandler({ source: { models: () => [{ key: "m", blockSize: 16, events: events() }] }, ready: () => true, logger: quietLogger(), chunkBytes: 1024 }));
    servers.push({ stop: p.stop });
    const abort = new AbortController();
    const res = await fetch(`${p.peer.url}/dump`, { signal: abort.signal });
    const reader = res.body!.getReader();
    await reader.read();
    abort.abort();
    await reader.cancel().catch(() => {});
    const deadline = Date.now() + 5000;
    while (!closed && Date.now() < deadline) await Bun.sleep(10);
    expect(closed).toBe(true);
  });
});
