// bun run bench:body-handoff
//
// The decision thread's cost of handing a request body to a tokenizer pool member: per body, the µs spent on the
// sending thread only (joining the chunks, any copy, the postMessage), against a real Worker that reads every byte
// and answers, the two arms taking turns on the same bodies (~2 KB, ~50 KB, ~500 KB of JSON) in the same run.
//   chunks   the body came in pieces (ext_proc's full duplex: 16 KiB chunks, at least two), each a view of its own
//            gRPC message. before: joined into an ArrayBuffer, which the pool copies and transfers. after: joined
//            once into shared memory (joinBody), which the pool posts by reference.
//   one      the body came whole (buffered mode: a view of its gRPC message). before (kept): the pool copies it and
//            transfers the copy. shared: a copy into shared memory instead, posted by reference (not taken).
//   kept     a body no member reads (token ids, read on the decision thread): the join alone, into an ArrayBuffer
//            (before) or into shared memory (after, joinBody).
import { isMainThread, parentPort, Worker } from "node:worker_threads";
import { joinBody } from "../src/pool/shared-body";

const SIZES = [2 * 1024, 50 * 1024, 500 * 1024];
const CHUNK = 16 * 1024;
/** Bodies posted before their answers are awaited (a burst, as a busy decision thread sends them). */
const BATCH = 8;
/** Sending-thread time per arm and size, about (the rounds alternate the arms). */
const TARGET_MS = 120;

if (!isMainThread) {
  // The member: reads every byte (as its JSON reading would) and answers.
  parentPort!.on("message", (m: { id: number; job: { request: { body: Uint8Array } } }) => {
    const body = m.job.request.body;
    const b = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    parentPort!.postMessage({ id: m.id, at: b.indexOf(0xff) });
  });
}

type Post = (body: Uint8Array, transfer?: ArrayBuffer[]) => void;
type Arm = { name: string; send: (chunks: Uint8Array[], total: number, post: Post) => void };

/** The join before joinBody (server.ts's concat). */
function joinPlain(chunks: Uint8Array[], total: number): Uint8Array {
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}

/** The pool's handoff before: a copy of the body's bytes, transferred. */
const copied = (body: Uint8Array, post: Post) => {
  const copy = new Uint8Array(body);
  post(copy, [copy.buffer]);
};
const before: Arm = { name: "before", send: (chunks, total, post) => copied(joinPlain(chunks, total), post) };
const after: Arm = { name: "after", send: (chunks, total, post) => post(joinBody(chunks, total)) };
const sharedCopy: Arm = {
  name: "shared",
  send: (chunks, total, post) => {
    const body = new Uint8Array(new SharedArrayBuffer(total));
    body.set(chunks[0]!);
    post(body);
  },
};
let sink = 0;
const keptBefore: Arm = { name: "before", send: (chunks, total) => void (sink += joinPlain(chunks, total)[total - 1]!) };
const keptAfter: Arm = { name: "after", send: (chunks, total) => void (sink += joinBody(chunks, total)[total - 1]!) };

/** `n` bytes of a chat body cut into chunks of `size`, each a view into a buffer of its own (its gRPC message). */
function bodyChunks(n: number, size: number): Uint8Array[] {
  const text = `{"model":"m","messages":[{"role":"user","content":"${"lorem ipsum dolor sit amet ".repeat(Math.ceil(n / 27)).slice(0, n - 60)}"}]}`;
  const bytes = new TextEncoder().encode(text);
  const out: Uint8Array[] = [];
  for (let off = 0; off < bytes.length; off += size) {
    const piece = bytes.subarray(off, Math.min(off + size, bytes.length));
    const message = new Uint8Array(piece.length + 24); // a frame's header and fields around the bytes
    message.set(piece, 12);
    out.push(message.subarray(12, 12 + piece.length));
  }
  return out;
}

async function main(): Promise<void> {
  const worker = new Worker(new URL(import.meta.url));
  const waiting = new Map<number, () => void>();
  worker.on("message", (m: { id: number }) => {
    waiting.get(m.id)?.();
    waiting.delete(m.id);
  });
  let id = 0;
  const post = (body: Uint8Array, transfer: ArrayBuffer[] = []) => worker.postMessage({ type: "job", id: ++id, job: { kind: "body", request: { body } }, discard: false }, transfer);

  /** One round of an arm: BATCH bodies sent (timed), then their answers awaited (not timed). */
  async function round(arm: Arm, chunks: Uint8Array[], total: number, sends: boolean): Promise<number> {
    const answers: Promise<void>[] = [];
    const t0 = performance.now();
    for (let i = 0; i < BATCH; i++) {
      arm.send(chunks, total, post);
      if (sends) answers.push(new Promise<void>((resolve) => waiting.set(id, resolve)));
    }
    const ms = performance.now() - t0;
    await Promise.all(answers);
    return ms;
  }

  const scenarios: { name: string; arms: [Arm, Arm]; chunkOf: (n: number) => number; sends: boolean }[] = [
    { name: "chunks", arms: [before, after], chunkOf: (n) => Math.min(CHUNK, Math.ceil(n / 2)), sends: true },
    { name: "one", arms: [before, sharedCopy], chunkOf: (n) => n, sends: true },
    { name: "kept", arms: [keptBefore, keptAfter], chunkOf: (n) => Math.min(CHUNK, Math.ceil(n / 2)), sends: false },
  ];
  const rows: string[] = [];
  for (const s of scenarios) {
    for (const size of SIZES) {
      const chunks = bodyChunks(size, s.chunkOf(size));
      const total = chunks.reduce((sum, c) => sum + c.length, 0);
      // Warm both arms, then size the run from the slower one's round.
      for (let i = 0; i < 20; i++) for (const arm of s.arms) await round(arm, chunks, total, s.sends);
      const probe = Math.max(...(await Promise.all(s.arms.map((arm) => round(arm, chunks, total, s.sends)))));
      const rounds = Math.max(20, Math.min(2000, Math.round(TARGET_MS / Math.max(probe, 0.001))));
      const perBody: number[][] = s.arms.map(() => []);
      for (let r = 0; r < rounds; r++)
        for (let a = 0; a < s.arms.length; a++) {
          const arm = s.arms[(a + r) % s.arms.length]!; // alternating which goes first
          perBody[(a + r) % s.arms.length]!.push(((await round(arm, chunks, total, s.sends)) * 1000) / BATCH);
        }
      const [b, c] = perBody.map(stats);
      const f = (x: { median: number; mean: number }) => `${x.median.toFixed(2)} / ${x.mean.toFixed(2)}`;
      rows.push(`| ${s.name} | ${(total / 1024).toFixed(1)} KiB in ${chunks.length} | ${f(b!)} | ${s.arms[1].name} | ${f(c!)} | ${(c!.median / b!.median).toFixed(2)} |`);
    }
  }
  await worker.terminate();
  console.log(`Sending thread, µs per body (median / mean of rounds of ${BATCH}); Bun ${Bun.version}\n`);
  console.log("| scenario | body | before | arm | arm's | arm/before (median) |\n|---|---|---|---|---|---|");
  for (const r of rows) console.log(r);
  if (sink === 0.5) console.log(sink);
}

function stats(xs: number[]): { median: number; mean: number } {
  const sorted = [...xs].sort((a, b) => a - b);
  return { median: sorted[Math.floor(sorted.length / 2)]!, mean: xs.reduce((s, x) => s + x, 0) / xs.length };
}

if (isMainThread) await main();
