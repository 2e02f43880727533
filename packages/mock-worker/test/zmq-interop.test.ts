import { afterEach, expect, test } from "bun:test";
import { decodeBatch, type BlockStored } from "@kv-epp/kv-events";
import { chainBlockIds, startMockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, residentFromEvents, syncSubscribers, type Received } from "./support.ts";

const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** A libzmq SUB in a Node child process; its messages are decoded here with @kv-epp/kv-events. */
function zmqSubscriber(endpoint: string, topic: string) {
  const child = Bun.spawn(["node", `${import.meta.dir}/zmq-subscriber.mjs`, endpoint, topic], { stdout: "pipe", stderr: "inherit" });
  cleanup.push(async () => {
    child.kill();
    await child.exited;
  });
  const messages: Received[] = [];
  const frameCounts: number[] = [];
  let ready = false;
  (async () => {
    let buf = "";
    for await (const chunk of child.stdout) {
      buf += new TextDecoder().decode(chunk);
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        if (line.ready) ready = true;
        else {
          frameCounts.push(line.parts);
          const payload = Buffer.from(line.payload, "base64");
          messages.push({ topic: line.topic, seq: BigInt("0x" + line.seq), batch: decodeBatch(payload), payload });
        }
      }
    }
  })();
  return { messages, frameCounts, ready: () => ready };
}

test("a libzmq subscriber (Node + zeromq) receives the worker's events, matching its cache", async () => {
  const w = await startMockWorker({
    listen: `${LOOPBACK}.2.4`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.4:0`, speed: 0, blockSize: 4, capacityBlocks: 3,
    topic: "kv", logLevel: "silent",
  });
  cleanup.push(() => w.close());
  const sub = zmqSubscriber(w.ranks[0]!.kvEvents, "kv");
  await waitFor(sub.ready, { message: "the Node subscriber to start" });
  await syncSubscribers(w.url, [sub]);

  const prompt = Array.from({ length: 9 }, (_, i) => i);
  for (const p of [prompt, prompt, prompt.map((t) => t + 100)]) {
    expect((await post(`${w.url}/v1/completions`, { prompt: p, max_tokens: 1 })).status).toBe(200);
  }
  // First prompt: 2 blocks stored; repeat: nothing; third: 2 blocks into capacity 3 evicts one.
  await waitFor(() => sub.messages.length === 2, { message: "two batches" });
  expect(sub.frameCounts.every((n) => n === 3)).toBe(true); // topic, seq, payload
  expect(sub.messages.every((m) => m.topic === "kv")).toBe(true);
  expect(sub.messages[1]!.seq).toBe(sub.messages[0]!.seq + 1n);
  const first = sub.messages[0]!.batch.events[0] as BlockStored;
  expect(first.blockHashes).toEqual(chainBlockIds(Uint32Array.from(prompt), 4).map((b) => b.hash));
  expect(sub.messages[1]!.batch.events.map((e) => e.type)).toEqual(["BlockRemoved", "BlockStored"]);
  expect(residentFromEvents(sub.messages)).toEqual(w.ranks[0]!.cache.residentHashes());
});
