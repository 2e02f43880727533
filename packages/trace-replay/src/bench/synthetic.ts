// A synthetic trace of another shape than the Mooncake conversations, in the same format: more sharing,
// shorter prompts. Many requests open with one of a few dozen shared system prompts (an app's
// instructions, 1-4 blocks of 512 tokens, popularity Zipf-like), followed by a short session: a new
// session's first turn adds one block; a later turn (half the requests) repeats its session so far and
// adds one more, up to four turns. Prompts run ~1-4k tokens against the conversation trace's ~13k, and
// most of each prompt is shared with other requests.
import { seededRandom } from "@kv-epp/testkit";
import { TRACE_BLOCK_TOKENS, type TraceRecord } from "../trace.ts";

export const SYNTHETIC_TRACE = "synthetic";

const APPS = 40;
const MAX_TURNS = 4;
/** Requests per second of trace time (the bench compresses time by --time-scale on top): ~80% of the simulated engines' prefill at 1x. */
const RATE_PER_S = 80;

type Session = { app: number; ids: number[]; turns: number };

export function syntheticTrace(requests: number, seed = 1): TraceRecord[] {
  const random = seededRandom(seed);
  let nextId = 1;
  const apps = Array.from({ length: APPS }, () => Array.from({ length: 1 + Math.floor(random() * 4) }, () => nextId++));
  // Zipf-like popularity: app k drawn with weight 1 / (k + 1).
  const weights = apps.map((_, k) => 1 / (k + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  const drawApp = () => {
    let r = random() * total;
    for (let k = 0; k < APPS; k++) if ((r -= weights[k]!) < 0) return k;
    return APPS - 1;
  };
  const open: Session[] = [];
  const out: TraceRecord[] = [];
  let t = 0;
  for (let i = 0; i < requests; i++) {
    // Poisson arrivals.
    t += (-Math.log(1 - random()) / RATE_PER_S) * 1000;
    let s: Session;
    if (open.length > 0 && random() < 0.5) {
      const k = Math.floor(random() * open.length);
      s = open[k]!;
      if (s.turns + 1 >= MAX_TURNS) open.splice(k, 1);
    } else {
      s = { app: drawApp(), ids: [], turns: 0 };
      open.push(s);
      if (open.length > 200) open.shift();
    }
    s.ids.push(nextId++);
    s.turns++;
    const hashIds = [...apps[s.app]!, ...s.ids];
    // The last block is partial: 100-500 of its 512 tokens.
    const inputLength = (hashIds.length - 1) * TRACE_BLOCK_TOKENS + 100 + Math.floor(random() * 400);
    out.push({ timestamp: Math.round(t), inputLength, outputLength: 50 + Math.floor(random() * 250), hashIds });
  }
  return out;
}
