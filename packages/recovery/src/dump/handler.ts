import { DUMP_BINARY_CONTENT_TYPE, DUMP_CONTENT_TYPE } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { DumpSource } from "../types.ts";
import { dumpBinaryChunks } from "./binary-writer.ts";
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
  /** Serve the binary body to requests that ask for it (default true); false: JSON only, as before it existed. */
  binary?: boolean;
};

const JSON_TYPE = { "content-type": DUMP_CONTENT_TYPE };

/**
 * Whether the request's Accept names the binary body with a q above 0. Anything else (no Accept, any type,
 * `application/json`: every client from before the binary body) gets JSON, the default shape.
 */
export function wantsBinary(accept: string | null): boolean {
  if (accept === null) return false;
  for (const range of accept.split(",")) {
    const [type, ...params] = range.split(";").map((x) => x.trim().toLowerCase());
    if (type !== DUMP_BINARY_CONTENT_TYPE) continue;
    const q = params.find((p) => p.startsWith("q="));
    return q === undefined || Number(q.slice(2)) > 0;
  }
  return false;
}

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
    // Not ready first: a 503 reveals nothing, and a cold peer with another token must still read as
    // "not serving" (not as a peer that refuses it) so that cold replicas bootstrap instead of waiting.
    if (!opts.ready()) return jsonError(503, "KV index not recovered yet", { "retry-after": "1" });
    if (opts.token) {
      const auth = req.headers.get("authorization") ?? "";
      if (!auth.startsWith("Bearer ") || !sameSecret(auth.slice(7), opts.token)) {
        return jsonError(401, "unauthorized", { "www-authenticate": "Bearer" });
      }
    }
    const binary = opts.binary !== false && wantsBinary(req.headers.get("accept"));
    const headers = { "content-type": binary ? DUMP_BINARY_CONTENT_TYPE : DUMP_CONTENT_TYPE, vary: "accept" };
    // The static-peer probe is a HEAD: answer it without walking the index.
    if (req.method === "HEAD") return new Response(null, { status: 200, headers });
    const started = performance.now();
    let bytes = 0;
    let first: Uint8Array | null;
    let next: () => Uint8Array | null;
    let chunks: Generator<Uint8Array>;
    try {
      // The first chunk is produced before answering, so a dump that cannot start is still a clean 500.
      chunks = binary ? dumpBinaryChunks(opts.source, opts.chunkBytes) : dumpChunks(opts.source, opts.chunkBytes);
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
        if (c === null) log.info({ bytes, ms: Math.round(performance.now() - started), format: binary ? "binary" : "json" }, "dump served");
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
    return new Response(streamFromChunks(counted, first, cancelled), { status: 200, headers });
  };
}
