// The load generators' requests, serialized once: per request the request_headers message (with the
// protocol_config of the mode) and the request_body message carrying a whole 8k-token body, both
// gRPC-framed as they go on the wire.
import { loadProtos } from "../src/extproc/protos.ts";
import { framed } from "../src/extproc/grpc-frames.ts";
import { requestBodies } from "./workload.ts";

export type Mode = "full-duplex" | "buffered";
export const REQUESTS = 512;

export function extProcRequests(mode: Mode, seed: number): { headers: Buffer; bodies: Buffer[] } {
  return extProcMessages(mode, "/v1/completions", requestBodies(REQUESTS, seed));
}

/** Any request bodies for `path` (e.g. chats for /v1/chat/completions), framed as extProcRequests frames them. */
export function extProcMessages(mode: Mode, path: string, payloads: readonly Uint8Array[]): { headers: Buffer; bodies: Buffer[] } {
  const method = loadProtos().extProc.service.Process!;
  const enc = new TextEncoder();
  const headers = framed(
    method.requestSerialize({
      request_headers: {
        headers: { headers: [{ key: ":method", raw_value: enc.encode("POST") }, { key: ":path", raw_value: enc.encode(path) }] },
      },
      protocol_config:
        mode === "buffered"
          ? { request_body_mode: "BUFFERED", response_body_mode: "NONE" }
          : { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" },
    }),
  );
  const bodies = payloads.map((body) => framed(method.requestSerialize({ request_body: { body, end_of_stream: true } })));
  return { headers, bodies };
}

/** The C generator's input file (bench/loadgen.c): u32le count, then per request u32le length + bytes of each message. */
export function requestsFile(mode: Mode, seed: number): Buffer {
  return requestsFileOf(extProcRequests(mode, seed));
}

export function requestsFileOf({ headers, bodies }: { headers: Buffer; bodies: Buffer[] }): Buffer {
  const u32 = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(n);
    return b;
  };
  return Buffer.concat([u32(bodies.length), ...bodies.flatMap((b) => [u32(headers.length), headers, u32(b.length), b])]);
}
