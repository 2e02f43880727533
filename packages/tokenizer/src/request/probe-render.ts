// What vLLM's startup probes of its renderer (inline-system-probe.ts, disabled-thinking-probe.ts) render with and
// compare by, shared by both.

/** A /v1/chat/completions body's chat encoded as the workers would; throws where they refuse or cannot render it. */
export type EncodeBody = (body: Record<string, unknown>) => Uint32Array;

/** Whether two renders are the same token ids. */
export const sameIds = (a: ArrayLike<number>, b: ArrayLike<number>) => a.length === b.length && Array.prototype.every.call(a, (v, i) => v === b[i]);
