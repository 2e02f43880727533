// A pool member: a worker thread with its own preprocessor and segment cache, tokenizing one job at a time.
import { parentPort, workerData } from "node:worker_threads";
import { encodeJob, type TokenizeJob } from "../job";
import { isMediaPart } from "../media";
import { createPreprocessor } from "../preprocessor";
import { EncodeStopped, type EncodeControl, type KnownPrefix } from "../segmenter";
import type { Preprocessor } from "../types";
import type { FromMember, MemberInit, ToMember } from "./protocol";

// Below this many unknown characters the whole job takes well under a millisecond: no early known prefix.
const KNOWN_PREFIX_MIN_CHARS = 16 * 1024;

const port = parentPort!;
const init = workerData as MemberInit;
const cancel = new Int32Array(init.cancel);
const post = (m: FromMember, transfer: ArrayBuffer[] = []) => port.postMessage(m, transfer);

let pre: Preprocessor;
try {
  pre = createPreprocessor(init.preprocessor);
  post({ type: "ready" });
} catch (err) {
  post({ type: "init-failed", message: (err as Error).message });
  process.exit(1);
}

// Microseconds per unknown character, learned from this member's own work (start: ~4 chars a token at
// ~1 µs a token, a slow start on purpose).
let usPerChar = 0.25;

port.on("message", (m: ToMember) => {
  const t0 = performance.now();
  let unknownChars = 0;
  const control: EncodeControl = {
    shouldStop: () => Atomics.load(cancel, 0) === m.id,
    warm: m.discard,
    knownPrefixMinChars: KNOWN_PREFIX_MIN_CHARS,
    knownPrefix: (known: KnownPrefix) => {
      unknownChars = known.unknownChars;
      // A chat cut at its first media part knows its cut only at the end.
      if (m.discard || known.unknownChars < KNOWN_PREFIX_MIN_CHARS || hasMedia(m.job)) return;
      const ids = known.ids.slice();
      post({ type: "known", id: m.id, ids, estimatedMs: (known.unknownChars * usPerChar) / 1000 }, [ids.buffer as ArrayBuffer]);
    },
  };
  // The cache's figures go back with every result: the pool sums its members' for the process's metrics.
  const before = pre.cacheStats();
  try {
    const ids = encodeJob(pre, m.job, control);
    const busyMs = performance.now() - t0;
    if (unknownChars >= KNOWN_PREFIX_MIN_CHARS) usPerChar = 0.8 * usPerChar + 0.2 * ((busyMs * 1000) / unknownChars);
    const cache = pre.cacheStats();
    const freshTokens = cache.freshTokens - before.freshTokens;
    const warmedTokens = cache.warmedHitTokens - before.warmedHitTokens;
    if (m.discard) post({ type: "done", id: m.id, ids: null, freshTokens, warmedTokens, busyMs, cache });
    else {
      const own = ids.byteOffset === 0 && ids.byteLength === ids.buffer.byteLength ? ids : ids.slice();
      post({ type: "done", id: m.id, ids: own, freshTokens, warmedTokens, busyMs, cache }, [own.buffer as ArrayBuffer]);
    }
  } catch (err) {
    const busyMs = performance.now() - t0;
    const cache = pre.cacheStats();
    if (err instanceof EncodeStopped) post({ type: "stopped", id: m.id, busyMs, cache });
    else post({ type: "error", id: m.id, name: (err as Error).name, message: (err as Error).message, busyMs, cache });
  }
});

function hasMedia(job: TokenizeJob): boolean {
  return job.kind === "chat" && job.cutAtMedia === true && job.messages.some((msg) => Array.isArray(msg.content) && msg.content.some(isMediaPart));
}
