// vLLM's Anthropic server, left at its default ("auto"), decides once whether inline system messages may stay in
// place by rendering a few probe chats with its renderer (inline_system.py, _Prober). The EPP renders with its own
// mirror of that renderer, so it runs the same probe on it, with the same chats and checks on the token ids, and
// reaches the verdict the workers reach for the served template.
import type { ChatMessage } from "../types";
import type { InlineSystemMode } from "./inline-system";
import { sameIds, type EncodeBody } from "./probe-render";

/** What the probe renders with: a preprocessor's chat reading and encoding, and its role-marker ids. */
export type ProbeRenderer = {
  readonly encodeBody: EncodeBody;
  decode(ids: ArrayLike<number>): string;
  /** The tokenizer's special and added tokens' ids (transformers' all_special_ids and get_added_vocab). */
  readonly markerIds: ReadonlySet<number>;
};

export type ProbeVerdict = { mode: InlineSystemMode; reason: string };

// vLLM's probe texts, kept word for word: the verdict can hang on how they tokenize. Each starts and ends with a word
// of its own, so that the inserted span prefix and suffix matching finds starts at the inserted message.
const LEADING = "Alpha leading instructions";
const INLINE = "Echo inline note";
const REASONING = "Foxtrot prior reasoning";
const CALL_ID = "probe0001";
const TOOL = { type: "function", function: { name: "probe_tool", description: "Probe tool.", parameters: { type: "object", properties: {} } } };
const SYSTEM: ChatMessage = { role: "system", content: LEADING };
const USER: ChatMessage = { role: "user", content: "Bravo first question" };

type ProbeCase = { name: "mid" | "after_tool" | "trailing"; messages: ChatMessage[]; at: number };

/** The chats, and where the inline message goes in each: between turns, after a tool result, at the end. */
const CASES: readonly ProbeCase[] = [
  { name: "mid", messages: [SYSTEM, USER, { role: "assistant", content: "Charlie first answer" }, { role: "user", content: "Delta second question" }], at: 3 },
  {
    name: "after_tool",
    messages: [
      SYSTEM,
      USER,
      { role: "assistant", reasoning: REASONING, tool_calls: [{ id: CALL_ID, type: "function", function: { name: "probe_tool", arguments: "{}" } }] },
      { role: "tool", tool_call_id: CALL_ID, content: "Golf output" },
    ],
    at: 4,
  },
  { name: "trailing", messages: [SYSTEM, USER], at: 2 },
];

// Claude Code sends an effort, and some templates keep past reasoning only with thinking on: both are checked.
const EFFORTS = ["high", undefined] as const;

/** Where `next` is `base` with one span inserted: its position and the span, or undefined when it is not. */
export function insertion(base: ArrayLike<number>, next: ArrayLike<number>): { at: number; span: number[] } | undefined {
  const shorter = Math.min(base.length, next.length);
  let p = 0;
  while (p < shorter && base[p] === next[p]) p++;
  let s = 0;
  while (s < shorter - p && base[base.length - 1 - s] === next[next.length - 1 - s]) s++;
  if (p + s !== base.length) return undefined;
  return { at: p, span: Array.from({ length: next.length - s - p }, (_, i) => next[p + i]!) };
}

const occurrences = (text: string, part: string) => text.split(part).length - 1;

class Prober {
  constructor(private readonly r: ProbeRenderer) {}

  render(messages: readonly ChatMessage[], effort: string | undefined): Uint32Array | undefined {
    try {
      // Copied: a render may rewrite the messages it is given.
      return this.r.encodeBody(structuredClone({ messages, tools: [TOOL], tool_choice: null, reasoning_effort: effort ?? null }));
    } catch {
      return undefined;
    }
  }

