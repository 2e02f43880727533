// The listener's message bound against what a real batch reaches (src/batch-bound.ts): a single-step
// prefill of a 1M-token prompt on a hybrid model is legal for vLLM and libzmq and far above 8 MiB.
import { afterEach, expect, test } from "bun:test";
import { batchBound, DEFAULT_KV_MAX_MESSAGE_SIZE, encodeBatch, KvEventListener, KvEventPublisher, REFERENCE_STEP, type KvEventBatch, type ListenerSignal } from "../src/index.ts";
import { EAGER_FRAME, ZmtpParser } from "../src/zmtp/parser.ts";
import { encodeGreeting, encodeMessage } from "../src/zmtp/wire.ts";
import { waitUntil } from "./zmq-peer.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const TOKENS = 2 ** 20;
const BLOCK = 16;

/** One engine step: the prompt's 65536 blocks stored by the full-attention and the sliding-window group. */
function prefillStep(): KvEventBatch {
  const tokenIds = Array.from({ length: TOKENS }, (_, i) => 100_000 + (i % 50_000)); // ids past 65535: 5 bytes each
  const blockHashes = Array.from({ length: TOKENS / BLOCK }, (_, i) => 2n ** 63n + BigInt(i));
  const store = (groupIdx: number, kind: string) =>
    ({ type: "BlockStored", blockHashes, parentBlockHash: null, tokenIds, blockSize: BLOCK, loraId: null, medium: "GPU", loraName: null, groupIdx, kvCacheSpecKind: kind }) as const;
  return { ts: 1.5, dataParallelRank: 0, events: [store(0, "full_attention"), store(1, "sliding_window")] };
}

test("the default bound covers the reference step it is computed from, and is a power of two", () => {
  expect(batchBound(REFERENCE_STEP)).toBeLessThanOrEqual(DEFAULT_KV_MAX_MESSAGE_SIZE);
  expect(DEFAULT_KV_MAX_MESSAGE_SIZE).toBe(64 * 2 ** 20);
  expect(encodeBatch(prefillStep()).length).toBeLessThanOrEqual(batchBound({ ...REFERENCE_STEP, hashBytes: 9, extraKeyBytes: 0 }));
});

test("a 1M-token single-step prefill batch (over 8 MiB) reaches the consumer whole: no reset, no refusal", async () => {
  const pub = await KvEventPublisher.bind({ endpoint: `tcp://${LOOPBACK}.1.5:0` });
  cleanups.push(() => pub.close());
  const l = new KvEventListener({ workerId: "w", dpRank: 0, endpoint: pub.endpoint, socket: { reconnectMinMs: 10, reconnectMaxMs: 50 } });
  cleanups.push(() => l.close());
  const got: ListenerSignal[] = [];
  l.start();
  l.attach((s) => got.push(s));
  const small: KvEventBatch = { ts: 0.5, dataParallelRank: 0, events: [{ type: "AllBlocksCleared" }] };
  await waitUntil(() => got.length > 0 || (pub.publish(small), false));
  const big = prefillStep();
  const bytes = encodeBatch(big);
  expect(bytes.length).toBeGreaterThan(8 * 2 ** 20);
  pub.publishPayload(bytes);
  await waitUntil(() => got.some((s) => s.kind === "batch" && s.batch.events.length === 2), 20_000);
  const delivered = got.find((s) => s.kind === "batch" && s.batch.events.length === 2);
  expect(delivered?.kind === "batch" && delivered.batch.events[0]!.type === "BlockStored" && delivered.batch.events[0]!.tokenIds.length).toBe(TOKENS);
  expect(got.filter((s) => s.kind === "reset")).toEqual([]);
  expect(l.socketCounters?.oversize).toBe(0);
}, 30_000);

test("a frame declared larger than what has arrived grows with its bytes, and comes out whole however it is chunked", () => {
  const body = Buffer.alloc(3 * EAGER_FRAME + 12345);
  for (let i = 0; i < body.length; i++) body[i] = (i * 7) & 0xff;
  const frames: Buffer[] = [];
  const parser = new ZmtpParser({ greeting: () => undefined, frame: (_f, b) => void frames.push(Buffer.from(b)) }, 64 * 2 ** 20);
  const stream = Buffer.concat([encodeGreeting(1, false), encodeMessage([body])]);
  for (let off = 0; off < stream.length; off += 65_521) parser.push(stream.subarray(off, off + 65_521));
  expect(parser.error).toBeNull();
  expect(frames).toHaveLength(1);
  expect(frames[0]!.equals(body)).toBe(true);
});
