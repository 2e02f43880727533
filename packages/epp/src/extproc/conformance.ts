// The two test hooks of GAIE's conformance suite (conformance/ in gateway-api-inference-extension),
// which certifies gateways with a picker in the loop. Its reference test picker (pkg/lwepp) implements
// them, and so does this EPP behind --conformance-test-hooks, so the suite can run against a
// deployment of kv-epp. Off by default: any client could steer its own requests with the header.
//
// - Steering: the request header `test-epp-endpoint-selection: ip[,ip:port...]` restricts the
//   candidates: an `ip` entry to every endpoint of that pod, an `ip:port` entry to that endpoint alone
//   (GAIE's HeaderBasedTestingFilter; the data-parallel test pins a pod's rank by its port). As lwepp
//   does, the header wins over the gateway's subset hint, and a header naming no known endpoint leaves
//   every endpoint a candidate.
// - Echo: the response headers report the endpoint the data plane says served the request (`envoy.lb`
//   `x-gateway-destination-endpoint-served` metadata) in `x-conformance-test-served-endpoint`, or why
//   it is missing (lwepp's words, so the suite's failure reads the same), and this picker's choice in
//   `x-conformance-test-selected-endpoint`.
import { endpointHost } from "@kv-epp/protocol";
import { findHeader, METADATA_NAMESPACE, SERVED_KEY, type HeaderMap, type ProcessingRequest } from "./messages.ts";

export const SELECTION_HEADER = "test-epp-endpoint-selection";
export const SERVED_HEADER = "x-conformance-test-served-endpoint";
export const SELECTED_HEADER = "x-conformance-test-selected-endpoint";

/**
 * The pod IPs and `ip:port` endpoints a request is steered to (the picker's subset), for `endpoints`
 * (the routable ones); undefined when the request carries no selection header (the gateway's subset
 * hint applies), and `{ subset: undefined }` when it names no known endpoint (every one is a candidate).
 */
export function steering(headers: HeaderMap | undefined, endpoints: readonly string[]): { subset: Set<string> | undefined } | undefined {
  const value = findHeader(headers, SELECTION_HEADER)?.trim();
  if (!value) return undefined;
  const named = new Set(value.split(",").map((e) => e.trim()).filter((e) => e.length > 0).map(selectionEntry));
  const known = endpoints.some((e) => named.has(endpointHost(e)) || named.has(e));
  return { subset: known ? named : undefined };
}

/** `ip` and `[v6]` name a pod (brackets dropped, as endpointHost gives a pod's IP); `ip:port` and `[v6]:port` stay an endpoint. */
function selectionEntry(entry: string): string {
  const host = endpointHost(entry);
  return host === entry || `[${host}]` === entry ? host : entry;
}

/** The echo headers for a response: what served the request (as the data plane reports it) and what was picked. */
export function echo(msg: ProcessingRequest, picked: string | undefined): [string, string][] {
  const lb = msg.metadata_context?.filter_metadata?.[METADATA_NAMESPACE];
  const served = lb?.fields?.[SERVED_KEY]?.stringValue;
  const out: [string, string][] = [
    [SERVED_HEADER, !lb ? "fail: missing envoy lb metadata" : served === undefined ? "fail: missing destination endpoint served metadata" : served],
  ];
  if (picked) out.push([SELECTED_HEADER, picked]);
  return out;
}
