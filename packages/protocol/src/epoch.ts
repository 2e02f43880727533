// A KV-event publisher's epoch (its lifetime id): carried by vLLM's 24-byte seq frame or SGLang's topic, kept in the
// stream cursors a /dump carries. One reading for all of them.

/** The longest epoch read, in UTF-8 bytes: SGLang's bound on the epochs it publishes (its readers refuse longer ones). */
export const MAX_EPOCH_BYTES = 256;

// A BOM is part of an epoch, not dropped: two epochs differing by one must not read equal.
const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** An epoch from its UTF-8 bytes; undefined when it is empty, longer than MAX_EPOCH_BYTES or not UTF-8. */
export function decodeEpoch(b: Uint8Array): string | undefined {
  if (b.length === 0 || b.length > MAX_EPOCH_BYTES) return undefined;
  try {
    return UTF8.decode(b);
  } catch {
    return undefined;
  }
}