  /** `message` rendered at `at`: the base (rendered again when the first try is no insertion), the render, the insertion. */
  insert(messages: readonly ChatMessage[], base: Uint32Array, at: number, message: ChatMessage, effort: string | undefined) {
    const withIt = [...messages.slice(0, at), message, ...messages.slice(at)];
    let next = this.render(withIt, effort);
    let found = next === undefined ? undefined : insertion(base, next);
    if (next !== undefined && found === undefined) {
      // A template printing today's date renders differently across midnight: once more, from a fresh base.
      const again = this.render(messages, effort);
      if (again !== undefined && !sameIds(again, base)) {
        base = again;
        next = this.render(withIt, effort);
        found = next === undefined ? undefined : insertion(base, next);
      }
    }
    return { base, next, found };
  }

  /** Why an inline system message is unsafe to keep in `c`, or undefined. */
  check(c: ProbeCase, firstBase: Uint32Array, effort: string | undefined): string | undefined {
    const { base, next, found } = this.insert(c.messages, firstBase, c.at, { role: "system", content: INLINE }, effort);
    if (next === undefined) return `${c.name}: renderer rejects it`;
    const text = this.r.decode(next);
    if (!text.includes(INLINE)) return `${c.name}: renderer drops it`;
    if (found === undefined) return `${c.name}: rendering it changes other parts of the prompt`;
    if (c.at === c.messages.length && found.at >= base.length) return `${c.name}: it lands after the generation prompt`;
    if (occurrences(this.r.decode(found.span), INLINE) !== 1) return `${c.name}: it is not rendered as its own segment`;
    if (!found.span.some((id) => this.r.markerIds.has(id))) return `${c.name}: it has no role marker`;
    if (c.name === "mid") {
      const asUser = this.insert(c.messages, base, c.at, { role: "user", content: INLINE }, effort).found;
      if (asUser !== undefined && sameIds(asUser.span, found.span)) return `${c.name}: it renders the same as a user message`;
    }
    if (this.r.decode(base).includes(REASONING) !== text.includes(REASONING)) return `${c.name}: it changes which reasoning is kept`;
    return undefined;
  }

  probe(): ProbeVerdict {
    let checked: Uint32Array[] | undefined;
    for (const effort of EFFORTS) {
      const cases: ProbeCase[] = [];
      const bases: Uint32Array[] = [];
      for (let c of CASES) {
        let base = this.render(c.messages, effort);
        if (base === undefined && c.messages.some((m) => "reasoning" in m)) {
          // A renderer may refuse past reasoning (Mistral's without think tokens): probed without it.
          c = { ...c, messages: c.messages.map(({ reasoning: _, ...m }) => m) };
          base = this.render(c.messages, effort);
        }
        if (base === undefined) break;
        cases.push(c);
        bases.push(base);
      }
      // An effort the template ignores renders the same chats: nothing new to check.
      if (bases.length !== CASES.length || (checked !== undefined && bases.every((b, i) => sameIds(b, checked![i]!)))) continue;
      checked = bases;
      for (const [i, c] of cases.entries()) {
        const why = this.check(c, bases[i]!, effort);
        if (why !== undefined) return { mode: "fold", reason: `${why} (reasoning_effort=${effort ?? "None"})` };
      }
    }
    if (checked === undefined) return { mode: "fold", reason: "the probe conversations could not be rendered" };
    return { mode: "preserve", reason: "the renderer marks them as distinct system turns" };
  }
}

/**
 * The mode vLLM's probe picks on this renderer: "preserve" when an inline system message renders as a system turn
 * of its own, with a role marker, inserted without changing anything else, before the generation prompt, unlike a
 * user message and keeping the same reasoning, in each probe chat, with reasoning_effort "high" and without; "fold"
 * otherwise, or when the probe fails.
 */
export function probeInlineSystem(r: ProbeRenderer): ProbeVerdict {
  try {
    return new Prober(r).probe();
  } catch (err) {
    return { mode: "fold", reason: `the probe failed: ${(err as Error).message}` };
  }
}
