import { afterEach, beforeAll, describe, expect, test } from "bun:test";
import { Worker } from "node:worker_threads";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { hashSeed } from "../fast/word-cache";
import { encodeJob, type TokenizeJob } from "../job";
import { createPreprocessor, messagesModes, unprobedMessagesOptions } from "../preprocessor";
import { readBody } from "../request/read-body";
import type { FromMember, MemberInit, ToMember } from "./protocol";

let dir: string;
beforeAll(async () => {
  dir = await qwen3TokenizerDir();
}, 60_000);

const workers: Worker[] = [];
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.terminate()));
});

/** A member thread started by `init`, and the messages it posts, awaited by their type. */
function member(init: MemberInit) {
  const worker = new Worker(new URL("./pool-member.ts", import.meta.url), { workerData: init });
  workers.push(worker);
  const heard: FromMember[] = [];
  const waiting: (() => void)[] = [];
  worker.on("message", (m: FromMember) => {
    heard.push(m);
    waiting.splice(0).forEach((wake) => wake());
  });
  return {
    post: (m: ToMember) => worker.postMessage(m),
    async next(type: FromMember["type"]): Promise<FromMember> {
      for (;;) {
        const found = heard.find((m) => m.type === type);
        if (found) return found;
        await new Promise<void>((wake) => waiting.push(wake));
      }
    },
  };
}

describe("a pool member", () => {
  // A pool starts its members while it probes (tokenizer-pool.ts): they load by the unprobed modes and are told the
  // verdict ahead of any job, which they take in order after it.
  test("started by the unprobed Messages modes, renders a Messages job posted at once by the verdict posted before it", async () => {
    const probed = createPreprocessor({ tokenizerDir: dir });
    const modes = messagesModes(probed.rules)!;
    const unprobed = createPreprocessor(unprobedMessagesOptions({ tokenizerDir: dir }));
    expect(modes).toEqual({ inlineSystem: "preserve", disabledThinkingEffort: "none" });
    expect(messagesModes(unprobed.rules)).toEqual({ inlineSystem: "fold", disabledThinkingEffort: "low" });
    const body = {
      model: "m", max_tokens: 10, thinking: { type: "disabled" },
      messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello" }, { role: "system", content: "Be brief." }, { role: "user", content: "Why?" }],
    };
    const request = { body: new TextEncoder().encode(JSON.stringify(body)), path: "/v1/messages" };
    const ids = (pre: typeof probed) => [...encodeJob(pre, readBody(request, pre.rules).job as TokenizeJob)];
    expect(ids(unprobed)).not.toEqual(ids(probed));

    const m = member({ preprocessor: unprobedMessagesOptions({ tokenizerDir: dir }), seed: hashSeed(), cancel: new SharedArrayBuffer(8), nice: 0, sliceUs: 0, serving: false });
    m.post({ type: "messages-modes", modes });
    m.post({ type: "job", id: 1, job: { kind: "body", request }, discard: false });
    const done = await m.next("done");
    expect(done).toMatchObject({ id: 1 });
    expect([...(done as Extract<FromMember, { type: "done" }>).ids!]).toEqual(ids(probed));
  }, 60_000);
});
