// Bodies prepared ahead of their arrival.
import { describe, expect, test } from "bun:test";
import type { TraceRecord } from "../trace.ts";
import { BodyLookahead, completionBody, requestBuilder, requestSource } from "./bodies.ts";

const records: TraceRecord[] = [0, 1, 2, 3, 4].map((i) => ({ timestamp: i * 10, inputLength: 600 + i, outputLength: 3, hashIds: [i, 100 + i] }));
const json = (b: Uint8Array) => JSON.parse(new TextDecoder().decode(b)) as { prompt?: number[]; messages?: { role: string; content: string }[] };

// Record 1 continues record 0 (its ids extend 0's); both built ahead, before any reply.
const turns: TraceRecord[] = [
  { timestamp: 0, inputLength: 1300, outputLength: 20, hashIds: [0, 1, 2] },
  { timestamp: 10, inputLength: 2500, outputLength: 5, hashIds: [0, 1, 5, 6, 7] },
];
async function twoTurnsBuiltAhead() {
  const source = requestSource(turns, "m", "chat");
  const bodies = new BodyLookahead(turns.length, source.build, 8, source.stale);
  await bodies.fill(() => true);
  return { source, bodies };
}

describe("BodyLookahead", () => {
  test("fills up to its depth in idle time; taken bodies are the records' own, in order", async () => {
    const bodies = new BodyLookahead(records.length, requestBuilder(records, "m", "tokens"), 3);
    await bodies.fill(() => true);
    for (const i of [0, 1, 2]) expect(bodies.take(i)).toEqual({ path: "/v1/completions", body: completionBody(records[i]!, "m") });
    expect(bodies.late).toBe(0);
    // Nothing was built beyond the depth: record 3 has to be built when taken.
    expect(json(bodies.take(3).body).prompt).toHaveLength(603);
    expect(bodies.late).toBe(1);
    await bodies.fill(() => true);
    expect(json(bodies.take(4).body).prompt).toHaveLength(604);
    expect(bodies.late).toBe(1);
  });

  test("a fill whose time is up builds nothing", async () => {
    const bodies = new BodyLookahead(records.length, requestBuilder(records, "m", "tokens"));
    await bodies.fill(() => false);
    bodies.take(0);
    expect(bodies.late).toBe(1);
  });

  test("chat bodies are streamed chat completions with the record's conversation as text", () => {
    const build = requestBuilder(records, "m", "chat");
    const r = build(0);
    expect(r.path).toBe("/v1/chat/completions");
    const body = JSON.parse(new TextDecoder().decode(r.body));
    expect(body).toMatchObject({ model: "m", max_tokens: 3, stream: true, stream_options: { include_usage: true } });
    expect(body.messages).toHaveLength(1);
    expect(body.messages[0].role).toBe("user");
    expect(body.messages[0].content.split(" ").length).toBeGreaterThan(590);
  });

  test("a chat turn built before its earlier turn's reply came is built again, resending that reply", async () => {
    const { source, bodies } = await twoTurnsBuiltAhead();
    bodies.take(0);
    source.replied(0, { content: "The reply the client received." });
    const next = json(bodies.take(1).body).messages!;
    expect(bodies.rebuilt).toBe(1);
    expect(next.map((m) => m.role)).toEqual(["user", "assistant", "user"]);
    expect(next[1]!.content).toBe("The reply the client received.");
    expect(source.replyCounts()).toEqual({ resent: 1, stoodIn: 0 });
  });

  test("a chat turn resends its earlier turn's reply in the role the response named", async () => {
    const { source, bodies } = await twoTurnsBuiltAhead();
    bodies.take(0);
    source.replied(0, { role: "model", content: "A reply in a server's --response-role." });
    const next = json(bodies.take(1).body).messages!;
    expect(next[1]).toEqual({ role: "model", content: "A reply in a server's --response-role." });
    expect(next.map((m) => m.role)).toEqual(["user", "model", "user"]);
  });

  test("a turn sent before its earlier turn's reply came carries the trace's text in its place, and is counted so", async () => {
    const { source, bodies } = await twoTurnsBuiltAhead();
    const first = json(bodies.take(0).body).messages!;
    const next = json(bodies.take(1).body).messages!;
    expect(bodies.rebuilt).toBe(0);
    expect(next.slice(0, 1)).toEqual(first);
    expect(next[1]!.content.split(" ").length).toBe(20);
    expect(source.replyCounts()).toEqual({ resent: 0, stoodIn: 1 });
    // The same bodies as the deterministic builder's (what the benchmarks send).
    expect(json(requestBuilder(turns, "m", "chat")(0).body).messages).toEqual(first);
  });
});
