// ext_proc message shapes (as @grpc/proto-loader objects) and builders for the EPP's answers
// (GAIE endpoint picker protocol: destination header + envoy.lb dynamic metadata).
import { endpointHost } from "@kv-epp/protocol";

export type HeaderValue = { key: string; value?: string; raw_value?: Uint8Array };
export type HeaderMap = { headers?: HeaderValue[] };
export type StructValue = {
  stringValue?: string;
  numberValue?: number;
  listValue?: { values?: StructValue[] };
  structValue?: Struct;
  kind?: string;
};
export type Struct = { fields?: Record<string, StructValue> };

export type BodySendMode = "NONE" | "STREAMED" | "BUFFERED" | "BUFFERED_PARTIAL" | "FULL_DUPLEX_STREAMED" | "GRPC";

export type ProcessingRequest = {
  request?: "request_headers" | "response_headers" | "request_body" | "response_body" | "request_trailers" | "response_trailers";
  request_headers?: { headers?: HeaderMap; end_of_stream?: boolean };
  response_headers?: { headers?: HeaderMap; end_of_stream?: boolean };
  request_body?: { body?: Uint8Array; end_of_stream?: boolean };
  response_body?: { body?: Uint8Array; end_of_stream?: boolean };
  request_trailers?: { trailers?: HeaderMap };
  response_trailers?: { trailers?: HeaderMap };
  metadata_context?: { filter_metadata?: Record<string, Struct> };
  observability_mode?: boolean;
  protocol_config?: { request_body_mode?: BodySendMode; response_body_mode?: BodySendMode };
};

export type ProcessingResponse = Record<string, unknown>;

export const DESTINATION_HEADER = "x-gateway-destination-endpoint";
export const METADATA_NAMESPACE = "envoy.lb";
export const SUBSET_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_KEY = "x-gateway-destination-endpoint-subset";
/** Each scored endpoint's score, beside the destination (llm-d's --emit-endpoint-scores). */
export const SCORES_KEY = "x-gateway-destination-endpoint-scores";
/** Where the data plane reports which endpoint served a request (on the response path). */
export const SERVED_KEY = "x-gateway-destination-endpoint-served";
/** vLLM's API server routes to this data-parallel rank when the header is present. */
export const DP_RANK_HEADER = "x-data-parallel-rank";
/**
 * SGLang's header overrides of a request's ranks (with SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES): its own rank, applied
 * over x-data-parallel-rank, and under P/D disaggregation the rank of the prefill server that computes its prompt.
 * Removed from every request, since only the pick names a rank (the EPP sets neither).
 */
const SGLANG_RANK_OVERRIDE_HEADERS = ["x-override-routed-dp-rank", "x-override-disagg-prefill-dp-rank"];
/** A client's own rank headers: each steers a request to a rank the pick did not choose. */
const CLIENT_RANK_HEADERS = [DP_RANK_HEADER, ...SGLANG_RANK_OVERRIDE_HEADERS];

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export function headerValue(h: HeaderValue): string {
  // Envoy puts values in raw_value; value is kept for senders that predate it.
  return h.raw_value && h.raw_value.length > 0 ? decoder.decode(h.raw_value) : (h.value ?? "");
}

export function findHeader(map: HeaderMap | undefined, key: string): string | undefined {
  for (const h of map?.headers ?? []) if (h.key === key) return headerValue(h);
  return undefined;
}

/**
 * The GAIE subset hint as the pod IPs it names, matched by IP as GAIE's EPP does
 * (pkg/epp/requestcontrol/candidates.go): "ip:port" entries lose their port, so a pod named under any
 * of its ports makes all its endpoints eligible. A hint is a list (non-string items skipped) or one string, each
 * string comma-separated entries, as GAIE's lightweight EPP reads them; any other value is as if absent. A hint
 * naming nothing allows nothing. Undefined: this message carries none.
 */
export function subsetHint(req: ProcessingRequest): Set<string> | undefined {
  const v = req.metadata_context?.filter_metadata?.[SUBSET_NAMESPACE]?.fields?.[SUBSET_KEY];
  if (!v) return undefined;
  const out = new Set<string>();
  const add = (entries: string) => {
    for (const entry of entries.split(",")) if (entry.trim() !== "") out.add(endpointHost(entry.trim()));
  };
  if (v.kind === "stringValue" || (v.kind === undefined && v.stringValue !== undefined)) add(v.stringValue ?? "");
  else if (v.kind === "listValue" || v.listValue !== undefined) {
    for (const item of v.listValue?.values ?? []) if (item.stringValue !== undefined) add(item.stringValue);
  } else return undefined;
  return out;
}

