import { describe, expect, test } from "bun:test";
import { freshWords } from "@kv-epp/testkit";
import { affinityKey, nextTurnJob, type ChatMessage, type PoolJob } from "../src/index";
import { chatReplyBody } from "./chat-reply-body";

const enc = new TextEncoder();
const body = (fields: object, indent?: number): PoolJob => ({ kind: "body", request: { body: enc.encode(JSON.stringify(fields, null, indent)) } });
const chatBody = (messages: ChatMessage[], indent?: number) => body({ model: "m", messages, stream: true }, indent);
const parsed = (messages: ChatMessage[]) => ({ kind: "chat" as const, messages, opts: {} });

const user = (content: string): ChatMessage => ({ role: "user", content });
const assistant = (content: string): ChatMessage => ({ role: "assistant", content });
/** A conversation of fresh text (from `seed`) after `lead` (its system messages), as its turns 1, 2 and 3 send it. */
function turns(seed: number, ...lead: ChatMessage[]): ChatMessage[][] {
  const c = [user(freshWords(30, seed)), assistant(freshWords(80, seed + 1)), user(freshWords(20, seed + 2)), assistant(freshWords(80, seed + 3)), user(freshWords(10, seed + 4))];
  return [1, 3, 5].map((n) => [...lead, ...c.slice(0, n)]);
}
const keys = (jobs: PoolJob[]) => jobs.map(affinityKey);
const system = { role: "system", content: freshWords(200, 11) };

describe("affinity key", () => {
  test("a conversation's turns 1, 2 and 3 share a key without a system prompt, as bodies and as parsed jobs", () => {
    const sends = turns(20);
    expect(new Set(keys(sends.map((m) => chatBody(m)))).size).toBe(1);
    expect(new Set(keys(sends.map(parsed))).size).toBe(1);
  });

  test("a conversation's turns share a key after a system prompt, after several, and after a developer message", () => {
    const developer = { role: "developer", content: "Answer in French." };
    for (const lead of [[system], [system, { role: "system", content: "Be brief." }], [developer], [system, developer]]) {
      const sends = turns(30, ...lead);
      expect(new Set(keys(sends.map((m) => chatBody(m)))).size).toBe(1);
      expect(new Set(keys(sends.map(parsed))).size).toBe(1);
    }
  });

  test("a pretty-printed body's turns share a key, its roles read through the whitespace around the colon", () => {
    const sends = turns(40, system);
    expect(new Set(keys(sends.map((m) => chatBody(m, 2)))).size).toBe(1);
    // The system message read as such: the first user turn is in the key.
    expect(affinityKey(chatBody(turns(50, system)[0]!, 2))).not.toBe(affinityKey(chatBody(sends[0]!, 2)));
    const spaced = (u: string) => ({ kind: "body" as const, request: { body: enc.encode(`{"messages" : [ { "role" :\n "system" , "content" : "s" } ,\n{ "role" : "user", "content" : "${u}" } ] }`) } });
    expect(affinityKey(spaced("one"))).not.toBe(affinityKey(spaced("two")));
  });

  test("the warm of turn 1's reply keys like turn 2, as a body and as a parsed job", () => {
    for (const lead of [[], [system]]) {
      const [first, second] = turns(60, ...lead);
      const reply = second![second!.length - 2]!;
      const warm: PoolJob = { kind: "body", request: (chatBody(first!) as Extract<PoolJob, { kind: "body" }>).request, reply: chatReplyBody(reply) };
      expect(affinityKey(warm)).toBe(affinityKey(chatBody(second!)));
      expect(affinityKey(nextTurnJob(parsed(first!), reply)!)).toBe(affinityKey(parsed(second!)));
    }
  });

  test("two conversations with the same system prompt (or two) get different keys", () => {
    for (const lead of [[system], [system, { role: "system", content: "Be brief." }]]) {
      const [a, b] = [turns(70, ...lead), turns(80, ...lead)];
      for (const i of [0, 1, 2]) {
        expect(affinityKey(chatBody(a[i]!))).not.toBe(affinityKey(chatBody(b[i]!)));
        expect(affinityKey(parsed(a[i]!))).not.toBe(affinityKey(parsed(b[i]!)));
      }
    }
  });

  test("a body's key and a parsed job's key group the same turns together", () => {
    const sends = [turns(90), turns(100), turns(110, system), turns(120, system), turns(90, system)].flat();
    const grouping = (key: (m: ChatMessage[]) => number) => sends.map((m) => sends.map((n) => key(m) === key(n)));
    expect(grouping((m) => affinityKey(chatBody(m)))).toEqual(grouping((m) => affinityKey(parsed(m))));
  });

  test("a role or a key quoted inside a message's text is not read as one", () => {
    const quoting = { role: "system", content: `Reply as JSON: {"role": "user", "content": "..."}, "messages": [] ` };
    const [a, b] = [turns(130, quoting), turns(140, quoting)];
    expect(new Set(keys(a.map((m) => chatBody(m)))).size).toBe(1);
    expect(affinityKey(chatBody(a[0]!))).not.toBe(affinityKey(chatBody(b[0]!)));
  });

  test("a Responses request's input items key like messages, item types and developer items allowed", () => {
    const send = (input: object[]) => body({ model: "m", instructions: "Be brief.", input, store: false });
    const question = (text: string) => ({ type: "message", role: "user", content: [{ type: "input_text", text }] });
    const call = [{ type: "function_call", call_id: "c1", name: "weather", arguments: "{}" }, { type: "function_call_output", call_id: "c1", output: "sunny" }];
    for (const lead of [[], [{ type: "message", role: "developer", content: "Use tools." }]]) {
      const first = [...lead, question("the weather?")];
      expect(affinityKey(send([...first, ...call]))).toBe(affinityKey(send(first)));
      expect(affinityKey(send([...lead, question("the time?")]))).not.toBe(affinityKey(send(first)));
    }
  });

  test("a string input or prompt keys on its text, not on the fields after it; token-id prompts still key", () => {
    expect(affinityKey(body({ input: "hello", max_output_tokens: 5 }))).toBe(affinityKey(body({ input: "hello", max_output_tokens: 9 })));
    expect(affinityKey(body({ prompt: "The cat", max_tokens: 5 }))).toBe(affinityKey(body({ prompt: "The cat", max_tokens: 9 })));
    expect(affinityKey(body({ prompt: "The cat" }))).not.toBe(affinityKey(body({ prompt: "The dog" })));
    expect(affinityKey(body({ prompt: [1, 2, 3], max_tokens: 5 }))).not.toBe(affinityKey(body({ prompt: [1, 2, 4], max_tokens: 5 })));
  });

  test("a conversation's turns, as bodies, call the same member home whatever their size; other conversations spread", () => {
    const turn = (...rest: ChatMessage[]) => chatBody([system, ...rest]);
    const key = affinityKey(turn(user("first question")));
    expect(affinityKey(turn(user("first question"), assistant("an answer"), user("a follow-up")))).toBe(key);
    expect(affinityKey(turn(user("first question"), assistant("an answer"), user("a follow-up"), assistant("more"), user(freshWords(50_000, 12))))).toBe(key);
    // A first turn larger than the scan reads: its turns still share the key.
    const huge = freshWords(50_000, 13);
    expect(affinityKey(chatBody([user(huge), assistant("ok"), user("and?")]))).toBe(affinityKey(chatBody([user(huge)])));
    const others = new Set(Array.from({ length: 16 }, (_, i) => affinityKey(chatBody([{ role: "system", content: freshWords(50, 100 + i) }, user("q")])) % 4));
    expect(others.size).toBeGreaterThan(1);
  });
});
