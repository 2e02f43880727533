// grpc.health.v1.Health/Check as the kubelet's grpc probe calls it. The two messages are one field
// each (HealthCheckRequest.service = 1, string; HealthCheckResponse.status = 1, enum), so they are
// encoded here by hand rather than loading a .proto.
import * as grpc from "@grpc/grpc-js";

export type ServingStatus = "UNKNOWN" | "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN";
const STATUSES: ServingStatus[] = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"];

export type ProbeResult = ServingStatus | "UNREACHABLE";

function varint(n: number): number[] {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return out;
}

function readVarint(buf: Uint8Array, pos: number): [number, number] {
  let value = 0;
  let shift = 0;
  for (;;) {
    if (pos >= buf.length) throw new Error("truncated varint");
    const b = buf[pos++]!;
    value += (b & 0x7f) * 2 ** shift;
    if ((b & 0x80) === 0) return [value, pos];
    shift += 7;
  }
}

/** Field 1 of a one-field message, skipping any other field. */
function readField1(buf: Uint8Array): { varint?: number; bytes?: Uint8Array } {
  let pos = 0;
  let found: { varint?: number; bytes?: Uint8Array } = {};
  while (pos < buf.length) {
    const [tag, p] = readVarint(buf, pos);
    pos = p;
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire === 0) {
      const [v, q] = readVarint(buf, pos);
      pos = q;
      if (field === 1) found = { varint: v };
    } else if (wire === 2) {
      const [len, q] = readVarint(buf, pos);
      if (field === 1) found = { bytes: buf.subarray(q, q + len) };
      pos = q + len;
    } else if (wire === 1) pos += 8;
    else if (wire === 5) pos += 4;
    else throw new Error(`unsupported wire type ${wire}`);
  }
  return found;
}

export function encodeCheckRequest(service: string): Buffer {
  const s = Buffer.from(service, "utf8");
  return s.length === 0 ? Buffer.alloc(0) : Buffer.concat([Buffer.from([0x0a, ...varint(s.length)]), s]);
}

export function decodeCheckRequest(buf: Uint8Array): string {
  const f = readField1(buf);
  return f.bytes ? Buffer.from(f.bytes).toString("utf8") : "";
}

export function encodeCheckResponse(status: ServingStatus): Buffer {
  const n = STATUSES.indexOf(status);
  return n === 0 ? Buffer.alloc(0) : Buffer.from([0x08, ...varint(n)]);
}

export function decodeCheckResponse(buf: Uint8Array): ServingStatus {
  return STATUSES[readField1(buf).varint ?? 0] ?? "UNKNOWN";
}

const CHECK_PATH = "/grpc.health.v1.Health/Check";

export type HealthCheckRequest = { service: string };

/**
 * The service definition, for a test server that plays a pod's health endpoint. The request
 * deserializes to an object: grpc-js rejects a falsy request ("Received no request message"), which
 * a bare "" (the kubelet's default, empty service) would be.
 */
export const healthServiceDefinition: grpc.ServiceDefinition = {
  Check: {
    path: CHECK_PATH,
    requestStream: false,
    responseStream: false,
    requestSerialize: (r: HealthCheckRequest) => encodeCheckRequest(r.service),
    requestDeserialize: (b: Buffer): HealthCheckRequest => ({ service: decodeCheckRequest(b) }),
    responseSerialize: (s: ServingStatus) => encodeCheckResponse(s),
    responseDeserialize: (b: Buffer) => decodeCheckResponse(b),
  },
};

/** A reusable probe client for one address (`host:port`), like the kubelet keeps per container. */
export class HealthProbe {
  private readonly client: grpc.Client;
  constructor(readonly address: string) {
    // A local subchannel pool: grpc-js otherwise shares connections per address process-wide, and a
    // new pod on a reused address would inherit the reconnect backoff of the dead one's channel.
    this.client = new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  }

  check(service: string, timeoutMs = 1000): Promise<ProbeResult> {
    return new Promise((resolve) => {
      this.client.makeUnaryRequest(
        CHECK_PATH,
        (s: string) => encodeCheckRequest(s),
        (b: Buffer) => decodeCheckResponse(b),
        service,
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err, status) => {
          if (err) resolve(err.code === grpc.status.NOT_FOUND ? "SERVICE_UNKNOWN" : "UNREACHABLE");
          else resolve(status ?? "UNKNOWN");
        },
      );
    });
  }

  close(): void {
    this.client.close();
  }
}