/** envoy.lb x-gateway-destination-endpoint-served from a message's metadata_context, when there. */
export function servedEndpoint(req: ProcessingRequest): string | undefined {
  const v = req.metadata_context?.filter_metadata?.[METADATA_NAMESPACE]?.fields?.[SERVED_KEY];
  return v?.stringValue?.trim() || undefined;
}

function setHeader(key: string, value: string) {
  return { header: { key, raw_value: encoder.encode(value) }, append_action: "OVERWRITE_IF_EXISTS_OR_ADD" };
}

/**
 * `body`: the request body replacing the buffered one (a rewritten `model`), in the body answer only.
 * `removeHeaders`: request headers the client may have sent that must not reach the upstream.
 */
export type Route = {
  endpoint: string;
  dpRank?: number;
  contentLength?: number;
  extraHeaders?: readonly [string, string][];
  removeHeaders?: readonly string[];
  body?: Uint8Array;
  /** Endpoint -> score, in the envoy.lb metadata beside the destination (llm-d's --emit-endpoint-scores). */
  scores?: Readonly<Record<string, number>>;
};

function routeCommon(r: Route) {
  const set = [setHeader(DESTINATION_HEADER, r.endpoint)];
  // Without a rank of the EPP's, a client's own rank header is removed: it would steer the request to a rank the
  // pick did not choose (or one the server refuses), as the EPP's would override it otherwise.
  const removed = [...(r.dpRank === undefined ? CLIENT_RANK_HEADERS : SGLANG_RANK_OVERRIDE_HEADERS), ...(r.removeHeaders ?? [])];
  if (r.dpRank !== undefined) set.push(setHeader(DP_RANK_HEADER, String(r.dpRank)));
  if (r.contentLength !== undefined) set.push(setHeader("content-length", String(r.contentLength)));
  for (const [k, v] of r.extraHeaders ?? []) set.push(setHeader(k, v));
  const remove = { remove_headers: removed };
  return { header_mutation: { set_headers: set, ...remove }, clear_route_cache: true, ...(r.body ? { body_mutation: { body: r.body } } : {}) };
}

function routeMetadata(r: Route): Struct {
  const fields: Struct["fields"] = { [DESTINATION_HEADER]: { stringValue: r.endpoint } };
  // No endpoint with a finite score: the key is left out, as llm-d leaves it, rather than sent empty.
  if (r.scores && Object.keys(r.scores).length > 0) fields[SCORES_KEY] = { structValue: { fields: Object.fromEntries(Object.entries(r.scores).map(([e, s]) => [e, { numberValue: s }])) } };
  return { fields: { [METADATA_NAMESPACE]: { structValue: { fields } } } };
}

/** The routing answer, on the request-headers response (streamed mode, or a body-less request). */
export function routedHeaders(r: Route): ProcessingResponse {
  return { request_headers: { response: routeCommon(r) }, dynamic_metadata: routeMetadata(r) };
}

/** The routing answer on the request-body response (buffered mode: header mutations apply there). */
export function routedBody(r: Route): ProcessingResponse {
  return { request_body: { response: routeCommon(r) }, dynamic_metadata: routeMetadata(r) };
}

/**
 * The routing answer on the request-trailers response: a buffered mode's request whose headers were
 * answered, then trailers came and no body, so Envoy waits on a trailers answer (any other kind it counts
 * as spurious and stops asking). That answer can only mutate the trailers: the route goes as the envoy.lb
 * metadata alone, which the data plane's load balancer reads when the request continues.
 */
export function routedTrailers(r: Route): ProcessingResponse {
  return { request_trailers: {}, dynamic_metadata: routeMetadata(r) };
}

/** Lets the response headers through with these set (an explanation the client asked for). */
export function responseHeadersWith(headers: readonly [string, string][]): ProcessingResponse {
  return { response_headers: { response: { header_mutation: { set_headers: headers.map(([k, v]) => setHeader(k, v)) } } } };
}

export type Phase = "request_headers" | "request_body" | "response_headers" | "response_body" | "request_trailers" | "response_trailers";

/**
 * A buffered mode's answer to the request headers, before the body takes the route: a client's own rank headers
 * removed already, since a route that comes on a trailers answer (routedTrailers) can no longer touch them; one
 * that comes on the body sets the pick's rank again.
 */
export function continueRequestHeaders(): ProcessingResponse {
  return { request_headers: { response: { header_mutation: { remove_headers: CLIENT_RANK_HEADERS } } } };
}

export function continueResponse(phase: Phase): ProcessingResponse {
  if (phase === "request_trailers" || phase === "response_trailers") return { [phase]: {} };
  return { [phase]: { response: {} } };
}

