import type { DumpSource, RouterEvent } from "../types.ts";

// Streaming `/dump` writer (DESIGN.md §6). The body is produced chunk by chunk from the source's iterators
// as the consumer pulls, so memory stays bounded by one chunk however large the index is, and a slow reader
// slows the iteration instead of piling bytes up (pull-based ReadableStream, high-water mark of one chunk).

/** Target size of one emitted chunk, in UTF-16 code units before encoding (the body is ASCII but for keys). */
export const DUMP_CHUNK_CHARS = 64 * 1024;

function routerEventJson(e: RouterEvent): string {
  // bigint.toString() is exact for any u64: no Number conversion anywhere on this path.
  let blocks = "";
  for (let i = 0; i < e.blocks.length; i++) {
    const b = e.blocks[i]!;
    blocks += (i === 0 ? '{"block_hash":' : ',{"block_hash":') + b.blockHash.toString() + ',"tokens_hash":' + b.tokensHash.toString() + "}";
  }
  const parent = e.parentHash === null ? "null" : e.parentHash.toString();
  return (
    '{"worker_id":' + JSON.stringify(e.workerId) +
    ',"event":{"event_id":' + e.eventId +
    ',"data":{"stored":{"parent_hash":' + parent +
    ',"blocks":[' + blocks + ']}}},"dp_rank":' + e.dpRank + "}"
  );
}

/** The body as a lazy sequence of JSON text pieces. */
export function* dumpPieces(source: DumpSource): Generator<string> {
  yield "{";
  let firstModel = true;
  for (const m of source.models()) {
    yield (firstModel ? "" : ",") + JSON.stringify(m.key) + ':{"block_size":' + m.blockSize + ',"events":[';
    firstModel = false;
    let firstEvent = true;
    for (const e of m.events) {
      yield firstEvent ? routerEventJson(e) : "," + routerEventJson(e);
      firstEvent = false;
    }
    yield "]}";
  }
  yield "}";
}

/** Groups pieces into chunks of about `chunkChars`; returns null when the body is complete. */
export function chunker(pieces: Iterator<string>, chunkChars = DUMP_CHUNK_CHARS): () => Uint8Array | null {
  const encoder = new TextEncoder();
  let done = false;
  return () => {
    if (done) return null;
    let text = "";
    while (text.length < chunkChars) {
      const r = pieces.next();
      if (r.done) {
        done = true;
        break;
      }
      text += r.value;
    }
    return text.length === 0 ? null : encoder.encode(text);
  };
}

/**
 * The `/dump` body as a pull-based byte stream. Errors thrown by the source surface as a stream error (the
 * HTTP layer then aborts the connection, and the peer sees a truncated body and fails its attempt).
 * `first` lets a caller pre-pull the first chunk so that a failure before any byte is sent can still
 * become a 500 (see `dumpResponse`).
 */
export function dumpStream(source: DumpSource, opts: { chunkChars?: number } = {}): ReadableStream<Uint8Array> {
  return streamFromChunks(chunker(dumpPieces(source), opts.chunkChars), null);
}

export function streamFromChunks(next: () => Uint8Array | null, first: Uint8Array | null): ReadableStream<Uint8Array> {
  let pending = first;
  return new ReadableStream<Uint8Array>(
    {
      pull(controller) {
        const chunk = pending ?? next();
        pending = null;
        if (chunk === null) controller.close();
        else controller.enqueue(chunk);
      },
    },
    { highWaterMark: 1 },
  );
}
