import type { Logger } from "pino";
import type { DumpSource } from "../types.ts";
import { gcPacer } from "./gc-pacer.ts";
import { dumpChunks, streamFromChunks } from "./writer.ts";

// The producer side of GET /dump (docs/CONTRACTS.md §7), framework-free: `(Request) => Response`, so Hono mounts it
// with `app.get("/dump", (c) => handler(c.req.raw))` (Hono routes HEAD to it too, keeping the method).

export type DumpHandlerOptions = {
  source: DumpSource;
  /** True once this replica's recovery has ended; until then /dump answers 503 (a cold index is no snapshot). */
  ready: () => boolean;
  /** DYN_EPP_PEER_TOKEN: when set, requests without `Authorization: Bearer <token>` get 401. */
  token?: string;
  logger: Logger;
  chunkBytes?: number;
};

const JSON_TYPE = { "content-type": "application/json" };

function jsonError(status: number, error: string, extra: Record<string, string> = {}): Response {
  return new Response(JSON.stringify({ error }), { status, headers: { ...JSON_TYPE, ...extra } });
}

/** Compares in time independent of where the strings differ, so the token cannot be guessed byte by byte. */
function sameSecret(a: string, b: string): boolean {
  const x = new TextEncoder().encode(a);
  const y = new TextEncoder().encode(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

export function dumpHandler(opts: DumpHandlerOptions): (req: Request) => Response {
  const log = opts.logger.child({ component: "dump" });
  return (req) => {
    // Not ready first: a 503 reveals nothing, and a cold sibling with another token must still read as
    // "not serving" (not as a peer that refuses it) so that cold replicas bootstrap instead of waiting.
    if (!opts.ready()) return jsonError(503, "KV index not recovered yet", { "retry-after": "1" });
    if (opts.token) {
      const auth = req.headers.get("authorization") ?? "";
      if (!auth.startsWith("Bearer ") || !sameSecret(auth.slice(7), opts.token)) {
        return jsonError(401, "unauthorized", { "www-authenticate": "Bearer" });
      }
    }
    // The static-peer probe is a HEAD: answer it without walking the index.
    if (req.method === "HEAD") return new Response(null, { status: 200, headers: JSON_TYPE });
    const started = performance.now();
    let bytes = 0;
    let first: Uint8Array | null;
    let next: () => Uint8Array | null;
    let chunks: Generator<Uint8Array>;
    try {
      // The first chunk is produced before answering, so a dump that cannot start is still a clean 500.
      chunks = dumpChunks(opts.source, opts.chunkBytes);
      next = () => {
        const r = chunks.next();
        return r.done ? null : r.value;
      };
      first = next();
    } catch (err) {
      log.error({ err: String(err) }, "dump failed before the first byte");
      return jsonError(500, `dump failed: ${err instanceof Error ? err.message : String(err)}`);
    }
    const pace = gcPacer();
    const counted = () => {
      try {
        const c = next();
        if (c === null) log.info({ bytes, ms: Math.round(performance.now() - started) }, "dump served");
        else {
          bytes += c.length;
          pace(c.length);
        }
        return c;
      } catch (err) {
        // Headers are gone: erroring the stream aborts the connection, and the reader fails on a truncated body.
        log.error({ err: String(err), bytes }, "dump failed mid-body, aborting the response");
        throw err;
      }
    };
    if (first !== null) bytes += first.length;
    const cancelled = () => {
      chunks.return(undefined);
      log.info({ bytes, ms: Math.round(performance.now() - started) }, "dump abandoned by the reader");
    };
    return new Response(streamFromChunks(counted, first, cancelled), { status: 200, headers: JSON_TYPE });
  };
}
