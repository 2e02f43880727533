// Recovery peers that misbehave on purpose, for the tests and benches of a replica's /dump client. Each
// answers HEAD /dump 200 (so static discovery counts it as serving) and serves GET /dump in one of the
// ways a broken or hostile peer could. Bodies are pulled streams: they cost the peer nothing while
// the reader is slow, so what they measure is the reader.

export type HostileDump =
  /** One valid model whose events never end: distinct root blocks, 16 per event. */
  | { kind: "endless-events"; model: string; blockSize: number }
  /** Valid model objects that never end, each a new key with one small event. */
  | { kind: "endless-models"; blockSize: number }
  /** A valid start, then one byte every `intervalMs` (inside any per-read timeout longer than that). */
  | { kind: "trickle"; intervalMs: number }
  /** 200 and then a body that is not a dump (cut JSON), every time. */
  | { kind: "broken" };

/** `bytes()`: body bytes handed to readers so far (pulled, so about what they have read). */
export type HostilePeer = { url: string; requests: () => number; bytes: () => number; stop: () => void };

const enc = new TextEncoder();
const CHUNK = 64 * 1024;

// Numbers (exact below 2^53), not BigInts: the peer must outpace the reader it measures.
function event(id: number, firstHash: number, blocks: number): string {
  let s = `{"worker_id":"hostile-worker","event":{"event_id":${id},"data":{"stored":{"parent_hash":null,"blocks":[`;
  for (let i = 0; i < blocks; i++) s += `${i > 0 ? "," : ""}{"block_hash":${firstHash + i},"tokens_hash":${firstHash + i + 2 ** 40}}`;
  return s + `]}}},"dp_rank":0}`;
}

/** A body of `head` then `next()` strings forever, in chunks of about 64 KiB, produced on demand. */
function endless(head: string, next: (i: number) => string, count: (n: number) => void): ReadableStream<Uint8Array> {
  let i = 0;
  let first = true;
  return new ReadableStream(
    {
      pull(c) {
        let s = first ? head : "";
        first = false;
        while (s.length < CHUNK) s += next(i++);
        const bytes = enc.encode(s);
        count(bytes.length);
        c.enqueue(bytes);
      },
    },
    { highWaterMark: 1 },
  );
}

function trickle(intervalMs: number, signal: AbortSignal): ReadableStream<Uint8Array> {
  let timer: ReturnType<typeof setInterval> | undefined;
  return new ReadableStream({
    start(c) {
      c.enqueue(enc.encode('{"m":{"block_size":16,"events":['));
      // Whitespace is valid JSON between tokens: the body stays well-formed, only slow.
      timer = setInterval(() => {
        try {
          c.enqueue(enc.encode(" "));
        } catch {
          clearInterval(timer);
        }
      }, intervalMs);
      signal.addEventListener("abort", () => clearInterval(timer), { once: true });
    },
    cancel() {
      clearInterval(timer);
    },
  });
}

function body(d: HostileDump, signal: AbortSignal, count: (n: number) => void): ReadableStream<Uint8Array> | string {
  switch (d.kind) {
    case "endless-events":
      return endless(`{${JSON.stringify(`${d.model}`)}:{"block_size":${d.blockSize},"events":[`, (i) => (i > 0 ? "," : "") + event(i, i * 16 + 1, 16), count);
    case "endless-models":
      return endless("{", (i) => `${i > 0 ? "," : ""}"hostile-model-${i}:default":{"block_size":${d.blockSize},"events":[${event(0, i + 1, 1)}]}`, count);
    case "trickle":
      return trickle(d.intervalMs, signal);
    case "broken":
      return '{"m":{"block_size":16,"events":[{"worker_id":';
  }
}

export function hostileDumpPeer(d: HostileDump, opts: { hostname: string; port?: number }): HostilePeer {
  let requests = 0;
  let bytes = 0;
  const count = (n: number) => void (bytes += n);
  const server = Bun.serve({
    hostname: opts.hostname,
    port: opts.port ?? 0,
    idleTimeout: 0,
    fetch(req) {
      if (new URL(req.url).pathname !== "/dump") return new Response("not found", { status: 404 });
      if (req.method === "HEAD") return new Response(null, { status: 200, headers: { "content-type": "application/json" } });
      requests++;
      return new Response(body(d, req.signal, count), { headers: { "content-type": "application/json" } });
    },
  });
  return { url: `http://${opts.hostname}:${server.port}`, requests: () => requests, bytes: () => bytes, stop: () => server.stop(true) };
}