/**
 * A body message answered with other bytes (BUFFERED or STREAMED mode, where each body message gets one
 * answer); `contentLength`: the new length, for a body whose headers are still held (BUFFERED).
 */
export function replacedBody(phase: "request_body" | "response_body", body: Uint8Array, contentLength?: number): ProcessingResponse {
  const headers = contentLength === undefined ? {} : { header_mutation: { set_headers: [setHeader("content-length", String(contentLength))] } };
  return { [phase]: { response: { ...headers, body_mutation: { body } } } };
}

/** Marks a streamed-body answer, which `encodeResponse` writes without copying the body. */
const STREAMED = Symbol("streamed body");
type Streamed = { phase: "request_body" | "response_body"; body: Uint8Array; endOfStream: boolean };

/** FULL_DUPLEX_STREAMED: body chunks must be handed back for the data plane to forward them. */
export function streamedBody(phase: "request_body" | "response_body", body: Uint8Array, endOfStream: boolean): ProcessingResponse {
  const streamed: Streamed = { phase, body, endOfStream };
  return { [phase]: { response: { body_mutation: { streamed_response: { body, end_of_stream: endOfStream } } } }, [STREAMED]: streamed };
}

/**
 * Encodes a ProcessingResponse. A streamed body (every request body in full duplex, every response
 * chunk) is encoded here as its few header bytes followed by the body itself, so the bytes are not
 * copied into a new message: in full duplex that copy was ~50 KB per 8k-token request, and the
 * garbage it made set how often the GC paused the server (bench/epp.bench.ts). Everything else goes
 * through the proto-loader serializer.
 */
export function responseEncoder(serialize: (m: ProcessingResponse) => Buffer): (m: ProcessingResponse) => Uint8Array | Uint8Array[] {
  return (m) => {
    const s = (m as { [STREAMED]?: Streamed })[STREAMED];
    return s ? encodeStreamed(s) : serialize(m);
  };
}

// Field numbers (envoy/service/ext_proc/v3/external_processor.proto), all length-delimited here:
// ProcessingResponse.request_body = 3 / .response_body = 4 -> BodyResponse.response = 1 ->
// CommonResponse.body_mutation = 3 -> BodyMutation.streamed_response = 3 ->
// StreamedBodyResponse.body = 1, .end_of_stream = 2 (varint).
const LEN = 2;
const tag = (field: number, wire: number) => (field << 3) | wire;
// end_of_stream is written even when false, as the proto-loader serializer does (same bytes).
const EOS = [new Uint8Array([tag(2, 0), 0]), new Uint8Array([tag(2, 0), 1])] as const;

function encodeStreamed(s: Streamed): Uint8Array[] {
  const n = s.body.length;
  const inner = 1 + varintSize(n) + n + 2; // StreamedBodyResponse
  const fields = [tag(s.phase === "request_body" ? 3 : 4, LEN), tag(1, LEN), tag(3, LEN), tag(3, LEN)];
  // Sizes from the innermost message out: each level is its child's tag + length + bytes.
  const sizes = [inner];
  for (let i = fields.length - 1; i > 0; i--) sizes.unshift(1 + varintSize(sizes[0]!) + sizes[0]!);
  const head: number[] = [];
  for (let i = 0; i < fields.length; i++) {
    head.push(fields[i]!);
    pushVarint(head, sizes[i]!);
  }
  head.push(tag(1, LEN));
  pushVarint(head, n);
  return [Uint8Array.from(head), s.body, EOS[s.endOfStream ? 1 : 0]];
}

function varintSize(v: number): number {
  let n = 1;
  while (v >= 0x80) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

function pushVarint(out: number[], v: number): void {
  while (v >= 0x80) {
    out.push((v % 128) | 0x80);
    v = Math.floor(v / 128);
  }
  out.push(v);
}

export type ImmediateStatus = 400 | 413 | 429 | 500 | 503;

/** llm-d's header naming why a request never reached a model server, by our refusals' status codes. */
const DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason";
const DROPPED_REASON: Partial<Record<ImmediateStatus, string>> = { 429: "rejected-saturated", 503: "rejected-no-endpoints" };

export function immediate(code: ImmediateStatus, message: string, details: string): ProcessingResponse {
  const dropped = DROPPED_REASON[code];
  const headers = [setHeader("content-type", "application/json"), ...(dropped ? [setHeader(DROPPED_REASON_HEADER, dropped)] : [])];
  return {
    immediate_response: {
      status: { code },
      headers: { set_headers: headers },
      body: encoder.encode(JSON.stringify({ error: { message, type: details, code } })),
      details,
    },
  };
}
